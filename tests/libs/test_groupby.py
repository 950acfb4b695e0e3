"""Group-by sums, counts and means against numpy, with the keys held by a party (which
makes the digit one-hots) or secret on the device (digits from the keys' bits)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang.libs import groupby
from mplang.libs.groupby import groupby_count, groupby_mean, groupby_sum

GROUPS = 6
RNG = np.random.default_rng(3)
KEYS = RNG.integers(0, GROUPS, size=40).astype(np.int32)
KEYS[[5, 17]] = [GROUPS, -1]  # out of range: counted in no group
KEYS[KEYS == 4] = 3  # group 4 is empty
VECTOR = RNG.normal(size=40).astype(np.float32) * 5
MATRIX = RNG.normal(size=(40, 3)).astype(np.float32)
INTS = RNG.integers(-50, 50, size=40).astype(np.int32)


MIN_ROWS = 7
"""Groups of fewer rows are reported as 0: some of `KEYS`'s groups are, some are not."""


def ref_count(keys: np.ndarray, min_rows: int = 1) -> np.ndarray:
    counts = np.bincount(keys[(keys >= 0) & (keys < GROUPS)], minlength=GROUPS)
    return np.where(counts >= min_rows, counts, 0)


def ref_sum(keys: np.ndarray, values: np.ndarray, min_rows: int = 1) -> np.ndarray:
    out = np.zeros((GROUPS, *values.shape[1:]), np.float64)
    for k, v in zip(keys, values, strict=True):
        if 0 <= k < GROUPS:
            out[k] += v
    kept = ref_count(keys, min_rows) > 0
    return out * kept.reshape(-1, *[1] * (values.ndim - 1))


def ref_mean(keys: np.ndarray, values: np.ndarray, min_rows: int = 1) -> np.ndarray:
    counts = np.maximum(ref_count(keys, min_rows), 1).reshape(-1, *[1] * (values.ndim - 1))
    return ref_sum(keys, values, min_rows) / counts


def place_keys(k: Any, secret: bool) -> Any:
    """Keys on P0, or secret on SP0 (shared by P2, which then knows nothing more)."""
    if secret:
        return mp.device("SP0")(lambda x: x)(mp.put("P2", k))
    return mp.put("P0", k)


@pytest.mark.parametrize("secret", [False, True], ids=["keys_on_P0", "keys_secret"])
def test_sum_count_mean_match_numpy(sim: mp.Simulator, secret: bool) -> None:
    def prog(k: Any, v: Any, m: Any) -> Any:
        keys = place_keys(k, secret)
        vector, matrix = mp.put("P1", v), mp.put("P1", m)
        return (groupby_sum(keys, vector, GROUPS, min_rows=MIN_ROWS),
                groupby_sum(keys, matrix, GROUPS, to="P1", min_rows=MIN_ROWS),
                groupby_count(keys, GROUPS, to="P2", min_rows=MIN_ROWS),
                groupby_mean(keys, matrix, GROUPS, min_rows=MIN_ROWS))

    small = (ref_count(KEYS) > 0) & (ref_count(KEYS) < MIN_ROWS)
    assert small.any() and (ref_count(KEYS) >= MIN_ROWS).any()
    out = mp.evaluate(sim, prog, KEYS, VECTOR, MATRIX)
    assert [mp.get_dev_attr(o) for o in out] == ["P0", "P1", "P2", "P0"]
    assert sim.held(out[2])[:2] == [None, None]
    sums, sums_m, counts, means = mp.fetch(sim, out)
    np.testing.assert_allclose(sums, ref_sum(KEYS, VECTOR, MIN_ROWS), atol=2e-3)
    assert sums_m.shape == (GROUPS, 3)
    np.testing.assert_allclose(sums_m, ref_sum(KEYS, MATRIX, MIN_ROWS), atol=2e-3)
    assert counts.dtype == np.int32
    np.testing.assert_array_equal(counts, ref_count(KEYS, MIN_ROWS))
    np.testing.assert_allclose(means, ref_mean(KEYS, MATRIX, MIN_ROWS), atol=2e-3)
    np.testing.assert_array_equal(means[4], 0.0)  # the empty group
    np.testing.assert_array_equal(means[small], 0.0)  # groups of fewer than MIN_ROWS rows
    np.testing.assert_array_equal(sums[small], 0.0)


@pytest.mark.parametrize("secret", [False, True], ids=["keys_on_P0", "keys_secret"])
def test_integer_sums_are_exact(sim: mp.Simulator, secret: bool) -> None:
    out = mp.evaluate(sim, lambda k, v: groupby_sum(place_keys(k, secret), mp.put("P1", v),
                                                   GROUPS, min_rows=1), KEYS, INTS)
    sums = mp.fetch(sim, out)
    assert sums.dtype == np.int32
    np.testing.assert_array_equal(sums, ref_sum(KEYS, INTS).astype(np.int32))


