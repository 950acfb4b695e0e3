"""Local tensor computation at run time: Python operators, indexing and `tensor.run_jax`.

Every case runs on a 3-party simulator with the operands held by parties 0 and
1, either inside an explicit ``simp.pcall((0, 1), ...)`` body ("pcall" level) or
directly on the simp-level values, where operators wrap themselves into a
pcall over the parties holding all operands ("simp" level). Results are
compared with numpy on the same inputs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.edsl.pytree import tree_flatten, tree_unflatten

HOLDERS = (0, 1)
LEVELS = ("pcall", "simp")


def run_local(sim: mp.Simulator, level: str, fn: Callable[..., Any], *arrays: Any) -> Any:
    """``fn`` on ``arrays`` as local tensors of parties 0 and 1; party 0's result pytree.

    Checks that parties 0 and 1 got the same values and party 2 holds nothing.
    """

    def prog() -> Any:
        xs = [simp.constant(HOLDERS, a) for a in arrays]
        if level == "pcall":
            return simp.pcall(HOLDERS, fn, *xs)
        return fn(*xs)

    out = mp.evaluate(sim, prog)
    leaves, tree = tree_flatten(out)
    assert leaves, "the program returned no values"
    values = []
    for leaf in leaves:
        assert isinstance(leaf, mp.MPObject)
        assert leaf.pmask == mp.Mask.of(HOLDERS)
        per_party = mp.fetch(sim, leaf)
        assert len(per_party) == 3
        assert per_party[2] is None
        np.testing.assert_array_equal(per_party[0], per_party[1])
        values.append(per_party[0])
    return tree_unflatten(tree, values)


def assert_same(got: Any, want: Any) -> None:
    """``got`` equals numpy's ``want`` (bool and int exactly, floats to float32 precision)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    if want.dtype == bool or np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------- binary operators

BINARY = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}

# Operands with mixed signs and equal entries (to exercise == and <=); no zero divisors.
INT_A = np.array([[-7, 3, 5], [2, -4, 9]], dtype=np.int32)
INT_B = np.array([[2, -3, 5], [3, 2, -4]], dtype=np.int32)
FLOAT_A = np.array([[-7.5, 3.25, 5.0], [2.0, -4.0, 9.5]], dtype=np.float32)
FLOAT_B = np.array([[2.0, -1.5, 5.0], [3.0, 2.5, -4.0]], dtype=np.float32)
# `**` needs non-negative integer exponents and positive float bases.
INT_BASE = np.array([[-3, 2, 5], [0, 1, -2]], dtype=np.int32)
INT_EXP = np.array([[2, 3, 0], [4, 1, 3]], dtype=np.int32)
FLOAT_BASE = np.array([[0.5, 2.0, 3.5], [1.0, 4.0, 9.0]], dtype=np.float32)

SCALARS = {"int32": 3, "float32": 2.5}


def _operands(op: str, dtype: str) -> tuple[np.ndarray, np.ndarray, int | float]:
    if op == "**":
        if dtype == "int32":
            return INT_BASE, INT_EXP, 2
        return FLOAT_BASE, FLOAT_B, 1.5
    if dtype == "int32":
        return INT_A, INT_B, SCALARS[dtype]
    return FLOAT_A, FLOAT_B, SCALARS[dtype]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_operator_tensor_tensor(sim: mp.Simulator, level: str, dtype: str,
                                       op: str) -> None:
    a, b, _ = _operands(op, dtype)
    fn = BINARY[op]
    assert_same(run_local(sim, level, fn, a, b), fn(a, b))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_operator_python_scalar_right(sim: mp.Simulator, level: str, dtype: str,
                                             op: str) -> None:
    a, _, s = _operands(op, dtype)
    fn = BINARY[op]
    assert_same(run_local(sim, level, lambda x: fn(x, s), a), fn(a, s))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_operator_python_scalar_left(sim: mp.Simulator, level: str, dtype: str,
                                            op: str) -> None:
    a, b, s = _operands(op, dtype)
    fn = BINARY[op]
    # `s ** x` needs non-negative integer exponents: use the exponent operand there.
    x = b if op == "**" else a
    assert_same(run_local(sim, level, lambda v: fn(s, v), x), fn(s, x))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["int32", "float32"])
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_operator_numpy_operand_right(sim: mp.Simulator, level: str, dtype: str,
                                             op: str) -> None:
    a, b, _ = _operands(op, dtype)
    fn = BINARY[op]
    assert_same(run_local(sim, level, lambda x: fn(x, b), a), fn(a, b))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("op", ["+", "-", "*", "/", "<", "=="])
