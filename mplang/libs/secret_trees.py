"""SecureBoost's trees grown on a secret-sharing device: every histogram, split choice
and row routing stays secret there, and only the trees leave it.

``SecureBoost(..., device="SP0")`` (`mplang.libs.secureboost`) runs it. Each party bins
its columns locally from counts (`grid_bins`) and secret-shares its one-hot bins (the
active party also its labels); the device computes every level of every tree
(`_secret_trees`). Each party receives its own splits (feature and bin; the threshold
stays with it), the active party the leaf values.

Who learns what (the device's model: semi-honest parties, and an honest majority on
ABY3): the active party learns the leaf values and its own splits, the passive party
its own splits; both learn which nodes they did not split. Every split leaves at least
``min_samples_leaf`` rows on each side, so each leaf is a sum over that many rows and
the leaves partition the rows: the release relies on the ``aggregate`` rule of both
parties' policies with ``min_rows`` at most ``min_samples_leaf`` (the members vouch for
the function: `mplang.flows.vouched`). Successive trees partition the same rows
differently, as successive model updates do.

Split choices compare gains computed in fixed point: ties within 0.1% go to the lowest
feature and bin, and splits gaining less than ``1e-3`` are not made. Bins placed from
counts are the quantiles to within 1/1024 of a column's range, so the trees can differ
from scikit-learn's where the PHE protocol's do not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang.device.kinds import place
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject
from mplang.flows.vouched import approvable, bind, suppressing
from mplang.libs.aggregation import reveal, secure_device
from mplang.libs.secureboost import (
    HESSIAN_EPS,
    Params,
    baseline_score,
    chosen_splits,
    log_loss_gradients,
    own_splits,
    run_on_party,
    split_thresholds,
)

mark_library(__file__)

_COARSE = np.concatenate([-np.logspace(8, -8, 129), [0.0], np.logspace(-8, 8, 129)]
                         ).astype(np.float32)
"""Where `grid_bins` first counts a column's rows: 0 and ±10**k, k from -8 to 8."""
_FINE = 1024
"""How many grid points `grid_bins` counts at between a column's coarse bounds."""


def grid_bins(x: jax.Array, n_bins: int) -> tuple[jax.Array, jax.Array]:
    """Each column's ``n_bins - 1`` bin edges and every value's bin (int8), from counts
    only: the rows at or below each point of a coarse grid (`_COARSE`) bound the column,
    the rows at or below each of `_FINE` points between those bounds place the edges
    (the first point with at least ``k * n / n_bins`` rows at or below it: a quantile to
    within 1/1024 of the column's range). Edges so made are aggregates over every row
    of the column, where `quantile_bins`' are some rows' values (order statistics); a
    value's bin is the number of edges below it."""
    n = x.shape[0]
    target = jnp.ceil(jnp.arange(1, n_bins) * (n / n_bins))

    def edges(col: jax.Array) -> jax.Array:
        at_most = jnp.sum(col[:, None] <= _COARSE[None, :], axis=0)
        lo = jnp.max(jnp.where(at_most == 0, _COARSE, _COARSE[0]))
        hi = jnp.min(jnp.where(at_most == n, _COARSE, _COARSE[-1]))
        grid = lo + (hi - lo) * jnp.linspace(0.0, 1.0, _FINE + 1)[1:]
        fine = jnp.sum(col[:, None] <= grid[None, :], axis=0)
        return grid[jnp.argmax(fine[None, :] >= target[:, None], axis=1)]

    e = jnp.stack([edges(x[:, f]) for f in range(x.shape[1])])  # (features, n_bins - 1)
    bins = jnp.sum(x[:, :, None] > e[None, :, :], axis=2)
    return e, bins.astype(jnp.int8)


_MIN_GAIN = 1e-3
"""A split on the device must gain more than this: fixed-point noise is not a gain."""
_SECRET_TIE = 1e-3
"""Gains on the device within this fraction of the best one are ties: its fixed-point
divisions are accurate to about 1e-4."""


