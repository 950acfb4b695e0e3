"""Estimators in scikit-learn's style over the parties' values: vertical logistic
regression (`mplang.libs.linear`) and SecureBoost (`mplang.libs.secureboost`).

``X`` is a list with one value per party (its feature columns, rows aligned), ``y``
the labels on their holder's device. ``fit(X, y)`` returns the estimator, with the
fitted model in attributes ending in ``_`` (values that stay on the parties);
``predict(X)`` and ``predict_proba(X)`` (two columns, as scikit-learn's) return values
on the device that receives them, and ``score(X, y)`` the accuracy. The methods are
traced like any MPLang function: inside ``@mp.function`` they become part of that
program (fit and predict in one program, or the fitted attributes passed to the
next); under ``with sim:`` each runs as a program of its own. Hyper-parameters are
keyword arguments of the constructor, read back by ``get_params`` and changed by
``set_params``, and checked by ``fit``.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang.edsl.errors import MPLangError, MPTypeError
from mplang.edsl.function import function
from mplang.edsl.location import mark_library
from mplang.flows.vouched import approvable, bind
from mplang.libs import linear, secureboost
from mplang.libs.aggregation import device_value, reveal

mark_library(__file__)

__all__ = ["SecureBoostClassifier", "VerticalLogisticRegression"]


class _Estimator:
    """Hyper-parameters as in scikit-learn: the constructor's keyword arguments, stored
    as attributes of the same names."""

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The hyper-parameters, by name."""
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {name: getattr(self, name) for name in names}

    def set_params(self, **params: Any) -> Any:
        """Change hyper-parameters (checked by the next ``fit``); returns the estimator."""
        known = self.get_params()
        for name, value in params.items():
            if name not in known:
                raise ValueError(f"{type(self).__name__}: unknown parameter {name!r}; its "
                                 f"parameters are {', '.join(known)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    def _fitted(self, attribute: str, method: str) -> Any:
        value = getattr(self, attribute, None)
        if value is None:
            raise MPLangError(f"{type(self).__name__}.{method}: the estimator is not fitted; "
                              "call fit(X, y) first")
        return value


def _parties(op: str, X: Any, count: int | None = None) -> list[Any]:
    if isinstance(X, mp.MPObject) or not isinstance(X, Sequence) or not X or (
            count is not None and len(X) != count):
        want = "a non-empty list" if count is None else f"a list of {count}"
        raise MPTypeError(f"{op}: X must be {want} values, one per party (its columns of "
                          f"the same rows), got {type(X).__name__}")
    return list(X)


def _two_columns(p: Any) -> Any:
    return jnp.stack([1.0 - p, p], axis=1)


@approvable("score")
def _correct(predicted: Any, y: Any) -> Any:
    return jnp.sum(predicted == y.reshape(-1).astype(predicted.dtype), dtype=jnp.int32)


def _ratio(count: Any, rows: Any) -> Any:
    return count.astype(jnp.float32) / rows  # rows an input: XLA would multiply by 1/rows


def _accuracy(device: str, to: str | None, predicted: Any, y: Any) -> Any:
    """The fraction of rows whose prediction is ``y``'s: the count made on ``device``
    (exact) and divided where it is revealed (in fixed point, a division by the row
    count would be off by about rows * 2**-19)."""
    count = reveal(mp.device(device)(bind(_correct))(predicted, y), to)
    rows = device_value("score", predicted, "the predictions").shape[0]
    if not isinstance(rows, int):
        raise MPTypeError(f"score: the row count must be known while tracing, got {rows}")
    return mp.device(to or device)(_ratio)(count, np.float32(rows))


class VerticalLogisticRegression(_Estimator):
    """Logistic regression on columns split between parties, trained on the secure
    ``device`` (`mplang.libs.linear.train_vertical_lr`: ``epochs``, ``lr``,
    ``batch_size``, ``l2``, ``fit_intercept``); predictions and scores are revealed to
    ``to`` only (None: kept secret on ``device``).

    Fitted: ``weights_`` (one weight vector per party, revealed to that party, the
    intercept with the label holder's, as `train_vertical_lr` returns),
    ``n_features_in_`` and ``classes_`` (0 and 1)."""

    def __init__(self, *, epochs: int = 10, lr: float = 0.5, batch_size: int | None = 64,
                 l2: float = 0.0, fit_intercept: bool = True, device: str = "SP0",
                 to: str | None = "P0"):
        self.epochs, self.lr, self.batch_size, self.l2 = epochs, lr, batch_size, l2
        self.fit_intercept, self.device, self.to = fit_intercept, device, to
        self.weights_: list[Any] | None = None

    def fit(self, X: Sequence[Any], y: Any) -> VerticalLogisticRegression:
        """Train on ``X`` (each party's ``[rows, columns]`` features) and the 0/1 labels
        ``y`` (``[rows]`` on one party)."""
        xs = _parties("VerticalLogisticRegression.fit", X)
        self.weights_ = linear.train_vertical_lr(
            xs, y, epochs=self.epochs, lr=self.lr, device=self.device,
            batch_size=self.batch_size, l2=self.l2, fit_intercept=self.fit_intercept)
        self.n_features_in_ = sum(int(x.shape[1]) for x in xs)
        self.classes_ = (0, 1)
        return self

    def predict(self, X: Sequence[Any]) -> Any:
        """The class of each row (int32 0 or 1), on ``to``."""
        weights = self._fitted("weights_", "predict")
        return linear.predict(_parties("VerticalLogisticRegression.predict", X), weights,
                              self.device, self.to)

    def predict_proba(self, X: Sequence[Any]) -> Any:
        """``[P(0), P(1)]`` for each row (``[rows, 2]``, float32), on ``to``."""
        weights = self._fitted("weights_", "predict_proba")
        p = linear.predict_proba(_parties("VerticalLogisticRegression.predict_proba", X),
                                 weights, self.device, self.to)
        return mp.device(self.to or self.device)(_two_columns)(p)

    def score(self, X: Sequence[Any], y: Any) -> Any:
        """The accuracy on ``X`` and labels ``y``, computed on ``device`` from predictions
        that stay there; only the accuracy is revealed to ``to``."""
        weights = self._fitted("weights_", "score")
        predicted = linear.predict(_parties("VerticalLogisticRegression.score", X), weights,
                                   self.device, None)
        return _accuracy(self.device, self.to, predicted, y)


class SecureBoostClassifier(_Estimator):
    """SecureBoost between an ``active`` party (labels, some columns) and a ``passive``
    one (other columns) (`mplang.libs.secureboost`: the published PHE protocol, or with
    ``device="SP0"`` trees grown on a secure device). ``X`` is ``[x_active,
    x_passive]``; predictions go to the active party.

    Fitted: ``model_`` (the dict `secureboost.train` returns: each part on the party
    that keeps it), ``n_features_in_`` and ``classes_`` (0 and 1)."""

    def __init__(self, *, n_trees: int = 10, max_depth: int = 3, n_bins: int = 32,
                 learning_rate: float = 0.1, reg_lambda: float = 0.0,
                 min_samples_leaf: int = 20, min_child_weight: float = 1e-3,
                 scheme: str = "ou", key_bits: int = 2048, device: str | None = None,
                 active: str = "P0", passive: str = "P1"):
        self.n_trees, self.max_depth, self.n_bins = n_trees, max_depth, n_bins
        self.learning_rate, self.reg_lambda = learning_rate, reg_lambda
        self.min_samples_leaf, self.min_child_weight = min_samples_leaf, min_child_weight
        self.scheme, self.key_bits, self.device = scheme, key_bits, device
        self.active, self.passive = active, passive
        self.model_: dict[str, Any] | None = None

    def _params(self) -> secureboost.Params:
        return secureboost.Params(self.n_trees, self.max_depth, self.n_bins,
                                  self.learning_rate, self.reg_lambda, self.min_samples_leaf,
                                  self.min_child_weight, self.scheme, self.key_bits,
                                  self.device)

    def fit(self, X: Sequence[Any], y: Any) -> SecureBoostClassifier:
        """Train on ``X = [x_active, x_passive]`` and the active party's 0/1 labels."""
        x0, x1 = _parties("SecureBoostClassifier.fit", X, 2)
        params, active, passive = self._params(), self.active, self.passive

        @function
        def secureboost_fit(a: Any, p: Any, labels: Any) -> dict[str, Any]:
            return secureboost.train(a, p, labels, params, active=active, passive=passive)

        self.model_ = secureboost_fit(x0, x1, y)
        self.n_features_in_ = int(self.model_["edges0"].shape[0]) + \
            int(self.model_["edges1"].shape[0])
        self.classes_ = (0, 1)
        return self

    def _proba(self, X: Sequence[Any], method: str, keep: bool = False) -> Any:
        model = self._fitted("model_", method)
        x0, x1 = _parties(f"SecureBoostClassifier.{method}", X, 2)
        active, passive, device = self.active, self.passive, self.device

        @function
        def secureboost_predict(m: dict[str, Any], a: Any, p: Any) -> Any:
            return secureboost.predict_proba(m, a, p, active=active, passive=passive,
                                             device=device, keep=keep)

        return secureboost_predict(model, x0, x1)

    def predict_proba(self, X: Sequence[Any]) -> Any:
        """``[P(0), P(1)]`` for each row (``[rows, 2]``), on the active party."""
        return mp.device(self.active)(_two_columns)(self._proba(X, "predict_proba"))

    def predict(self, X: Sequence[Any]) -> Any:
        """The class of each row (int32 0 or 1), on the active party."""
        return mp.device(self.active)(_classes)(self._proba(X, "predict"))

    def score(self, X: Sequence[Any], y: Any) -> Any:
        """The accuracy on ``X`` and the active party's labels ``y``, on the active
        party. With a secure ``device`` the predictions stay there and only the accuracy
        is revealed; without, the active party holds both the predictions and the
        labels."""
        if self.device is None:
            return _accuracy(self.active, None, self.predict(X), y)
        classes = mp.device(self.device)(_classes)(self._proba(X, "score", keep=True))
        return _accuracy(self.device, self.active, classes, y)


def _classes(p: Any) -> Any:
    return (p >= 0.5).astype(jnp.int32)
