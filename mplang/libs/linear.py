"""Vertical logistic regression trained on secret shares.

Several parties hold different feature columns of the same rows (aligned
beforehand, e.g. by PSI); one party holds the 0/1 labels. Training runs on a
secure device: features and labels are secret-shared into it, mini-batch
gradient descent on the logistic loss runs there, and each party receives only
the weights of its own columns. The intercept goes to the label holder: it is
the last entry of the label holder's weights when that party also holds
features, else one extra entry of the returned list (a 1-element vector on the
label holder).

Prediction: each party computes its partial score ``x_i @ w_i`` locally, the
secure device adds the scores (and applies the sigmoid or the 0.5 threshold),
and only the result is revealed to ``to``.

What leaks: the weights of a party's columns to that party (by design), the
predictions to ``to``; shapes (rows, columns per party) are public. Features,
labels and intermediate gradients stay secret-shared. Batches are taken in row
order, the same for every party (no data-dependent choice).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

import mplang as mp
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.object import MPObject
from mplang.edsl.typing import TensorType
from mplang.flows.vouched import approvable, bind
from mplang.libs.aggregation import device_value, on_party, reveal, secure_device

__all__ = ["accuracy", "predict", "predict_proba", "train_vertical_lr"]


def _party_device(op: str, x: MPObject, what: str) -> str:
    if not on_party(op, x):
        raise MPTypeError(f"{op}: {what} must be held by one party (e.g. on 'P0'), not by "
                          f"the secure device {x.device!r}")
    return x.device or ""


def _features(op: str, features: Any) -> tuple[list[MPObject], list[TensorType]]:
    if isinstance(features, MPObject) or not isinstance(features, Sequence) or not features:
        raise MPTypeError(f"{op}: features must be a non-empty list of device values, one per "
                          f"party, got {type(features).__name__}")
    types = [device_value(op, x, f"features[{i}]", min_ndim=2) for i, x in enumerate(features)]
    for i, (x, t) in enumerate(zip(features, types, strict=True)):
        if len(t.shape) != 2 or t.shape[0] != types[0].shape[0]:
            raise MPTypeError(f"{op}: features[{i}] must be a [rows, columns] matrix with the "
                              f"{types[0].shape[0]} rows of features[0], got {t.shape}")
        _party_device(op, x, f"features[{i}]")
    return list(features), types


def _positive_int(op: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MPTypeError(f"{op}: {name} must be a positive int, got {value!r}")
    return value


def _number(op: str, name: str, value: Any, allow_zero: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and (
        value > 0 or (allow_zero and value == 0))
    if not ok:
        raise MPTypeError(f"{op}: {name} must be a {'non-negative' if allow_zero else 'positive'}"
                          f" number, got {value!r}")
    return float(value)


@approvable("train_vertical_lr")
def _train(epochs: int, lr: float, batch: int, l2: float, intercept: int, y: Any,
           *xs: Any) -> tuple[Any, ...]:
    """Mini-batch gradient descent from zero weights (``batch`` 0: the full batch); the
    weights split per party (the intercept last)."""
    x = jnp.concatenate([a.astype(jnp.float32) for a in xs], axis=1)
    y = y.reshape(-1).astype(jnp.float32)
    n = x.shape[0]
    if intercept:
        x = jnp.concatenate([x, jnp.ones((n, 1), jnp.float32)], axis=1)
    d = x.shape[1]
    penalty = jnp.ones(d, jnp.float32).at[-1].set(0.0 if intercept else 1.0) * l2

    def update(w: Any, xb: Any, yb: Any) -> Any:
        error = jax.nn.sigmoid(xb @ w) - yb
        return w - lr * (xb.T @ error / xb.shape[0] + penalty * w)

    if batch == 0:  # the full batch (the row count may be known only at run time)
        w = jax.lax.fori_loop(0, epochs, lambda _, w: update(w, x, y), jnp.zeros(d, jnp.float32))
        return _split(w, xs, intercept)
    head = max(n // batch - 1, 0) * batch  # every batch has at least `batch` rows
    blocks_x = x[:head].reshape(-1, batch, d)
    blocks_y = y[:head].reshape(-1, batch)

    def epoch(_: Any, w: Any) -> Any:
        def step(i: Any, w: Any) -> Any:
            xb = jax.lax.dynamic_index_in_dim(blocks_x, i, keepdims=False)
            yb = jax.lax.dynamic_index_in_dim(blocks_y, i, keepdims=False)
            return update(w, xb, yb)

        if head:
            w = jax.lax.fori_loop(0, head // batch, step, w)
        return update(w, x[head:], y[head:])  # the last batch takes the rows left over

    w = jax.lax.fori_loop(0, epochs, epoch, jnp.zeros(d, jnp.float32))
    return _split(w, xs, intercept)


def _split(w: Any, xs: Sequence[Any], intercept: int) -> tuple[Any, ...]:
    """The weights of each party's columns (the intercept last)."""
    bounds = [0, *itertools.accumulate(a.shape[1] for a in xs)]
    return (*(w[lo:hi] for lo, hi in itertools.pairwise(bounds)),
            *((w[-1:],) if intercept else ()))


