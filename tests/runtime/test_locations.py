"""Errors that say where: the user's source line (``test_locations.py:LINE``) that
traced the op travels with the op (``Operation.loc``) through tracing, the
serialized program and execution, and shows in type errors, run-time failures
(with the op's region key) and errors about loaded programs (with the field path
or op index).
"""

from __future__ import annotations

import json
import pathlib
import re
import struct
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor

HERE = pathlib.Path(__file__)
FILE = HERE.name
HEADER = struct.Struct("<8sQ")
F32_3 = jax.ShapeDtypeStruct((3,), jnp.float32)


def line_of(tag: str) -> int:
    """The line of this file ending with the comment ``# @tag``."""
    lines = [i for i, text in enumerate(HERE.read_text().splitlines(), 1)
             if text.rstrip().endswith(f"# @{tag}")]
    assert len(lines) == 1, (tag, lines)
    return lines[0]


def at(tag: str) -> str:
    return f"{FILE}:{line_of(tag)}"




# ---------------------------------------------------------------- programs


def located_prog() -> Any:
    x = simp.constant((0,), np.arange(3, dtype=np.float32))  # @const
    y = simp.pcall((0,), lambda v: tensor.run_jax(jnp.square, v), x)  # @pcall
    return simp.shuffle_static(y, {1: 0})  # @shuffle


LOCATED = {0: "const", 1: "pcall", 2: "shuffle"}
"""Op index of `located_prog` -> the tag of the line that traced it."""


def explode(a: np.ndarray) -> np.ndarray:
    raise ValueError("host exploded")


def failing_prog() -> Any:
    x = simp.constant((0, 1), np.arange(3, dtype=np.float32))
    return simp.pcall((1,), lambda v: tensor.pyfunc(explode, v, out=F32_3), x)  # @pyfunc


def failing_branch_prog() -> Any:
    flag = simp.constant((0, 1, 2), True)
    x = simp.constant((0, 1), np.arange(3, dtype=np.float32))
    return simp.uniform_cond(
        flag,
        lambda v: simp.pcall((1,), lambda t: tensor.pyfunc(explode, t, out=F32_3), v),  # @branch
        lambda v: simp.pcall((1,), lambda t: t, v),
        x)


def non_uniform_prog() -> Any:
    r = simp.prank()
    return simp.uniform_cond(r < 1, lambda v: v + 1, lambda v: v - 1, r)  # @cond


# ---------------------------------------------------------------- type errors while tracing


def test_type_error_names_the_op_and_the_line() -> None:
    def prog() -> Any:
        x = simp.constant((0,), 1)
        return simp.shuffle_static(x, {1: 2})  # @bad_route

    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(prog, world_size=3)
    message = str(info.value)
    assert message.startswith("simp.shuffle_static: route 1 <- 2 reads from party 2")
    assert message.endswith(f"(at {at('bad_route')})")


def test_type_error_of_an_op_with_a_region_names_its_line() -> None:
    def prog() -> Any:
        x = simp.constant((0,), 1)
        return simp.pcall((1,), lambda v: v + 1, x)  # @bad_pcall

    with pytest.raises(mp.MPTypeError, match=r"^simp\.pcall on parties \{1\}: input 0") as info:
        mp.compile(prog, world_size=3)
    assert str(info.value).endswith(f"(at {at('bad_pcall')})")
    assert str(info.value).count("(at ") == 1  # located once, not once per enclosing call


def test_type_error_inside_a_region_names_the_inner_line() -> None:
    def prog() -> Any:
        flag = simp.constant((0, 1, 2), True)
        x = simp.constant((0, 1, 2), np.float32(1))
        return simp.uniform_cond(flag,
                                 lambda v: simp.shuffle(v, v),  # @bad_index
                                 lambda v: v, x)

    with pytest.raises(mp.MPTypeError, match=r"^simp\.shuffle: the index must be an integer "
                                             r"scalar") as info:
        mp.compile(prog, world_size=3)
    assert str(info.value).endswith(f"(at {at('bad_index')})")


