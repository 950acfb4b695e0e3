"""SecureBoost: gradient-boosted decision trees over vertically split data, with PHE.

Two parties hold different feature columns of the same rows: the *active* party
(device ``P0`` by default) holds its features and the binary labels, the
*passive* party (``P1``) holds the other features. They train binary-logistic
gradient boosting (as scikit-learn's ``HistGradientBoostingClassifier``: one
``learning_rate``-shrunk tree per round, leaf value ``-G / (H + reg_lambda)``,
split gain ``GL²/(HL+λ) + GR²/(HR+λ) - G²/(H+λ)``, ``min_samples_leaf``) level by
level, in the classic SecureBoost protocol (Cheng et al., 2019):

1. each party bins its own columns into ``n_bins`` quantile bins, locally (the
   bin edges never leave it);
2. per tree, the active party computes every row's gradient and hessian,
   encrypts them under its own key (OU by default, on sf-heu) and sends the
   ciphertexts to the passive party;
3. per level, the passive party sums the ciphertexts per (node, feature, bin)
   (``phe.bucket_sum``), re-randomizes the sums (adds fresh encryptions of 0)
   and sends them with its plaintext row counts per (node, feature, bin) to the
   active party; it sums only the smaller child of each split node, the active
   party gets the larger one by subtracting it from the parent;
4. the active party decrypts, builds its own histograms in the clear, and picks
   each node's best split over both parties' features; it tells the passive
   party, for the nodes split on the passive party's features, which feature
   and bin (and nothing for the other nodes);
5. each party computes, for the nodes split on its own features, which rows go
   right, and sends these bits to the other party: both then know every row's
   node;
6. the active party computes the leaf values and updates its scores.

Who learns what (semi-honest parties; the active party's key is OU or Paillier
of ``key_bits`` bits):

* the active party learns: the per-(node, feature, bin) sums of gradients,
  hessians and row counts of the passive party's features (so the histogram of
  each passive feature within each node), every split's (party, feature, bin
  index), the rows that go to each node, and, at prediction, the passive
  party's comparison bit for every sample at every node split on the passive
  party's features (including nodes off the sample's path). It never sees the
  passive party's feature values or bin edges (thresholds).
* the passive party learns: which of its samples go to which node at every level
  (the known leakage of SecureBoost: this partition of the rows includes the
  active party's splits), which nodes are split on its own features and at
  which bin, and ciphertexts only of the gradients and hessians. It never sees
  labels, gradients, leaf values, the active party's features or thresholds, or
  predictions.
* both learn the number of rows, each other's number of features, the trees'
  shape (``max_depth``, ``n_trees``) and which nodes did not split.

Only the active party holds the leaf values and predictions (probabilities of
class 1). The histograms of step 3 reveal more than SecureBoost's minimum when
a node holds few rows (a bin with one row reveals that row's gradient); raising
``min_samples_leaf`` does not prevent it. No protection against a party that
deviates from the protocol.

On workers that enforce policies (``docs/privacy.md``), these reveals are plaintext
flows a party must allow: the passive party's histograms, counts and bits derived from
its columns go to the active party, the active party's routing bits to the passive
party, and the probabilities to whoever fetches them (``plaintext_to``, or the
program's digest in ``programs`` after review).

On a secret-sharing device (``SecureBoost(..., device="SP0")``:
`mplang.libs.secret_trees`) the same trees grow with nothing but the trees leaving the
device, and pass the policies ``mplang init`` writes once the passive party approves
``mplang.libs.secret_trees`` (its bins choose the rows of the gradients).

Why PHE and not secret sharing: each level needs, for every (node, feature, bin), the sum
of the gradients and hessians of the rows in that node whose *passive-party* bin
matches. On secret shares the bin memberships and the gradients would both be
secret: a secret (features x bins, rows) by (rows, 2 x nodes) matrix product per
level, about 10^9 secure multiplications at 10^5 rows, 320 bins and 16 nodes. With
PHE the passive party works on its own bins in the clear and does one ciphertext
addition per row and feature per level (OU: about a million a second on one
core), and the active party's own histograms are plaintext work. The price is
the reveals listed above, which are those of SecureBoost.

Results: with scikit-learn's binning (``quantile_bins``), gains and leaf values,
the trees are scikit-learn's (``max_leaf_nodes=None``, ``early_stopping=False``)
up to ties: splits whose gains agree to `_TIE` go to the lowest feature and bin,
where scikit-learn's float64 rounding may pick another (in the first tree, where
every hessian is equal, exact ties are common). Gradients are float32, encrypted
at the ``phe`` dialect's fixed-point scale 2**24.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import phe, simp, tensor
from mplang.device.cluster import ClusterSpec
from mplang.device.kinds import describe, get_kind, place
from mplang.edsl.context import ExecutionContext
from mplang.edsl.errors import MPLangError, MPTypeError
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject
from mplang.edsl.tracer import current_tracer
from mplang.edsl.typing import MPType, TensorType

mark_library(__file__)

HESSIAN_EPS = 1e-12
"""Keeps divisions by a hessian sum finite."""
_TIE = 1e-5
"""Split gains within this fraction of the best one are ties (float32 rounding noise)."""
Data = Any
"""Where a party's input comes from: a numpy array (the driver's data, a constant of
the party), a file name or a (file, member) pair in the party's data root
(``tensor.load``, read on the party's side), or an MPLang object the party holds."""


@dataclass(frozen=True)
class Params:
    """The training hyper-parameters (see `SecureBoost`)."""

    n_trees: int = 10
    max_depth: int = 3
    n_bins: int = 32
    learning_rate: float = 0.1
    reg_lambda: float = 0.0
    min_samples_leaf: int = 20
    min_child_weight: float = 1e-3
    scheme: str = "ou"
    key_bits: int = 2048
    device: str | None = None
    """None: the PHE protocol; a secure device's name: every statistic on that device
    (`mplang.libs.secret_trees`)."""

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, want: str) -> None:
            if not ok:
                raise ValueError(f"SecureBoost: {name} must be {want}, got "
                                 f"{getattr(self, name)!r}")

        need(_is_int(self.n_trees) and self.n_trees >= 1, "n_trees", "an int >= 1")
        need(_is_int(self.max_depth) and 1 <= self.max_depth <= 10, "max_depth",
             "an int in [1, 10]")
        need(_is_int(self.n_bins) and 2 <= self.n_bins <= phe.MAX_BUCKET_BINS, "n_bins",
             f"an int in [2, {phe.MAX_BUCKET_BINS}]")
        need(isinstance(self.learning_rate, int | float) and self.learning_rate > 0,
             "learning_rate", "a positive number")
        need(isinstance(self.reg_lambda, int | float) and self.reg_lambda >= 0, "reg_lambda",
             "a number >= 0")
        need(_is_int(self.min_samples_leaf) and self.min_samples_leaf >= 1,
             "min_samples_leaf", "an int >= 1")
        need(isinstance(self.min_child_weight, int | float) and self.min_child_weight >= 0,
             "min_child_weight", "a number >= 0")
        need(self.scheme in phe.SCHEMES, "scheme", f"one of {', '.join(phe.SCHEMES)}")
        need(_is_int(self.key_bits) and phe.MIN_KEY_BITS <= self.key_bits <= phe.MAX_KEY_BITS,
             "key_bits", f"an int in [{phe.MIN_KEY_BITS}, {phe.MAX_KEY_BITS}]")
        need(self.device is None or (isinstance(self.device, str) and self.device != ""),
             "device", "None or the name of a secure device")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# ---------------------------------------------------------------- local JAX steps


