"""``simp.shuffle_static`` with N inputs / N outputs: its type rule, its worker kernel
and the ``list`` kind of the wire format that carries the batched message."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.dialects.simp import shuffle_static_p
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.pytree import tree_flatten
from mplang.edsl.typing import Mask, MPType, TensorType
from mplang.kernels.spu.run import SpuShare
from mplang.transport.wire import MAGIC, decode_value, encode_value, encode_value_bytes

W = 3
I32 = TensorType("int32", ())
F32x2 = TensorType("float32", (2,))


def _infer(types: list[Any], routes: dict[int, int]) -> list[Any]:
    return shuffle_static_p.infer(types, {"routes": routes}, [], W)


# ---------------------------------------------------------------- type rule


def test_output_i_is_input_i_held_by_the_destinations() -> None:
    ins = [MPType(I32, Mask.of([0])), MPType(F32x2, Mask.of([0, 2])), MPType(I32, None)]
    outs = _infer(ins, {1: 0, 2: 0})
    assert outs == [MPType(I32, Mask.of([1, 2])), MPType(F32x2, Mask.of([1, 2])),
                    MPType(I32, Mask.of([1, 2]))]


def test_every_input_is_checked_and_named() -> None:
    ins = [MPType(I32, Mask.of([0])), MPType(I32, Mask.of([1]))]
    with pytest.raises(mp.MPTypeError, match=r"route 2 <- 0 .* but value 1 \(i32\[\]@\{1\}\) "
                                             r"is held only by \{1\}"):
        _infer(ins, {2: 0})
    with pytest.raises(mp.MPTypeError, match=r"operand values\[1\] must be a simp-level value, "
                                             r"got i32\[\]"):
        _infer([MPType(I32, Mask.of([0])), I32], {1: 0})
    with pytest.raises(mp.MPTypeError, match="needs at least one value"):
        _infer([], {1: 0})


def test_one_input_keeps_its_messages() -> None:
    with pytest.raises(mp.MPTypeError, match=r"but the value \(i32\[\]@\{1\}\) is held only"):
        _infer([MPType(I32, Mask.of([1]))], {2: 0})
    with pytest.raises(mp.MPTypeError, match=r"simp\.shuffle_static: operand values\[0\] must "
                                             r"be a simp-level value"):
        _infer([I32], {1: 0})


def test_public_signature_is_unchanged() -> None:
    def prog() -> Any:
        return simp.shuffle_static(simp.constant((0,), np.int32(4)), {1: 0, 2: 0})

    op = mp.compile(prog, world_size=W).graph.operations[-1]
    assert len(op.inputs) == len(op.outputs) == 1


# ---------------------------------------------------------------- kernel


def _program(n: int, routes: dict[int, int], holders: list[list[int]]) -> mp.Program:
    """Constants held by ``holders[i]`` (types claim party 0 holds them all), moved by one
    N-input shuffle; hand-built, so a party can be made to lack a value at run time."""
    ops, values = [], []
    for i in range(n):
        v = Value(f"c{i}", MPType(I32, Mask.of([0])))
        ops.append(Operation("simp.constant", (), (v,), {
            "parties": Mask.of(holders[i]), "value": np.asarray(np.int32(10 + i))}))
        values.append(v)
    types = _infer([v.type for v in values], routes)
    outs = tuple(Value(f"s{i}", t) for i, t in enumerate(types))
    ops.append(Operation("simp.shuffle_static", tuple(values), outs, {"routes": routes}))
    graph = Graph([], ops, list(outs))
    graph.verify()
    _, tree = tree_flatten(tuple(range(n)))
    return mp.Program(graph, tree, W)


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_kernel_moves_every_value(sim: mp.Simulator, mode: str) -> None:
    program = _program(3, {1: 0, 2: 0, 0: 0}, [[0]] * 3)
    got = mp.fetch(sim, mp.evaluate(sim, program, mode=mode))
    assert [[None if v is None else int(v) for v in x] for x in got] == \
        [[10, 10, 10], [11, 11, 11], [12, 12, 12]]


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_a_missing_value_is_named(sim: mp.Simulator, mode: str) -> None:
    program = _program(3, {1: 0}, [[0], [0], [1]])
    with pytest.raises(mp.MPRuntimeError, match=r"party 0: op simp\.shuffle_static: must send "
                                                r"to party 1 value 2, which it does not hold"):
        mp.evaluate(sim, program, mode=mode)
    keep = _program(2, {0: 0}, [[0], [1]])
    with pytest.raises(mp.MPRuntimeError, match="must keep value 1, which it does not hold"):
        mp.evaluate(sim, keep, mode=mode)


# ---------------------------------------------------------------- wire format


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and \
            a.tobytes() == b.tobytes()
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("value", [
    [],
    [np.int32(3)],
    [np.arange(6, dtype=np.float64).reshape(2, 3), None, 7, 2.5, True, b"\x00raw",
     np.array([], dtype=np.uint8), np.array([True, False])],
])
def test_lists_round_trip(value: list[Any]) -> None:
    decoded = decode_value(encode_value_bytes(value))
    expected = [np.asarray(v) if isinstance(v, np.generic) else v for v in value]
    assert _same(decoded, expected)


def test_a_list_of_shares_round_trips() -> None:
    import spu.libspu as libspu

    from mplang.dialects.spu import SpuConfig, io_for

    config = SpuConfig("SP0", (0, 1), "SEMI2K", "FM64")
    shares = io_for(config).make_shares(np.arange(3, dtype=np.int32),
                                        libspu.Visibility.VIS_SECRET)
    decoded = decode_value(encode_value_bytes([SpuShare(s) for s in shares]))
    assert len(decoded) == 2 and all(isinstance(d, SpuShare) for d in decoded)
    from mplang.dialects.spu import reconstruct
    assert reconstruct(config, [d.to_libspu() for d in decoded],
                       TensorType("int32", (3,))).tolist() == [0, 1, 2]


def test_list_elements_are_sent_without_copies() -> None:
    big = np.arange(1 << 16, dtype=np.float32)
    parts = encode_value([big, big])
    assert sum(isinstance(p, memoryview) for p in parts) == 2


def _frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<4sI", MAGIC, len(text)) + text + payload


def test_lists_do_not_nest() -> None:
    with pytest.raises(mp.MPSerializationError, match="lists do not nest"):
        encode_value([[1]])
    inner = _frame({"kind": "list", "sizes": []})
    with pytest.raises(mp.MPSerializationError, match="a list inside a list"):
        decode_value(_frame({"kind": "list", "sizes": [len(inner)]}, inner))


@pytest.mark.parametrize("header,payload", [
    ({"kind": "list"}, b""),                                       # no sizes
    ({"kind": "list", "sizes": 3}, b"abc"),                        # not a list
    ({"kind": "list", "sizes": [-1]}, b""),                        # negative
    ({"kind": "list", "sizes": [1.5]}, b"ab"),                     # not an int
    ({"kind": "list", "sizes": [True]}, b"a"),                     # bool is not a size
    ({"kind": "list", "sizes": [4]}, b"abc"),                      # sizes exceed payload
    ({"kind": "list", "sizes": [1]}, b"abc"),                      # payload left over
    ({"kind": "list", "sizes": [3]}, b"abc"),                      # element is no frame
])
def test_malformed_lists_are_refused(header: dict[str, Any], payload: bytes) -> None:
    with pytest.raises(mp.MPSerializationError, match="malformed value"):
        decode_value(_frame(header, payload))


def test_a_malformed_element_is_refused() -> None:
    bad = _frame({"kind": "array", "dtype": "object", "shape": []})
    with pytest.raises(mp.MPSerializationError, match="array dtype"):
        decode_value(_frame({"kind": "list", "sizes": [len(bad)]}, bad))