def test_a_jax_trace_failure_names_the_line() -> None:
    """`tensor.run_jax` fails while JAX traces the function (outside the type rule)."""
    def prog() -> Any:
        x = simp.constant((0,), np.ones((2, 3), np.float32))
        return simp.pcall((0,), lambda v: tensor.run_jax(jnp.matmul, v, v), x)  # @matmul

    with pytest.raises(mp.MPTypeError, match=r"^tensor\.run_jax\[matmul\]: JAX could not trace "
                                             r"the function") as info:
        mp.compile(prog, world_size=3)
    assert str(info.value).endswith(f"(at {at('matmul')})")


def test_a_party_local_op_at_the_simp_level_names_the_line() -> None:
    def prog() -> Any:
        return tensor.constant(np.float32(1))  # @simp_level

    with pytest.raises(mp.MPTypeError, match=r"^tensor\.constant is a party-local op") as info:
        mp.compile(prog, world_size=3)
    assert str(info.value).endswith(f"(at {at('simp_level')})")


# ---------------------------------------------------------------- ops keep their location


def test_traced_ops_record_their_line() -> None:
    program = mp.compile(located_prog, world_size=3)
    ops = program.graph.operations
    assert [op.opcode for op in ops] == ["simp.constant", "simp.pcall", "simp.shuffle_static"]
    assert [op.loc for op in ops] == [at(LOCATED[i]) for i in range(3)]
    (inner,) = ops[1].regions[0].operations
    assert (inner.opcode, inner.loc) == ("tensor.run_jax", at("pcall"))


def test_a_loaded_program_keeps_its_locations() -> None:
    program = mp.compile(located_prog, world_size=3)
    data = program.to_bytes()
    doc = _split(data)[1]
    assert [op["loc"] for op in doc["graph"]["ops"]] == [at(LOCATED[i]) for i in range(3)]
    loaded = mp.Program.from_bytes(data)
    assert [op.loc for op in loaded.graph.walk()] == [op.loc for op in program.graph.walk()]
    assert [op.loc for op in loaded.graph.walk()] == [at("const"), at("pcall"), at("pcall"),
                                                     at("shuffle")]
    assert loaded.to_bytes() == data


def test_locations_are_optional_in_a_loaded_program() -> None:
    magic, doc, tail = _split(mp.compile(located_prog, world_size=3).to_bytes())
    for op in _all_ops(doc["graph"]):
        del op["loc"]
    loaded = mp.Program.from_bytes(_join(magic, doc, tail))
    assert [op.loc for op in loaded.graph.walk()] == [None] * 4


def test_program_bytes_carry_no_absolute_source_paths() -> None:
    """Programs go to every party: they name source files by base name only, so the
    same source traced in another checkout gives the same bytes."""
    data = mp.compile(located_prog, world_size=3).to_bytes()
    package = pathlib.Path(mp.__file__).resolve().parent
    for directory in (HERE.resolve().parent, package):
        assert str(directory).encode() not in data, directory


