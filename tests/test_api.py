"""The public API of DESIGN.md: compile / evaluate / fetch, programs as data,
runtime inputs, eager mode, concurrency and the lifetime of runtime objects."""

from __future__ import annotations

import gc
import os
import threading
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor


@mp.function
def prog(a):  # the DESIGN.md example, verbatim
    x = simp.constant((0,), a)        # value held by party 0 only
    y = simp.pcall((0,), lambda v: tensor.run_jax(jnp.square, v), x)
    z = simp.shuffle_static(y, {1: 0})   # party 1 receives party 0's value
    return z


def store_sizes(sim: mp.Simulator) -> list[int]:
    return [len(w.store) for w in sim.mesh.workers]


# ---------------------------------------------------------------- the DESIGN.md example


def test_design_example(sim: mp.Simulator) -> None:
    out = mp.evaluate(sim, prog, 3)
    assert mp.fetch(sim, out) == [None, 9, None]
    assert isinstance(out, mp.MPObject)
    assert out.pmask == mp.Mask.of([1])
    assert out.dtype == "int32" and out.shape == ()


def test_design_example_in_both_modes(sim: mp.Simulator, mode: str) -> None:
    got = mp.fetch(sim, mp.evaluate(sim, prog, 4, mode=mode))
    assert got[0] is None and got[2] is None
    assert int(got[1]) == 16


def test_compile_and_print(sim: mp.Simulator) -> None:
    p = mp.compile(prog, 3, world_size=3)
    assert isinstance(p, mp.Program)
    assert p.world_size == 3
    assert p.input_types == []
    text = str(p)
    for name in ("simp.constant", "simp.pcall", "tensor.run_jax", "simp.shuffle_static"):
        assert name in text, f"{name} missing from:\n{text}"
    assert "@{1}" in text  # the result's placement
    assert mp.fetch(sim, mp.evaluate(sim, p)) == [None, 9, None]


def test_save_and_load(sim: mp.Simulator, tmp_path: Any, mode: str) -> None:
    p = mp.compile(prog, 3, world_size=3)
    path = tmp_path / "prog.mpl"
    p.save(str(path))
    p2 = mp.load(str(path))
    assert isinstance(p2, mp.Program)
    assert p2.to_bytes() == p.to_bytes()
    for name in ("simp.constant", "simp.pcall", "tensor.run_jax", "simp.shuffle_static"):
        assert name in str(p2)
    assert p2.world_size == 3
    assert mp.fetch(sim, mp.evaluate(sim, p2, mode=mode)) == [None, 9, None]
    # deterministic bytes: compiling again and saving again gives the same file
    path2 = tmp_path / "again.mpl"
    mp.compile(prog, 3, world_size=3).save(path2)
    assert path2.read_bytes() == path.read_bytes()
    p2.save(tmp_path / "resaved.mpl")
    assert (tmp_path / "resaved.mpl").read_bytes() == path.read_bytes()


def test_save_and_load_a_program_with_runtime_inputs_and_pytree_outputs(
        sim: mp.Simulator, tmp_path: Any, mode: str) -> None:
    x = mp.evaluate(sim, lambda: simp.constant((0, 1, 2), np.array([1.0, 2.0], np.float32)))

    def fn(v: Any) -> Any:
        r = simp.prank()
        return {"scaled": v * 3.0, "ring": simp.shuffle(r, (r + 1) % 3)}

    mp.compile(fn, x, world_size=3).save(tmp_path / "p.mpl")
    loaded = mp.load(tmp_path / "p.mpl")
    out = mp.evaluate(sim, loaded, x, mode=mode)
    got = mp.fetch(sim, out)
    assert set(got) == {"scaled", "ring"}
    for v in got["scaled"]:
        np.testing.assert_allclose(v, [3.0, 6.0])
    assert [int(v) for v in got["ring"]] == [1, 2, 0]


def test_make_simulator() -> None:
    sim = simp.make_simulator(world_size=3)
    try:
        assert isinstance(sim, mp.Simulator)
        assert sim.world_size == 3
        assert mp.fetch(sim, mp.evaluate(sim, prog, 3)) == [None, 9, None]
    finally:
        sim.close()


def test_function_keyword_arguments(sim: mp.Simulator) -> None:
    def fn(a: int, *, b: int) -> Any:
        return simp.constant((2,), a * 10 + b)

    assert mp.fetch(sim, mp.evaluate(sim, fn, 4, b=2)) == [None, None, 42]


# ---------------------------------------------------------------- runtime inputs


