"""Joint analytics by approval: a vertical logistic regression weights each party's rows by
the other's real values, so it is no aggregate; under the policies `mplang init` writes it
is refused, naming the narrowest ``approve`` entry, and with the entries its docs show,
fit, predict and score run and match numpy. A program posing as the library function is
not vouched for."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cluster.local import write_dev_policies
from mplang.libs import linear
from mplang.libs.estimators import SecureBoostClassifier, VerticalLogisticRegression
from mplang.policy.policy import Policy, PolicyError
from tests.libs.test_estimators import BATCH, EPOCHS, LR, X_TEST, X_TRAIN, Y_TEST, Y_TRAIN
from tests.libs.test_linear import numpy_reference

APPROVALS = ("approve:\n"
             "  - {library: mplang.libs.linear, to: ['*']}        # train, predict\n"
             "  - {library: mplang.libs.secret_trees, to: ['*']}  # SecureBoost on SP0\n"
             "  - {library: mplang.libs.estimators, to: ['*']}    # one accuracy\n")
"""What the estimators' docs tell each party to add to its policy."""


def _simulator(tmp: Path, extra: str) -> mp.Simulator:
    write_dev_policies(mp.ClusterSpec.simple(2), tmp)
    roots = {}
    for i in (0, 1):
        root = tmp / f"data_{i}"
        root.mkdir()
        for name, rows in (("train", X_TRAIN), ("test", X_TEST)):
            np.save(root / f"{name}.npy", rows[:, 6 * i: 6 * i + 6])
        roots[f"node_{i}"] = str(root)
        policy = tmp / "policies" / f"node_{i}.yaml"
        policy.write_text(policy.read_text().replace("approve: []\n", extra or "approve: []\n"))
    np.save(Path(roots["node_1"]) / "y_train.npy", Y_TRAIN)
    np.save(Path(roots["node_1"]) / "y_test.npy", Y_TEST)
    return mp.Simulator(2, data_roots=roots, policies={
        n: str(tmp / "policies" / f"{n}.yaml") for n in roots})


@pytest.fixture(scope="module")
def approved(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mp.Simulator]:
    with _simulator(tmp_path_factory.mktemp("approved"), APPROVALS) as sim:
        yield sim


@pytest.fixture(scope="module")
def init(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mp.Simulator]:
    with _simulator(tmp_path_factory.mktemp("init"), "") as sim:
        yield sim


def load(party: int, name: str) -> Any:
    return mp.device(f"P{party}")(lambda: tensor.load(f"{name}.npy"))()


def features(name: str) -> list[Any]:
    return [load(0, name), load(1, name)]


def test_a_vertical_regression_is_refused_naming_the_approval(init: mp.Simulator) -> None:
    with pytest.raises(mp.MPRefusedError) as caught:
        mp.evaluate(init, lambda: linear.train_vertical_lr(
            features("train"), load(1, "y_train"), epochs=EPOCHS, lr=LR, batch_size=BATCH))
    message = str(caught.value)
    assert "the output of mplang.libs.linear.train_vertical_lr on " in message, message
    assert "add approve: - {library: mplang.libs.linear.train_vertical_lr, to: [" in message
    assert "plaintext_to" not in message


def test_fit_predict_and_score_run_with_the_approvals_and_match_numpy(
        approved: mp.Simulator) -> None:
    model = VerticalLogisticRegression(epochs=EPOCHS, lr=LR, batch_size=BATCH, to="P1")

    @mp.function
    def prog() -> Any:
        model.fit(features("train"), load(1, "y_train"))
        test = features("test")
        return model.weights_, model.predict(test), model.score(test, load(1, "y_test"))

    weights, classes, accuracy = mp.fetch(approved, mp.evaluate(approved, prog))
    w = np.concatenate(weights)
    np.testing.assert_allclose(w, numpy_reference(X_TRAIN, Y_TRAIN, EPOCHS, LR, BATCH),
                               atol=0.02)
    np.testing.assert_array_equal(classes, (X_TEST @ w[:-1] + w[-1] > 0).astype(np.int32))
    assert float(accuracy) == pytest.approx(np.mean(classes == Y_TEST), abs=1e-4)


