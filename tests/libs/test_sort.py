"""Secure sort, argsort and top-k against numpy: ties, descending order, several
parties' parts, matrices, integers, the two-party device, and the errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang.libs.sort import argsort, sort, sort_with_indices, top_k

RNG = np.random.default_rng(11)
TIES = RNG.integers(0, 6, size=15).astype(np.float32) - 2.5  # many ties
FLOATS = RNG.normal(size=(3, 9)).astype(np.float32) * 100
PART = RNG.normal(size=(3, 4)).astype(np.float32)
INTS = RNG.integers(-(2**20), 2**20, size=12).astype(np.int32)


def descending_order(x: np.ndarray) -> np.ndarray:
    """Positions of ``x`` by decreasing value, the earlier position first among ties."""
    return np.argsort(-x, axis=-1, stable=True)


def test_sort_and_argsort_match_numpy_with_ties(sim: mp.Simulator) -> None:
    def prog(a: Any) -> Any:
        x = mp.put("P1", a)
        return (sort(x), argsort(x, to="P2"), sort(x, descending=True),
                argsort(x, descending=True), sort_with_indices(x, to="P1"))

    out = mp.evaluate(sim, prog, TIES)
    assert mp.get_dev_attr(out[1]) == "P2" and sim.held(out[1])[:2] == [None, None]
    up, up_index, down, down_index, (both, both_index) = mp.fetch(sim, out)
    np.testing.assert_allclose(up, np.sort(TIES), atol=1e-4)
    np.testing.assert_array_equal(up_index, np.argsort(TIES, stable=True))
    np.testing.assert_allclose(down, np.sort(TIES)[::-1], atol=1e-4)
    np.testing.assert_array_equal(down_index, descending_order(TIES))
    np.testing.assert_allclose(both, up, atol=1e-4)
    np.testing.assert_array_equal(both_index, up_index)
    assert up_index.dtype == np.int32


def test_matrix_rows_joined_from_two_parties(sim: mp.Simulator) -> None:
    """P0's [3, 9] and P1's [3, 4] are joined into [3, 13]; each row is sorted."""
    joined = np.concatenate([FLOATS, PART], axis=1)

    def prog(a: Any, b: Any) -> Any:
        parts = [mp.put("P0", a), mp.put("P1", b)]
        return sort_with_indices(parts, descending=True), top_k(parts, 5, to="P2")

    (values, index), (top, top_index) = mp.fetch(sim, mp.evaluate(sim, prog, FLOATS, PART))
    order = descending_order(joined)
    np.testing.assert_array_equal(index, order)
    np.testing.assert_allclose(values, np.take_along_axis(joined, order, -1), atol=1e-3)
    np.testing.assert_array_equal(top_index, order[:, :5])
    np.testing.assert_allclose(top, values[:, :5], atol=1e-3)


def test_top_k_matches_numpy_with_ties_and_integers(sim: mp.Simulator) -> None:
    def prog(a: Any, b: Any) -> Any:
        return top_k(mp.put("P0", a), 4), top_k(mp.put("P1", b), 12), sort(mp.put("P1", b))

    (values, index), (ints, ints_index), ints_sorted = mp.fetch(
        sim, mp.evaluate(sim, prog, TIES, INTS))
    np.testing.assert_array_equal(index, descending_order(TIES)[:4])
    np.testing.assert_allclose(values, TIES[descending_order(TIES)[:4]], atol=1e-4)
    assert ints.dtype == np.int32 and ints_sorted.dtype == np.int32
    np.testing.assert_array_equal(ints, np.sort(INTS)[::-1])
    np.testing.assert_array_equal(ints_index, descending_order(INTS))
    np.testing.assert_array_equal(ints_sorted, np.sort(INTS))


def test_secret_result_composes(sim: mp.Simulator) -> None:
    """The median of two parties' values: sorted on shares, only the middle one revealed."""
    def prog(a: Any, b: Any) -> Any:
        ordered = sort([mp.put("P0", a), mp.put("P1", b)], to=None)
        assert mp.get_dev_attr(ordered) == "SP0"
        return mp.put("P0", mp.device("SP0")(lambda s: s[s.shape[0] // 2])(ordered))

    median = mp.fetch(sim, mp.evaluate(sim, prog, FLOATS[0], FLOATS[1][:8]))
    np.testing.assert_allclose(median, np.median(np.concatenate([FLOATS[0], FLOATS[1][:8]])),
                               atol=1e-3)


def test_two_party_device(sim2: mp.Simulator) -> None:
    """CHEETAH sorts with a sorting network (not stable): ties still follow positions."""
    x = TIES[:6]
    out = mp.evaluate(sim2, lambda a: sort_with_indices(mp.put("P0", a), to="P1"), x)
    values, index = mp.fetch(sim2, out)
    np.testing.assert_array_equal(index, np.argsort(x, stable=True))
    np.testing.assert_allclose(values, np.sort(x), atol=1e-4)


@pytest.mark.parametrize("build, match", [
    (lambda a: top_k(mp.put("P0", a), 0), r"top_k: k must be an int in 1\.\.15 \(the length "
                                          r"of the last axis\), got 0"),
    (lambda a: top_k(mp.put("P0", a), 16), r"top_k: k must be an int in 1\.\.15"),
    (lambda a: top_k([mp.put("P0", a), mp.put("P1", a)], 31), r"top_k: k must be an int in "
                                                              r"1\.\.30"),
    (lambda a: sort(mp.put("P0", a[0])), r"sort: x must have at least 1 dimension\(s\), got "
                                         r"shape \(\)"),
    (lambda a: argsort([mp.put("P0", a), mp.put("P1", a.reshape(3, 5))]),
     r"argsort: parts are joined along the last axis, so their other dimensions must agree; "
     r"got shapes \(15,\), \(3, 5\)"),
    (lambda a: sort(mp.put("P0", a), descending=1), r"sort: descending must be True or False, "
                                                    r"got 1"),
    (lambda a: sort([]), r"sort: x must be a device value or a non-empty list of them"),
    (lambda a: sort(a), r"sort: x must be a value on a device"),
    (lambda a: sort(mp.put("P0", a), to="SP0"), r"sort: to='SP0' is a SPU device"),
])
def test_errors_name_the_op_and_the_fix(sim: mp.Simulator, build: Any, match: str) -> None:
    with pytest.raises(mp.MPTypeError, match=match):
        mp.compile(build, TIES, cluster=sim.cluster)