@pytest.mark.parametrize("groups", [1, 2, 5, 37, 300])
def test_digit_bases_cover_every_group(groups: int) -> None:
    for binary in (False, True):
        high, low = groupby.digit_bases(groups, binary)
        assert high * low >= groups and high <= low
        if binary:
            assert high & (high - 1) == 0 and low & (low - 1) == 0
    assert groupby.digit_bases(100, False) == (10, 10)
    assert groupby.digit_bases(100, True) == (8, 16)


@pytest.mark.parametrize("secret", [False, True], ids=["keys_on_P0", "keys_secret"])
def test_many_groups_and_keys_out_of_range(sim: mp.Simulator, secret: bool) -> None:
    """37 groups (not a square, not a power of two); keys from -70 to 140, most outside."""
    keys = RNG.integers(-70, 140, size=60).astype(np.int32)
    values = RNG.normal(size=60).astype(np.float32)
    inside = (keys >= 0) & (keys < 37)

    def prog(k: Any, v: Any) -> Any:
        placed = place_keys(k, secret)
        return (groupby_sum(placed, mp.put("P1", v), 37, min_rows=1),
                groupby_count(placed, 37, min_rows=1))

    sums, counts = mp.fetch(sim, mp.evaluate(sim, prog, keys, values))
    np.testing.assert_allclose(sums, np.bincount(keys[inside], values[inside], minlength=37),
                               atol=2e-3)
    np.testing.assert_array_equal(counts, np.bincount(keys[inside], minlength=37))


def test_keys_and_values_of_one_party_and_secret_result(sim: mp.Simulator) -> None:
    """to=None keeps the sums secret; only their maximum is revealed, to P2."""
    def prog(k: Any, v: Any) -> Any:
        sums = groupby_sum(mp.put("P1", k), mp.put("P1", v), GROUPS, to=None, min_rows=1)
        counts = groupby_count(mp.put("P1", k), GROUPS, to=None, min_rows=1)
        assert mp.get_dev_attr(sums) == mp.get_dev_attr(counts) == "SP0"
        top, total = mp.device("SP0")(lambda s, c: (s.max(), c.sum()))(sums, counts)
        return mp.put("P2", top), mp.put("P2", total)

    top, total = mp.fetch(sim, mp.evaluate(sim, prog, KEYS, VECTOR))
    np.testing.assert_allclose(top, ref_sum(KEYS, VECTOR).max(), atol=2e-3)
    assert total == ref_count(KEYS).sum() == 38


def test_uint8_keys_with_many_groups(sim: mp.Simulator) -> None:
    keys = np.array([0, 255, 3, 255, 200], np.uint8)
    out = mp.evaluate(sim, lambda k: groupby_count(mp.put("P0", k), 300, min_rows=1), keys)
    expected = np.bincount(keys, minlength=300)
    np.testing.assert_array_equal(mp.fetch(sim, out), expected)


@pytest.mark.parametrize("build, match", [
    (lambda k, v: groupby_sum(mp.put("P0", v), mp.put("P1", v), GROUPS),
     r"groupby_sum: keys must be integers in \[0, num_groups\), got dtype float32; cast "
     r"them on their owner first"),
    (lambda k, v: groupby_count(mp.put("P0", k), 0),
     r"groupby_count: num_groups must be a positive int, got 0"),
    (lambda k, v: groupby_mean(mp.put("P0", k), mp.put("P1", v), GROUPS, min_rows=0),
     r"groupby_mean: min_rows must be a positive int \(groups of fewer rows are reported "
     r"as 0\), got 0"),
    (lambda k, v: groupby_sum(mp.put("P0", k), mp.put("P1", v), True),
     r"groupby_sum: num_groups must be a positive int, got True"),
    (lambda k, v: groupby_sum(mp.put("P0", k), mp.put("P1", v[:10]), GROUPS),
     r"groupby_sum: values must have one row per key: shape \(40,\) or \(40, m\), got "
     r"\(10,\)"),
    (lambda k, v: groupby_mean(mp.put("P0", k.reshape(4, 10)), mp.put("P1", v), GROUPS),
     r"groupby_mean: keys must be a vector \(one key per row\), got shape \(4, 10\)"),
    (lambda k, v: groupby_sum(k, mp.put("P1", v), GROUPS),
     r"groupby_sum: keys must be a value on a device"),
    (lambda k, v: groupby_sum(mp.put("P0", k), mp.put("P1", v), GROUPS, device="P2"),
     r"groupby_sum: device 'P2' is a PPU of one party"),
])
def test_errors_name_the_op_and_the_fix(sim: mp.Simulator, build: Any, match: str) -> None:
    with pytest.raises(mp.MPTypeError, match=match):
        mp.compile(build, KEYS, VECTOR, cluster=sim.cluster)
