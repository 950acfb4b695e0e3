"""SecureBoost against scikit-learn's HistGradientBoostingClassifier on the same data.

With the same binning, gain, leaf values and stopping rules, the trees must be the
same as scikit-learn's (split features, thresholds, leaf values), and so the
probabilities and the accuracy. 1024-bit keys keep the tests fast (the default is
2048).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.ensemble._hist_gradient_boosting.binning import _BinMapper
from sklearn.model_selection import train_test_split

import mplang as mp
from mplang.edsl.errors import MPLangError, MPRefusedError, MPTypeError
from mplang.libs.secureboost import (
    ACTIVE_PARTS,
    PASSIVE_PARTS,
    Params,
    SecureBoost,
    quantile_bins,
    train,
)
from mplang.policy.policy import Policy

pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")

KEY_BITS = 1024
TREES, DEPTH, RATE = 3, 3, 0.3


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    x, y = make_classification(n_samples=800, n_features=20, random_state=0)
    x_train, x_test, y_train, y_test = train_test_split(x.astype(np.float32), y,
                                                        test_size=0.25, random_state=0)
    return {"x_train": x_train, "x_test": x_test, "y_train": y_train, "y_test": y_test}


@pytest.fixture(scope="module")
def sim2() -> Iterator[mp.Simulator]:
    sim = mp.Simulator(2)
    try:
        yield sim
    finally:
        sim.close()


def sklearn_model(x: np.ndarray, y: np.ndarray, trees: int, depth: int
                  ) -> HistGradientBoostingClassifier:
    """The reference: depth-wise growth (no leaf limit), no early stopping."""
    return HistGradientBoostingClassifier(
        max_iter=trees, max_depth=depth, max_bins=32, learning_rate=RATE, max_leaf_nodes=None,
        early_stopping=False).fit(x, y)


@pytest.fixture(scope="module")
def trained(sim2: mp.Simulator, data: dict[str, np.ndarray]) -> SecureBoost:
    x = data["x_train"]
    return SecureBoost(TREES, DEPTH, learning_rate=RATE, key_bits=KEY_BITS).fit(
        sim2, x[:, :10], x[:, 10:], data["y_train"])


def test_accuracy_and_probabilities_match_sklearn(sim2: mp.Simulator, trained: SecureBoost,
                                                  data: dict[str, np.ndarray]) -> None:
    x = data["x_test"]
    ref = sklearn_model(data["x_train"], data["y_train"], TREES, DEPTH)
    proba = trained.predict_proba(sim2, x[:, :10], x[:, 10:])
    np.testing.assert_allclose(proba, ref.predict_proba(x)[:, 1], atol=1e-4)
    accuracy = np.mean(trained.predict(sim2, x[:, :10], x[:, 10:]) == data["y_test"])
    assert abs(accuracy - ref.score(x, data["y_test"])) <= 0.02
    assert accuracy > 0.85


def test_trees_are_sklearns_and_each_party_keeps_its_splits(
        sim2: mp.Simulator, trained: SecureBoost, data: dict[str, np.ndarray]) -> None:
    assert trained.model is not None
    devices = {k: mp.get_dev_attr(v) for k, v in trained.model.items()}
    assert devices == {**dict.fromkeys(ACTIVE_PARTS, "P0"), **dict.fromkeys(PASSIVE_PARTS, "P1")}
    m = {k: np.asarray(mp.fetch(sim2, v)) for k, v in trained.model.items()}
    ref = sklearn_model(data["x_train"], data["y_train"], TREES, DEPTH)
    assert m["base"] == pytest.approx(float(ref._baseline_prediction.ravel()[0]), abs=1e-6)
    for t, (predictor,) in enumerate(ref._predictors):
        nodes = predictor.nodes

        def walk(i: int, level: int, k: int, t: int = t, nodes: Any = nodes) -> None:
            node = nodes[i]
            if node["is_leaf"]:
                assert m["leaf"][t, k << (DEPTH - level)] == pytest.approx(node["value"],
                                                                          abs=1e-5)
                return
            heap = (1 << level) - 1 + k
            f, own = (0, "0") if node["feature_idx"] < 10 else (10, "1")
            other = "1" if own == "0" else "0"
            assert m[f"feature{own}"][t, heap] == node["feature_idx"] - f
            assert m[f"feature{other}"][t, heap] == -1
            assert m[f"threshold{own}"][t, heap] == pytest.approx(node["num_threshold"],
                                                                  abs=1e-6)
            walk(node["left"], level + 1, 2 * k)
            walk(node["right"], level + 1, 2 * k + 1)

        walk(0, 0, 0)
    assert (m["feature1"] >= 0).any() and (m["feature0"] >= 0).any()  # both parties split


def test_bins_match_sklearn() -> None:
    x, _ = make_classification(n_samples=500, n_features=6, random_state=1)
    x = x.astype(np.float32)
    x[:, 1] = np.round(x[:, 1])  # few distinct values: midpoints
    x[:, 2] = 3.0  # constant: one bin
    edges, bins = jax.jit(quantile_bins, static_argnums=1)(x, 32)
    mapper = _BinMapper(n_bins=33, subsample=None).fit(x)
    np.testing.assert_array_equal(np.asarray(bins), mapper.transform(x))
    for f, want in enumerate(mapper.bin_thresholds_):
        np.testing.assert_allclose(np.asarray(edges)[f, :len(want)], want, rtol=1e-6)
    assert np.asarray(bins).dtype == np.int8 and not np.asarray(bins)[:, 2].any()


def test_passive_party_sends_only_ciphertexts_counts_and_routing_bits() -> None:
    """What the passive party (rank 1) sends the active party (rank 0) while training."""
    n, f1, bins = 60, 4, 8
    rng = np.random.default_rng(0)
    x0, x1 = rng.normal(size=(n, 3)), rng.normal(size=(n, f1))
    y = (rng.random(n) < 0.5).astype(np.float32)
    params = Params(n_trees=1, max_depth=2, n_bins=bins, key_bits=KEY_BITS)
    program = mp.compile(lambda: train(x0, x1, y, params), cluster=mp.ClusterSpec.simple(2))
    sent = [str(op.inputs[0].type.base) for op in program.graph.walk()
            if op.opcode == "simp.shuffle_static" and op.attrs["routes"] == {0: 1}]
    assert sorted(sent) == sorted([
        f"phe.ct<float32[1,{f1},{bins},2],k0,scale=2^24>", f"f32[1,{f1},{bins}]", "i8[60]",
        f"phe.ct<float32[1,{f1},{bins},2],k0,scale=2^24>", f"f32[1,{f1},{bins}]", "i8[60]"])


def test_inputs_from_data_roots_on_three_parties(tmp_path: Path) -> None:
    """Active P2 and passive P0 of a 3-party cluster read their columns from their own data
    roots; the result is sklearn's."""
    x, y = make_classification(n_samples=300, n_features=20, random_state=0)
    x = x.astype(np.float32)
    roots = {f"node_{i}": tmp_path / f"node_{i}" for i in range(3)}
    for root in roots.values():
        root.mkdir()
    np.savez(roots["node_2"] / "active.npz", x=x[:, :10], y=y.astype(np.float32))
    np.save(roots["node_0"] / "passive.npy", x[:, 10:])
    sim = mp.Simulator(mp.ClusterSpec.simple(3), data_roots=roots, policies="open")
    try:
        model = SecureBoost(1, 2, learning_rate=RATE, key_bits=KEY_BITS, active="P2",
                            passive="P0").fit(sim, ("active.npz", "x"), "passive.npy",
                                              ("active.npz", "y"))
        proba = model.predict_proba(sim, ("active.npz", "x"), "passive.npy")
    finally:
        sim.close()
    np.testing.assert_allclose(proba, sklearn_model(x, y, 1, 2).predict_proba(x)[:, 1],
                               atol=1e-5)


