"""Common-subexpression elimination: deep attribute equality, equivalent regions,
what is merged and what must not be."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.typing import Mask, MPType, TensorType
from mplang.passes import eliminate_common_subexpressions
from mplang.passes.common import attr_equal, attrs_equal, graphs_equivalent

W = 3


def double(v: Any) -> Any:
    return v * 2


# ---------------------------------------------------------------- attribute equality


@pytest.mark.parametrize(("a", "b"), [
    (np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32)),
    (np.float32(np.nan), np.float32(np.nan)),
    (np.array(np.nan), np.array(np.nan)),
    (b"\x00\x01", b"\x00\x01"),
    ({1: 0, 2: 0}, {2: 0, 1: 0}),
    ((1, (2.5, "x")), (1, (2.5, "x"))),
    (Mask.of([0, 2]), Mask.of([2, 0])),
    (TensorType("int32", (2,)), TensorType("int32", (2,))),
    (float("nan"), float("nan")),
    (None, None),
])
def test_equal_attributes(a: Any, b: Any) -> None:
    assert attr_equal(a, b)
    assert attrs_equal({"k": a}, {"k": b})


@pytest.mark.parametrize(("a", "b"), [
    (np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int64)),   # dtype
    (np.arange(4, dtype=np.int32), np.arange(4, dtype=np.int32).reshape(2, 2)),  # shape
    (np.float32(0.0), np.float32(-0.0)),                             # bytes
    (np.array([1, 2], dtype=np.int32), np.array([1, 3], dtype=np.int32)),
    (0.0, -0.0),
    (True, 1),
    (1, 1.0),
    ({1: 0}, {True: 0}),
    ({1: 0}, {1: 0, 2: 0}),
    ((1, 2), [1, 2]),
    ((1, 2), (1, 2, 3)),
    (b"a", "a"),
    (Mask.of([0]), Mask.of([1])),
    (TensorType("int32", ()), TensorType("float32", ())),
    (None, 0),
])
def test_different_attributes(a: Any, b: Any) -> None:
    assert not attr_equal(a, b)
    assert not attrs_equal({"k": a}, {"k": b})


def test_attribute_dicts_must_have_the_same_keys() -> None:
    assert not attrs_equal({"a": 1}, {"a": 1, "b": 2})
    assert attrs_equal({"a": 1, "b": 2}, {"b": 2, "a": 1})


# ---------------------------------------------------------------- region equivalence


def _pcalls(fn_a: Any, fn_b: Any) -> tuple[Operation, Operation]:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        return simp.pcall((0,), fn_a, x), simp.pcall((0,), fn_b, x)

    graph = mp.compile(prog, world_size=W).graph
    return graph.operations[1], graph.operations[2]


def test_separately_traced_identical_bodies_are_equivalent() -> None:
    a, b = _pcalls(double, double)
    assert a.regions[0] is not b.regions[0]
    assert graphs_equivalent(a.regions[0], b.regions[0])
    other_a, other_b = _pcalls(double, jnp.sin)
    assert not graphs_equivalent(other_a.regions[0], other_b.regions[0])


def test_equivalence_follows_the_wiring_not_the_names() -> None:
    t = TensorType("float32", ())

    def body(swap: bool) -> Graph:
        x, y = Value("x", t), Value("y", t)
        out = Value("o", t)
        args = (y, x) if swap else (x, y)
        module = _sub_module()
        op = Operation("tensor.run_jax", args, (out,), {"fn": "subtract", "module": module})
        return Graph([x, y], [op], [out])

    assert graphs_equivalent(body(False), body(False))
    assert not graphs_equivalent(body(False), body(True))


def _sub_module() -> bytes:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(1.0))
        return simp.pcall((0,), lambda a, b: a - b, x, x)

    body = mp.compile(prog, world_size=W).graph.operations[1].regions[0]
    module: bytes = body.operations[0].attrs["module"]
    return module


# ---------------------------------------------------------------- the pass


def test_identical_pcalls_merge_and_later_uses_follow() -> None:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        a = simp.pcall((0,), double, x)
        b = simp.pcall((0,), double, x)
        c = simp.pcall((0,), lambda p, q: p - q, a, b)
        return c, b

    program = mp.compile(prog, world_size=W)
    g = program.graph
    out = eliminate_common_subexpressions(g)
    out.verify()
    a, b = g.operations[1], g.operations[2]
    assert [op.opcode for op in out.operations] == ["simp.constant", "simp.pcall", "simp.pcall"]
    assert out.operations[1] is a
    assert out.operations[2].inputs == (a.outputs[0], a.outputs[0])
    assert out.outputs[1] is a.outputs[0] and g.outputs[1] is b.outputs[0]


def test_pcalls_on_other_parties_or_other_bodies_stay() -> None:
    def prog() -> Any:
        x = simp.constant((0, 1), np.float32(2.0))
        return (simp.pcall((0,), double, x), simp.pcall((1,), double, x),
                simp.pcall((0,), jnp.sin, x), simp.pcall((0, 1), double, x))

    program = mp.compile(prog, world_size=W)
    out = eliminate_common_subexpressions(program.graph)
    assert len(out.operations) == len(program.graph.operations)


def test_duplicates_inside_a_body_merge() -> None:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        return simp.pcall((0,), lambda v: double(v) + double(v), x)

    program = mp.compile(prog, world_size=W)
    body = eliminate_common_subexpressions(program.graph).operations[1].regions[0]
    assert [op.attrs["fn"] for op in body.operations] == ["multiply", "add"]
    assert body.operations[1].inputs == (body.operations[0].outputs[0],) * 2


def test_region_operands_are_rewritten() -> None:
    def prog() -> Any:
        x = simp.constant((0, 1, 2), np.int32(1))
        y = simp.constant((0, 1, 2), np.int32(1))          # the same constant
        return simp.while_loop(lambda s: simp.pcall(None, lambda n: n < 5, s[0]),
                               lambda s: (s[0] + s[1], s[1]), (x, y))

    program = mp.compile(prog, world_size=W)
    out = eliminate_common_subexpressions(program.graph)
    out.verify()
    loop = out.operations[-1]
    assert loop.inputs == (out.operations[0].outputs[0],) * 2


def test_effects_are_never_merged() -> None:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        f32 = TensorType("float32", ())
        a = simp.pcall((0,), lambda v: tensor.pyfunc(np.negative, v, out=f32), x)
        b = simp.pcall((0,), lambda v: tensor.pyfunc(np.negative, v, out=f32), x)
        return a, b

    program = mp.compile(prog, world_size=W)
    out = eliminate_common_subexpressions(program.graph)
    assert len(out.operations) == 3


def test_constants_that_differ_in_sign_of_zero_stay_apart() -> None:
    """Merging 0.0 and -0.0 would change 1/x from inf to -inf."""
    def prog() -> Any:
        p = simp.constant((0,), np.float32(0.0))
        n = simp.constant((0,), np.float32(-0.0))
        return simp.pcall((0,), lambda a: 1.0 / a, p), simp.pcall((0,), lambda a: 1.0 / a, n)

    program = mp.compile(prog, world_size=W)
    out = eliminate_common_subexpressions(program.graph)
    assert sum(op.opcode == "simp.constant" for op in out.operations) == 2
    sim = mp.Simulator(W)
    try:
        got = mp.fetch(sim, mp.evaluate(sim, mp.Program(out, program.out_tree, W)))
        assert float(got[0][0]) == float("inf") and float(got[1][0]) == float("-inf")
    finally:
        sim.close()


def test_hand_built_ops_with_different_output_types_stay() -> None:
    """Same opcode, inputs and attributes but other declared types: not merged."""
    t32 = MPType(TensorType("int32", ()), Mask.of([0]))
    t32b = MPType(TensorType("int32", ()), Mask.of([0, 1]))
    attrs = {"parties": Mask.of([0]), "value": np.asarray(np.int32(1))}
    a = Operation("simp.constant", (), (Value("a", t32),), attrs)
    b = Operation("simp.constant", (), (Value("b", t32b),), dict(attrs))
    c = Operation("simp.constant", (), (Value("c", t32),), dict(attrs))
    g = Graph([], [a, b, c], [a.outputs[0], b.outputs[0], c.outputs[0]])
    out = eliminate_common_subexpressions(g)
    assert out.operations == [a, b]
    assert out.outputs == [a.outputs[0], b.outputs[0], a.outputs[0]]
