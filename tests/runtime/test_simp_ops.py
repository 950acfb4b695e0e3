"""Run-time semantics of the simp primitives, against plain Python references.

Every test runs in both execution modes (``launch``: every party runs the whole
graph; ``standard``: the driver dispatches op by op); the core primitives also
run on worlds of 2, 3, 10 and 32 parties (the ``world`` fixture).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor


def per_party(sim: mp.Simulator, obj: Any) -> list[Any]:
    """Each party's value of ``obj`` as Python numbers (ints/floats/lists), None elsewhere."""
    values = mp.fetch(sim, obj)
    assert isinstance(values, list) and len(values) == sim.world_size
    return [None if v is None else np.asarray(v).tolist() for v in values]


def holders(obj: mp.MPObject) -> list[int]:
    assert obj.pmask is not None
    return list(obj.pmask)


# ---------------------------------------------------------------- constant / prank


def test_constant_on_a_subset(world: mp.Simulator, mode: str) -> None:
    n = world.world_size
    parties = tuple(range(0, n, 2))
    value = np.array([[1.5, -2.0], [3.0, 4.25]], dtype=np.float32)

    out = mp.evaluate(world, lambda: simp.constant(parties, value), mode=mode)
    assert holders(out) == list(parties)
    got = mp.fetch(world, out)
    for r in range(n):
        if r in parties:
            np.testing.assert_array_equal(got[r], value)
            assert got[r].dtype == np.float32
        else:
            assert got[r] is None


def test_constant_on_every_party(world: mp.Simulator, mode: str) -> None:
    n = world.world_size
    out = mp.evaluate(world, lambda: simp.constant(range(n), 42), mode=mode)
    assert per_party(world, out) == [42] * n


def test_prank(world: mp.Simulator, mode: str) -> None:
    n = world.world_size
    out = mp.evaluate(world, simp.prank, mode=mode)
    assert holders(out) == list(range(n))
    got = mp.fetch(world, out)
    assert [int(v) for v in got] == list(range(n))
    assert all(np.asarray(v).dtype == np.int32 for v in got)


# ---------------------------------------------------------------- pcall


def test_pcall_on_explicit_parties(world: mp.Simulator, mode: str) -> None:
    n = world.world_size
    parties = (0, n - 1)

    def prog() -> Any:
        r = simp.prank()
        return simp.pcall(parties, lambda v: v * v + 1, r)

    out = mp.evaluate(world, prog, mode=mode)
    assert holders(out) == sorted(set(parties))
    assert per_party(world, out) == [r * r + 1 if r in parties else None for r in range(n)]


def test_pcall_parties_none_runs_where_all_inputs_are_held(world: mp.Simulator,
                                                           mode: str) -> None:
    n = world.world_size
    a = sorted(set(range(0, n, 2)) | {1})
    b = list(range(1, n))
    both = sorted(set(a) & set(b))

    def prog() -> Any:
        r = simp.prank()
        x = simp.pcall(a, lambda v: v * 10, r)
        y = simp.pcall(b, lambda v: v + 1, r)
        return simp.pcall(None, lambda u, w: u + w, x, y)

    out = mp.evaluate(world, prog, mode=mode)
    assert holders(out) == both
    assert per_party(world, out) == [11 * r + 1 if r in both else None for r in range(n)]


def test_pcall_multiple_outputs_and_pytrees(sim: mp.Simulator, mode: str) -> None:
    def body(v: Any) -> Any:
        return {"double": v * 2, "pair": (v + 1, v - 1)}

    def prog() -> Any:
        return simp.pcall((1, 2), body, simp.prank())

    out = mp.evaluate(sim, prog, mode=mode)
    assert set(out) == {"double", "pair"}
    assert per_party(sim, out["double"]) == [None, 2, 4]
    assert per_party(sim, out["pair"][0]) == [None, 2, 3]
    assert per_party(sim, out["pair"][1]) == [None, 0, 1]