def quantile_bins(x: jax.Array, n_bins: int) -> tuple[jax.Array, jax.Array]:
    """Each column's ``n_bins - 1`` bin edges and every value's bin (int8), as
    scikit-learn (1.9) bins: midpoints between distinct values when a column has at most
    ``n_bins`` of them, else its percentiles by the averaged inverted CDF; a value's bin
    is the number of edges below it."""
    n = x.shape[0]
    # numpy's "averaged_inverted_cdf" percentiles: static indices and weights
    v = n * (np.linspace(0.0, 100.0, n_bins + 1)[1:-1] / 100) - 1
    low = np.floor(v)
    weight = np.where(v - low == 0, 0.5, 1.0)
    high = low + 1
    low, high = np.where(v >= n - 1, n - 1, low), np.where(v >= n - 1, n - 1, high)
    low, high = (np.clip(np.where(v < 0, 0, i), 0, max(n - 1, 0)).astype(np.int32)
                 for i in (low, high))

    def edges(col: jax.Array) -> jax.Array:
        s = jnp.sort(col)
        distinct = 1 + jnp.sum(s[1:] != s[:-1])
        values = jnp.unique(s, size=n_bins, fill_value=jnp.inf)
        mids = (values[:-1] + values[1:]) * 0.5
        a, b = s[low], s[high]
        percentiles = jnp.where(weight == 1.0, b, b - (b - a) * 0.5)
        return jnp.where(distinct <= n_bins, mids, percentiles)

    e = jax.vmap(edges, in_axes=1)(x)  # (features, n_bins - 1)
    bins = jnp.sum(x[:, :, None] > e[None, :, :], axis=2)
    return e, bins.astype(jnp.int8)


