"""Private inputs in the simulator: ``tensor.load`` from each party's data root and
``simp.load`` of objects uploaded to a party, with types looked up while tracing."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from tests.op_failures import assert_generic, logged_failure, traced_at


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    dirs = {f"node_{i}": tmp_path / f"r{i}" for i in range(3)}
    for d in dirs.values():
        d.mkdir()
    np.save(dirs["node_0"] / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(dirs["node_1"] / "x.npy", np.full((2, 3), 10, dtype=np.float32))
    np.save(dirs["node_2"] / "x.npy", np.ones(4, dtype=np.float32))
    np.savez(dirs["node_0"] / "t.npz", w=np.array([1.5, 2.5]), b=np.array(7))
    (tmp_path / "secret.npy").write_bytes((dirs["node_0"] / "x.npy").read_bytes())
    return dirs


@pytest.fixture
def sim(roots: dict[str, Path]) -> Iterator[mp.Simulator]:
    simulator = mp.Simulator(3, data_roots=roots, policies="open")  # values fetched to compare
    yield simulator
    simulator.close()


def test_load_from_each_party_s_data_root(sim: mp.Simulator) -> None:
    def prog() -> object:
        x = simp.pcall((0, 1), lambda: tensor.load("x.npy"))
        y = simp.pcall(None, lambda v: v * 2, x)
        w = simp.pcall((0,), lambda: tensor.load("t.npz", "w"))
        return y, w

    y, w = mp.fetch(sim, mp.evaluate(sim, prog))
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(y[0], base * 2)
    np.testing.assert_array_equal(y[1], np.full((2, 3), 20, np.float32))
    assert y[2] is None
    np.testing.assert_array_equal(w[0], [1.5, 2.5])


def test_the_type_comes_from_the_file(sim: mp.Simulator) -> None:
    with sim:
        program = mp.compile(lambda: simp.pcall((0,), lambda: tensor.load("t.npz", "b")),
                             cluster=sim.cluster)
    (out,) = program.graph.outputs
    # the file holds int64; the program takes JAX's canonical int32
    assert str(out.type) == str(mp.MPType(mp.TensorType("int32", ()), mp.Mask.of([0])))
    load_op = program.graph.operations[0].regions[0].operations[0]
    assert load_op.opcode == "tensor.load"
    assert load_op.attrs == {"path": "t.npz", "key": "b", "type": mp.TensorType("int32", ())}


def test_declared_type_needs_no_context_and_is_checked_when_run(sim: mp.Simulator) -> None:
    def declared() -> object:
        return simp.pcall((0,), lambda: tensor.load("x.npy", dtype="float32", shape=(2, 3)))

    program = mp.compile(declared, world_size=3)
    assert program.graph.outputs[0].type == mp.MPType(mp.TensorType("float32", (2, 3)),
                                                      mp.Mask.of([0]))
    with pytest.raises(mp.MPTypeError, match=r"tensor.load: the type of 'x.npy' cannot be "
                                             r"looked up while compiling without a simulator "
                                             r"or driver to ask; pass dtype= and shape="):
        mp.compile(lambda: simp.pcall((0,), lambda: tensor.load("x.npy")), world_size=3)

    def wrong() -> object:
        return simp.pcall((0,), lambda: tensor.load("x.npy", dtype="float32", shape=(6,)))

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, wrong)
    message = str(info.value)
    assert "party 0: tensor.load: 'x.npy' on node_0 is f32[2,3], but the program expects " \
           "f32[6]" in message
    assert re.search(r"test_private_inputs.py:\d+", message)


def test_parties_must_agree_on_the_type(sim: mp.Simulator) -> None:
    with pytest.raises(mp.MPTypeError) as info:
        mp.evaluate(sim, lambda: simp.pcall((0, 2), lambda: tensor.load("x.npy")))
    assert str(info.value).startswith(
        "tensor.load: 'x.npy' has different types on the parties (party 0: f32[2,3], "
        "party 2: f32[4]); every party of one pcall must load the same type")


@pytest.mark.parametrize(("path", "message"), [
    ("../secret.npy", "tensor.load: path '../secret.npy' escapes the data root of node_0"),
    ("/etc/x.npy", "tensor.load: path '/etc/x.npy' is absolute; give a path relative to the "
                   "data root of node_0"),
    ("link.npy", "tensor.load: path 'link.npy' escapes the data root of node_0"),
    ("nope.npy", "tensor.load: node_0 has no file 'nope.npy' in its data root"),
])
def test_bad_paths_are_refused_while_tracing(sim: mp.Simulator, roots: dict[str, Path],
                                             path: str, message: str) -> None:
    (roots["node_0"] / "link.npy").symlink_to(roots["node_0"].parent / "secret.npy")
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: tensor.load(path)))
    assert str(info.value).startswith(message)
    assert re.search(r"\(at test_private_inputs.py:\d+\)$", str(info.value))


def test_bad_paths_are_refused_by_the_worker(sim: mp.Simulator, roots: dict[str, Path]) -> None:
    (roots["node_0"] / "link.npy").symlink_to(roots["node_0"].parent / "secret.npy")

    def prog() -> object:
        return simp.pcall((0,), lambda: tensor.load("link.npy", dtype="float32", shape=(2, 3)))

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog)
    assert "party 0: tensor.load: path 'link.npy' escapes the data root of node_0" \
        in str(info.value)
    assert info.value.party == 0


def test_simp_load_after_upload(sim: mp.Simulator) -> None:
    sim.upload("node_2", "myvec", np.array([1, 2, 3], dtype=np.int32))

    def prog() -> object:
        v = simp.load(2, "myvec")
        return simp.pcall(None, lambda a: a + 1, v)

    out = mp.fetch(sim, mp.evaluate(sim, prog))
    assert out[:2] == [None, None]
    np.testing.assert_array_equal(out[2], [2, 3, 4])
    assert sim.mesh.workers[2].named.uses("myvec") == 1
    mp.evaluate(sim, prog)
    assert sim.mesh.workers[2].named.uses("myvec") == 2


def assert_missing_name_refused(ctx: Any, rank: int, name: str) -> None:
    """``simp.load`` of a name never uploaded to party ``rank`` fails while tracing (type
    looked up) and, with a declared type, when the party runs it."""
    message = f"simp.load: node_{rank} has no uploaded object {name!r}"
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(ctx, lambda: simp.load(rank, name))
    assert str(info.value).startswith(message)
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(ctx, lambda: simp.load(rank, name, dtype="int32", shape=(3,)))
    assert f"party {rank}: {message}" in str(info.value)


def test_simp_load_of_a_missing_name(sim: mp.Simulator) -> None:
    assert_missing_name_refused(sim, 2, "myvec")


def test_simp_load_type_is_checked_and_party_validated(sim: mp.Simulator) -> None:
    sim.upload("node_1", "v", np.zeros(2))
    with pytest.raises(mp.MPRuntimeError, match=r"party 1: simp.load: object 'v' on node_1 is "
                                                r"f32\[2\], but the program expects f32\[3\]"):
        mp.evaluate(sim, lambda: simp.load(1, "v", dtype="float64", shape=(3,)))
    with pytest.raises(mp.MPTypeError, match=r"simp.load: party 5 is not a party of a 3-party"):
        mp.compile(lambda: simp.load(5, "v", dtype="float64", shape=(2,)), world_size=3)


def test_data_roots_must_name_cluster_nodes(tmp_path: Path) -> None:
    with pytest.raises(mp.MPLangError, match=r"data_roots names nodes \['node_9'\]"):
        mp.Simulator(2, data_roots={"node_9": tmp_path})


def test_default_data_root_is_data_slash_node(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "node_1").mkdir(parents=True)
    np.save(tmp_path / "data" / "node_1" / "a.npy", np.array([4, 5], dtype=np.int32))
    simulator = mp.Simulator(2, policies="open")
    try:
        out = mp.fetch(simulator, mp.evaluate(
            simulator, lambda: simp.pcall((1,), lambda: tensor.load("a.npy"))))
    finally:
        simulator.close()
    np.testing.assert_array_equal(out[1], [4, 5])


def test_loaded_data_takes_jax_s_canonical_dtype(sim: mp.Simulator, roots: dict[str, Path],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    np.save(roots["node_0"] / "f64.npy", np.arange(4, dtype=np.float64) / 3)
    np.save(roots["node_0"] / "big.npy", np.array([2**40, 1]))

    def mean() -> object:
        x = simp.pcall((0,), lambda: tensor.load("f64.npy"))
        return x, simp.pcall((0,), lambda v: tensor.run_jax(np.mean, v), x)

    x, m = mp.fetch(sim, mp.evaluate(sim, mean))
    assert x[0].dtype == np.float32  # as JAX runs float64 data without jax_enable_x64
    np.testing.assert_allclose(x[0], np.arange(4) / 3, rtol=1e-6)
    assert m[0] == pytest.approx(0.5)
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: tensor.load("big.npy")))  # @big
    # the values are node_0's data: the driver hears that the load failed, node_0's log why
    at = traced_at(__file__, "big")
    assert_generic(info.value, "tensor.load", at, 0)
    assert logged_failure(caplog, "tensor.load", at, "node_0").startswith(
        "MPRuntimeError: party 0: 'big.npy' on node_0: tensor.load: integer values in "
        "[1, 1099511627776] do not fit int32")


def test_a_device_function_may_load_its_party_s_data(sim: mp.Simulator) -> None:
    def prog() -> object:
        x = mp.device("P0")(lambda: tensor.load("x.npy") * 2)()
        return mp.device("P0")(lambda v: v.sum())(x)

    assert mp.fetch(sim, mp.evaluate(sim, prog)) == 30.0