def _write_split(x: np.ndarray, y: np.ndarray, roots: dict[str, Path]) -> None:
    """node_0 keeps features 0-9 and the labels, node_1 features 10-19."""
    for root in roots.values():
        root.mkdir(parents=True, exist_ok=True)
    np.savez(roots["node_0"] / "active.npz", x=x[:, :10], y=y.astype(np.float32))
    np.save(roots["node_1"] / "passive.npy", x[:, 10:])


def test_a_passive_party_policy_must_allow_the_reveals(tmp_path: Path) -> None:
    """Under the default policy the passive party refuses: the histograms and routing bits
    derived from its columns go to the active party, and the model parts derived from
    them stay where the driver may fetch them. Allowing node_0 and the driver lets it
    run. (The active party lets its routing bits go: its own policy is not the subject.)"""
    x, y = make_classification(n_samples=200, n_features=20, random_state=0)
    x = x.astype(np.float32)
    roots = {f"node_{i}": tmp_path / f"node_{i}" for i in range(2)}
    _write_split(x, y, roots)
    args = (("active.npz", "x"), "passive.npy", ("active.npz", "y"))
    for policy in (Policy.default(), Policy(plaintext_to=("node_0", "driver"))):
        sim = mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots,
                           policies={"node_0": Policy(plaintext_to=("*",)), "node_1": policy})
        try:
            model = SecureBoost(1, 2, learning_rate=RATE, key_bits=KEY_BITS)
            if policy == Policy.default():
                with pytest.raises(MPRefusedError, match=r"node_1 refuses the program: op "
                                   r"phe\.decrypt at test_secureboost\.py:\d+ sends the "
                                   r"plaintext it decrypts, raw of passive\.npy, to node_0; "
                                   r"approve this program alone with approve: "):
                    model.fit(sim, *args)
                continue
            proba = model.fit(sim, *args).predict_proba(sim, args[0], args[1])
        finally:
            sim.close()
    np.testing.assert_allclose(proba, sklearn_model(x, y, 1, 2).predict_proba(x)[:, 1],
                               atol=1e-5)