def test_binary_operator_numpy_operand_left(sim: mp.Simulator, level: str, op: str) -> None:
    """``ndarray <op> x`` must defer to the MPLang operand, as ``x <op> ndarray`` does."""
    fn = BINARY[op]
    assert_same(run_local(sim, level, lambda x: fn(FLOAT_B, x), FLOAT_A), fn(FLOAT_B, FLOAT_A))


@pytest.mark.parametrize("level", LEVELS)
def test_numpy_scalar_operands(sim: mp.Simulator, level: str) -> None:
    got = run_local(sim, level, lambda x: (x * np.float32(3.0), x - np.int32(2)), FLOAT_A)
    assert_same(got[0], FLOAT_A * np.float32(3.0))
    assert_same(got[1], FLOAT_A - np.int32(2))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("a", [INT_A, FLOAT_A], ids=["int32", "float32"])
def test_negation(sim: mp.Simulator, level: str, a: np.ndarray) -> None:
    got = run_local(sim, level, lambda x: -x, a)
    assert_same(got, -a)
    assert got.dtype == a.dtype


@pytest.mark.parametrize("level", LEVELS)
def test_operators_compose(sim: mp.Simulator, level: str) -> None:
    def fn(x: Any, y: Any) -> Any:
        return ((x * 2 - y) / (y * y + 1)) ** 2 + (x > y) * 1.0 - (-x) % 3

    assert_same(run_local(sim, level, fn, FLOAT_A, FLOAT_B), fn(FLOAT_A, FLOAT_B))


# ---------------------------------------------------------------- matmul

MAT_A = np.array([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], dtype=np.float32)
MAT_B = np.array([[2.0, 1.0], [-1.0, 3.0], [0.0, 5.0]], dtype=np.float32)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("shapes", [
    ("matrix@matrix", MAT_A, MAT_B),
    ("matrix@vector", MAT_A, np.array([1.0, 2.0, -3.0], dtype=np.float32)),
    ("vector@matrix", np.array([2.0, -1.0], dtype=np.float32), MAT_A),
    ("int", MAT_A.astype(np.int32), MAT_B.astype(np.int32)),
], ids=lambda s: s[0])
def test_matmul(sim: mp.Simulator, level: str, shapes: tuple[str, np.ndarray, np.ndarray]
                ) -> None:
    _, a, b = shapes
    assert_same(run_local(sim, level, operator.matmul, a, b), a @ b)


@pytest.mark.parametrize("level", LEVELS)
def test_matmul_with_numpy_operand(sim: mp.Simulator, level: str) -> None:
    assert_same(run_local(sim, level, lambda x: x @ MAT_B, MAT_A), MAT_A @ MAT_B)


# ---------------------------------------------------------------- indexing

CUBE = np.arange(24, dtype=np.float32).reshape(2, 3, 4)

STATIC_INDICES = {
    "int": 1,
    "negative int": -1,
    "slice": slice(1, None),
    "negative slice": slice(-2, None),
    "reversed": slice(None, None, -1),
    "stepped": (slice(None), slice(None, None, 2)),
    "tuple of ints": (0, 2),
    "negative tuple": (-1, -2, -3),
    "int and slice": (1, slice(None), -1),
    "ellipsis": (Ellipsis, 0),
    "newaxis": (None, 0),
    "slices": (slice(0, 2), slice(1, 3), 2),
}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", list(STATIC_INDICES))
def test_static_indexing(sim: mp.Simulator, level: str, name: str) -> None:
    index = STATIC_INDICES[name]
    got = run_local(sim, level, lambda x: x[index], CUBE)
    want = CUBE[index]
    assert_same(got, want)


@pytest.mark.parametrize("level", LEVELS)
def test_numpy_array_index(sim: mp.Simulator, level: str) -> None:
    rows = np.array([2, 0, 2], dtype=np.int32)
    got = run_local(sim, level, lambda x: x[rows], CUBE[0])
    assert_same(got, CUBE[0][rows])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("k", [0, 2, -1, -3])
def test_traced_integer_index(sim: mp.Simulator, level: str, k: int) -> None:
    vec = np.array([10.0, 20.0, 30.0], dtype=np.float32)
    got = run_local(sim, level, lambda x, i: x[i], vec, np.int32(k))
    assert_same(got, vec[k])
    got = run_local(sim, level, lambda x, i: x[i], CUBE[1], np.int32(k))
    assert_same(got, CUBE[1][k])


