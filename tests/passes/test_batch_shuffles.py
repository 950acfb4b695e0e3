"""Batching of shuffles: what merges, where the merged op goes, and one message per
route at run time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.dialects.simp import shuffle_static_p
from mplang.edsl.graph import Graph
from mplang.edsl.typing import TensorType
from mplang.passes import batch_shuffles
from mplang.passes.common import rounds
from mplang.worker.mem import ThreadCommunicator

W = 3
ROUTES = {1: 0, 2: 0}


@pytest.fixture
def messages(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int, Any]]]:
    """Every message the simulator's parties send: (src, dst, value)."""
    sent: list[tuple[int, int, Any]] = []
    original = ThreadCommunicator.send

    def send(self: ThreadCommunicator, dst: int, tag: Any, value: Any) -> None:
        sent.append((self.rank, dst, value))
        original(self, dst, tag, value)

    monkeypatch.setattr(ThreadCommunicator, "send", send)
    yield sent


def three_moves() -> Any:
    a = simp.constant((0,), np.float32(1.5))
    b = simp.constant((0,), np.arange(4, dtype=np.int32))
    c = simp.pcall((0,), lambda v: v * 2, a)
    return (simp.shuffle_static(a, ROUTES), simp.shuffle_static(b, ROUTES),
            simp.shuffle_static(c, ROUTES))


def _shuffles(graph: Graph) -> list[Any]:
    return [op for op in graph.operations if op.opcode == "simp.shuffle_static"]


def test_independent_shuffles_merge_into_one_op() -> None:
    program = mp.compile(three_moves, world_size=W)
    before = _shuffles(program.graph)
    out = batch_shuffles(program.graph)
    out.verify()
    (merged,) = _shuffles(out)
    assert merged.inputs == tuple(op.inputs[0] for op in before)
    assert merged.outputs == tuple(op.outputs[0] for op in before)
    assert merged.attrs == {"routes": ROUTES}
    # the merged op is what the type rule says it is
    types = shuffle_static_p.infer([v.type for v in merged.inputs], dict(merged.attrs), [], W)
    assert types == [v.type for v in merged.outputs]
    assert out.outputs == program.graph.outputs


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_one_message_per_route(messages: list[tuple[int, int, Any]], mode: str) -> None:
    program = mp.compile(three_moves, world_size=W)
    sim = mp.Simulator(W)
    try:
        want = mp.fetch(sim, mp.evaluate(sim, program, mode=mode))
        assert sorted((s, d) for s, d, _ in messages) == [(0, 1)] * 3 + [(0, 2)] * 3
        assert not any(isinstance(v, list) for _, _, v in messages)  # N == 1: bare values
        messages.clear()
        got = mp.fetch(sim, mp.evaluate(sim, mp.optimize(program), mode=mode))
        assert sorted((s, d) for s, d, _ in messages) == [(0, 1), (0, 2)]
        assert all(isinstance(v, list) and len(v) == 3 for _, _, v in messages)
        assert repr(got) == repr(want)
    finally:
        sim.close()


def test_dependent_shuffles_and_other_routes_stay_apart() -> None:
    def prog() -> Any:
        a = simp.constant((0,), np.float32(1.0))
        hop = simp.shuffle_static(a, {1: 0})
        ret = simp.shuffle_static(hop, {0: 1})
        back = simp.shuffle_static(simp.pcall((0,), lambda v: v + 1, ret), {1: 0})  # same routes

        other = simp.shuffle_static(a, {2: 0})       # other routes
        return hop, back, other

    program = mp.compile(prog, world_size=W)
    out = batch_shuffles(program.graph)
    assert len(_shuffles(out)) == 4