@function
def train_vertical_lr(features: Sequence[Any], labels: Any, epochs: int = 10, lr: float = 0.5,
                      device: str = "SP0", batch_size: int | None = 64, l2: float = 0.0,
                      fit_intercept: bool = True) -> list[Any]:
    """Train a logistic regression on column-split ``features`` (one ``[rows, d_i]``
    matrix per party) and 0/1 ``labels`` (``[rows]`` on one party) on ``device``.

    ``epochs`` passes of mini-batch gradient descent (``batch_size`` rows in row order,
    the last batch taking the rows left over; None: the full batch) with step ``lr`` and
    L2 penalty ``l2`` (not on the intercept), from zero weights. Returns one weight
    vector per entry of ``features``, revealed to that entry's party only; the intercept
    is appended to the label holder's weights (or, if the label holder holds no
    features, returned as one more entry). Standardize
    each party's columns first (locally): the steps assume features of unit scale.

    Policies: every step is a sum over one batch of rows, so the weights are an
    aggregate of each party's data over ``batch_size`` rows (``aggregate`` with
    ``min_rows`` at most ``batch_size``; the full batch: the row count).
    """
    op = "train_vertical_lr"
    secure_device(op, device, None)
    xs, types = _features(op, features)
    rows = types[0].shape[0]
    t = device_value(op, labels, "labels", min_ndim=1)
    if t.shape not in ((rows,), (rows, 1)):
        raise MPTypeError(f"{op}: labels must have one entry per row, shape ({rows},), got "
                          f"{t.shape}")
    owner = _party_device(op, labels, "labels")
    if batch_size is None:
        batch = 0  # the full batch, whatever the row count
    elif not isinstance(rows, int):
        raise MPTypeError(f"{op}: the row count is known only at run time ({rows}), so "
                          "mini-batches are not: pass batch_size=None (the full batch)")
    else:
        batch = min(_positive_int(op, "batch_size", batch_size), rows)
    intercept = int(bool(fit_intercept))  # static arguments a program names: ints, floats
    train = bind(_train, _positive_int(op, "epochs", epochs), _number(op, "lr", lr), batch,
                 _number(op, "l2", l2, allow_zero=True), intercept)
    parts = mp.device(device)(train)(labels, *xs)
    weights = list(parts[: len(xs)])
    if intercept:
        holder = next((i for i, x in enumerate(xs) if x.device == owner), None)
        if holder is None:
            weights.append(parts[-1])
        else:
            weights[holder] = mp.device(device)(_append)(weights[holder], parts[-1])
    owners = [x.device for x in xs] + [owner] * (len(weights) - len(xs))
    return [reveal(w, dev) for w, dev in zip(weights, owners, strict=True)]


def _append(w: Any, b: Any) -> Any:
    return jnp.concatenate([w, b])


def _partial_score(x: Any, w: Any) -> Any:
    """This party's share of the logits: ``x @ w`` (plus ``w[-1]``, the intercept, when
    ``w`` has one entry more than ``x`` has columns)."""
    x = x.astype(jnp.float32)
    score = x @ w[: x.shape[1]]
    return score + w[-1] if w.shape[0] == x.shape[1] + 1 else score


