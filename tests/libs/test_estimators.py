"""Estimators in scikit-learn's style: fit(X, y) and predict(X) on the parties' values,
inside one ``@mp.function`` or program by program, against numpy, scikit-learn and the
functions they wrap; scikit-learn's conventions (get_params, set_params, clone, fitted
attributes, two-column predict_proba); and their errors."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_classification
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.model_selection import train_test_split

import mplang as mp
from mplang.libs.estimators import SecureBoostClassifier, VerticalLogisticRegression
from tests.libs.test_linear import numpy_reference, sigmoid

X, Y = make_classification(n_samples=600, n_features=12, n_informative=6, random_state=1)
X_TRAIN, X_TEST, Y_TRAIN, Y_TEST = (a.astype(np.float32) for a in train_test_split(
    X, Y, test_size=0.25, random_state=1))
EPOCHS, LR, BATCH = 6, 0.5, 64


def on_parties(x: np.ndarray) -> list[Any]:
    """P0 holds columns 0-5, P1 columns 6-11."""
    return [mp.put("P0", x[:, :6]), mp.put("P1", x[:, 6:])]


def test_logistic_regression_in_one_program_matches_numpy(sim: mp.Simulator) -> None:
    model = VerticalLogisticRegression(epochs=EPOCHS, lr=LR, batch_size=BATCH, to="P1")

    @mp.function
    def prog() -> Any:
        fitted = model.fit(on_parties(X_TRAIN), mp.put("P1", Y_TRAIN))
        assert fitted is model and model.n_features_in_ == 12 and model.classes_ == (0, 1)
        test = on_parties(X_TEST)
        return (model.weights_, model.predict(test), model.predict_proba(test),
                model.score(test, mp.put("P1", Y_TEST)))

    weights, classes, proba, accuracy = mp.evaluate(sim, prog)
    assert [mp.get_dev_attr(v) for v in (classes, proba, accuracy)] == ["P1"] * 3
    w = np.concatenate(mp.fetch(sim, weights))
    np.testing.assert_allclose(w, numpy_reference(X_TRAIN, Y_TRAIN, EPOCHS, LR, BATCH),
                               atol=0.02)
    classes, proba = mp.fetch(sim, classes), mp.fetch(sim, proba)
    assert proba.shape == (len(X_TEST), 2)
    np.testing.assert_allclose(proba[:, 1], sigmoid(X_TEST @ w[:-1] + w[-1]), atol=5e-3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_array_equal(classes, (X_TEST @ w[:-1] + w[-1] > 0).astype(np.int32))
    assert float(mp.fetch(sim, accuracy)) == pytest.approx(np.mean(classes == Y_TEST),
                                                           abs=1e-4)


def test_logistic_regression_program_by_program(sim: mp.Simulator) -> None:
    """Under ``with sim:`` each method runs as its own program; the fitted weights stay on
    the parties and feed the next one."""
    model = VerticalLogisticRegression(epochs=EPOCHS, lr=LR, batch_size=BATCH)
    with sim:
        model.fit(on_parties(X_TRAIN), mp.put("P1", Y_TRAIN))
        classes = model.predict(on_parties(X_TEST))
    w = np.concatenate(mp.fetch(sim, model.weights_))
    np.testing.assert_allclose(w, numpy_reference(X_TRAIN, Y_TRAIN, EPOCHS, LR, BATCH),
                               atol=0.02)
    assert mp.get_dev_attr(classes) == "P0"
    np.testing.assert_array_equal(mp.fetch(sim, classes),
                                  (X_TEST @ w[:-1] + w[-1] > 0).astype(np.int32))


def test_scikit_learn_conventions() -> None:
    model = VerticalLogisticRegression(epochs=3, l2=0.1)
    assert model.get_params() == {"epochs": 3, "lr": 0.5, "batch_size": 64, "l2": 0.1,
                                  "fit_intercept": True, "device": "SP0", "to": "P0"}
    assert model.set_params(lr=0.2, to=None) is model and model.lr == 0.2
    copy = clone(model)
    assert copy is not model and copy.get_params() == model.get_params()
    assert repr(copy) == ("VerticalLogisticRegression(epochs=3, lr=0.2, batch_size=64, "
                          "l2=0.1, fit_intercept=True, device='SP0', to=None)")
    boost = clone(SecureBoostClassifier(n_trees=2, device="SP0"))
    assert boost.get_params()["n_trees"] == 2 and boost.get_params()["device"] == "SP0"
    with pytest.raises(ValueError, match=r"^VerticalLogisticRegression: unknown parameter "
                                         r"'C'; its parameters are epochs, lr, "):
        model.set_params(C=1.0)


def test_errors_name_the_method() -> None:
    cluster = mp.ClusterSpec.simple(3)
    with pytest.raises(mp.MPLangError) as info:
        mp.compile(lambda: VerticalLogisticRegression().predict(on_parties(X_TEST)),
                   cluster=cluster)
    assert str(info.value) == ("VerticalLogisticRegression.predict: the estimator is not "
                               "fitted; call fit(X, y) first")
    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(lambda: SecureBoostClassifier().fit(on_parties(X_TRAIN)[:1], None),
                   cluster=cluster)
    assert str(info.value).split(" (at ")[0] == (
        "SecureBoostClassifier.fit: X must be a list of 2 values, one per party (its columns "
        "of the same rows), got list")
    with pytest.raises(mp.MPTypeError, match=r"train_vertical_lr: epochs must be a positive "
                                             r"int, got 0"):
        mp.compile(lambda: VerticalLogisticRegression(epochs=0).fit(
            on_parties(X_TRAIN), mp.put("P1", Y_TRAIN)), cluster=cluster)


@pytest.fixture(scope="module")
def sim2() -> Iterator[mp.Simulator]:
    simulator = mp.Simulator(2)
    yield simulator
    simulator.close()


@pytest.mark.parametrize("device", [None, "SP0"], ids=["phe", "secure_device"])
def test_secureboost_in_one_program_matches_sklearn(sim2: mp.Simulator,
                                                    device: str | None) -> None:
    if device is None:
        pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")
    model = SecureBoostClassifier(n_trees=2, max_depth=2, learning_rate=0.3, key_bits=1024,
                                  device=device)

    @mp.function
    def prog() -> Any:
        model.fit(on_parties(X_TRAIN), mp.put("P0", Y_TRAIN))
        test = on_parties(X_TEST)
        return model.predict_proba(test), model.predict(test), \
            model.score(test, mp.put("P0", Y_TEST))

    proba, classes, accuracy = mp.fetch(sim2, mp.evaluate(sim2, prog, timeout=300))
    assert model.n_features_in_ == 12 and proba.shape == (len(X_TEST), 2)
    ref = HistGradientBoostingClassifier(max_iter=2, max_depth=2, max_bins=32,
                                         learning_rate=0.3, max_leaf_nodes=None,
                                         early_stopping=False).fit(X_TRAIN, Y_TRAIN)
    if device is None:  # the PHE protocol grows scikit-learn's trees
        np.testing.assert_allclose(proba, ref.predict_proba(X_TEST), atol=1e-4)
    np.testing.assert_array_equal(classes, (proba[:, 1] >= 0.5).astype(np.int32))
    assert float(accuracy) == pytest.approx(np.mean(classes == Y_TEST), abs=1e-6)
    assert float(accuracy) > 0.75