def test_operators_at_simp_level_run_where_operands_are_held(sim: mp.Simulator,
                                                             mode: str) -> None:
    def prog() -> Any:
        x = simp.constant((0, 1), np.array([1, 2, 3], dtype=np.int32))
        y = simp.constant((1, 2), np.array([10, 20, 30], dtype=np.int32))
        return x + y, x * 2, -y

    s, d, neg = mp.evaluate(sim, prog, mode=mode)
    assert per_party(sim, s) == [None, [11, 22, 33], None]
    assert per_party(sim, d) == [[2, 4, 6], [2, 4, 6], None]
    assert per_party(sim, neg) == [None, [-10, -20, -30], [-10, -20, -30]]


# ---------------------------------------------------------------- shuffle_static


def test_shuffle_static_ring(world: mp.Simulator, mode: str) -> None:
    n = world.world_size
    ring = {i: (i - 1) % n for i in range(n)}

    def prog() -> Any:
        return simp.shuffle_static(simp.prank() * 100 + 7, ring)

    out = mp.evaluate(world, prog, mode=mode)
    assert holders(out) == list(range(n))
    assert per_party(world, out) == [((i - 1) % n) * 100 + 7 for i in range(n)]


def test_shuffle_static_partial_routes(world: mp.Simulator, mode: str) -> None:
    n = world.world_size
    routes = {0: n - 1, 1: 1}  # party 0 receives from the last party, party 1 keeps its own

    def prog() -> Any:
        return simp.shuffle_static(simp.prank() + 1000, routes)

    out = mp.evaluate(world, prog, mode=mode)
    assert holders(out) == [0, 1]
    assert per_party(world, out) == [n - 1 + 1000, 1001] + [None] * (n - 2)


def test_shuffle_static_broadcast_from_a_single_holder(world: mp.Simulator, mode: str) -> None:
    n = world.world_size
    value = np.array([3.5, -1.0], dtype=np.float32)

    def prog() -> Any:
        x = simp.constant((n - 1,), value)
        return simp.shuffle_static(x, {i: n - 1 for i in range(n)})

    out = mp.evaluate(world, prog, mode=mode)
    assert per_party(world, out) == [[3.5, -1.0]] * n


def test_shuffle_static_chain_of_hops(sim: mp.Simulator, mode: str) -> None:
    def prog() -> Any:
        x = simp.constant((0,), 5)
        y = simp.shuffle_static(x, {1: 0})
        y = simp.pcall((1,), lambda v: v * 3, y)
        z = simp.shuffle_static(y, {2: 1})
        return simp.pcall((2,), lambda v: v - 1, z)

    assert per_party(sim, mp.evaluate(sim, prog, mode=mode)) == [None, None, 14]


# ---------------------------------------------------------------- shuffle (dynamic)


def test_shuffle_with_index_from_prank(world: mp.Simulator, mode: str) -> None:
    n = world.world_size

    def prog() -> Any:
        r = simp.prank()
        x = r * 3 + 1
        return simp.shuffle(x, (r + 1) % n)

    out = mp.evaluate(world, prog, mode=mode)
    assert holders(out) == list(range(n))
    assert per_party(world, out) == [((r + 1) % n) * 3 + 1 for r in range(n)]


def test_shuffle_with_index_held_by_one_party(world: mp.Simulator, mode: str) -> None:
    n = world.world_size

    def prog() -> Any:
        x = simp.prank() * 2 + 100
        return simp.shuffle(x, simp.constant((0,), n - 1))

    out = mp.evaluate(world, prog, mode=mode)
    assert holders(out) == [0]
    assert per_party(world, out) == [(n - 1) * 2 + 100] + [None] * (n - 1)


def test_shuffle_reverse_permutation_and_self_index(sim: mp.Simulator, mode: str) -> None:
    def prog() -> Any:
        r = simp.prank()
        x = simp.pcall(None, lambda v: v * 10 + jnp.int32(5), r)
        return simp.shuffle(x, 2 - r), simp.shuffle(x, r)

    rev, same = mp.evaluate(sim, prog, mode=mode)
    assert per_party(sim, rev) == [25, 15, 5]
    assert per_party(sim, same) == [5, 15, 25]


# ---------------------------------------------------------------- converge


def test_converge_one_value_per_party(world: mp.Simulator, mode: str) -> None:
    n = world.world_size

    def prog() -> Any:
        return simp.converge(*[simp.constant((r,), r * r) for r in range(n)])

    out = mp.evaluate(world, prog, mode=mode)
    assert holders(out) == list(range(n))
    assert per_party(world, out) == [r * r for r in range(n)]


