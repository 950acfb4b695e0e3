"""Programs shared by the simulator and the HTTP driver tests.

Each `Case` is a zero-argument program (its data are compile-time constants),
the reference result computed with numpy / plain Python, and the tolerance
float results get (integers and booleans always match exactly). Results are
compared through `plain`, which turns fetched values into Python lists/numbers
(with numpy dtypes kept alongside for arrays, so a dtype change is caught).

The programs cover every ``simp`` primitive (constant, prank, pcall,
shuffle_static, shuffle, converge, uniform_cond, while_loop, func.func) and the
device level (millionaire, SPU arithmetic with automatic moves, reveal to a PPU,
fetching an SPU value).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import simp, tensor

WORLD = 3
RING = {i: (i - 1) % WORLD for i in range(WORLD)}
"""Party i receives from party i - 1."""

A = np.array([[1.5, -2.25, 3.0], [0.5, 4.0, -1.0]], dtype=np.float32)
B = np.array([[0.75, 1.0, -3.5], [2.0, -0.5, -1.0]], dtype=np.float32)
IA = np.array([7, -3, 12, 0, 5], dtype=np.int32)
IB = np.array([2, -3, 15, -8, 5], dtype=np.int32)


@dataclass(frozen=True)
class Case:
    name: str
    program: Callable[[], Any]
    expected: Any
    tol: float = 1e-6
    """Tolerance of float results: XLA's float32 differs from numpy's in the last bits,
    SPU fixed point (FM64, 18 fraction bits) by far more."""
    holders: Any = None
    """The expected pmask(s) of the outputs as sorted lists, if checked."""


def plain(value: Any) -> Any:
    """Fetched values as plain Python: arrays -> ("dtype", nested lists), scalars -> numbers."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        arr = np.asarray(value)
        return (arr.dtype.name, arr.tolist())
    raise TypeError(f"unexpected fetched value {value!r}")


def f32(x: Any) -> tuple[str, Any]:
    return ("float32", np.asarray(x, dtype=np.float32).tolist())


def i32(x: Any) -> tuple[str, Any]:
    return ("int32", np.asarray(x, dtype=np.int32).tolist())


def b1(x: Any) -> tuple[str, Any]:
    return ("bool", np.asarray(x, dtype=np.bool_).tolist())


def assert_same(actual: Any, expected: Any, tol: float = 0.0, where: str = "result") -> None:
    """``actual`` equals ``expected`` (both in `plain` form); floats within ``tol``
    (relative and absolute) if it is not 0, bit for bit otherwise."""
    if isinstance(expected, tuple) and len(expected) == 2 and isinstance(expected[0], str):
        assert isinstance(actual, tuple) and len(actual) == 2, f"{where}: {actual!r}"
        assert actual[0] == expected[0], f"{where}: dtype {actual[0]} != {expected[0]}"
        if tol == 0 or expected[0] not in ("float32", "float64"):
            assert actual[1] == expected[1], f"{where}: {actual[1]!r} != {expected[1]!r}"
        else:
            np.testing.assert_allclose(actual[1], expected[1], rtol=tol, atol=tol,
                                       err_msg=where)
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected), f"{where}: {actual!r}"
        for k in expected:
            assert_same(actual[k], expected[k], tol, f"{where}[{k!r}]")
        return
    if isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple) and len(actual) == len(expected), \
            f"{where}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, tol, f"{where}[{i}]")
        return
    assert actual == expected, f"{where}: {actual!r} != {expected!r}"


# ---------------------------------------------------------------- simp level


def constant() -> Any:
    return simp.constant((0, 2), A), simp.constant(range(WORLD), 42)


def prank() -> Any:
    return simp.prank()


def pcall() -> Any:
    r = simp.prank()
    sq = simp.pcall((0, 2), lambda v: tensor.run_jax(jnp.square, v) + 1, r)
    mat = simp.pcall((1,), lambda m: tensor.run_jax(lambda x: jnp.tanh(x) @ x.T, m),
                     simp.constant((1,), A))
    return sq, mat


def shuffle_static() -> Any:
    x = simp.prank() * 100 + 7
    ring = simp.shuffle_static(x, RING)
    partial = simp.shuffle_static(simp.constant((2,), A), {0: 2, 1: 2})
    return ring, partial


def shuffle() -> Any:
    r = simp.prank()
    x = r * 3 + 1
    rotated = simp.shuffle(x, (r + 1) % WORLD)
    from_last = simp.shuffle(x, simp.constant((0,), WORLD - 1))
    return rotated, from_last


def converge() -> Any:
    r = simp.prank()
    low = simp.pcall((0,), lambda v: v - 50, r)
    high = simp.pcall((1, 2), lambda v: v + 50, r)
    return simp.converge(low, high) * 2


def _uniform_cond(flag: bool) -> Callable[[], Any]:
    def prog() -> Any:
        r = simp.prank()
        pred = (r * 0 + (1 if flag else 0)) > 0  # uniform: every party computes the same
        return simp.uniform_cond(pred,
                                 lambda x: simp.shuffle_static(x, RING),
                                 lambda x: x * 10,
                                 r)

    return prog


def while_loop() -> Any:
    """Three rounds, each passing every party's accumulator one step around the ring."""
    i = simp.constant(range(WORLD), 0)
    acc = simp.prank() * 10

    def body(state: Any) -> Any:
        k, a = state
        return k + 1, simp.shuffle_static(a, RING) + k

    return simp.while_loop(lambda s: s[0] < 3, body, (i, acc))