# ---------------------------------------------------------------- failures at run time


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_kernel_failure_names_op_party_key_and_line(sim: mp.Simulator, mode: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, failing_prog, mode=mode)
    err = info.value
    assert not isinstance(err, mp.MPCommunicationError)
    assert (err.op, err.party, err.loc) == ("tensor.pyfunc", 1, at("pyfunc"))
    # program op 1 (the pcall) inside the launcher's op 0, then op 0 of the pcall's region
    assert err.key is not None and err.key.startswith("/0/1/")
    if mode == "launch":
        assert err.key == "/0/1/0"
    # the kernel's text may quote the party's data: it stays in the party's log
    assert str(err) == f"op tensor.pyfunc at {at('pyfunc')} failed on node_1 (party 1; its log " \
                       "has the details)"
    assert err.__cause__ is None and err.__context__ is None
    assert f"party 1: op tensor.pyfunc at {err.key} (defining %" in caplog.text
    assert f"traced at {at('pyfunc')}) failed: ValueError: host exploded" in caplog.text


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_kernel_failure_in_a_branch_names_the_branch_path(sim: mp.Simulator, mode: str) -> None:
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, failing_branch_prog, mode=mode)
    err = info.value
    assert (err.op, err.party, err.loc) == ("tensor.pyfunc", 1, at("branch"))
    # op 2 (uniform_cond), branch 0, its op 0 (pcall), the pcall region's op 0
    assert err.key is not None and err.key.startswith("/0/2/b0/0/")
    if mode == "launch":
        assert err.key == "/0/2/b0/0/0"
    assert str(err) == f"op tensor.pyfunc at {at('branch')} failed on node_1 (party 1; its log " \
                       "has the details)"


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_simp_op_failure_names_key_and_line(sim: mp.Simulator, mode: str) -> None:
    """A failure a simp kernel detects itself (a predicate that is not uniform)."""
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, non_uniform_prog, mode=mode)
    err = info.value
    assert err.op == "simp.uniform_cond"
    assert err.loc == at("cond")
    assert err.key == "/0/2"  # program op 2 (prank, the lifted `<`, the cond)
    if mode == "launch":  # a party's own check, naming no party's predicate
        assert re.fullmatch(rf"party (\d): op simp\.uniform_cond \(traced at "
                            rf"{re.escape(at('cond'))}\): the predicate is not uniform: the "
                            r"parties computed different values \(at /0/2\)", str(err))
    else:  # the driver decides the branch itself
        assert "the predicate is not uniform" in str(err)
        assert f"traced at {at('cond')}" in str(err)


def test_a_loaded_program_fails_at_the_traced_line(sim: mp.Simulator) -> None:
    loaded = mp.Program.from_bytes(mp.compile(failing_prog, world_size=3).to_bytes())
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, loaded)
    assert (info.value.op, info.value.party, info.value.loc) == ("tensor.pyfunc", 1,
                                                                 at("pyfunc"))
    assert f"op tensor.pyfunc at {at('pyfunc')} failed on node_1" in str(info.value)


# ---------------------------------------------------------------- corrupted programs


def _split(data: bytes) -> tuple[bytes, Any, bytes]:
    magic, size = HEADER.unpack_from(data)
    return magic, json.loads(data[HEADER.size:HEADER.size + size]), data[HEADER.size + size:]


def _join(magic: bytes, doc: Any, tail: bytes) -> bytes:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return HEADER.pack(magic, len(text)) + text + tail


def _all_ops(graph: Any) -> Iterator[Any]:
    for op in graph["ops"]:
        yield op
        for region in op["regions"]:
            yield from _all_ops(region)


def _mutated(change: Callable[[Any], None]) -> bytes:
    magic, doc, tail = _split(mp.compile(located_prog, world_size=3).to_bytes())
    change(doc["graph"])
    return _join(magic, doc, tail)


def test_the_helpers_rebuild_valid_bytes() -> None:
    data = mp.compile(located_prog, world_size=3).to_bytes()
    assert _join(*_split(data)) == data
    assert mp.Program.from_bytes(_mutated(lambda g: None)).to_bytes() == data


def _set(path: list[Any], value: Any) -> Callable[[Any], None]:
    def change(graph: Any) -> None:
        node = graph
        for step in path[:-1]:
            node = node[step]
        node[path[-1]] = value

    return change


MP_I32_3 = {"mp": [{"tensor": ["int32", [3]]}, 2]}


