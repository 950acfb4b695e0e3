"""Dead-code elimination: what goes, what stays (effects, region signatures)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.passes import eliminate_dead_code
from tests.passes import programs

W = programs.WORLD


def test_dead_ops_go_transitively_and_used_ones_stay() -> None:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(1.0))
        a = simp.pcall((0,), jnp.exp, x)
        b = simp.shuffle_static(a, {1: 0})             # a, b, c: a dead chain
        simp.pcall((1,), jnp.sin, b)
        return simp.pcall((0,), jnp.cos, x)

    program = mp.compile(prog, world_size=W)
    out = eliminate_dead_code(program.graph)
    out.verify()
    assert [op.opcode for op in out.operations] == ["simp.constant", "simp.pcall"]
    assert out.operations[1] is program.graph.operations[-1]  # a live op is kept as it is
    assert out.outputs == program.graph.outputs


def test_regions_are_cleaned_but_keep_their_signature() -> None:
    def prog() -> Any:
        x = simp.constant((0, 1, 2), np.int32(2))
        pred = simp.pcall(None, lambda v: v > 1, x)

        def body(v: Any) -> Any:
            tensor.run_jax(jnp.negative, v)            # dead, inside a pcall body
            return v + 1, v * 2                        # the second output is never used

        def then_fn(v: Any) -> Any:
            simp.pcall((0,), jnp.exp, v)               # dead, inside a branch
            return simp.pcall((0,), body, v)[0]

        def else_fn(v: Any) -> Any:
            return simp.pcall((0,), lambda t: t - 1, v)

        return simp.uniform_cond(pred, then_fn, else_fn, x)

    program = mp.compile(prog, world_size=W)
    out = eliminate_dead_code(program.graph)
    out.verify()
    cond = out.operations[-1]
    before = program.graph.operations[-1]
    assert cond.opcode == "simp.uniform_cond"
    for new, old in zip(cond.regions, before.regions, strict=True):
        assert new.inputs == old.inputs and new.outputs == old.outputs
    then_ops = cond.regions[0].operations
    assert [op.opcode for op in then_ops] == ["simp.pcall"]
    pcall = then_ops[0]
    assert len(pcall.outputs) == 2, "a pcall keeps its outputs, used or not"
    assert [op.attrs["fn"] for op in pcall.regions[0].operations] == ["add", "multiply"]
    assert programs.op_counts(program.graph)["tensor.run_jax"] - \
        programs.op_counts(out)["tensor.run_jax"] == 2


def test_loop_body_and_condition_are_cleaned() -> None:
    def prog() -> Any:
        i0 = simp.constant((0, 1, 2), np.int32(0))

        def cond(i: Any) -> Any:
            simp.pcall(None, lambda n: n * 7, i)       # dead
            return simp.pcall(None, lambda n: n < 4, i)

        def body(i: Any) -> Any:
            simp.shuffle_static(i, {0: 1})             # dead communication
            return simp.pcall(None, lambda n: n + 1, i)

        return simp.while_loop(cond, body, i0)

    program = mp.compile(prog, world_size=W)
    out = eliminate_dead_code(program.graph)
    out.verify()
    loop = out.operations[-1]
    assert [len(r.operations) for r in loop.regions] == [1, 1]
    sim = mp.Simulator(W)
    try:
        for mode in ("launch", "standard"):
            optimized = mp.Program(out, program.out_tree, W)
            assert programs.run(sim, optimized, [], mode) == programs.run(sim, program, [], mode)
    finally:
        sim.close()


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_side_effects_stay_even_when_unused(mode: str) -> None:
    program = mp.compile(programs.effects, world_size=W)
    out = eliminate_dead_code(program.graph)
    assert programs.op_counts(out)["tensor.pyfunc"] == 3
    sim = mp.Simulator(W)
    try:
        programs.CALLS.clear()
        before = programs.run(sim, program, [], mode)
        calls_before = sorted(programs.CALLS)
        programs.CALLS.clear()
        after = programs.run(sim, mp.optimize(program), [], mode)
        assert after == before
        assert sorted(programs.CALLS) == calls_before
        assert len(calls_before) == 4  # 2 parties of the unused call, twice on party 0
    finally:
        sim.close()


def test_a_program_without_dead_code_is_unchanged() -> None:
    program = mp.compile(programs.pcall_chains, world_size=W)
    out = eliminate_dead_code(program.graph)
    assert out is not program.graph
    assert [id(op) for op in out.operations] == [id(op) for op in program.graph.operations]


def test_effects_deep_inside_regions_keep_their_ops() -> None:
    """An unused cond whose branch calls a host function stays, and so does that call."""
    def prog() -> Any:
        x = simp.constant((0, 1, 2), np.float32(1.0))
        pred = simp.pcall(None, lambda v: v > 0, x)

        def then_fn(v: Any) -> Any:
            simp.pcall((0,), lambda t: tensor.pyfunc(programs.record, t, out=programs.F32), v)
            return v

        simp.uniform_cond(pred, then_fn, lambda v: v, x)
        return pred

    program = mp.compile(prog, world_size=W)
    out = eliminate_dead_code(program.graph)
    assert [op.opcode for op in out.operations] == \
        ["simp.constant", "simp.pcall", "simp.uniform_cond"]
    assert programs.op_counts(out)["tensor.pyfunc"] == 1