def test_shuffles_of_different_rounds_are_not_batched() -> None:
    """Merging them would delay the early one by a round of communication."""
    def prog() -> Any:
        a = simp.constant((1,), np.float32(1.0))
        early = simp.shuffle_static(a, {0: 1})
        x = simp.shuffle_static(simp.constant((0,), np.float32(2.0)), {1: 0})
        late = simp.shuffle_static(simp.pcall((1,), lambda v: v + 1, x), {0: 1})
        return early, late

    program = mp.compile(prog, world_size=W)
    ops = program.graph.operations
    starts = rounds(ops)
    assert [starts[i] for i, op in enumerate(ops) if op.attrs.get("routes") == {0: 1}] == [0, 1]
    assert len(_shuffles(batch_shuffles(program.graph))) == 3


def test_a_value_moved_twice_is_left_to_cse() -> None:
    def prog() -> Any:
        a = simp.constant((0,), np.float32(1.0))
        return simp.shuffle_static(a, {1: 0}), simp.shuffle_static(a, {1: 0})

    program = mp.compile(prog, world_size=W)
    assert len(_shuffles(batch_shuffles(program.graph))) == 2
    optimized = mp.optimize(program)
    assert len(_shuffles(optimized.graph)) == 1


def test_ops_reading_an_earlier_member_move_after_the_merged_op() -> None:
    def prog() -> Any:
        a = simp.constant((0,), np.float32(1.0))
        sa = simp.shuffle_static(a, {1: 0})
        use = simp.pcall((1,), lambda v: v * 3, sa)  # between the two members
        b = simp.constant((0,), np.float32(2.0))
        sb = simp.shuffle_static(b, {1: 0})
        return use, sb

    program = mp.compile(prog, world_size=W)
    out = batch_shuffles(program.graph)
    out.verify()
    assert [op.opcode for op in out.operations] == [
        "simp.constant", "simp.constant", "simp.shuffle_static", "simp.pcall"]
    assert len(out.operations[2].inputs) == 2


def test_effects_keep_their_order_when_ops_move() -> None:
    f32 = TensorType("float32", ())

    def prog() -> Any:
        a = simp.constant((1,), np.float32(1.0))
        b = simp.constant((1,), np.float32(2.0))
        sa = simp.shuffle_static(a, {0: 1})
        e1 = simp.pcall((0,), lambda v: tensor.pyfunc(np.negative, v, out=f32), sa)
        c = simp.constant((2,), np.float32(3.0))
        e2 = simp.pcall((2,), lambda v: tensor.pyfunc(np.negative, v, out=f32), c)
        sb = simp.shuffle_static(b, {0: 1})
        return e1, e2, sb

    program = mp.compile(prog, world_size=W)
    out = batch_shuffles(program.graph)
    out.verify()
    effects = [op for op in out.operations if op.opcode == "simp.pcall"]
    assert effects == [op for op in program.graph.operations if op.opcode == "simp.pcall"]
    order = [op.opcode for op in out.operations]
    assert order.index("simp.shuffle_static") < order.index("simp.pcall")


def test_batching_inside_regions() -> None:
    def prog() -> Any:
        x = simp.constant((0, 1, 2), np.int32(1))
        pred = simp.pcall(None, lambda v: v > 0, x)

        def then_fn(v: Any) -> Any:
            p = simp.pcall((0,), lambda t: t + 1, v)
            q = simp.pcall((0,), lambda t: t + 2, v)
            return simp.shuffle_static(p, {1: 0}), simp.shuffle_static(q, {1: 0})

        def else_fn(v: Any) -> Any:
            p = simp.shuffle_static(v, {1: 0})
            return p, p

        return simp.uniform_cond(pred, then_fn, else_fn, x)

    program = mp.compile(prog, world_size=W)
    out = batch_shuffles(program.graph)
    out.verify()
    then_g = out.operations[-1].regions[0]
    assert len(_shuffles(then_g)) == 1
    sim = mp.Simulator(W)
    try:
        for mode in ("launch", "standard"):
            want = mp.fetch(sim, mp.evaluate(sim, program, mode=mode))
            got = mp.fetch(sim, mp.evaluate(sim, mp.Program(out, program.out_tree, W),
                                            mode=mode))
            assert repr(got) == repr(want)
    finally:
        sim.close()