def test_converge_of_partial_holders(world: mp.Simulator, mode: str) -> None:
    n = world.world_size
    low = [0]
    high = list(range(2, n)) if n > 2 else [1]  # party 1 holds nothing if n > 2

    def prog() -> Any:
        r = simp.prank()
        a = simp.pcall(low, lambda v: v - 50, r)
        b = simp.pcall(high, lambda v: v + 50, r)
        return simp.converge(a, b)

    out = mp.evaluate(world, prog, mode=mode)
    assert holders(out) == low + high
    assert per_party(world, out) == [-50 if r in low else r + 50 if r in high else None
                                     for r in range(n)]


def test_converge_then_compute(sim: mp.Simulator, mode: str) -> None:
    def prog() -> Any:
        x = simp.converge(simp.constant((0,), 1.0), simp.constant((1, 2), 2.0))
        return x * 10.0

    assert per_party(sim, mp.evaluate(sim, prog, mode=mode)) == [10.0, 20.0, 20.0]


# ---------------------------------------------------------------- uniform_cond


@pytest.mark.parametrize("flag", [True, False])
def test_uniform_cond_takes_the_same_branch_everywhere(world: mp.Simulator, mode: str,
                                                       flag: bool) -> None:
    n = world.world_size
    ring = {i: (i + 1) % n for i in range(n)}

    def prog(k: int) -> Any:
        r = simp.prank()
        pred = (r * 0 + k) > 0  # uniform: computed identically by every party
        return simp.uniform_cond(pred,
                                 lambda x: simp.shuffle_static(x, ring),
                                 lambda x: x * 10,
                                 r)

    out = mp.evaluate(world, prog, 1 if flag else 0, mode=mode)
    want = [(r + 1) % n for r in range(n)] if flag else [r * 10 for r in range(n)]
    assert per_party(world, out) == want


@pytest.mark.parametrize("flag", [True, False])
def test_uniform_cond_without_verification(sim: mp.Simulator, mode: str, flag: bool) -> None:
    def prog() -> Any:
        pred = simp.constant((0, 1, 2), flag)
        x = simp.prank()
        return simp.uniform_cond(pred, lambda v: v + 100, lambda v: v - 100, x,
                                 verify_uniform=False)

    out = mp.evaluate(sim, prog, mode=mode)
    assert per_party(sim, out) == [r + 100 if flag else r - 100 for r in range(3)]


def test_uniform_cond_pytree_operands_and_results(sim: mp.Simulator, mode: str) -> None:
    def prog(k: int) -> Any:
        pred = simp.constant((0, 1, 2), k > 0)
        state = {"a": simp.prank(), "b": simp.constant((0, 1, 2), 2.5)}

        def then_fn(s: Any) -> Any:
            return {"a": s["a"] + 1, "b": s["b"] * 2.0}

        def else_fn(s: Any) -> Any:
            return {"a": s["a"] - 1, "b": s["b"]}

        return simp.uniform_cond(pred, then_fn, else_fn, state)

    out = mp.evaluate(sim, prog, 1, mode=mode)
    assert per_party(sim, out["a"]) == [1, 2, 3]
    assert per_party(sim, out["b"]) == [5.0, 5.0, 5.0]
    out = mp.evaluate(sim, prog, 0, mode=mode)
    assert per_party(sim, out["a"]) == [-1, 0, 1]
    assert per_party(sim, out["b"]) == [2.5, 2.5, 2.5]


# ---------------------------------------------------------------- while_loop


def test_while_loop_counts(world: mp.Simulator, mode: str) -> None:
    n = world.world_size

    def prog() -> Any:
        i = simp.constant(range(n), 0)
        return simp.while_loop(lambda c: c < 4, lambda c: c + 1, i)

    assert per_party(world, mp.evaluate(world, prog, mode=mode)) == [4] * n