def baseline_score(y: jax.Array) -> jax.Array:
    p = jnp.clip(jnp.mean(y), 1e-7, 1 - 1e-7)
    return jnp.log(p / (1 - p))


def _start_scores(y: jax.Array, base: jax.Array) -> jax.Array:
    return jnp.full(y.shape, base, jnp.float32)


def log_loss_gradients(score: jax.Array, y: jax.Array) -> jax.Array:
    p = jax.nn.sigmoid(score)
    return jnp.stack([p - y, p * (1 - p)], axis=1)


def _zeros(n: int) -> jax.Array:
    return jnp.zeros(n, jnp.int32)


def _histograms(bins: jax.Array, group: jax.Array, gh: jax.Array, n_groups: int,
                n_bins: int) -> jax.Array:
    """(groups, features, bins, 3): sums of gradient, hessian and 1 per (group, feature,
    bin) over the rows of group ``group[i]`` (-1: none)."""
    n, features = bins.shape
    size = n_groups * features * n_bins
    index = group[:, None] * (features * n_bins) + jnp.arange(features) * n_bins + bins
    index = jnp.where(group[:, None] >= 0, index, size)  # into a dropped extra segment
    values = jnp.concatenate([gh, jnp.ones((n, 1), gh.dtype)], axis=1)
    values = jnp.broadcast_to(values[:, None, :], (n, features, 3)).reshape(-1, 3)
    sums = jax.ops.segment_sum(values, index.reshape(-1), num_segments=size + 1)
    return sums[:size].reshape(n_groups, features, n_bins, 3)


def _counts(bins: jax.Array, group: jax.Array, n_groups: int, n_bins: int) -> jax.Array:
    """(groups, features, bins): row counts per (group, feature, bin)."""
    gh = jnp.zeros((bins.shape[0], 2), jnp.float32)
    return _histograms(bins, group, gh, n_groups, n_bins)[..., 2]


def _smaller_children(node: jax.Array, n_parents: int) -> tuple[jax.Array, jax.Array]:
    """Per row, the parent index if the row is in its parent's smaller child (else -1),
    and per parent whether that child is the left one. Both parties compute it."""
    counts = jax.ops.segment_sum(jnp.ones_like(node), node, num_segments=2 * n_parents)
    left_smaller = counts[0::2] <= counts[1::2]
    small = 2 * jnp.arange(n_parents) + jnp.where(left_smaller, 0, 1)
    parent = node // 2
    return jnp.where(node == small[parent], parent, -1), left_smaller


def _children(small: jax.Array, parent: jax.Array, left_smaller: jax.Array) -> jax.Array:
    """The histograms of every child from its parent's and its smaller child's."""
    other = parent - small
    pick = left_smaller[:, None, None, None]
    left, right = jnp.where(pick, small, other), jnp.where(pick, other, small)
    return jnp.stack([left, right], axis=1).reshape((-1, *small.shape[1:]))


def _best_splits(hist0: jax.Array, hist1: jax.Array, reg_lambda: float, min_leaf: int,
                 min_weight: float) -> tuple[jax.Array, jax.Array]:
    """Per node, the best split's feature (active's first, then passive's; -1: no split
    with positive gain) and bin (rows with bin <= it go left).

    The gain ``GL²/a + GR²/b - G²/(H+λ)`` (``a = HL+λ``, ``b = HR+λ``) is computed as
    ``(GL·b - GR·a)² / (a·b·(a+b)) - λG²/((H+2λ)(H+λ))``, with left and right sums
    both summed from the bins: the same value without the cancellation of large terms.
    Gains within `_TIE` of the best are ties (often exact ones: in the first tree every
    row's hessian is the same), broken by the lowest feature, then the lowest bin
    (scikit-learn breaks exact ties by its float64 rounding, so it may pick another)."""
    h = jnp.concatenate([hist0, hist1], axis=1)  # (nodes, features, bins, 3)
    left = jnp.cumsum(h, axis=2)
    suffix = jnp.cumsum(h[:, :, ::-1], axis=2)[:, :, ::-1]  # not total - left: no cancellation
    right = jnp.concatenate([suffix[:, :, 1:], jnp.zeros_like(suffix[:, :, :1])], axis=2)
    total = left[:, :1, -1:, :]
    a, b = left[..., 1] + reg_lambda, right[..., 1] + reg_lambda
    cross = left[..., 0] * b - right[..., 0] * a
    g, hess = total[..., 0], total[..., 1]
    offset = reg_lambda * g ** 2 / jnp.maximum((hess + 2 * reg_lambda) * (hess + reg_lambda),
                                               HESSIAN_EPS)
    gain = cross ** 2 / jnp.maximum(a * b * (a + b), HESSIAN_EPS) - offset
    return chosen_splits(gain, left, right, min_leaf, min_weight, invalid=-jnp.inf, tie=_TIE,
                         min_gain=0.0)