def _while_expected() -> Any:
    want = [r * 10 for r in range(WORLD)]
    for k in range(3):
        want = [want[RING[r]] + k for r in range(WORLD)]
    return [i32(3)] * WORLD, [i32(w) for w in want]


@mp.func.func
def _rotate_and_add(x: Any, y: Any) -> Any:
    return simp.shuffle_static(x, RING) + y


def func_func() -> Any:
    r = simp.prank()
    once = _rotate_and_add(r, r * 100)
    return _rotate_and_add(once, once)


def _func_expected() -> Any:
    once = [r * 100 + RING[r] for r in range(WORLD)]
    return [i32(once[RING[r]] + once[r]) for r in range(WORLD)]


# ---------------------------------------------------------------- device level


def _millionaire(alice: int, bob: int) -> Callable[[], Any]:
    def prog() -> Any:
        x = mp.device("P0")(lambda: jnp.int32(alice))()
        y = mp.device("P1")(lambda: jnp.int32(bob))()
        z = mp.device("SP0")(lambda a, b: a < b)(x, y)  # secret-shared compare
        return mp.put("P0", z)  # revealed to P0 only

    return prog


def spu_float_with_moves() -> Any:
    """P0 and P1 inputs sealed into SP0, computed there, revealed to P2 and used there."""
    x = mp.put("P0", A)
    y = mp.put("P1", B)
    z = mp.device("SP0")(lambda a, b: a * b + a @ b.T @ a - b / 4)(x, y)
    return mp.device("P2")(lambda v: jnp.sum(v, axis=0) * 2.0)(z)


def spu_int_arith() -> Any:
    x = mp.put("P0", IA)
    y = mp.put("P2", IB)
    z = mp.device("SP0")(lambda a, b: a * b - a + jnp.maximum(a, b) * 3)(x, y)
    return mp.put("P1", z)


def reveal_to_ppu() -> Any:
    x = mp.put("P0", IA)
    y = mp.put("P1", IB)
    s = mp.device("SP0")(lambda a, b: (a + b, a >= b))(x, y)
    return mp.put("P1", s[0]), mp.put("P2", s[1])


CASES: list[Case] = [
    Case("constant", constant,
         ([f32(A), None, f32(A)], [("int32", 42)] * WORLD), holders=[[0, 2], [0, 1, 2]]),
    Case("prank", prank, [i32(r) for r in range(WORLD)], holders=[0, 1, 2]),
    Case("pcall", pcall,
         ([i32(1), None, i32(5)], [None, f32(np.tanh(A) @ A.T), None]),
         holders=[[0, 2], [1]]),
    Case("shuffle_static", shuffle_static,
         ([i32(RING[r] * 100 + 7) for r in range(WORLD)], [f32(A), f32(A), None]),
         holders=[[0, 1, 2], [0, 1]]),
    Case("shuffle", shuffle,
         ([i32(((r + 1) % WORLD) * 3 + 1) for r in range(WORLD)],
          [i32((WORLD - 1) * 3 + 1), None, None]),
         holders=[[0, 1, 2], [0]]),
    Case("converge", converge, [i32(-100), i32(102), i32(104)], holders=[0, 1, 2]),
    Case("uniform_cond_then", _uniform_cond(True), [i32(RING[r]) for r in range(WORLD)]),
    Case("uniform_cond_else", _uniform_cond(False), [i32(r * 10) for r in range(WORLD)]),
    Case("while_loop", while_loop, _while_expected()),
    Case("func_func", func_func, _func_expected()),
    Case("millionaire_poorer", _millionaire(1_000_000, 2_000_000), ("bool", True)),
    Case("millionaire_richer", _millionaire(2_000_001, 2_000_000), ("bool", False)),
    Case("spu_float_with_moves", spu_float_with_moves,
         f32(np.sum(A * B + A @ B.T @ A - B / 4, axis=0) * 2.0), tol=2e-3),
    Case("spu_int_arith", spu_int_arith, i32(IA * IB - IA + np.maximum(IA, IB) * 3)),
    Case("reveal_to_ppu", reveal_to_ppu, (i32(IA + IB), b1(IA >= IB)),
         holders=[[1], [2]]),
]
"""Every shared program with its numpy reference."""

CASE_IDS = [c.name for c in CASES]


def chained_joins(seed: int = 1) -> tuple[Callable[[], Any], list[int]]:
    """Three chained two-party PSI joins of P0's, P1's and P2's 1,500 ids (of 2,000), and
    the ids all three share, which the last join's result holds."""
    import pyarrow as pa

    from mplang.dialects import table
    from mplang.libs import psi

    rng = np.random.default_rng(seed)
    ids = [pa.table({"id": pa.array(rng.choice(2000, 1500, replace=False), pa.int64())})
           for _ in range(3)]

    def chained() -> Any:
        a, b, c = (simp.pcall((i,), lambda t=t: table.constant(t)) for i, t in enumerate(ids))
        a1, b1 = psi.join(a, b, "id")
        _, c2 = psi.join(b1, c, "id")
        return psi.join(c2, a1, "id")[0]

    shared = set.intersection(*(set(t["id"].to_pylist()) for t in ids))
    return chained, sorted(shared)
