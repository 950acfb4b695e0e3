"""Private constants: commitments, openings, program digests, driver shares on an SPU,
and the refusal to fetch an unrevealed secure value (in-process)."""

from __future__ import annotations

import json
import re
import struct
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.cluster.commitments import (
    commit,
    decode_openings,
    encode_openings,
    open_program,
    program_digest,
)
from mplang.edsl.errors import MPRefusedError, MPRuntimeError, MPSerializationError
from mplang.edsl.graph import Graph
from mplang.edsl.private import Commitment
from mplang.edsl.serde import decode_graph_bundle, encode_graph_bundle

SECRET0 = np.array([3.14159, -2.71828, 1.41421], dtype=np.float32)
SECRET1 = np.array([[1234567, -7654321]], dtype=np.int32)


def two_secrets(a: Any = SECRET0, b: Any = SECRET1) -> Any:
    x = simp.constant((0,), a)
    y = simp.pcall((1,), lambda: tensor.constant(b))
    return x, y


def compiled(fn: Any = two_secrets, *args: Any) -> Graph:
    return mp.compile(lambda: fn(*args), world_size=3).graph


def wire(graph: Graph, rank: int) -> bytes:
    """What party ``rank`` receives of ``graph``: the committed program and its openings."""
    committed = commit(graph, 3)
    return encode_graph_bundle(committed.graph, {}) + encode_openings(committed.openings[rank])


def test_each_party_receives_only_its_own_constants() -> None:
    graph = compiled()
    for rank, (mine, other) in enumerate([(SECRET0, SECRET1), (SECRET1, SECRET0),
                                          (None, SECRET0)]):
        received = wire(graph, rank)
        assert other.tobytes() not in received
        assert (mine is None and SECRET1.tobytes() not in received) or \
            (mine is not None and mine.tobytes() in received)
    committed = commit(graph, 3)
    assert all(isinstance(op.attrs["value"], Commitment) for op in committed.graph.walk()
               if op.opcode in ("simp.constant", "tensor.constant"))
    assert SECRET0.tobytes() not in encode_graph_bundle(committed.graph, {})


def test_openings_verify_and_restore_exactly_the_partys_values() -> None:
    graph = compiled()
    committed = commit(graph, 3)
    data = encode_graph_bundle(committed.graph, {})
    for rank in range(3):
        received, _ = decode_graph_bundle(data)
        openings = decode_openings(encode_openings(committed.openings[rank]))
        opened = open_program(received, openings, rank, 3)
        values = {op.opcode: op.attrs["value"] for op in opened.walk()
                  if op.opcode in ("simp.constant", "tensor.constant")}
        if rank == 0:
            np.testing.assert_array_equal(values["simp.constant"], SECRET0)
        else:
            assert isinstance(values["simp.constant"], Commitment)
        if rank == 1:
            np.testing.assert_array_equal(values["tensor.constant"], SECRET1)
        else:
            assert isinstance(values["tensor.constant"], Commitment)


def test_the_same_graph_commits_the_same_way_every_run() -> None:
    graph = compiled()
    assert commit(graph, 3) is commit(graph, 3)
    again = compiled()
    assert encode_graph_bundle(commit(again, 3).graph, {}) != \
        encode_graph_bundle(commit(graph, 3).graph, {})  # fresh nonces per traced graph


def test_a_tampered_opening_is_refused_naming_op_attr_and_line() -> None:
    graph = compiled()
    committed = commit(graph, 3)
    (path, (value, nonce)), = committed.openings[0].items()
    loc = committed.graph.operations[0].loc
    assert loc is not None and loc.startswith("test_private_constants.py:")
    with pytest.raises(MPRefusedError) as e:
        open_program(committed.graph, {path: (value + 1, nonce)}, 0, 3)
    assert e.value.status == 400
    assert str(e.value) == (f"party 0: op #0 simp.constant (traced at {loc}), attribute "
                            "'value': the opening does not match its commitment")
    with pytest.raises(MPRefusedError, match="the opening does not match"):
        open_program(committed.graph, {path: (value, bytes(16))}, 0, 3)
    with pytest.raises(MPRefusedError, match="the driver sent no opening"):
        open_program(committed.graph, {}, 0, 3)
    with pytest.raises(MPRefusedError, match="openings for attributes this party may not see"):
        open_program(committed.graph, committed.openings[0], 2, 3)