@pytest.mark.parametrize("change, message", [
    (_set(["ops", 0, "out", 0, 1], {"bogus": 1}),
     r"graph\.ops\[0\]\.out\[0\]\.type: unknown type tag 'bogus'"),
    (_set(["ops", 0, "out", 0, 1, "mp", 1], -1),
     r"graph\.ops\[0\]\.out\[0\]\.type\.mp\[1\]: bad pmask"),
    (_set(["ops", 0, "out", 0, 1, "mp", 0], {"tensor": ["float32", "3"]}),
     r"graph\.ops\[0\]\.out\[0\]\.type\.mp\[0\]\.tensor: ValueError: shape must be a list"),
    (_set(["ops", 1, "regions", 0, "ops", 0, "out", 0, 1], {"tensor": ["float99", [3]]}),
     r"graph\.ops\[1\]\.regions\[0\]\.ops\[0\]\.out\[0\]\.type\.tensor: .*float99"),
    (_set(["ops", 1, "regions", 0, "inputs", 0, 1], {"tensor": "f32"}),
     r"graph\.ops\[1\]\.regions\[0\]\.inputs\[0\]\.type\.tensor"),
    (_set(["ops", 0, "attrs", "parties"], {"$mask": -3}),
     r"graph\.ops\[0\]\.attrs\.parties\.\$mask: a mask is a non-negative int"),
    (_set(["ops", 2, "attrs", "routes"], {"$dict": [[1]]}),
     r"graph\.ops\[2\]\.attrs\.routes\.\$dict: expected \[key, value\] pairs"),
    (_set(["ops", 0, "op"], "simp.nope"), r"graph\.ops\[0\]\.op: unknown op 'simp\.nope'"),
    (_set(["ops", 2, "in", 0], "zz"), r"graph\.ops\[2\]\.in\[0\]: %zz is not defined"),
    (_set(["ops", 0, "loc"], 7), r"graph\.ops\[0\]\.loc"),
    (_set(["outputs", 0], "nowhere"), r"graph\.outputs\[0\]: %nowhere is not defined"),
], ids=["type-tag", "pmask", "tensor-body", "region-op-type", "region-input", "attr-mask",
        "attr-dict", "unknown-op", "undefined-input", "loc", "output"])
def test_corrupted_program_names_the_field_path(change: Callable[[Any], None],
                                                message: str) -> None:
    with pytest.raises(mp.MPSerializationError, match=rf"^malformed program: {message}"):
        mp.Program.from_bytes(_mutated(change))


# ---------------------------------------------------------------- ill-typed loaded programs


def test_ill_typed_op_names_its_index_and_line() -> None:
    data = _mutated(_set(["ops", 2, "out", 0, 1], MP_I32_3))
    with pytest.raises(mp.MPSerializationError) as info:
        mp.Program.from_bytes(data)
    assert str(info.value) == (
        f"invalid program: graph: op #2 simp.shuffle_static (traced at {at('shuffle')}): "
        "outputs are typed (i32[3]@{1}) but its type rule gives (f32[3]@{1})")


def test_ill_typed_region_op_names_its_path_and_line() -> None:
    data = _mutated(_set(["ops", 1, "regions", 0, "ops", 0, "out", 0, 1],
                         {"tensor": ["int32", [3]]}))
    with pytest.raises(mp.MPSerializationError) as info:
        mp.Program.from_bytes(data)
    message = str(info.value)
    assert message.startswith("invalid program: graph: op #1 region 0: op #0 tensor.run_jax "
                              f"(traced at {at('pcall')}): outputs are typed (i32[3])")


def test_type_rule_failure_of_a_loaded_op_names_its_index_and_line() -> None:
    data = _mutated(_set(["ops", 2, "attrs", "routes"], {"$dict": [[7, 0]]}))
    with pytest.raises(mp.MPSerializationError,
                       match=rf"^invalid program: graph: op #2 simp\.shuffle_static \(traced at "
                             rf"{FILE}:{line_of('shuffle')}\): simp\.shuffle_static: "
                             r"destination 7 is not a party of a 3-party world"):
        mp.Program.from_bytes(data)


def test_malformed_attributes_of_a_loaded_op_name_its_index_and_line() -> None:
    def drop_routes(graph: Any) -> None:
        del graph["ops"][2]["attrs"]["routes"]

    with pytest.raises(mp.MPSerializationError,
                       match=rf"^invalid program: graph: op #2 simp\.shuffle_static \(traced at "
                             rf"{FILE}:{line_of('shuffle')}\): attributes do not match the "
                             r"declaration \(missing \['routes'\], unknown \[\]\)"):
        mp.Program.from_bytes(_mutated(drop_routes))
