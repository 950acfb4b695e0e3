"""SecureBoost on a secret-sharing device (``device="SP0"``): the trees match the same
computation in plaintext JAX, scikit-learn's accuracy, and pass the policies `mplang
init` writes, with the passive party's approval of `mplang.libs.secret_trees` (its bins
choose the rows of the active party's gradients), on the simulator and on worker
processes; a driver cannot make the device release smaller groups."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import make_classification
from sklearn.ensemble import HistGradientBoostingClassifier

import mplang as mp
from mplang.cluster.local import write_dev_policies
from mplang.libs import secret_trees, secureboost
from mplang.libs.secret_trees import grid_bins
from mplang.libs.secureboost import SecureBoost

TREES, DEPTH, BINS, RATE, LEAF = 2, 3, 16, 0.3, 20
APPROVE = ("approve: []\n", 'approve:\n  - {library: mplang.libs.secret_trees, to: ["*"]}\n')
"""The passive party's approval (docs/analytics.md), as an edit of its init policy."""
ARGS = (("active.npz", "x"), "passive.npy", ("active.npz", "y"))
"""Where the parties' inputs are: node_0's features and labels, node_1's features."""


def _data(n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    x, y = make_classification(n_samples=n, n_features=8, random_state=0)
    return x.astype(np.float32), y


def _write_split(x: np.ndarray, y: np.ndarray, roots: dict[str, Path]) -> None:
    """node_0 keeps features 0-3 and the labels, node_1 features 4-7."""
    for root in roots.values():
        root.mkdir(parents=True, exist_ok=True)
    np.savez(roots["node_0"] / "active.npz", x=x[:, :4], y=y.astype(np.float32))
    np.save(roots["node_1"] / "passive.npy", x[:, 4:])


def _reference(x: np.ndarray, y: np.ndarray, min_leaf: int = LEAF) -> dict[str, np.ndarray]:
    """The same trees in plaintext JAX (float32 instead of the device's fixed point)."""
    e0, b0 = grid_bins(jnp.asarray(x[:, :4]), BINS)
    e1, b1 = grid_bins(jnp.asarray(x[:, 4:]), BINS)
    s0, s1, leaf = secret_trees._secret_trees(
        TREES, DEPTH, BINS, min_leaf, RATE, 0.0, 1e-3, secret_trees._one_hot_bins(b0, BINS),
        secret_trees._one_hot_bins(b1, BINS), jnp.asarray(y, jnp.float32))
    f0, t0 = secret_trees._tree_thresholds(e0, s0)
    f1, t1 = secret_trees._tree_thresholds(e1, s1)
    return {"feature0": np.asarray(f0), "threshold0": np.asarray(t0),
            "feature1": np.asarray(f1), "threshold1": np.asarray(t1), "leaf": np.asarray(leaf)}


def _model(ctx: Any, min_leaf: int = LEAF) -> SecureBoost:
    return SecureBoost(TREES, DEPTH, n_bins=BINS, learning_rate=RATE,
                       min_samples_leaf=min_leaf, device="SP0").fit(ctx, *ARGS)


def _fetched(ctx: Any, model: SecureBoost) -> dict[str, np.ndarray]:
    assert model.model is not None
    return {k: np.asarray(mp.fetch(ctx, v)) for k, v in model.model.items()}


def _same_trees(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    """The device's trees against the plaintext ones: the same root splits, and the same
    class for at least 95% of the rows. Its fixed-point divisions (about 1e-4 relative)
    may pick another of two splits whose gains are that close."""
    x, y = _data()
    for part in ("feature0", "threshold0", "feature1", "threshold1"):
        np.testing.assert_allclose(got[part][:, 0], want[part][:, 0], rtol=1e-6, err_msg=part)
    agree = np.mean((_probabilities(x, got, y) >= 0.5) == (_probabilities(x, want, y) >= 0.5))
    assert agree >= 0.95, agree


@pytest.fixture(scope="module")
def cluster_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two parties' data roots and the policies `mplang init` writes for them."""
    base = tmp_path_factory.mktemp("secureboost-spu")
    (_, passive) = write_dev_policies(mp.ClusterSpec.simple(2), base)
    passive.write_text(passive.read_text().replace(*APPROVE))
    _write_split(*_data(), {f"node_{i}": base / f"node_{i}" for i in range(2)})
    return base


@pytest.fixture(scope="module")
def sim(cluster_dir: Path) -> Iterator[mp.Simulator]:
    nodes = ("node_0", "node_1")
    with mp.Simulator(2, data_roots={n: str(cluster_dir / n) for n in nodes},
                      policies={n: str(cluster_dir / "policies" / f"{n}.yaml")
                                for n in nodes}) as s:
        yield s


@pytest.fixture(scope="module")
def trained(sim: mp.Simulator) -> SecureBoost:
    return _model(sim)


def test_the_init_policies_accept_it_and_the_trees_are_the_plaintext_ones(
        sim: mp.Simulator, trained: SecureBoost) -> None:
    x, y = _data()
    got = _fetched(sim, trained)
    _same_trees(got, _reference(x, y))
    assert (got["feature0"] >= 0).any() and (got["feature1"] >= 0).any()  # both split
    assert float(got["base"]) == pytest.approx(np.log(y.mean() / (1 - y.mean())), rel=1e-5)


def test_accuracy_is_scikit_learns(sim: mp.Simulator, trained: SecureBoost) -> None:
    """The trees the parties received, applied in the clear to the training rows."""
    x, y = _data()
    reference = HistGradientBoostingClassifier(
        max_iter=TREES, max_depth=DEPTH, max_bins=BINS, learning_rate=RATE,
        min_samples_leaf=LEAF, early_stopping=False).fit(x, y)
    proba = _probabilities(x, _fetched(sim, trained), y)
    assert abs(np.mean((proba >= 0.5) == y) - reference.score(x, y)) <= 0.03


def test_groups_below_the_policy_s_min_rows_are_refused(sim: mp.Simulator) -> None:
    """Leaves of 5 rows: aggregates the init policies (10 rows) do not allow."""
    with pytest.raises(mp.MPRefusedError, match=r"node_0 refuses the program: op spu\.reveal "
                       r"at test_secureboost_spu\.py:\d+ sends the value revealed from SP0, "
                       r"aggregate over groups of at least 5 rows \(smaller ones suppressed at run "
                       r"time\) of active\.npz\[x\], active\.npz\[y\], to node_1; add a "
                       r"rule \{to: \[node_1\], when: aggregate, min_rows: 5\}"):
        _model(sim, min_leaf=5)


def test_a_function_posing_as_the_trees_is_not_vouched_for(sim: mp.Simulator) -> None:
    """The driver names the registered trees but sends its own StableHLO (per-bin sums of
    the labels, what the device keeps secret): the members derive the real function, see
    another text and judge the release as it is."""
    one_hot = secret_trees._one_hot_bins

    @functools.wraps(secret_trees._secret_trees)
    def posing(hot0: Any, hot1: Any, y: Any) -> Any:
        return hot0.astype(jnp.float32).T @ y

    posing.static_args = (TREES, DEPTH, BINS, LEAF, RATE, 0.0, 1e-3)  # type: ignore

    def program() -> Any:
        from mplang import tensor

        def load(path: Any) -> Any:
            return tensor.load(*path) if isinstance(path, tuple) else tensor.load(path)

        x0 = mp.device("P0")(lambda: load(ARGS[0]))()
        x1 = mp.device("P1")(lambda: load(ARGS[1]))()
        y = mp.device("P0")(lambda: load(ARGS[2]))()
        b0 = mp.device("P0")(lambda v: one_hot(grid_bins(v, BINS)[1], BINS))(x0)
        b1 = mp.device("P1")(lambda v: one_hot(grid_bins(v, BINS)[1], BINS))(x1)
        return mp.put("P0", mp.device("SP0")(posing)(b0, b1, y))

    with pytest.raises(mp.MPRefusedError, match=r"node_0 refuses to send object .* to the "
                       r"driver: it is aggregate over a data-dependent number of rows of "
                       r"active\.npz\[x\], active\.npz\[y\]"):  # kept on node_0: judged at fetch
        mp.fetch(sim, mp.evaluate(sim, program))


@pytest.mark.skipif(not hasattr(mp, "Driver"), reason="no HTTP runtime")
def test_on_worker_processes_with_the_init_policies(tmp_path: Path) -> None:
    """Two HTTP workers over mutual TLS with the policies `mplang init` writes, each
    reading its columns from its data root: refused by the passive party until it
    approves `mplang.libs.secret_trees`, then accepted, the simulator's trees."""
    from mplang.cluster.local import LocalCluster
    from tests.worker.support import edit_policies, free_ports

    x, y = _data()
    _write_split(x, y, {f"node_{i}": tmp_path / f"node_{i}" for i in range(2)})
    spec = mp.ClusterSpec.simple(2).to_dict()
    for node, port in zip(spec["nodes"], free_ports(2), strict=True):
        node["endpoint"] = f"127.0.0.1:{port}"
    local = LocalCluster(mp.ClusterSpec.from_dict(spec), data_root=tmp_path)
    local.start()
    driver = local.driver(timeout=60.0, run_timeout=300.0)
    try:
        with pytest.raises(mp.MPRefusedError, match=r"node_1 refuses the program: .* add "
                           r"approve: - \{library: mplang\.libs\.secret_trees\.grown_on_device"):
            _model(driver)
        edit_policies(local, ["node_1"], lambda t: t.replace(*APPROVE))
        got = _fetched(driver, _model(driver))
        with pytest.raises(mp.MPRefusedError, match=r"node_[01] refuses the program: op "
                           r"spu\.reveal at test_secureboost_spu\.py:\d+ sends the value "
                           r"revealed from SP0, aggregate over groups of at least 5 rows"):
            _model(driver, min_leaf=5)
    finally:
        driver.close()
        local.close()
    _same_trees(got, _reference(x, y))


def _probabilities(x: np.ndarray, model: dict[str, np.ndarray], y: np.ndarray) -> np.ndarray:
    right0 = secureboost._decisions(jnp.asarray(x[:, :4]), model["feature0"],
                                    model["threshold0"])
    right1 = secureboost._decisions(jnp.asarray(x[:, 4:]), model["feature1"],
                                    model["threshold1"])
    base = np.float32(np.log(y.mean() / (1 - y.mean())))
    return np.asarray(secureboost._probabilities(right0, right1, jnp.asarray(model["leaf"]),
                                                 base, DEPTH))