@pytest.mark.slow
def test_on_worker_processes(tmp_path: Path) -> None:
    """Two HTTP workers over mutual TLS, each reading its columns from its data root, with
    policies that allow SecureBoost's reveals: the simulator's result, within 2 points of
    sklearn's accuracy."""
    from mplang.cluster.local import LocalCluster
    from tests.worker.support import free_ports

    x, y = make_classification(n_samples=300, n_features=20, random_state=0)
    x = x.astype(np.float32)
    roots = {f"node_{i}": tmp_path / f"node_{i}" for i in range(2)}
    _write_split(x, y, roots)
    args = (("active.npz", "x"), "passive.npy", ("active.npz", "y"))
    spec = mp.ClusterSpec.simple(2).to_dict()
    for node, port in zip(spec["nodes"], free_ports(2), strict=True):
        node["endpoint"] = f"127.0.0.1:{port}"
    local = LocalCluster(mp.ClusterSpec.from_dict(spec), data_root=tmp_path)
    for path in (local.spec_path.parent / "policies").glob("node_*.yaml"):
        other = "node_1" if path.stem == "node_0" else "node_0"
        path.write_text(path.read_text().replace("plaintext_to: []",
                                                 f"plaintext_to: [{other}, driver]"))
    local.start()
    driver = local.driver(timeout=60.0, run_timeout=300.0)
    sim = mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots)
    try:
        probas = [SecureBoost(2, 3, learning_rate=RATE, key_bits=KEY_BITS).fit(ctx, *args)
                  .predict_proba(ctx, args[0], args[1]) for ctx in (driver, sim)]
    finally:
        sim.close()
        driver.close()
        local.close()
    np.testing.assert_array_equal(probas[0], probas[1])
    accuracy = np.mean((probas[0] >= 0.5) == y)
    assert abs(accuracy - sklearn_model(x, y, 2, 3).score(x, y)) <= 0.02


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_trees": 0}, r"SecureBoost: n_trees must be an int >= 1, got 0"),
    ({"max_depth": 11}, r"SecureBoost: max_depth must be an int in \[1, 10\], got 11"),
    ({"n_bins": 128}, r"SecureBoost: n_bins must be an int in \[2, 127\], got 128"),
    ({"learning_rate": 0}, r"SecureBoost: learning_rate must be a positive number, got 0"),
    ({"scheme": "rsa"}, r"SecureBoost: scheme must be one of paillier, ou, got 'rsa'"),
    ({"key_bits": 512}, r"SecureBoost: key_bits must be an int in \[1024, 8192\], got 512"),
])
def test_bad_parameters_are_named(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SecureBoost(**kwargs)


def test_misuse_is_an_error_naming_what_to_do(sim2: mp.Simulator) -> None:
    x = np.zeros((30, 2), np.float32)
    y = np.zeros(30)
    with pytest.raises(MPLangError, match=r"SecureBoost\.predict_proba: the model is not "
                       r"trained; call fit\(ctx, x_active, x_passive, y\) first"):
        SecureBoost().predict(sim2, x, x)
    with pytest.raises(ValueError, match=r"SecureBoost\.fit: the labels must be 0 or 1"):
        SecureBoost().fit(sim2, x, x, y + 2)
    with pytest.raises(MPTypeError, match=r"secureboost\.train: the features and labels must "
                       r"have one positive number of rows .* got 30x2 \(active\), 29x2 "
                       r"\(passive\) and 30 labels"):
        SecureBoost(key_bits=KEY_BITS).fit(sim2, x, x[:29], y)
    with pytest.raises(MPTypeError, match=r"secureboost\.train: the labels must be a vector of "
                       r"0/1 labels of numbers, got f32\[30,2\]"):
        SecureBoost(key_bits=KEY_BITS).fit(sim2, x, x, x)
    with pytest.raises(MPTypeError, match=r"secureboost\.train: the active \(P0\) and passive "
                       r"\(P0\) devices are on one party"):
        SecureBoost(passive="P0").fit(sim2, x, x, y)
    with pytest.raises(MPTypeError, match=r"secureboost\.train: 'SP0' is not a PPU of the "
                       r"cluster; use one of P0, P1"):
        SecureBoost(passive="SP0").fit(sim2, x, x, y)


def test_predicting_on_other_columns_is_a_type_error(sim2: mp.Simulator,
                                                     trained: SecureBoost) -> None:
    x = np.zeros((5, 10), np.float32)
    with pytest.raises(MPTypeError, match=r"secureboost\.predict_proba: the parties must hold "
                       r"the same rows, with the columns the model was trained on \(10 active, "
                       r"10 passive\); got 5x10 \(active\) and 5x9 \(passive\)"):
        trained.predict(sim2, x, x[:, :9])


def test_an_input_of_the_wrong_party_is_a_type_error(sim2: mp.Simulator) -> None:
    x = np.zeros((30, 2), np.float32)

    @mp.function
    def prog() -> Any:
        theirs = mp.put("P1", x)  # the active party's features, but held by P1
        return train(theirs, x, np.zeros(30), Params(key_bits=KEY_BITS))

    with pytest.raises(MPTypeError, match=r"secureboost\.train: the active party's features "
                       r"must be held by P0 \(party 0\), got f32\[30,2\]@\{1\} on P1"):
        mp.compile(prog, cluster=mp.ClusterSpec.simple(2))
