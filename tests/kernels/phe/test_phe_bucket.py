"""``phe.bucket_sum``: encrypted histograms per (group, feature, bin), checked against numpy."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import phe, simp
from mplang.edsl.errors import MPRuntimeError, MPTypeError
from tests.kernels.phe.conftest import KEY_BITS
from tests.op_failures import assert_generic, logged_failure, traced_at

RNG = np.random.default_rng(11)
N, F, B, G = 40, 3, 5, 3
VALUES = RNG.normal(size=(N, 2)).round(4)
BINS = RNG.integers(0, B, size=(N, F)).astype(np.int8)
GROUPS = RNG.integers(-1, G, size=N).astype(np.int32)


def histograms(values: np.ndarray, bins: np.ndarray, groups: np.ndarray | None, n_groups: int,
               n_bins: int) -> np.ndarray:
    """The plaintext reference: out[g, f, b] = sum of values[i] with groups[i] == g and
    bins[i, f] == b."""
    groups = np.zeros(len(values), np.int64) if groups is None else groups
    out = np.zeros((n_groups, bins.shape[1], n_bins, *values.shape[1:]))
    for i in range(len(values)):
        if groups[i] >= 0:
            for f in range(bins.shape[1]):
                out[groups[i], f, bins[i, f]] += values[i]
    return out


def run_bucket_sum(sim: mp.Simulator, values: np.ndarray, bins: np.ndarray,
                   groups: np.ndarray | None, n_groups: int, n_bins: int,
                   scheme: str = "ou") -> Any:
    """Party 0 encrypts ``values``; party 1 holds ``bins`` and ``groups`` and sums; party 0
    decrypts the histograms."""
    @mp.function
    def prog() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(scheme=scheme, key_bits=KEY_BITS))
        x = simp.constant((0,), values)
        c = simp.shuffle_static(simp.pcall((0,), phe.encrypt, x, pk), {1: 0})
        b = simp.constant((1,), bins)
        extra = () if groups is None else (simp.constant((1,), groups),)
        h = simp.pcall((1,), lambda c, b, *g: phe.bucket_sum(  # @bucket_sum
            c, b, *g, n_groups=n_groups, n_bins=n_bins), c, b, *extra)
        return simp.pcall((0,), phe.decrypt, simp.shuffle_static(h, {0: 1}), sk)

    return mp.fetch(sim, mp.evaluate(sim, prog))[0]


def test_matrix_rows_per_group_feature_and_bin(sim2: mp.Simulator) -> None:
    got = run_bucket_sum(sim2, VALUES, BINS, GROUPS, G, B)
    want = histograms(VALUES, BINS, GROUPS, G, B)
    assert got.shape == (G, F, B, 2)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_vector_integers_are_exact_and_paillier_agrees(sim2: mp.Simulator) -> None:
    ints = RNG.integers(-1000, 1000, size=N).astype(np.int64)
    want = histograms(ints, BINS, GROUPS, G, B)
    for scheme in ("ou", "paillier"):
        got = run_bucket_sum(sim2, ints, BINS, GROUPS, G, B, scheme=scheme)
        assert got.shape == (G, F, B) and got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_without_groups_every_row_is_in_group_zero(sim2: mp.Simulator) -> None:
    got = run_bucket_sum(sim2, VALUES, BINS, None, 1, B)
    np.testing.assert_allclose(got, histograms(VALUES, BINS, None, 1, B), atol=1e-5)


def test_empty_groups_and_buckets_are_zero(sim2: mp.Simulator) -> None:
    groups = np.full(N, -1, np.int32)
    groups[:4] = 1  # group 0 and 2 are empty
    got = run_bucket_sum(sim2, VALUES, BINS, groups, G, B + 2)  # bins B, B+1 are empty
    want = histograms(VALUES, BINS, groups, G, B + 2)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert not got[0].any() and not got[2].any() and not got[..., B:, :].any()


def test_no_rows(sim2: mp.Simulator) -> None:
    got = run_bucket_sum(sim2, np.zeros((0, 2)), np.zeros((0, F), np.int8),
                         np.zeros(0, np.int32), 2, B)
    np.testing.assert_array_equal(got, np.zeros((2, F, B, 2), np.float32))


def test_the_type_names_shape_key_and_scale() -> None:
    seen = {}

    @mp.function
    def prog() -> Any:
        pk, _ = simp.pcall((0,), lambda: phe.keygen(key_bits=KEY_BITS))

        def body(k: Any) -> Any:
            h = phe.bucket_sum(phe.encrypt(VALUES, k), BINS, GROUPS, n_groups=G, n_bins=B)
            seen["h"] = h.base_type
            return h

        return simp.pcall((0,), body, pk)

    mp.compile(prog, world_size=1)
    assert seen["h"] == phe.Ciphertext("float32", (G, F, B, 2), "k0", phe.FLOAT_SCALE)


def _compile_body(body: Any) -> None:
    @mp.function
    def prog() -> Any:
        pk, _ = simp.pcall((0,), lambda: phe.keygen(key_bits=KEY_BITS))
        return simp.pcall((0,), body, pk)

    mp.compile(prog, world_size=1)


@pytest.mark.parametrize(("body", "message"), [
    (lambda k: phe.bucket_sum(VALUES, BINS, n_bins=B),
     r"phe\.bucket_sum: operand c must be a PHE ciphertext, got f32\[40,2\]"),
    (lambda k: phe.bucket_sum(phe.encrypt(np.zeros((2, 2, 2)), k), np.zeros((2, 1), np.int8),
                              n_bins=B),
     r"phe\.bucket_sum: sums the rows of a ciphertext vector \(n\) or matrix \(n, k\), got "
     r"phe\.ct<float32\[2,2,2\]"),
    (lambda k: phe.bucket_sum(phe.encrypt(VALUES, k), BINS[:5], n_bins=B),
     r"phe\.bucket_sum: the bins must be an integer matrix of shape \[40, features\]"),
    (lambda k: phe.bucket_sum(phe.encrypt(VALUES, k), BINS.astype(np.float32), n_bins=B),
     r"phe\.bucket_sum: operand bins must be an integer tensor, got f32\[40,3\]"),
    (lambda k: phe.bucket_sum(phe.encrypt(VALUES, k), BINS, GROUPS[:3], n_groups=G, n_bins=B),
     r"phe\.bucket_sum: the group ids must be an integer vector of shape \[40\] \(-1: in no "
     r"group\)"),
    (lambda k: phe.bucket_sum(phe.encrypt(VALUES, k), BINS, n_bins=128),
     r"phe\.bucket_sum: attribute 'n_bins' must lie in \[1, 127\], got 128"),
    (lambda k: phe.bucket_sum(phe.encrypt(VALUES, k), BINS, n_groups=0, n_bins=B),
     r"phe\.bucket_sum: attribute 'n_groups' must lie in \[1, 65536\], got 0"),
])
def test_type_errors_name_the_op(body: Any, message: str) -> None:
    with pytest.raises(MPTypeError, match=message):
        _compile_body(body)


def test_out_of_range_indices_are_run_time_errors(sim2: mp.Simulator,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The indices are party 1's data: the driver hears that the op failed on party 1,
    party 1's log says why."""
    at = traced_at(__file__, "bucket_sum")
    for n_groups, n_bins, reason in [
            (G, B - 1, r"every bin index must lie in \[0, 4\), found 4"),
            (G - 1, B, r"every group id must lie in \[-1, 2\), found 2")]:
        caplog.clear()
        with pytest.raises(MPRuntimeError) as info:
            run_bucket_sum(sim2, VALUES, BINS, GROUPS, n_groups, n_bins)
        assert_generic(info.value, "phe.bucket_sum", at, 1)
        assert re.match(rf"MPRuntimeError: party 1: op phe\.bucket_sum: {reason} ",
                        logged_failure(caplog, "phe.bucket_sum", at, "node_1"))