def _secret_best_splits(hist: jax.Array, reg_lambda: float, min_leaf: int,
                        min_weight: float) -> tuple[jax.Array, jax.Array]:
    """`_best_splits` in the device's fixed point: ``hist`` (nodes, features, bins, 3)
    of both parties' columns; the left sums by a product with a triangular constant (a
    running sum along the bins would be a window reduction, which the flow analysis
    does not model), the right ones by subtraction (exact in fixed point)."""
    n_bins = hist.shape[2]
    upto = (jnp.arange(n_bins)[:, None] <= jnp.arange(n_bins)[None, :]).astype(jnp.float32)
    left = jnp.einsum("kfbc,bd->kfdc", hist, upto)
    total = left[:, :1, -1:, :]
    right = total - left

    def score(s: jax.Array) -> jax.Array:
        return s[..., 0] ** 2 / jnp.maximum(s[..., 1] + reg_lambda, HESSIAN_EPS)

    gain = score(left) + score(right) - score(total)
    return chosen_splits(gain, left, right, min_leaf, min_weight, invalid=-1.0,
                         tie=_SECRET_TIE, min_gain=_MIN_GAIN)


def _one_hot_bins(bins: jax.Array, n_bins: int) -> jax.Array:
    """(rows, features * n_bins) int8: 1 at each row's bin of each column."""
    hot = bins[:, :, None].astype(jnp.int32) == jnp.arange(n_bins, dtype=jnp.int32)
    return hot.astype(jnp.int8).reshape(bins.shape[0], -1)


@suppressing(min_rows_arg=3, release="grown_on_device", partition=True)
def _secret_trees(n_trees: int, max_depth: int, n_bins: int, min_leaf: int,
                  learning_rate: float, reg_lambda: float, min_weight: float,
                  hot0: jax.Array, hot1: jax.Array, y: jax.Array
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Every tree, on secret shares, from both parties' one-hot bins (`_one_hot_bins`)
    and the labels: per level, the (node, feature, bin) sums of gradient, hessian and
    rows as one product of the one-hot matrix with the rows' node memberships, each
    node's best split, and each row's side as one product of the one-hot matrix with the
    bins right of the splits. Returns the active party's splits (trees, inner nodes, 2),
    the passive party's (the same; `own_splits`) and the leaf values (trees,
    2**max_depth).

    Every split leaves at least ``min_leaf`` rows on each side, so every leaf value is a
    sum over ``min_leaf`` rows or more (a leaf under a node that did not split is empty
    or its parent; a root of fewer rows gives 0): the leaves partition the rows, none
    suppressed. Nothing but the leaves and the split choices leaves the device."""
    in_bin = jnp.concatenate([hot0, hot1], axis=1).astype(jnp.float32)
    n, width = in_bin.shape
    features, active_features = width // n_bins, hot0.shape[1] // n_bins
    above = (jnp.arange(n_bins)[:, None] < jnp.arange(n_bins)[None, :]).astype(jnp.float32)
    y = y.astype(jnp.float32)
    score = jnp.zeros((n,), jnp.float32) + baseline_score(y)
    trees: list[tuple[jax.Array, jax.Array, jax.Array]] = []
    for _ in range(n_trees):
        gh = log_loss_gradients(score, y)
        weights = jnp.concatenate([gh, jnp.ones((n, 1), jnp.float32)], axis=1)
        member = jnp.ones((n, 1), jnp.float32)
        splits0, splits1 = [], []
        for _level in range(max_depth):
            nodes = member.shape[1]
            weighted = (member[:, :, None] * weights[:, None, :]).reshape(n, nodes * 3)
            hist = (in_bin.T @ weighted).reshape(features, n_bins, nodes, 3)
            feature, bin_ = _secret_best_splits(hist.transpose(2, 0, 1, 3), reg_lambda,
                                                min_leaf, min_weight)
            chosen = ((jnp.arange(width)[None, :] == (feature * n_bins + bin_)[:, None])
                      & (feature >= 0)[:, None]).astype(jnp.float32)
            # a row goes right of a split at bin b when its bin of that column is above b
            right_of = (chosen.reshape(nodes, features, n_bins) @ above).reshape(nodes, width)
            right = in_bin @ right_of.T  # (rows, nodes)
            member = jnp.stack([member * (1 - right), member * right], axis=2
                               ).reshape(n, 2 * nodes)
            splits0.append(own_splits(feature, bin_, 0, active_features))
            splits1.append(own_splits(feature, bin_, active_features,
                                       features - active_features))
        sums = member.T @ weights
        leaf = -learning_rate * sums[:, 0] / jnp.maximum(sums[:, 1] + reg_lambda, HESSIAN_EPS)
        leaf = jnp.where(sums[:, 2] >= min_leaf, leaf, 0.0)  # all rows, if fewer than min_leaf
        score = score + member @ leaf
        trees.append((jnp.concatenate(splits0), jnp.concatenate(splits1), leaf))
    return tuple(jnp.stack([t[i] for t in trees]) for i in range(3))  # type: ignore[return-value]


def _tree_thresholds(edges: jax.Array, splits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`split_thresholds` of every tree: splits (trees, inner nodes, 2)."""
    feature, threshold = split_thresholds(edges, splits.reshape(-1, 2))
    return feature.reshape(splits.shape[:2]), threshold.reshape(splits.shape[:2])


