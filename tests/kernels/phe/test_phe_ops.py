"""The phe dialect's ops on sf-heu, checked against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import phe, simp
from tests.kernels.phe.conftest import KEY_BITS

RNG = np.random.default_rng(7)
F = RNG.normal(size=(3, 4)).round(3)
W = RNG.normal(size=(4,)).round(3)
M = RNG.normal(size=(4, 2)).round(3)
INTS = RNG.integers(-1000, 1000, size=(3, 4)).astype(np.int64)


def run_he(sim: mp.Simulator, body: Any, x: np.ndarray, scheme: str = "paillier") -> list[Any]:
    """Party 0 makes the keys; party 1 encrypts ``x`` and runs ``body(c)``; party 0
    decrypts every output."""
    @mp.function
    def prog() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(scheme=scheme, key_bits=KEY_BITS))
        value = simp.constant((1,), x)
        pk1 = simp.shuffle_static(pk, {1: 0})
        outs = simp.pcall((1,), lambda v, k: body(phe.encrypt(v, k)), value, pk1)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return [simp.pcall((0,), phe.decrypt, simp.shuffle_static(o, {0: 1}), sk)
                for o in outs]

    return [r[0] for r in mp.fetch(sim, mp.evaluate(sim, prog))]


def test_float_arithmetic_matches_numpy(sim2: mp.Simulator) -> None:
    got = run_he(sim2, lambda c: (phe.add(c, c), c + 1.5, 2.0 - c, c - c, phe.mul_plain(c, F),
                                  c * 3, c * 1.5 + c), F)
    want = [F + F, F + 1.5, 2.0 - F, F - F, F * F, F * 3, F * 2.5]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-5)
        assert g.dtype == np.float32  # a float64 constant is float32 in the program


def test_sums_and_dots_match_numpy(sim2: mp.Simulator) -> None:
    got = run_he(sim2, lambda c: (phe.sum(c), phe.sum(c, axis=0), phe.sum(c, axis=1),
                                  phe.sum(c, axis=-1), phe.dot(c, W), phe.dot(c, M)), F)
    want = [F.sum(), F.sum(0), F.sum(1), F.sum(-1), F @ W, F @ M]
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, atol=1e-4)


def test_vector_dot_and_scalar_results(sim2: mp.Simulator) -> None:
    v = F[0]
    got = run_he(sim2, lambda c: (phe.dot(c, W), phe.dot(c, M), phe.sum(c, axis=0)), v)
    for g, w in zip(got, [v @ W, v @ M, v.sum()], strict=True):
        assert g.shape == np.shape(w)
        np.testing.assert_allclose(g, w, atol=1e-4)


def test_integer_arithmetic_is_exact(sim2: mp.Simulator) -> None:
    weights = np.arange(12, dtype=np.int64).reshape(3, 4) - 5
    got = run_he(sim2, lambda c: (c + c, c * weights, phe.sum(c, axis=0), c * 7 - 3,
                                  phe.dot(c, np.arange(4, dtype=np.int64))), INTS)
    want = [INTS + INTS, INTS * weights, INTS.sum(0), INTS * 7 - 3, INTS @ np.arange(4)]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.int32  # an int64 constant is int32 in the program
        np.testing.assert_array_equal(g, w)


def test_higher_rank_elementwise_and_total_sum(sim2: mp.Simulator) -> None:
    x = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    got = run_he(sim2, lambda c: (c + x, phe.sum(c)), x)
    np.testing.assert_array_equal(got[0], 2 * x)
    assert got[1] == x.sum() and got[1].dtype == np.int32


def test_ou_scheme(sim2: mp.Simulator) -> None:
    got = run_he(sim2, lambda c: (c + c, phe.sum(c)), INTS, scheme="ou")
    np.testing.assert_array_equal(got[0], 2 * INTS)
    assert got[1] == INTS.sum()


def test_scales_are_tracked_in_the_type() -> None:
    """1.5 x 1.5 decrypts as 2.25: the product's scale is the factors' product."""
    seen = {}

    @mp.function
    def prog() -> Any:
        pk, _ = simp.pcall((0,), lambda: phe.keygen(key_bits=KEY_BITS))

        def body(k: Any) -> Any:
            c = phe.encrypt(np.float64(1.5), k)
            p = c * 1.5
            seen["c"], seen["p"] = c.base_type, p.base_type
            return p

        return simp.pcall((0,), body, pk)

    mp.compile(prog, world_size=1)
    assert seen["c"] == phe.Ciphertext("float32", (), "k0", 1 << 24)
    assert seen["p"] == phe.Ciphertext("float32", (), "k0", 1 << 48)
    assert str(seen["p"]) == "phe.ct<float32[],k0,scale=2^48>"


def test_one_point_five_squared(sim2: mp.Simulator) -> None:
    got = run_he(sim2, lambda c: c * 1.5, np.float64(1.5))
    assert got[0] == pytest.approx(2.25)
