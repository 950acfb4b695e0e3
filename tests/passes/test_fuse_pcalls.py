"""Fusion of adjacent same-party pcalls: wiring, chains, what is left alone, the
round guard, clashing region values, effects in order."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.typing import TensorType
from mplang.passes import fuse_pcalls

W = 3


def f(v: Any) -> Any:
    return v * 2


def g(a: Any, b: Any) -> Any:
    return a - b


def h(v: Any) -> Any:
    return jnp.sin(v)


def _same_results(program: mp.Program, graph: Graph) -> None:
    sim = mp.Simulator(W)
    try:
        other = mp.Program(graph, program.out_tree, W)
        for mode in ("launch", "standard"):
            want = mp.fetch(sim, mp.evaluate(sim, program, mode=mode))
            got = mp.fetch(sim, mp.evaluate(sim, other, mode=mode))
            assert repr(got) == repr(want)
    finally:
        sim.close()


def test_a_chain_becomes_one_pcall_with_wired_body() -> None:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        y = simp.constant((0,), np.float32(0.5))
        a = simp.pcall((0,), f, x)
        b = simp.pcall((0,), g, a, y)    # a from the first op, y new
        c = simp.pcall((0,), h, b)
        return c, a

    program = mp.compile(prog, world_size=W)
    ops = program.graph.operations
    out = fuse_pcalls(program.graph)
    out.verify()
    assert len(out.operations) == 3
    fused = out.operations[2]
    assert fused.attrs["fn"] == "f+g+h"
    assert fused.attrs["parties"] == ops[2].attrs["parties"]
    # the same output values, first op's first: nothing downstream changes
    assert fused.outputs == ops[2].outputs + ops[3].outputs + ops[4].outputs
    # the first op's outputs are wired inside; only x and y come from outside
    assert fused.inputs == (ops[0].outputs[0], ops[1].outputs[0])
    body = fused.regions[0]
    assert len(body.inputs) == 2
    assert [op.attrs["fn"] for op in body.operations] == ["multiply", "subtract", "h"]
    mul, sub, sin = body.operations
    assert sub.inputs[0] is mul.outputs[0] and sin.inputs[0] is sub.outputs[0]
    assert body.outputs == [mul.outputs[0], sub.outputs[0], sin.outputs[0]]
    _same_results(program, out)


def test_a_shared_outer_input_becomes_one_region_input() -> None:
    def prog() -> Any:
        x = simp.constant((1,), np.int32(3))
        return simp.pcall((1,), f, x), simp.pcall((1,), lambda v: v + 1, x)

    program = mp.compile(prog, world_size=W)
    out = fuse_pcalls(program.graph)
    fused = out.operations[1]
    assert len(fused.inputs) == 1 and len(fused.regions[0].inputs) == 1
    _same_results(program, out)


@pytest.mark.parametrize("second_parties", [None, (1,), (0, 1)])
def test_other_parties_or_unknown_parties_are_not_fused(second_parties: Any) -> None:
    def prog() -> Any:
        x = simp.constant((0, 1), np.float32(2.0))
        return simp.pcall((0,), f, x), simp.pcall(second_parties, h, x)

    program = mp.compile(prog, world_size=W)
    assert len(fuse_pcalls(program.graph).operations) == 3


def test_only_adjacent_pcalls_fuse() -> None:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        a = simp.pcall((0,), f, x)
        y = simp.constant((1,), np.float32(1.0))     # in between
        return simp.pcall((0,), h, a), y

    program = mp.compile(prog, world_size=W)
    assert sum(op.opcode == "simp.pcall" for op in fuse_pcalls(program.graph).operations) == 2


def _round_guard_program(a_used_elsewhere: bool) -> Any:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        z = simp.constant((1,), np.float32(5.0))
        late = simp.shuffle_static(z, {0: 1})        # a message party 0 must wait for
        a = simp.pcall((0,), f, x)                   # round 0
        b = simp.pcall((0,), g, a, late)             # round 1
        if a_used_elsewhere:
            return b, simp.shuffle_static(a, {2: 0})  # would wait for `late` if fused
        return b

    return prog


def test_fusion_never_makes_an_op_wait_for_a_later_round() -> None:
    program = mp.compile(_round_guard_program(True), world_size=W)
    out = fuse_pcalls(program.graph)
    assert sum(op.opcode == "simp.pcall" for op in out.operations) == 2


def test_fusion_across_rounds_when_nobody_else_waits() -> None:
    program = mp.compile(_round_guard_program(False), world_size=W)
    out = fuse_pcalls(program.graph)
    assert sum(op.opcode == "simp.pcall" for op in out.operations) == 1
    _same_results(program, out)


def test_pcalls_inside_regions_fuse() -> None:
    def prog() -> Any:
        i0 = simp.constant((0, 1, 2), np.int32(0))
        acc0 = simp.constant((2,), np.float32(1.0))

        def body(s: Any) -> Any:
            i, acc = s
            i1 = simp.pcall(None, lambda n: n + 1, i)
            a = simp.pcall((2,), f, acc)
            return i1, simp.pcall((2,), g, a, acc)

        return simp.while_loop(lambda s: simp.pcall(None, lambda n: n < 3, s[0]), body,
                               (i0, acc0))

    program = mp.compile(prog, world_size=W)
    out = fuse_pcalls(program.graph)
    out.verify()
    body = out.operations[-1].regions[1]
    assert sum(op.opcode == "simp.pcall" for op in body.operations) == 2
    _same_results(program, out)


def test_bodies_sharing_values_get_fresh_ones() -> None:
    """Two pcalls with the very same region object (or clashing value names) fuse into
    a region whose values are all distinct, which serialization needs."""
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        return simp.pcall((0,), f, x)

    program = mp.compile(prog, world_size=W)
    const, call = program.graph.operations
    body = call.regions[0]
    again = call.replace(inputs=call.outputs, outputs=tuple(
        type(v)(v.name + "b", v.type) for v in call.outputs))
    graph = Graph([], [const, call, again], [again.outputs[0]])
    graph.verify()
    assert again.regions[0] is body
    out = fuse_pcalls(graph)
    out.verify()
    (fused,) = out.operations[1:]
    names = [v.name for v in fused.regions[0].inputs] + \
        [v.name for op in fused.regions[0].operations for v in op.outputs]
    assert len(names) == len(set(names))
    loaded = mp.Program.from_bytes(mp.Program(out, program.out_tree, W).to_bytes())
    loaded.graph.verify()
    sim = mp.Simulator(W)
    try:
        for p in (mp.Program(graph, program.out_tree, W), loaded):
            assert float(mp.fetch(sim, mp.evaluate(sim, p))[0]) == 8.0
    finally:
        sim.close()


EVENTS: list[str] = []


def first(v: np.ndarray) -> np.ndarray:
    EVENTS.append("first")
    return np.asarray(v, dtype=np.float32)


def second(v: np.ndarray) -> np.ndarray:
    EVENTS.append("second")
    return np.asarray(v, dtype=np.float32)


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_effects_keep_their_order_in_the_fused_body(mode: str) -> None:
    f32 = TensorType("float32", ())

    def prog() -> Any:
        x = simp.constant((0,), np.float32(1.0))
        a = simp.pcall((0,), lambda v: tensor.pyfunc(first, v, out=f32), x)
        return simp.pcall((0,), lambda v: tensor.pyfunc(second, v, out=f32), x), a

    program = mp.compile(prog, world_size=W)
    fused = fuse_pcalls(program.graph)
    assert [op.opcode for op in fused.operations] == ["simp.constant", "simp.pcall"]
    sim = mp.Simulator(W)
    try:
        EVENTS.clear()
        mp.evaluate(sim, mp.Program(fused, program.out_tree, W), mode=mode)
        assert EVENTS == ["first", "second"]
    finally:
        sim.close()


def test_non_pcall_ops_are_untouched() -> None:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(2.0))
        return simp.shuffle_static(simp.pcall((0,), f, x), {1: 0})

    program = mp.compile(prog, world_size=W)
    out = fuse_pcalls(program.graph)
    assert all(a is b for a, b in zip(out.operations, program.graph.operations, strict=True))
    assert isinstance(out.operations[0], Operation)