def test_while_loop_accumulates_with_messages(world: mp.Simulator, mode: str) -> None:
    """Each iteration passes every party's accumulator one step around the ring."""
    n = world.world_size
    ring = {i: (i - 1) % n for i in range(n)}
    steps = 3

    def prog() -> Any:
        i = simp.constant(range(n), 0)
        acc = simp.prank() * 10

        def body(state: Any) -> Any:
            k, a = state
            return k + 1, simp.shuffle_static(a, ring) + k

        return simp.while_loop(lambda s: s[0] < steps, body, (i, acc))

    k, acc = mp.evaluate(world, prog, mode=mode)
    want = [r * 10 for r in range(n)]
    for k_ in range(steps):
        want = [want[(r - 1) % n] + k_ for r in range(n)]
    assert per_party(world, k) == [steps] * n
    assert per_party(world, acc) == want


def test_while_loop_that_never_runs(sim: mp.Simulator, mode: str) -> None:
    def prog() -> Any:
        x = simp.constant((0, 1, 2), 7.5)
        return simp.while_loop(lambda v: v < 0.0, lambda v: v * 2.0, x)

    assert per_party(sim, mp.evaluate(sim, prog, mode=mode)) == [7.5, 7.5, 7.5]


def test_while_loop_sum_of_series(sim: mp.Simulator, mode: str) -> None:
    """Sum of 1..10 via a dict state; the predicate reads one leaf only."""

    def prog() -> Any:
        state = {"i": simp.constant((0, 1, 2), 1), "total": simp.constant((0, 1, 2), 0)}

        def body(s: Any) -> Any:
            return {"i": s["i"] + 1, "total": s["total"] + s["i"]}

        return simp.while_loop(lambda s: s["i"] <= 10, body, state)

    out = mp.evaluate(sim, prog, mode=mode)
    assert per_party(sim, out["total"]) == [sum(range(1, 11))] * 3
    assert per_party(sim, out["i"]) == [11] * 3


# ---------------------------------------------------------------- func.func


def test_func_opaque_call(sim: mp.Simulator, mode: str) -> None:
    @mp.func.func
    def rotate_and_add(x: Any, y: Any) -> Any:
        return simp.shuffle_static(x, {0: 2, 1: 0, 2: 1}) + y

    def prog() -> Any:
        r = simp.prank()
        once = rotate_and_add(r, r * 100)
        return rotate_and_add(once, once)

    program = mp.compile(prog, world_size=3)
    assert str(program).count("func.call") == 2
    once = [r * 100 + (r - 1) % 3 for r in range(3)]
    want = [once[(r - 1) % 3] + once[r] for r in range(3)]
    assert per_party(sim, mp.evaluate(sim, program, mode=mode)) == want
    assert per_party(sim, mp.evaluate(sim, prog, mode=mode)) == want


def test_func_opaque_call_inside_a_pcall_body(sim: mp.Simulator, mode: str) -> None:
    @mp.func.func
    def poly(v: Any) -> Any:
        return v * v - 3 * v + 2

    def prog() -> Any:
        return simp.pcall((0, 2), lambda v: poly(v) + poly(v + 1), simp.prank())

    out = mp.evaluate(sim, prog, mode=mode)

    def p(v: int) -> int:
        return v * v - 3 * v + 2

    assert per_party(sim, out) == [p(0) + p(1), None, p(2) + p(3)]


# ---------------------------------------------------------------- nesting and captures


def test_cond_inside_while(sim: mp.Simulator, mode: str) -> None:
    """Even iterations add the counter, odd ones rotate the values around the ring."""
    ring = {0: 2, 1: 0, 2: 1}

    def prog() -> Any:
        i = simp.constant((0, 1, 2), 0)
        acc = simp.prank() * 10

        def body(state: Any) -> Any:
            k, a = state
            a = simp.uniform_cond(k % 2 == 0,
                                  lambda v, c: v + c,
                                  lambda v, c: simp.shuffle_static(v, ring),
                                  a, k)
            return k + 1, a

        return simp.while_loop(lambda s: s[0] < 5, body, (i, acc))

    _, acc = mp.evaluate(sim, prog, mode=mode)
    want = [0, 10, 20]
    for k in range(5):
        want = [w + k for w in want] if k % 2 == 0 else [want[(r - 1) % 3] for r in range(3)]
    assert per_party(sim, acc) == want