def chosen_splits(gain: jax.Array, left: jax.Array, right: jax.Array, min_leaf: int,
                  min_weight: float, *, invalid: float, tie: float, min_gain: float
                  ) -> tuple[jax.Array, jax.Array]:
    """Per node, the feature (-1: no split gains more than ``min_gain``) and bin of the
    best split by ``gain`` (nodes, features, bins), among those leaving ``min_leaf`` rows
    and ``min_weight`` hessian on each side (``left``/``right``: their sums of gradient,
    hessian and rows; others score ``invalid``); gains within ``tie`` of the best are
    ties, which go to the lowest feature, then the lowest bin."""
    ok = (left[..., 2] >= min_leaf) & (right[..., 2] >= min_leaf) \
        & (left[..., 1] >= min_weight) & (right[..., 1] >= min_weight)
    flat = jnp.where(ok, gain, invalid).reshape(gain.shape[0], -1)
    top = jnp.max(flat, axis=1, keepdims=True)
    best = jnp.argmax(flat >= top - tie * jnp.abs(top), axis=1)  # the first of the ties
    split = top[:, 0] > min_gain
    n_bins = gain.shape[2]
    return (jnp.where(split, best // n_bins, -1).astype(jnp.int32),
            (best % n_bins).astype(jnp.int32))


def own_splits(feature: jax.Array, bin_: jax.Array, first: int, count: int
                ) -> jax.Array:
    """(nodes, 2): [feature index within the party's columns, bin] for the nodes split on
    the party's columns ``[first, first + count)``, [-1, 0] for the others."""
    mine = (feature >= first) & (feature < first + count)
    return jnp.stack([jnp.where(mine, feature - first, -1), jnp.where(mine, bin_, 0)], 1)


def _go_right(bins: jax.Array, node: jax.Array, splits: jax.Array) -> jax.Array:
    """1 where a row's node is split on this party's column and the row goes right."""
    f, b = splits[node, 0], splits[node, 1]
    value = jnp.take_along_axis(bins, jnp.maximum(f, 0)[:, None].astype(jnp.int32), 1)[:, 0]
    return ((f >= 0) & (value > b)).astype(jnp.int8)


def _advance(node: jax.Array, right_a: jax.Array, right_b: jax.Array) -> jax.Array:
    return 2 * node + (right_a | right_b).astype(jnp.int32)


def split_thresholds(edges: jax.Array, splits: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The party's model of one level: (feature or -1, threshold: go right if x > it)."""
    f, b = splits[:, 0], splits[:, 1]
    return f, jnp.where(f >= 0, edges[jnp.maximum(f, 0), b], 0.0)


def _leaves(score: jax.Array, gh: jax.Array, node: jax.Array, n_leaves: int,
            learning_rate: float, reg_lambda: float) -> tuple[jax.Array, jax.Array]:
    sums = jax.ops.segment_sum(gh, node, num_segments=n_leaves)
    leaf = -learning_rate * sums[:, 0] / jnp.maximum(sums[:, 1] + reg_lambda, HESSIAN_EPS)
    return score + leaf[node], leaf


def _active_start(bins: jax.Array, node: jax.Array, gh: jax.Array, n_nodes: int,
                  n_bins: int) -> tuple[jax.Array, jax.Array]:
    """The active party at a level's start: its own histograms and, below the root, which
    child of each split is the smaller."""
    hist = _histograms(bins, node, gh, n_nodes, n_bins)
    if n_nodes == 1:
        return hist, jnp.zeros(1, bool)
    return hist, _smaller_children(node, n_nodes // 2)[1]


def _passive_start(bins: jax.Array, node: jax.Array, n_groups: int, n_bins: int,
                   root: bool) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The passive party at a level's start: each row's group (its node at the root, else
    its parent where it is in the smaller child), the row counts, zeros to encrypt."""
    group = node if root else _smaller_children(node, n_groups)[0]
    zeros = jnp.zeros((n_groups, bins.shape[1], n_bins, 2), jnp.float32)
    return group, _counts(bins, group, n_groups, n_bins), zeros


def _active_split(sums: jax.Array, counts: jax.Array, parent: jax.Array | None,
                  left_smaller: jax.Array, hist0: jax.Array, bins: jax.Array,
                  node: jax.Array, edges: jax.Array, *, features: tuple[int, int],
                  reg_lambda: float, min_leaf: int, min_weight: float) -> tuple[jax.Array, ...]:
    """The active party once it has the passive histograms: every node's split; returns
    the passive histograms of every node, the passive party's splits, its own rows'
    go-right bits and its part of the level's model."""
    small = jnp.concatenate([sums, counts[..., None]], axis=-1)
    hist1 = small if parent is None else _children(small, parent, left_smaller)
    feature, bin_ = _best_splits(hist0, hist1, reg_lambda, min_leaf, min_weight)
    mine = own_splits(feature, bin_, 0, features[0])
    theirs = own_splits(feature, bin_, features[0], features[1])
    return (hist1, theirs, _go_right(bins, node, mine), *split_thresholds(edges, mine))


def _passive_route(bins: jax.Array, node: jax.Array, splits: jax.Array, edges: jax.Array
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The passive party's go-right bits and its part of the level's model."""
    return (_go_right(bins, node, splits), *split_thresholds(edges, splits))


def _as_float(x: jax.Array) -> jax.Array:
    return x.astype(jnp.float32)


def _concat(*levels: jax.Array) -> jax.Array:
    return jnp.concatenate(levels)


def _stack(*trees: jax.Array) -> jax.Array:
    return jnp.stack(trees)


def _decisions(x: jax.Array, feature: jax.Array, threshold: jax.Array) -> jax.Array:
    """(rows, trees, inner nodes): 1 where a node is split on this party's column and
    the row goes right."""
    value = x[:, jnp.maximum(feature, 0)]
    return ((feature >= 0) & (value > threshold)).astype(jnp.int8)


def _probabilities(right_a: jax.Array, right_b: jax.Array, leaf: jax.Array, base: jax.Array,
                   depth: int) -> jax.Array:
    go = right_a | right_b  # (rows, trees, inner nodes)
    node = jnp.zeros(go.shape[:2], jnp.int32)
    for level in range(depth):
        here = (1 << level) - 1 + node
        node = 2 * node + jnp.take_along_axis(go, here[..., None], 2)[..., 0].astype(jnp.int32)
    score = base + jnp.sum(leaf[jnp.arange(leaf.shape[0])[None, :], node], axis=1)
    return jax.nn.sigmoid(score)


# ---------------------------------------------------------------- the protocol


def _ranks(active: str, passive: str, what: str) -> tuple[int, int]:
    cluster = current_tracer(what).cluster
    if not isinstance(cluster, ClusterSpec):
        raise MPTypeError(f"{what}: the trace has no cluster; run it on mp.Simulator(cluster) "
                          "or mp.Driver, or compile with cluster=...")
    ranks = []
    for name in (active, passive):
        device = cluster.devices.get(name)
        if device is None or get_kind(device.kind).joint:
            ppus = sorted(n for n, d in cluster.devices.items() if not get_kind(d.kind).joint)
            raise MPTypeError(f"{what}: {name!r} is not a PPU of the cluster; use one of "
                              f"{', '.join(ppus)}")
        ranks.append(cluster.rank_of(device.members[0]))
    if ranks[0] == ranks[1]:
        raise MPTypeError(f"{what}: the active ({active}) and passive ({passive}) devices are "
                          "on one party; SecureBoost splits the features between two parties")
    return ranks[0], ranks[1]


def _held(x: Data, rank: int, device: str, what: str) -> MPObject:
    """Input ``x`` of party ``rank`` as a value that party holds."""
    if isinstance(x, MPObject):
        t = x.mptype
        if not isinstance(t, MPType) or t.pmask is None or rank not in t.pmask:
            raise MPTypeError(f"{what} must be held by {device} (party {rank}), got "
                              f"{describe(x)}")
        return x
    if isinstance(x, str) or (isinstance(x, tuple) and len(x) == 2):
        path, member = (x, None) if isinstance(x, str) else x
        return simp.pcall((rank,), lambda: tensor.load(path, member))
    return simp.constant((rank,), np.asarray(x))


def _shape(x: MPObject, ndim: int, what: str) -> tuple[int, ...]:
    t = x.base_type
    if not isinstance(t, TensorType) or len(t.shape) != ndim or t.dtype == "bool":
        want = "a (rows, features) matrix" if ndim == 2 else "a vector of 0/1 labels"
        raise MPTypeError(f"{what} must be {want} of numbers, got {describe(x)}")
    return t.static_shape(what)


def _at(x: MPObject, dst: int, src: int) -> MPObject:
    return simp.shuffle_static(x, {dst: src})


def run_on_party(rank: int, fn: Any, *args: Any, **static: Any) -> Any:
    return simp.pcall((rank,), lambda *a: tensor.run_jax(fn, *a, **static), *args)


ACTIVE_PARTS = ("edges0", "feature0", "threshold0", "leaf", "base")
"""What the active party keeps of a model: its bin edges (features, n_bins - 1); per tree
and inner node (heap order: node k of level l at ``2**l - 1 + k``) the feature of its own
splits (-1: not its split) and the threshold (right if x > it); the leaf values (trees,
2**max_depth); the baseline score (log-odds of the labels' mean)."""
PASSIVE_PARTS = ("edges1", "feature1", "threshold1")
"""What the passive party keeps: its bin edges, its own splits' features and thresholds."""


def _passive_histograms(c: MPObject, bins: MPObject, node: MPObject, pk: MPObject,
                        n_groups: int, n_bins: int, root: bool) -> tuple[MPObject, MPObject]:
    """The passive party's part of a level (inside its pcall): the encrypted (gradient,
    hessian) sums per (group, feature, bin), re-randomized by adding fresh encryptions of
    0 (so they are not products of the active party's own ciphertexts), and the row
    counts in plaintext."""
    group, counts, zeros = tensor.run_jax(_passive_start, bins, node, n_groups=n_groups,
                                          n_bins=n_bins, root=root)
    sums = phe.bucket_sum(c, bins, group, n_groups=n_groups, n_bins=n_bins)
    return phe.add(sums, phe.encrypt(zeros, pk)), counts


@dataclass(frozen=True)
class _Setup:
    """What every tree of one training uses: the parties' ranks, binned columns and keys."""

    params: Params
    a: int
    p: int
    n: int
    features: tuple[int, int]
    edges: tuple[MPObject, MPObject]
    bins: tuple[MPObject, MPObject]
    pk: tuple[MPObject, MPObject]
    """The active party's public key, at the active and at the passive party."""
    sk: MPObject


def _grow_tree(s: _Setup, score: MPObject, y: MPObject) -> tuple[MPObject, dict[str, MPObject]]:
    """One tree, level by level: the active party's new scores and the tree's parts."""
    a, p, nb, params = s.a, s.p, s.params.n_bins, s.params
    gh = run_on_party(a, log_loss_gradients, score, y)
    enc = _at(simp.pcall((a,), phe.encrypt, gh, s.pk[0]), p, a)
    node0, node1 = run_on_party(a, _zeros, n=s.n), run_on_party(p, _zeros, n=s.n)
    levels: dict[str, list[MPObject]] = {k: [] for k in ("feature0", "threshold0",
                                                         "feature1", "threshold1")}
    parent1: MPObject | None = None  # the active party's view of the passive histograms
    for level in range(params.max_depth):
        n_groups, root = 1 << max(level - 1, 0), level == 0  # the root, then smaller children
        hist0, left_smaller = run_on_party(a, _active_start, s.bins[0], node0, gh,
                                   n_nodes=1 << level, n_bins=nb)
        sums, counts = simp.pcall((p,), lambda c, b, v, k, ng=n_groups, r=root: (
            _passive_histograms(c, b, v, k, ng, nb, r)), enc, s.bins[1], node1, s.pk[1])
        sums = simp.pcall((a,), phe.decrypt, _at(sums, a, p), s.sk)
        parent1, splits1, right0, feat0, thr0 = run_on_party(
            a, _active_split, sums, _at(counts, a, p), parent1, left_smaller, hist0,
            s.bins[0], node0, s.edges[0], features=s.features, reg_lambda=params.reg_lambda,
            min_leaf=params.min_samples_leaf, min_weight=params.min_child_weight)
        right1, feat1, thr1 = run_on_party(p, _passive_route, s.bins[1], node1, _at(splits1, p, a),
                                   s.edges[1])
        node0 = run_on_party(a, _advance, node0, right0, _at(right1, a, p))
        node1 = run_on_party(p, _advance, node1, right1, _at(right0, p, a))
        for k, v in (("feature0", feat0), ("threshold0", thr0), ("feature1", feat1),
                     ("threshold1", thr1)):
            levels[k].append(v)
    score, leaf = run_on_party(a, _leaves, score, gh, node0, n_leaves=1 << params.max_depth,
                       learning_rate=params.learning_rate, reg_lambda=params.reg_lambda)
    tree = {k: run_on_party(a if k.endswith("0") else p, _concat, *v) for k, v in levels.items()}
    return score, {**tree, "leaf": leaf}


def train(x_active: Data, x_passive: Data, y: Data, params: Params, *, active: str = "P0",
          passive: str = "P1") -> dict[str, MPObject]:
    """Traced SecureBoost training (inside ``@mp.function``): the model, a dict of values
    each placed on the device of the party that keeps it (`ACTIVE_PARTS` on ``active``,
    `PASSIVE_PARTS` on ``passive``)."""
    what = "secureboost.train"
    a, p = _ranks(active, passive, what)
    x0 = _held(x_active, a, active, f"{what}: the active party's features")
    x1 = _held(x_passive, p, passive, f"{what}: the passive party's features")
    y = _held(y, a, active, f"{what}: the labels")
    (n, f0), (n1, f1), (ny,) = (_shape(x0, 2, f"{what}: the active party's features"),
                                _shape(x1, 2, f"{what}: the passive party's features"),
                                _shape(y, 1, f"{what}: the labels"))
    if not n == n1 == ny or n == 0 or f0 == 0 or f1 == 0:
        raise MPTypeError(f"{what}: the features and labels must have one positive number of "
                          f"rows and at least one column each, got {n}x{f0} (active), "
                          f"{n1}x{f1} (passive) and {ny} labels")
    if params.device is None:
        binning = quantile_bins
    else:
        from mplang.libs.secret_trees import grid_bins as binning
    edges0, bins0 = run_on_party(a, binning, run_on_party(a, _as_float, x0), n_bins=params.n_bins)
    edges1, bins1 = run_on_party(p, binning, run_on_party(p, _as_float, x1), n_bins=params.n_bins)
    y = run_on_party(a, _as_float, y)
    base = run_on_party(a, baseline_score, y)
    if params.device is not None:
        from mplang.libs.secret_trees import grown_on_device  # it builds on this module

        model = grown_on_device(params, (active, passive), (a, p), (edges0, edges1),
                                (bins0, bins1), y)
    else:
        model = _trained_with_phe(params, (a, p), n, (f0, f1), (edges0, edges1),
                                  (bins0, bins1), y, base)
    model.update(edges0=edges0, edges1=edges1, base=base)
    return {k: place(v, active if k in ACTIVE_PARTS else passive) for k, v in model.items()}


def _trained_with_phe(params: Params, ranks: tuple[int, int], n: int,
                      features: tuple[int, int], edges: tuple[MPObject, MPObject],
                      bins: tuple[MPObject, MPObject], y: MPObject, base: MPObject
                      ) -> dict[str, MPObject]:
    """The trees of the PHE protocol, each part held by the party that keeps it."""
    a, p = ranks
    pk, sk = simp.pcall((a,), lambda: phe.keygen(scheme=params.scheme,
                                                 key_bits=params.key_bits))
    setup = _Setup(params, a, p, n, features, edges, bins, (pk, _at(pk, p, a)), sk)
    score = run_on_party(a, _start_scores, y, base)
    trees: list[dict[str, MPObject]] = []
    for _ in range(params.n_trees):
        score, tree = _grow_tree(setup, score, y)
        trees.append(tree)
    return {k: run_on_party(a if k in ACTIVE_PARTS else p, _stack, *(t[k] for t in trees))
            for k in trees[0]}


def predict_proba(model: dict[str, Any], x_active: Data, x_passive: Data, *,
                  active: str = "P0", passive: str = "P1", device: str | None = None,
                  keep: bool = False) -> MPObject:
    """Traced prediction (inside ``@mp.function``): the probabilities of class 1, held by
    the active party (on its device). The passive party sends the active party its
    comparison bit for every row at every node split on its columns; with ``device`` (a
    secure device) both parties' bits meet there instead and only the probabilities leave
    it (`mplang.libs.secret_trees.predicted_on_device`; ``keep``: they stay secret on
    ``device``)."""
    what = "secureboost.predict_proba"
    a, p = _ranks(active, passive, what)
    missing = sorted(set(ACTIVE_PARTS + PASSIVE_PARTS) - set(model))
    if missing:
        raise MPTypeError(f"{what}: the model lacks {', '.join(missing)}; pass the dict "
                          "secureboost.train returned")
    part = {k: _held(model[k], a, active, f"{what}: model[{k!r}]") for k in ACTIVE_PARTS}
    part.update({k: _held(model[k], p, passive, f"{what}: model[{k!r}]")
                 for k in PASSIVE_PARTS})
    x0 = _held(x_active, a, active, f"{what}: the active party's features")
    x1 = _held(x_passive, p, passive, f"{what}: the passive party's features")
    (m, f0), (m1, f1) = (_shape(x0, 2, f"{what}: the active party's features"),
                         _shape(x1, 2, f"{what}: the passive party's features"))
    (t0, _), (t1, _) = (_shape(part["edges0"], 2, f"{what}: model['edges0']"),
                        _shape(part["edges1"], 2, f"{what}: model['edges1']"))
    if m != m1 or (f0, f1) != (t0, t1):
        raise MPTypeError(f"{what}: the parties must hold the same rows, with the columns the "
                          f"model was trained on ({t0} active, {t1} passive); got {m}x{f0} "
                          f"(active) and {m1}x{f1} (passive)")
    _, leaves = _shape(part["leaf"], 2, f"{what}: model['leaf']")
    right0 = run_on_party(a, _decisions, x0, part["feature0"], part["threshold0"])
    right1 = run_on_party(p, _decisions, x1, part["feature1"], part["threshold1"])
    depth = leaves.bit_length() - 1
    if device is not None:
        from mplang.libs.secret_trees import predicted_on_device  # it builds on this module

        return predicted_on_device(device, depth, (place(right0, active), place(right1, passive)),
                                   place(part["leaf"], active), place(part["base"], active),
                                   None if keep else active)
    proba = run_on_party(a, _probabilities, right0, _at(right1, a, p), part["leaf"], part["base"],
                 depth=depth)
    return place(proba, active)


# ---------------------------------------------------------------- the estimator


class SecureBoost:
    """SecureBoost binary classifier over two parties' columns (see the module doc).

    ``SecureBoost(n_trees, max_depth, n_bins=32, learning_rate=0.1)``;
    ``fit(ctx, x_active, x_passive, y)`` trains in one MPLang program on ``ctx`` (an
    ``mp.Simulator`` or ``mp.Driver`` whose cluster has PPUs ``active`` and
    ``passive``); the model stays with the parties (`model`: `ACTIVE_PARTS` on the
    active party, `PASSIVE_PARTS` on the passive one). ``predict_proba`` and ``predict``
    run a second program and return the active party's result. Inputs:
    numpy arrays (the driver's data), file names in each party's data root, or
    MPLang values the parties hold. Inside a program, in scikit-learn's style:
    `mplang.libs.estimators.SecureBoostClassifier`.
    """

    def __init__(self, n_trees: int = 10, max_depth: int = 3, n_bins: int = 32,
                 learning_rate: float = 0.1, *, reg_lambda: float = 0.0,
                 min_samples_leaf: int = 20, min_child_weight: float = 1e-3,
                 scheme: str = "ou", key_bits: int = 2048, device: str | None = None,
                 active: str = "P0", passive: str = "P1", timeout: float = 600.0):
        self.params = Params(n_trees, max_depth, n_bins, learning_rate, reg_lambda,
                             min_samples_leaf, min_child_weight, scheme, key_bits, device)
        self.active, self.passive, self.timeout = active, passive, timeout
        self.model: dict[str, MPObject] | None = None

    def fit(self, ctx: ExecutionContext, x_active: Data, x_passive: Data, y: Data
            ) -> SecureBoost:
        """Train on ``ctx``: ``x_active`` and the 0/1 labels ``y`` are the active party's,
        ``x_passive`` the passive party's (one row per sample, the same order)."""
        if isinstance(y, np.ndarray) and not np.isin(y, (0, 1)).all():
            raise ValueError("SecureBoost.fit: the labels must be 0 or 1 (binary "
                             "classification)")
        params, active, passive = self.params, self.active, self.passive

        @mp.function
        def secureboost_train(x0: Any, x1: Any, labels: Any) -> dict[str, Any]:
            return train(x0, x1, labels, params, active=active, passive=passive)

        self.model = mp.evaluate(ctx, secureboost_train, x_active, x_passive, y,
                                 timeout=self.timeout)
        return self

    def predict_proba(self, ctx: ExecutionContext, x_active: Data, x_passive: Data
                      ) -> np.ndarray:
        """The probability of class 1 for each row, computed for the active party."""
        if self.model is None:
            raise MPLangError("SecureBoost.predict_proba: the model is not trained; call "
                              "fit(ctx, x_active, x_passive, y) first")
        model, active, passive = self.model, self.active, self.passive

        @mp.function
        def secureboost_predict(m: Any, x0: Any, x1: Any) -> MPObject:
            return predict_proba(m, x0, x1, active=active, passive=passive,
                                 device=self.params.device)

        out = mp.evaluate(ctx, secureboost_predict, model, x_active, x_passive,
                          timeout=self.timeout)
        return np.asarray(mp.fetch(ctx, out))

    def predict(self, ctx: ExecutionContext, x_active: Data, x_passive: Data) -> np.ndarray:
        """The predicted class (0 or 1) of each row, computed for the active party."""
        return (self.predict_proba(ctx, x_active, x_passive) >= 0.5).astype(np.int64)


__all__: Sequence[str] = ["ACTIVE_PARTS", "PASSIVE_PARTS", "Params", "SecureBoost",
                          "predict_proba", "quantile_bins", "train"]