def _counting_fetch(sim: mp.Simulator, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record every value the driver brings back from a party."""
    calls: list[Any] = []
    original = sim.fetch

    def fetch(rank: int, uri: str) -> Any:
        calls.append((rank, uri))
        return original(rank, uri)

    monkeypatch.setattr(sim, "fetch", fetch)
    return calls


def test_objects_flow_into_the_next_evaluation_without_leaving_the_parties(
        sim: mp.Simulator, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting_fetch(sim, monkeypatch)

    first = mp.evaluate(sim, lambda: (simp.prank() * 2, simp.constant((1,), 5.0)), mode=mode)
    a, b = first

    def second(u: Any, v: Any) -> Any:
        w = simp.shuffle_static(v, {0: 1, 2: 1})
        return u + 1, simp.pcall((0, 2), lambda p, q: q * 2.0 + p, u, w)

    c, d = mp.evaluate(sim, second, a, b, mode=mode)
    assert calls == [], "values were brought to the driver while evaluating"
    assert [int(v) for v in mp.fetch(sim, c)] == [1, 3, 5]
    got = mp.fetch(sim, d)
    assert got[1] is None
    assert float(got[0]) == 10.0 and float(got[2]) == 14.0
    assert len(calls) == 5  # fetching did go through the parties


def test_runtime_inputs_enter_the_program_signature(sim: mp.Simulator) -> None:
    x = mp.evaluate(sim, lambda: simp.constant((0, 2), np.zeros((2, 3), np.float32)))
    p = mp.compile(lambda v: v + 1.0, x, world_size=3)
    assert p.input_types == [x.mptype]
    assert "f32[2,3]@{0,2}" in str(p).splitlines()[0]


def test_compiled_program_takes_new_objects_of_the_same_types(sim: mp.Simulator,
                                                              mode: str) -> None:
    def make(values: list[int]) -> Any:
        return mp.evaluate(sim, lambda: simp.converge(
            *[simp.constant((r,), np.int32(v)) for r, v in enumerate(values)]))

    def fn(x: Any) -> Any:
        return simp.shuffle(x * 10, (simp.prank() + 1) % 3)

    first = make([1, 2, 3])
    p = mp.compile(fn, first, world_size=3)
    assert [int(v) for v in mp.fetch(sim, mp.evaluate(sim, p, first, mode=mode))] == [20, 30, 10]
    second = make([7, 8, 9])
    assert second.mptype == first.mptype
    assert [int(v) for v in mp.fetch(sim, mp.evaluate(sim, p, second, mode=mode))] == [80, 90, 70]
    # the first object is untouched
    assert [int(v) for v in mp.fetch(sim, first)] == [1, 2, 3]


# ---------------------------------------------------------------- eager mode


@mp.function
def pytree_prog(k: int) -> Any:
    r = simp.prank()
    x = simp.constant((0, 1), np.array([1.0, 2.0], np.float32) * k)
    return {"rank": r, "pair": (x * 2.0, simp.shuffle_static(x, {2: 0})), "none": None}


def _same_fetched(a: Any, b: Any) -> None:
    """Two fetched pytrees have the same structure and values."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            _same_fetched(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _same_fetched(u, v)
    elif a is None:
        assert b is None
    else:
        np.testing.assert_array_equal(a, b)


def test_eager_call_matches_evaluate(sim: mp.Simulator) -> None:
    evaluated = mp.fetch(sim, mp.evaluate(sim, pytree_prog, 3))
    with sim:
        eager_out = pytree_prog(3)
    eager = mp.fetch(sim, eager_out)
    assert isinstance(eager_out["rank"], mp.MPObject)
    _same_fetched(eager, evaluated)
    assert isinstance(eager["pair"], tuple) and eager["none"] is None
    assert [int(v) for v in eager["rank"]] == [0, 1, 2]
    np.testing.assert_allclose(eager["pair"][1][2], [3.0, 6.0])
    assert eager["pair"][1][:2] == [None, None]


def test_eager_design_example(sim: mp.Simulator) -> None:
    with sim:
        out = prog(3)
    assert mp.fetch(sim, out) == [None, 9, None]


def test_eager_primitives(sim: mp.Simulator) -> None:
    with sim:
        x = simp.constant((0, 1), 5)
        y = x + 1
        r = simp.prank()
        z = simp.shuffle_static(y * r, {2: 1, 0: 0})
        w = simp.pcall((1,), lambda v: v - 100, x)
        m = simp.converge(simp.constant((0,), 1.5), simp.constant((2,), 2.5))
        pred = r >= 0
        c = simp.uniform_cond(pred, lambda v: v * 3, lambda v: v, r)
    for obj in (x, y, r, z, w, m, pred, c):
        assert isinstance(obj, mp.MPObject)
    assert mp.fetch(sim, x) == [5, 5, None]
    assert mp.fetch(sim, y) == [6, 6, None]
    assert mp.fetch(sim, z) == [0, None, 6]
    assert mp.fetch(sim, w) == [None, -95, None]
    assert mp.fetch(sim, m) == [1.5, None, 2.5]
    assert mp.fetch(sim, c) == [0, 3, 6]
    # eager objects feed mp.evaluate as runtime inputs
    assert mp.fetch(sim, mp.evaluate(sim, lambda u, v: u + v, y, x)) == [11, 11, None]


def test_eager_needs_a_context() -> None:
    with pytest.raises(mp.MPLangError):
        simp.prank()
    with pytest.raises(mp.MPLangError):
        prog(3)


# ---------------------------------------------------------------- concurrency


def test_concurrent_evaluations_on_one_simulator(sim: mp.Simulator) -> None:
    """Four threads run shuffle-heavy programs at once; their messages never mix."""
    rounds = 6
    results: dict[tuple[int, int], list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def program(seed: int) -> Any:
        def fn() -> Any:
            r = simp.prank()
            x = r * 1000 + seed
            y = simp.shuffle(x, (r + 1) % 3)
            z = simp.shuffle_static(y, {0: 2, 1: 0, 2: 1})
            i = simp.constant((0, 1, 2), 0)
            _, acc = simp.while_loop(
                lambda s: s[0] < 2,
                lambda s: (s[0] + 1, simp.shuffle_static(s[1], {0: 1, 1: 2, 2: 0}) + 1),
                (i, z))
            return acc

        return fn

    def run(t: int) -> None:
        try:
            barrier.wait()
            for k in range(rounds):
                seed = t * 100 + k
                out = mp.evaluate(sim, program(seed), mode="launch" if (t + k) % 2 else "standard")
                results[(t, k)] = [int(v) for v in mp.fetch(sim, out)]
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "an evaluation hangs"
    assert errors == []
    for (t, k), got in results.items():
        seed = t * 100 + k
        x = [r * 1000 + seed for r in range(3)]
        y = [x[(r + 1) % 3] for r in range(3)]
        z = [y[(r - 1) % 3] for r in range(3)]
        for _ in range(2):
            z = [z[(r + 1) % 3] + 1 for r in range(3)]
        assert got == z, f"thread {t} round {k}"
    assert len(results) == 4 * rounds


# ---------------------------------------------------------------- object lifetime


def test_objects_are_freed_when_collected(sim: mp.Simulator, mode: str,
                                          eventually: Any) -> None:
    gc.collect()
    before = store_sizes(sim)

    def fn() -> Any:
        r = simp.prank()
        x = r * 2 + 1
        y = simp.shuffle_static(x, {0: 1, 1: 2})
        return y, x - 1

    y, x = mp.evaluate(sim, fn, mode=mode)
    assert mp.fetch(sim, y) == [3, 5, None]
    during = store_sizes(sim)
    assert all(d > b for d, b in zip(during, before, strict=True))
    del y
    gc.collect()
    assert mp.fetch(sim, x) == [0, 2, 4]  # the other output is still there
    del x
    gc.collect()
    assert eventually(lambda: store_sizes(sim) == before)


def test_outputs_that_alias_inputs_own_their_storage(sim: mp.Simulator, mode: str) -> None:
    """Freeing a program's output must not free its input, nor a twin output."""
    a = mp.evaluate(sim, lambda: simp.constant((0, 1), 7))
    b = mp.evaluate(sim, lambda v: v, a, mode=mode)
    twin1, twin2 = mp.evaluate(sim, lambda v: (v, v), a, mode=mode)
    del b
    gc.collect()
    assert mp.fetch(sim, a) == [7, 7, None]
    del twin1
    gc.collect()
    assert mp.fetch(sim, twin2) == [7, 7, None]
    assert mp.fetch(sim, a) == [7, 7, None]


def test_nothing_is_written_to_the_current_directory(sim: mp.Simulator, tmp_path: Any,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     mode: str) -> None:
    monkeypatch.chdir(tmp_path)
    p = mp.compile(prog, 5, world_size=3)
    str(p)
    p.to_bytes()
    out = mp.evaluate(sim, p, mode=mode)
    assert mp.fetch(sim, out) == [None, 25, None]
    with sim:
        mp.fetch(sim, simp.constant((0,), 1) + 1)
    assert os.listdir(tmp_path) == []