def grown_on_device(params: Params, devices: tuple[str, str], ranks: tuple[int, int],
                    edges: tuple[MPObject, MPObject], bins: tuple[MPObject, MPObject],
                    y: MPObject) -> dict[str, MPObject]:
    """The trees grown on the secure device ``params.device`` (`_secret_trees`) from
    each party's bins and ``edges``: each party receives its own splits and keeps their
    thresholds, the active party the leaves (the parts of `secureboost.train`)."""
    device = params.device
    assert device is not None
    secure_device("secureboost.train", device, None)
    (active, passive), (a, p) = devices, ranks
    trees = bind(_secret_trees, params.n_trees, params.max_depth, params.n_bins,
                 params.min_samples_leaf, float(params.learning_rate),
                 float(params.reg_lambda), float(params.min_child_weight))
    hot0 = run_on_party(a, _one_hot_bins, bins[0], n_bins=params.n_bins)
    hot1 = run_on_party(p, _one_hot_bins, bins[1], n_bins=params.n_bins)
    splits0, splits1, leaf = mp.device(device)(trees)(
        place(hot0, active), place(hot1, passive), place(y, active))
    feature0, threshold0 = run_on_party(a, _tree_thresholds, edges[0], mp.put(active, splits0))
    feature1, threshold1 = run_on_party(p, _tree_thresholds, edges[1], mp.put(passive, splits1))
    return {"feature0": feature0, "threshold0": threshold0, "feature1": feature1,
            "threshold1": threshold1, "leaf": mp.put(active, leaf)}


@approvable("predicted_on_device")
def _device_probabilities(depth: int, right_a: jax.Array, right_b: jax.Array,
                          leaf: jax.Array, base: jax.Array) -> jax.Array:
    """`secureboost._probabilities` without secret indices: each row's leaf as a product
    of its sides level by level (a node is split by one party, so the bits add)."""
    go = right_a.astype(jnp.float32) + right_b.astype(jnp.float32)  # (rows, trees, nodes)
    member = jnp.ones((*go.shape[:2], 1), jnp.float32)
    for level in range(depth):
        side = go[:, :, (1 << level) - 1:(2 << level) - 1]
        member = jnp.stack([member * (1 - side), member * side], axis=3
                           ).reshape(*go.shape[:2], -1)
    return jax.nn.sigmoid(base + jnp.sum(member * leaf[None], axis=(1, 2)))


def predicted_on_device(device: str, depth: int, right: tuple[MPObject, MPObject],
                        leaf: MPObject, base: MPObject, to: str | None) -> MPObject:
    """The probabilities of class 1 computed on the secure ``device`` from each party's
    bits (``right``: which rows go right at the nodes split on its columns, placed on its
    device) and the active party's ``leaf`` and ``base``; revealed to ``to`` only (None:
    kept secret on ``device``). One value per row of the passive party's columns: the
    passive party approves it (``mplang.libs.secret_trees`` covers training and this)."""
    secure_device("secureboost.predict_proba", device, to)
    return reveal(mp.device(device)(bind(_device_probabilities, depth))(
        *right, leaf, base), to)


__all__ = ["grid_bins", "grown_on_device", "predicted_on_device"]