def _bias(b: Any) -> Any:
    """The intercept's share of the logits: a scalar, added to every row's."""
    return b[0].astype(jnp.float32)


def _scores(op: str, features: Any, weights: Any) -> list[Any]:
    xs, types = _features(op, features)
    if isinstance(weights, MPObject) or not isinstance(weights, Sequence) \
            or len(weights) not in (len(xs), len(xs) + 1):
        raise MPTypeError(f"{op}: weights must be the list train_vertical_lr returned: "
                          f"{len(xs)} or {len(xs) + 1} entries for {len(xs)} feature parties")
    scores = []
    for i, (x, t) in enumerate(zip(xs, types, strict=False)):
        wt = device_value(op, weights[i], f"weights[{i}]", min_ndim=1)
        features = t.shape[1]
        if not isinstance(features, int):
            raise MPTypeError(f"{op}: features[{i}] has {t.shape[1]} columns, a count known "
                              "only at run time; its columns must be known while tracing")
        if weights[i].device != x.device or wt.shape[0] not in (features, features + 1):
            raise MPTypeError(f"{op}: weights[{i}] must be the {features} (or, with the "
                              f"intercept, {features + 1}) weights of features[{i}] on "
                              f"{x.device}, got {wt.shape} on {weights[i].device}")
        scores.append(mp.device(x.device)(_partial_score)(x, weights[i]))
    if len(weights) > len(xs):
        b = weights[-1]
        bt = device_value(op, b, f"weights[{len(xs)}]", min_ndim=1)
        if bt.shape != (1,):
            raise MPTypeError(f"{op}: weights[{len(xs)}] must be the intercept, shape (1,), "
                              f"got {bt.shape}")
        scores.append(mp.device(_party_device(op, b, "the intercept"))(_bias)(b))
    return scores


@approvable("predict_proba")
def _probability(*scores: Any) -> Any:
    return jax.nn.sigmoid(sum(scores[1:], scores[0]))


@approvable("predict")
def _classes(*scores: Any) -> Any:
    return (sum(scores[1:], scores[0]) > 0).astype(jnp.int32)


@function
def predict_proba(features: Sequence[Any], weights: Sequence[Any], device: str = "SP0",
                  to: str | None = "P0") -> Any:
    """P(label = 1) per row (float32), from each party's partial score added on
    ``device``; revealed to ``to`` only (None: kept secret on ``device``, e.g. for
    `accuracy`). One value per row: each party approves it (``approve: - {library:
    mplang.libs.linear.predict_proba, to: [...]}``)."""
    op = "predict_proba"
    secure_device(op, device, to)
    return reveal(mp.device(device)(bind(_probability))(*_scores(op, features, weights)), to)


@function
def predict(features: Sequence[Any], weights: Sequence[Any], device: str = "SP0",
            to: str | None = "P0") -> Any:
    """Predicted classes (int32 0/1: logit > 0) per row, from each party's partial score
    added on ``device``; revealed to ``to`` only (None: kept secret on ``device``).
    Policies as `predict_proba`: one value per row."""
    op = "predict"
    secure_device(op, device, to)
    return reveal(mp.device(device)(bind(_classes))(*_scores(op, features, weights)), to)


@approvable("accuracy")
def _agreement(predicted: Any, labels: Any) -> Any:
    return jnp.mean(predicted == labels.reshape(-1).astype(predicted.dtype))


@function
def accuracy(predicted: Any, labels: Any, device: str = "SP0", to: str | None = "P0") -> Any:
    """The fraction of rows whose ``predicted`` class (on ``device``, e.g. `predict` with
    ``to=None``) is ``labels``' (0/1, one per row, on a party or ``device``), computed on
    ``device`` and revealed to ``to`` only: one number. Each party approves it
    (``approve: - {library: mplang.libs.linear, to: [...]}`` covers training,
    predictions and this)."""
    secure_device("accuracy", device, to)
    return reveal(mp.device(device)(bind(_agreement))(predicted, labels), to)