def test_a_tampered_commitment_is_refused() -> None:
    committed = commit(compiled(), 3)
    op = committed.graph.operations[0]
    forged = Commitment(bytes(32), op.attrs["value"].type)
    graph = Graph(committed.graph.inputs,
                  [op.replace(attrs={**op.attrs, "value": forged}),
                   *committed.graph.operations[1:]], committed.graph.outputs)
    with pytest.raises(MPRefusedError, match=r"op #0 simp.constant .*the opening does not match"):
        open_program(graph, committed.openings[0], 0, 3)


@pytest.mark.parametrize(("name", "hidden"), [
    ("fn", Commitment(bytes(32), None)),               # the body's name
    ("parties", [Commitment(bytes(32), None)]),        # nested in a list
])
def test_a_commitment_outside_a_private_attribute_is_refused(name: str, hidden: Any) -> None:
    """Only values an op declares private may be hidden: a commitment anywhere else (the
    code a party runs, its parties, its device) is refused before anything is opened."""
    committed = commit(compiled(), 3)
    pcall = committed.graph.operations[1]
    assert pcall.opcode == "simp.pcall"
    graph = Graph(committed.graph.inputs,
                  [committed.graph.operations[0],
                   pcall.replace(attrs={**pcall.attrs, name: hidden}),
                   *committed.graph.operations[2:]], committed.graph.outputs)
    with pytest.raises(MPRefusedError, match=rf"party 1: op #1 simp.pcall \(traced at "
                       rf"test_private_constants.py:\d+\), attribute '{name}': a commitment "
                       r"in an attribute simp.pcall does not declare private") as refused:
        open_program(graph, committed.openings[1], 1, 3)
    assert refused.value.status == 400


def test_an_opening_of_another_type_than_committed_is_refused() -> None:
    committed = commit(compiled(), 3)
    op = committed.graph.operations[0]
    (path, (value, _)), = committed.openings[0].items()
    digest = commit(compiled(two_secrets, value.astype(np.int32)), 3)
    # a commitment that matches the value but declares the original type
    (_, (v2, n2)), = digest.openings[0].items()
    mixed = Commitment(digest.graph.operations[0].attrs["value"].digest, op.attrs["value"].type)
    graph = Graph(committed.graph.inputs,
                  [op.replace(attrs={**op.attrs, "value": mixed}),
                   *committed.graph.operations[1:]], committed.graph.outputs)
    with pytest.raises(MPRefusedError, match="the opened value is i32\\[3\\], its commitment "
                                             "declares f32\\[3\\]"):
        open_program(graph, {path: (v2, n2)}, 0, 3)


def test_program_digest_is_stable_and_independent_of_constant_values() -> None:
    first = compiled()
    second = compiled(two_secrets, SECRET0 * 7, SECRET1 + 1)
    assert program_digest(first, 3) == program_digest(second, 3)
    assert program_digest(commit(first, 3).graph, 3) == program_digest(first, 3)
    opened = open_program(commit(first, 3).graph, commit(first, 3).openings[0], 0, 3)
    assert program_digest(opened, 3) == program_digest(first, 3)
    other_shape = compiled(two_secrets, SECRET0[:2])
    assert program_digest(other_shape, 3) != program_digest(first, 3)