def test_while_inside_cond(sim: mp.Simulator, mode: str) -> None:
    def prog(k: int) -> Any:
        pred = simp.constant((0, 1, 2), k > 0)
        x = simp.prank() + 1

        def doubling(v: Any) -> Any:
            count = simp.constant((0, 1, 2), 0)
            _, v = simp.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] * 2), (count, v))
            return v

        return simp.uniform_cond(pred, doubling, lambda v: v - 1, x)

    assert per_party(sim, mp.evaluate(sim, prog, 1, mode=mode)) == [8, 16, 24]
    assert per_party(sim, mp.evaluate(sim, prog, 0, mode=mode)) == [0, 1, 2]


def test_nested_conds(sim: mp.Simulator, mode: str) -> None:
    def prog(a: bool, b: bool) -> Any:
        pa = simp.constant((0, 1, 2), a)
        pb = simp.constant((0, 1, 2), b)
        x = simp.prank()

        def inner(v: Any) -> Any:
            return simp.uniform_cond(pb, lambda u: u + 1, lambda u: u + 2, v)

        return simp.uniform_cond(pa, inner, lambda v: v + 3, x)

    for a, b, add in [(True, True, 1), (True, False, 2), (False, True, 3)]:
        out = mp.evaluate(sim, prog, a, b, mode=mode)
        assert per_party(sim, out) == [r + add for r in range(3)]


def test_cond_branches_capture_outer_values(sim: mp.Simulator, mode: str) -> None:
    """Each branch uses a different outer value (not passed as an operand)."""

    def prog(k: int) -> Any:
        pred = simp.constant((0, 1, 2), k > 0)
        outer_a = simp.prank() * 100
        outer_b = simp.constant((0, 1, 2), 7)
        x = simp.prank()
        return simp.uniform_cond(pred, lambda v: v + outer_a, lambda v: v - outer_b, x)

    assert per_party(sim, mp.evaluate(sim, prog, 1, mode=mode)) == [0, 101, 202]
    assert per_party(sim, mp.evaluate(sim, prog, 0, mode=mode)) == [-7, -6, -5]


def test_while_loop_captures_outer_values(sim: mp.Simulator, mode: str) -> None:
    def prog() -> Any:
        step = simp.prank() + 1  # differs per party
        limit = simp.constant((0, 1, 2), 3)
        init = (simp.constant((0, 1, 2), 0), simp.constant((0, 1, 2), 0))

        def body(s: Any) -> Any:
            return s[0] + 1, s[1] + step

        return simp.while_loop(lambda s: s[0] < limit, body, init)

    count, total = mp.evaluate(sim, prog, mode=mode)
    assert per_party(sim, count) == [3, 3, 3]
    assert per_party(sim, total) == [3, 6, 9]


def test_pcall_body_captures_outer_values(sim: mp.Simulator, mode: str) -> None:
    """Outer simp-level values used in a pcall body become inputs of the body."""

    def prog() -> Any:
        x = simp.constant((0, 1), np.array([1.0, 2.0], dtype=np.float32))
        offset = simp.constant((0, 1, 2), np.array([10.0, 20.0], dtype=np.float32))
        scale = simp.prank() + 1
        return simp.pcall((0, 1), lambda v: v * scale + offset, x)

    assert per_party(sim, mp.evaluate(sim, prog, mode=mode)) == [[11.0, 22.0], [12.0, 24.0],
                                                                 None]


def test_loop_body_uses_pcall_on_a_subset(sim: mp.Simulator, mode: str) -> None:
    """The loop state may be held by a subset; only the predicate must be uniform."""

    def prog() -> Any:
        i = simp.constant((0, 1, 2), 0)
        x = simp.constant((1,), np.array([1.0, 2.0], dtype=np.float32))

        def body(s: Any) -> Any:
            k, v = s
            return k + 1, simp.pcall((1,), lambda a: tensor.run_jax(jnp.cumsum, a), v)

        return simp.while_loop(lambda s: s[0] < 3, body, (i, x))

    _, x = mp.evaluate(sim, prog, mode=mode)
    want = np.array([1.0, 2.0])
    for _ in range(3):
        want = np.cumsum(want)
    assert per_party(sim, x) == [None, want.tolist(), None]
