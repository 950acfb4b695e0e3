"""Vertical logistic regression on secret shares against the same algorithm in numpy
and against scikit-learn's LogisticRegression; who receives which weights; errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split

import mplang as mp
from mplang.libs.linear import predict, predict_proba, train_vertical_lr

X, Y = make_classification(n_samples=800, n_features=20, n_informative=8, random_state=0)
X_TRAIN, X_TEST, Y_TRAIN, Y_TEST = (a.astype(np.float32) for a in train_test_split(
    X, Y, test_size=0.25, random_state=0))
EPOCHS, LR, BATCH = 8, 0.5, 64


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def numpy_reference(x: np.ndarray, y: np.ndarray, epochs: int, lr: float,
                    batch: int) -> np.ndarray:
    """The documented algorithm in float64: mini-batches in row order, the last one
    taking the rows left over (so none has fewer than ``batch`` rows), from zero, the
    intercept as the last weight."""
    x = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(x.shape[1])
    head = max(len(x) // batch - 1, 0) * batch
    starts = [*range(0, head, batch), head]
    for _ in range(epochs):
        for lo, hi in zip(starts, [*starts[1:], len(x)], strict=True):
            xb, yb = x[lo:hi], y[lo:hi]
            w -= lr * xb.T @ (sigmoid(xb @ w) - yb) / len(xb)
    return w


def split(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return x[:, :10], x[:, 10:]


def test_matches_numpy_and_sklearn(sim: mp.Simulator) -> None:
    """P0 holds columns 0-9, P1 columns 10-19 and the labels: P1 gets the intercept."""
    def prog(a0: Any, a1: Any, y: Any, t0: Any, t1: Any) -> Any:
        weights = train_vertical_lr([mp.put("P0", a0), mp.put("P1", a1)], mp.put("P1", y),
                                    epochs=EPOCHS, lr=LR, batch_size=BATCH)
        test = [mp.put("P0", t0), mp.put("P1", t1)]
        return weights, predict(test, weights, to="P1"), predict_proba(test, weights)

    weights, classes, proba = mp.evaluate(sim, prog, *split(X_TRAIN), Y_TRAIN, *split(X_TEST))
    assert [mp.get_dev_attr(w) for w in weights] == ["P0", "P1"]
    assert sim.held(weights[0])[1:] == [None, None]  # P0's weights reach P0 only
    assert sim.held(weights[1])[0] is None and sim.held(weights[1])[2] is None
    w0, w1 = mp.fetch(sim, weights)
    assert w0.shape == (10,) and w1.shape == (11,)  # P1: its 10 weights and the intercept
    w = np.concatenate([w0, w1])
    np.testing.assert_allclose(w, numpy_reference(X_TRAIN, Y_TRAIN, EPOCHS, LR, BATCH),
                               atol=0.02)

    classes, proba = mp.fetch(sim, classes), mp.fetch(sim, proba)
    assert classes.dtype == np.int32 and set(np.unique(classes)) <= {0, 1}
    np.testing.assert_allclose(proba, sigmoid(X_TEST @ w[:-1] + w[-1]), atol=5e-3)
    np.testing.assert_array_equal(classes, (X_TEST @ w[:-1] + w[-1] > 0).astype(np.int32))
    accuracy = np.mean(classes == Y_TEST)
    sklearn = LogisticRegression().fit(X_TRAIN, Y_TRAIN).score(X_TEST, Y_TEST)
    assert accuracy > 0.8 and abs(accuracy - sklearn) <= 0.03, (accuracy, sklearn)


def test_full_batch_without_intercept_and_labels_on_a_third_party(sim: mp.Simulator) -> None:
    """Labels on P2, which holds no features: with an intercept it gets a third entry."""
    x, y = X_TRAIN[:200], Y_TRAIN[:200]

    def prog(a0: Any, a1: Any, labels: Any) -> Any:
        features = [mp.put("P0", a0), mp.put("P1", a1)]
        bare = train_vertical_lr(features, mp.put("P2", labels), epochs=5, lr=1.0,
                                 batch_size=None, fit_intercept=False)
        full = train_vertical_lr(features, mp.put("P2", labels), epochs=5, lr=1.0,
                                 batch_size=None)
        return bare, full, predict(features, full, to="P2")

    bare, full, classes = mp.evaluate(sim, prog, *split(x), y)
    assert [mp.get_dev_attr(w) for w in full] == ["P0", "P1", "P2"]
    bare, full, classes = mp.fetch(sim, (bare, full, classes))
    assert [w.shape for w in bare] == [(10,), (10,)]
    assert [w.shape for w in full] == [(10,), (10,), (1,)]
    reference = numpy_reference(x, y, 5, 1.0, len(x))
    np.testing.assert_allclose(np.concatenate(full), reference, atol=0.02)
    w = np.concatenate(full)
    np.testing.assert_array_equal(classes, (x @ w[:-1] + w[-1] > 0).astype(np.int32))


@pytest.mark.parametrize("build, match", [
    (lambda a, y: train_vertical_lr(mp.put("P0", a), mp.put("P1", y)),
     r"train_vertical_lr: features must be a non-empty list of device values, one per party"),
    (lambda a, y: train_vertical_lr([mp.put("P0", a), mp.put("P1", a[:5])], mp.put("P1", y)),
     r"train_vertical_lr: features\[1\] must be a \[rows, columns\] matrix with the 600 rows "
     r"of features\[0\], got \(5, 20\)"),
    (lambda a, y: train_vertical_lr([mp.put("P0", a)], mp.put("P1", y[:10])),
     r"train_vertical_lr: labels must have one entry per row, shape \(600,\), got \(10,\)"),
    (lambda a, y: train_vertical_lr([mp.put("P0", a)], mp.put("P1", y), epochs=0),
     r"train_vertical_lr: epochs must be a positive int, got 0"),
    (lambda a, y: train_vertical_lr([mp.put("P0", a)], mp.put("P1", y), lr=-0.1),
     r"train_vertical_lr: lr must be a positive number, got -0.1"),
    (lambda a, y: train_vertical_lr([mp.device("SP0")(lambda v: v)(mp.put("P0", a))],
                                    mp.put("P1", y)),
     r"train_vertical_lr: features\[0\] must be held by one party \(e\.g\. on 'P0'\), not by "
     r"the secure device 'SP0'"),
    (lambda a, y: predict([mp.put("P0", a)], [mp.put("P0", a[0]), mp.put("P1", y[:1]),
                                              mp.put("P1", y[:1])]),
     r"predict: weights must be the list train_vertical_lr returned: 1 or 2 entries for 1 "
     r"feature parties"),
    (lambda a, y: predict([mp.put("P0", a)], [mp.put("P1", a[0])]),
     r"predict: weights\[0\] must be the 20 \(or, with the intercept, 21\) weights of "
     r"features\[0\] on P0, got \(20,\) on P1"),
])
def test_errors_name_the_op_and_the_fix(sim: mp.Simulator, build: Any, match: str) -> None:
    with pytest.raises(mp.MPTypeError, match=match):
        mp.compile(build, X_TRAIN, Y_TRAIN, cluster=sim.cluster)