def secureboost() -> SecureBoostClassifier:
    """P1 holds the labels: it is the active party."""
    return SecureBoostClassifier(n_trees=2, max_depth=2, learning_rate=0.3, device="SP0",
                                 active="P1", passive="P0")


def test_secureboost_on_a_device_is_refused_naming_the_approval(init: mp.Simulator) -> None:
    model = secureboost()
    with pytest.raises(mp.MPRefusedError) as caught:
        mp.evaluate(init, lambda: model.fit(features("train")[::-1], load(1, "y_train")).model_)
    message = str(caught.value)
    assert message.startswith("node_0 refuses the program: "), message
    assert "add approve: - {library: mplang.libs.secret_trees.grown_on_device, to: [node_1]}" \
        in message
    assert message.count("on train.npy, to node_1;") == 1, "one clause for the splits and leaves"


def test_secureboost_scores_once_its_training_is_approved(approved: mp.Simulator) -> None:
    """Predictions and the accuracy are computed on the device from both parties' bits:
    the approval of `mplang.libs.secret_trees` covers them, with no row-wise bit sent."""
    model = secureboost()

    @mp.function
    def prog() -> Any:
        model.fit(features("train")[::-1], load(1, "y_train"))
        test = features("test")[::-1]
        return model.predict(test), model.score(test, load(1, "y_test"))

    classes, accuracy = mp.fetch(approved, mp.evaluate(approved, prog, timeout=300))
    assert float(accuracy) == pytest.approx(np.mean(classes == Y_TEST), abs=1e-6)
    assert float(accuracy) > 0.75


def test_a_function_posing_as_the_approved_one_is_not_vouched_for(
        approved: mp.Simulator) -> None:
    """The driver names the library's training function but sends its own StableHLO (the
    other party's first row): each member derives the real function and judges the
    release as it is."""
    @functools.wraps(linear._train)
    def posing(y: Any, *xs: Any) -> Any:
        return (*(x[0] for x in xs), jnp.sum(y))

    posing.static_args = (EPOCHS, LR, BATCH, 0.0, 1)  # type: ignore[attr-defined]
    with pytest.raises(mp.MPRefusedError) as caught:
        mp.evaluate(approved, lambda: mp.put("P0", mp.device("SP0")(posing)(
            load(1, "y_train"), *features("train"))[1]))
    assert "row-wise (raw) values of train.npy, to node_0" in str(caught.value) or \
        "raw of train.npy, to node_0" in str(caught.value), caught.value


@pytest.mark.parametrize("entry, error", [
    ("- {library: os.system, to: [node_0]}",
     "p.yaml:2: approve: library must name a function or module of mplang.libs, got "
     "'os.system'"),
    ("- {library: mplang.libs.linear}",
     "p.yaml:2: approve: an entry is {library: NAME, to: [...]} or {program: DIGEST}"),
    ("- {program: 9f2c}",
     "p.yaml:2: approve: a program entry is {program: DIGEST} alone, DIGEST a sha256 digest "
     "(64 lowercase hex digits)"),
    ("- {library: mplang.libs.linear, to: [node_0], when: any}",
     "p.yaml:2: approve: unknown key 'when' (known: library, to, program)"),
])
def test_a_malformed_approval_names_its_line(entry: str, error: str) -> None:
    with pytest.raises(PolicyError) as caught:
        Policy.parse(f"approve:\n  {entry}\n", "p.yaml")
    assert str(caught.value) == error


def test_a_module_approves_each_of_its_functions_and_nothing_else() -> None:
    policy = Policy.parse("approve:\n  - {library: mplang.libs.linear, to: [node_0]}\n"
                          f"  - {{program: {'ab' * 32}}}\n")
    assert policy.approvals("node_0", frozenset(["mplang.libs.linear.predict"])) is not None
    assert policy.approvals("node_1", frozenset(["mplang.libs.linear.predict"])) is None
    assert policy.approvals("node_0", frozenset(["mplang.libs.linear_extra.f"])) is None
    assert policy.approvals("node_0", frozenset(["mplang.libs.linear.predict",
                                                 "mplang.libs.estimators.score"])) is None
    assert "ab" * 32 in policy.programs
