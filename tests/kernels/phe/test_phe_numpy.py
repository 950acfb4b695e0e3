"""numpy habits on ciphertexts: inside a PHE device function ``c.sum()``,
``c.sum(axis=k)``, ``np.sum``, ``@`` with plaintext matrices (either side), scalar
multiplication, negation and division by numbers compute what numpy computes on the
plaintexts; what additive encryption cannot do (``jnp`` functions, comparisons,
indexing, two ciphertexts multiplied) fails naming the ops to use."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import phe
from tests.kernels.phe.test_phe_device import spec
from tests.simulators import simulated

X = np.array([1.5, -2.0, 0.25, 4.0, 3.0], dtype=np.float32)
M = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
W = np.array([[1.0, 0.5], [2.0, -1.0], [0.0, 1.0], [1.0, 1.0], [3.0, 0.0]])
V = np.array([0.5, -1.0, 2.0, 0.0, 1.0])
HABITS = ("a PHE ciphertext takes c + d, c - d, c * x, c / x, -c, c @ x and x @ c (x a "
          "plaintext; c @ x is phe.dot), c.sum() and c.sum(axis=k) (phe.sum)")


sim = simulated(spec(["node_0", "node_1"]))


def on_ciphertext(fn: Callable[..., Any], value: np.ndarray, *plain: Any) -> Any:
    """``fn(c, *plain)`` on the PHE device, ``c`` the encryption of P2's ``value``."""
    def prog() -> Any:
        x = mp.device("P2")(lambda: value)()
        out = mp.device("HE0")(fn)(mp.put("HE0", x), *plain)
        return mp.put("P0", out)

    return prog


def test_numpy_habits_compute_what_numpy_computes(sim: mp.Simulator) -> None:
    def vector(c: Any, w: Any) -> Any:
        return c.sum(), np.sum(c), c @ W, c @ V, V @ c, W.T @ c, w @ c, 3 * c, c * 0.5, \
            -c, c / 4, 2.0 - c, c.sum(axis=0), c / (w[0] + 1)

    got = mp.fetch(sim, mp.evaluate(sim, on_ciphertext(vector, X, W.T)))
    want = [X.sum(), X.sum(), X @ W, X @ V, V @ X, W.T @ X, W.T @ X, 3 * X, X * 0.5, -X,
            X / 4, 2.0 - X, X.sum(axis=0), X / (W.T[0] + 1)]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_sums_along_each_axis_of_a_ciphertext_matrix(sim: mp.Simulator) -> None:
    def matrix(c: Any) -> Any:
        return c.sum(axis=0), c.sum(axis=1), c.sum(axis=-1), np.sum(c, axis=0), c.sum(), \
            c @ np.ones((3, 2))

    got = mp.fetch(sim, mp.evaluate(sim, on_ciphertext(matrix, M)))
    want = [M.sum(axis=0), M.sum(axis=1), M.sum(axis=-1), M.sum(axis=0), M.sum(),
            M @ np.ones((3, 2))]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def test_an_integer_ciphertext_stays_exact(sim: mp.Simulator) -> None:
    xs = np.array([7, -3, 11, 2], dtype=np.int32)
    got = mp.fetch(sim, mp.evaluate(sim, on_ciphertext(
        lambda c: (c.sum(), c * 5, c @ np.array([1, 2, 3, 4], dtype=np.int32), -c), xs)))
    assert [np.asarray(g).tolist() for g in got] == [
        int(xs.sum()), (xs * 5).tolist(), int(xs @ np.array([1, 2, 3, 4])), (-xs).tolist()]


@pytest.mark.parametrize(("fn", "message"), [
    (lambda c: jnp.sum(c), f"jax.numpy does not take PHE ciphertexts: {HABITS}"),
    (lambda c: jnp.dot(c, W), f"jax.numpy does not take PHE ciphertexts: {HABITS}"),
    (lambda c: c.T, f"c.T: a PHE ciphertext has no attribute 'T'; {HABITS}"),
    (lambda c: c.mean(), f"c.mean: a PHE ciphertext has no attribute 'mean'; {HABITS}"),
    (lambda c: c > 0, f"> is not computable on a PHE ciphertext: {HABITS}; decrypt first "
                      "(mp.put to the key owner's PPU) or compute on a secure device"),
    (lambda c: c[0], f"c[...] is not computable on a PHE ciphertext: {HABITS}; decrypt first "
                     "(mp.put to the key owner's PPU) or compute on a secure device"),
    (lambda c: c @ c, f"c @ d: two ciphertexts do not multiply under additive encryption; "
                      f"{HABITS}"),
    (lambda c: 1.0 / c, f"/: nothing divides by a ciphertext under additive encryption; "
                        f"{HABITS}"),
    (lambda c: c.sum(axis=0, out=np.zeros(())),
     "c.sum: a ciphertext's sum is a new value; out= is not taken"),
])
def test_what_additive_encryption_cannot_do_names_the_ops_to_use(
        fn: Callable[[Any], Any], message: str) -> None:
    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(on_ciphertext(fn, X), cluster=spec(["node_0", "node_1"]))
    assert str(info.value).split(" (at ")[0] == f"device 'HE0' (<lambda>): {message}"
    assert "test_phe_numpy.py:" in str(info.value)


def test_a_plaintext_left_of_a_ciphertext_matrix_says_how() -> None:
    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(on_ciphertext(lambda c: np.ones((2, 4)) @ c, M),
                   cluster=spec(["node_0", "node_1"]))
    assert str(info.value).split(" (at ")[0] == (
        "device 'HE0' (<lambda>): x @ c: the ciphertext phe.ct<float32[4,3],k0,scale=2^24> is "
        "not a vector; phe.dot takes the ciphertext on the left: encrypt the transpose cT "
        "and compute (cT @ x.T), i.e. phe.dot(cT, x.T)")


def test_the_phe_ops_and_the_habits_build_the_same_program() -> None:
    cluster = spec(["node_0", "node_1"])
    ops = mp.compile(on_ciphertext(lambda c: (phe.sum(c, axis=0), phe.dot(c, W)), X),
                     cluster=cluster)
    habits = mp.compile(on_ciphertext(lambda c: (c.sum(axis=0), c @ W), X), cluster=cluster)
    assert str(ops).split("\n", 1)[1] == str(habits).split("\n", 1)[1]