@pytest.mark.parametrize("level", LEVELS)
def test_traced_index_in_tuple(sim: mp.Simulator, level: str) -> None:
    got = run_local(sim, level, lambda x, i: x[1, i], CUBE, np.int32(2))
    assert_same(got, CUBE[1, 2])


# ---------------------------------------------------------------- tensor.run_jax
# `tensor.run_jax` is a party-local op: it runs inside pcall bodies ("explicit").
# A pcall body may also be a plain JAX function, traced as run_jax ("plain").

JAX_STYLES = ("explicit", "plain")


def _jax_body(style: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if style == "plain":
        return fn
    return lambda *xs: tensor.run_jax(fn, *xs)


@pytest.mark.parametrize("style", JAX_STYLES)
def test_run_jax_sum(sim: mp.Simulator, style: str) -> None:
    got = run_local(sim, "pcall", _jax_body(style, jnp.sum), FLOAT_A)
    assert_same(got, FLOAT_A.sum())
    assert got.shape == ()


def test_run_jax_static_keyword_arguments(sim: mp.Simulator) -> None:
    """Two calls differing only in a static keyword must not share a compiled module."""

    def fn(x: Any) -> Any:
        return tensor.run_jax(jnp.sum, x, axis=0), tensor.run_jax(jnp.sum, x, axis=1)

    by_rows, by_cols = run_local(sim, "pcall", fn, FLOAT_A)
    assert_same(by_rows, FLOAT_A.sum(axis=0))
    assert_same(by_cols, FLOAT_A.sum(axis=1))


@pytest.mark.parametrize("style", JAX_STYLES)
def test_run_jax_tuple_output(sim: mp.Simulator, style: str) -> None:
    def stats(x: Any) -> Any:
        return jnp.min(x), jnp.max(x), x * 2

    got = run_local(sim, "pcall", _jax_body(style, stats), FLOAT_A)
    assert isinstance(got, tuple) and len(got) == 3
    assert_same(got[0], FLOAT_A.min())
    assert_same(got[1], FLOAT_A.max())
    assert_same(got[2], FLOAT_A * 2)


@pytest.mark.parametrize("style", JAX_STYLES)
def test_run_jax_dict_output(sim: mp.Simulator, style: str) -> None:
    def summary(x: Any, y: Any) -> Any:
        return {"total": jnp.sum(x + y), "diff": x - y, "nested": {"mean": jnp.mean(x)}}

    got = run_local(sim, "pcall", _jax_body(style, summary), FLOAT_A, FLOAT_B)
    assert isinstance(got, dict) and set(got) == {"total", "diff", "nested"}
    assert_same(got["total"], (FLOAT_A + FLOAT_B).sum())
    assert_same(got["diff"], FLOAT_A - FLOAT_B)
    assert_same(got["nested"]["mean"], FLOAT_A.mean())


def test_run_jax_kwargs(sim: mp.Simulator) -> None:
    def affine(x: Any, *, scale: float, shift: Any) -> Any:
        return x * scale + shift

    got = run_local(sim, "pcall",
                    lambda x, y: tensor.run_jax(affine, x, scale=3.0, shift=y), FLOAT_A, FLOAT_B)
    assert_same(got, FLOAT_A * 3.0 + FLOAT_B)


@pytest.mark.parametrize("style", JAX_STYLES)
def test_run_jax_relu(sim: mp.Simulator, style: str) -> None:
    got = run_local(sim, "pcall", _jax_body(style, jax.nn.relu), FLOAT_A)
    assert_same(got, np.maximum(FLOAT_A, 0))


@pytest.mark.parametrize("style", JAX_STYLES)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_run_jax_lax_cond(sim: mp.Simulator, style: str, sign: float) -> None:
    def fn(x: Any) -> Any:
        return jax.lax.cond(jnp.sum(x) > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)

    a = np.abs(FLOAT_A) * sign
    want = a * 2.0 if a.sum() > 0 else a - 1.0
    assert_same(run_local(sim, "pcall", _jax_body(style, fn), a), want)


def test_run_jax_pytree_and_numpy_inputs(sim: mp.Simulator) -> None:
    weights = np.array([0.5, -1.0, 2.0], dtype=np.float32)

    def fn(d: Any, w: Any) -> Any:
        return d["a"] @ w + d["b"][:, 0]

    got = run_local(sim, "pcall",
                    lambda x, y: tensor.run_jax(fn, {"a": x, "b": y}, weights), FLOAT_A, FLOAT_B)
    assert_same(got, FLOAT_A @ weights + FLOAT_B[:, 0])


def test_run_jax_mixed_with_operators(sim: mp.Simulator) -> None:
    def body(x: Any, y: Any) -> Any:
        z = tensor.run_jax(jnp.tanh, x * 0.5) - y
        return tensor.run_jax(jnp.sum, z[0]), z

    total, z = run_local(sim, "pcall", body, FLOAT_A, FLOAT_B)
    want = np.tanh(FLOAT_A * 0.5) - FLOAT_B
    assert_same(z, want)
    assert_same(total, want[0].sum())


def test_run_jax_same_function_on_different_shapes(sim: mp.Simulator) -> None:
    def fn(x: Any, y: Any) -> Any:
        return tensor.run_jax(jnp.cumsum, x), tensor.run_jax(jnp.cumsum, y)

    vec = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    got_x, got_y = run_local(sim, "pcall", fn, FLOAT_A, vec)
    assert_same(got_x, np.cumsum(FLOAT_A))
    assert_same(got_y, np.cumsum(vec))


def test_local_constant(sim: mp.Simulator) -> None:
    got = run_local(sim, "pcall", lambda v: v * tensor.constant(2.0) + tensor.constant(FLOAT_B),
                    FLOAT_A)
    assert_same(got, FLOAT_A * 2.0 + FLOAT_B)


# ---------------------------------------------------------------- dtypes

DTYPE_CASES = {
    "int32 + 1": (np.array([1, 2, 3, 4, 5, 6, 7], np.int32), lambda x: x + 1, "int32"),
    "1 + int32": (np.array([1, 2, 3, 4, 5, 6, 7], np.int32), lambda x: 1 + x, "int32"),
    "int32 * int32": (np.array([1, 2, 3, 4, 5, 6, 7], np.int32), lambda x: x * x, "int32"),
    "float32 * 2": (np.linspace(0, 1, 7, dtype=np.float32), lambda x: x * 2, "float32"),
    "float32 * 2.0": (np.linspace(0, 1, 7, dtype=np.float32), lambda x: x * 2.0, "float32"),
    "int32 < 3": (np.array([1, 2, 3, 4, 5, 6, 7], np.int32), lambda x: x < 3, "bool"),
    "int32 // 2": (np.array([1, 2, 3, 4, 5, 6, 7], np.int32), lambda x: x // 2, "int32"),
    "uint8 + 1 wraps": (np.array([250, 251, 252, 253, 254, 255, 0], np.uint8),
                        lambda x: x + 1, "uint8"),
    "-int32": (np.array([1, 2, 3, 4, 5, 6, 7], np.int32), lambda x: -x, "int32"),
    "float32[int]": (np.linspace(0, 1, 7, dtype=np.float32), lambda x: x[3], "float32"),
}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", list(DTYPE_CASES))
def test_result_dtype(sim: mp.Simulator, level: str, name: str) -> None:
    a, fn, dtype = DTYPE_CASES[name]

    def prog() -> Any:
        x = simp.constant(HOLDERS, a)
        return simp.pcall(HOLDERS, fn, x) if level == "pcall" else fn(x)

    out = mp.evaluate(sim, prog)
    assert out.dtype == dtype  # the traced type
    got = mp.fetch(sim, out)[0]
    assert np.asarray(got).dtype == np.dtype(dtype)  # the run-time value
    np.testing.assert_array_equal(got, fn(a))


def test_static_operands_that_compare_equal_are_not_confused(sim: mp.Simulator) -> None:
    """``1``, ``1.0`` and ``True`` hash alike but are different static operands.

    ``x + 1`` on int32 stays int32 while ``x + 1.0`` is float32, and on bools
    ``b + True`` is a logical or while ``b + 1`` counts: a cache of compiled
    functions must keep them apart (the shapes here are used by no other test).
    """
    ints = np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], dtype=np.int32)
    bools = np.array([False, True, False, True, True, False, False, True, False, True, True])

    def prog() -> Any:
        x = simp.constant((0,), ints)
        b = simp.constant((0,), bools)
        return x + 1, x + 1.0, b + 1, b + True

    out = mp.evaluate(sim, prog)
    got = [mp.fetch(sim, o)[0] for o in out]
    assert [o.dtype for o in out] == ["int32", "float32", "int32", "bool"]
    assert [g.dtype for g in got] == [np.int32, np.float32, np.int32, np.bool_]
    np.testing.assert_array_equal(got[0], ints + 1)
    np.testing.assert_array_equal(got[1], ints + 1.0)
    np.testing.assert_array_equal(got[2], bools + 1)
    np.testing.assert_array_equal(got[3], bools | True)