def test_commitments_round_trip_through_serde_and_are_schema_checked() -> None:
    committed = commit(compiled(), 3)
    data = encode_graph_bundle(committed.graph, {})
    graph, _ = decode_graph_bundle(data)
    assert graph.operations[0].attrs["value"] == committed.graph.operations[0].attrs["value"]
    size = struct.unpack_from("<Q", data, 8)[0]
    doc = json.loads(data[16:16 + size])
    doc["graph"]["ops"][0]["attrs"]["value"]["$commit"].append(None)
    text = json.dumps(doc).encode()
    broken = data[:8] + struct.pack("<Q", len(text)) + text + data[16 + size:]
    with pytest.raises(MPSerializationError, match=r"graph\.ops\[0\]\.attrs\.value\.\$commit"):
        decode_graph_bundle(broken)
    with pytest.raises(MPSerializationError, match="openings"):
        decode_openings(b"MPLANG\x00\x01" + (2).to_bytes(8, "little") + b"{}")


def test_simulator_runs_committed_programs(sim: mp.Simulator) -> None:
    x, y = mp.evaluate(sim, two_secrets)
    np.testing.assert_array_equal(mp.fetch(sim, x)[0], SECRET0)
    np.testing.assert_array_equal(mp.fetch(sim, y)[1], SECRET1)


def test_a_party_refusing_in_prepare_means_nothing_runs(sim: mp.Simulator,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []
    for worker in sim.mesh.workers:
        original = worker.run
        monkeypatch.setattr(worker, "run", lambda *a, _w=worker, _o=original, **k:
                            (ran.append(_w.rank), _o(*a, **k))[1])
    monkeypatch.setattr(sim.mesh.workers[2], "vet", lambda *a: "not with this program")
    with pytest.raises(MPRefusedError, match="node_2 refuses the program: not with this "
                                             "program"):
        mp.evaluate(sim, lambda: simp.pcall((0, 1, 2), lambda: tensor.constant(SECRET0)))
    assert ran == []


def test_driver_constant_on_spu_is_secret_shared_by_the_driver(sim: mp.Simulator) -> None:
    value = np.array([1234567, -7654321, 42], dtype=np.int32)

    def prog() -> Any:
        s = mp.put("SP0", value)
        t = mp.device("SP0")(lambda a: a * 2 + 1)(s)
        return mp.put("P1", t)

    program = mp.compile(prog, cluster=sim.cluster)
    assert [op.opcode for op in program.graph.operations if op.opcode.startswith("spu.")][:1] \
        == ["spu.shares"]
    assert "simp.constant" not in {op.opcode for op in program.graph.walk()}
    for rank in range(3):
        assert value.tobytes() not in wire(program.graph, rank)
    np.testing.assert_array_equal(mp.fetch(sim, mp.evaluate(sim, program)), value * 2 + 1)


def test_float_driver_constant_on_spu_matches_numpy(sim: mp.Simulator) -> None:
    a = np.array([[0.5, -1.25], [3.0, 2.0]], dtype=np.float32)

    def prog() -> Any:
        s = mp.put("SP0", a)
        return mp.put("P0", mp.device("SP0")(lambda u, v: u @ v)(s, s))

    np.testing.assert_allclose(mp.fetch(sim, mp.evaluate(sim, prog)), a @ a, atol=2e-3)


def test_fetch_of_an_unrevealed_spu_value_is_an_error(sim: mp.Simulator) -> None:
    def prog() -> Any:
        x = mp.put("P0", np.arange(3, dtype=np.int32))
        y = mp.put("P1", np.ones(3, dtype=np.int32))
        return mp.device("SP0")(lambda a, b: a + b)(x, y)

    z = mp.evaluate(sim, prog)
    with pytest.raises(MPRuntimeError) as e:
        mp.fetch(sim, z)
    assert re.fullmatch(re.escape("SP0 holds a secret-shared value; reveal it in the program "
                                  "first, e.g. return mp.put('P0', z)")
                        + r" \(at test_private_constants\.py:\d+\)", str(e.value))
