"""Differentially private releases on real workers: node_0 allows only dp releases of its
``x.npy`` (at most epsilon 1 each, 2 in all). A release runs and is charged; a larger
epsilon, an exact mean and a release past the budget are refused; a run another party
refuses is refunded; the ledger survives a
restart of node_0's worker; ``mplang budget`` shows it to node_0's owner only, and
``mplang audit`` shows the charges. No party received plaintext: the noise and the random
words it is drawn from travel only as secret shares."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cluster.local import LocalCluster
from mplang.libs import dp
from mplang.policy.ledger import LEDGER_FILE
from mplang.records.audit import plaintext_received
from tests.worker import support

X = np.linspace(0.0, 10.0, 200).astype(np.float32)
DP_ONLY = "declassify:\n  - {to: ['*'], when: dp, max_epsilon: 1.0, budget: 2.0}\n"


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    base = tmp_path_factory.mktemp("dp")
    dev = support.dev_cluster(base, support.make_spec(support.free_ports(3)))
    (dev.spec_path.parent / "policies" / "node_0.yaml").write_text(DP_ONLY)
    for node in ("node_0", "node_1", "node_2"):
        (base / "data" / node).mkdir(parents=True)
    np.save(base / "data" / "node_0" / "x.npy", X)
    np.save(base / "data" / "node_1" / "y.npy", X)
    cluster = LocalCluster(dev.spec_path, keys=dev.keys, audit_dir=base / "audit",
                           data_root=base / "data", state_dir=base / "state")
    try:
        cluster.start(timeout=120)
        yield cluster, base
    finally:
        cluster.close()


def noisy_mean(eps: float) -> Any:
    x = mp.device("P0")(lambda: tensor.load("x.npy"))()
    return dp.noisy_mean(x, (0.0, 10.0), eps, to="P1")


def budget_cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*support.mplang_command(), "budget", "--cluster",
                           str(cluster.spec_path), *args],
                          capture_output=True, text=True, timeout=120)


def test_releases_budget_restart_and_cli(workers: tuple[LocalCluster, Path]) -> None:
    cluster, base = workers
    with support.connected_driver(cluster) as driver:
        value = mp.fetch(driver, mp.evaluate(driver, noisy_mean, 0.75))
        assert value == pytest.approx(5.0, abs=2.0)
        with pytest.raises(mp.MPRefusedError, match=(
                r"node_0 refuses the program: .*a noisy release \(epsilon 1\.5\) of x\.npy")):
            mp.evaluate(driver, noisy_mean, 1.5)
        with pytest.raises(mp.MPRefusedError, match=r"aggregate over 200 rows of x\.npy"):
            mp.evaluate(driver, lambda: mp.put("P1", mp.device("SP0")(jnp.mean)(
                mp.device("P0")(lambda: tensor.load("x.npy"))())))
        with pytest.raises(mp.MPRefusedError, match="node_1 refuses the program"):
            mp.evaluate(driver, lambda: (noisy_mean(0.75), mp.put("P2", mp.device("P1")(
                lambda: tensor.load("y.npy"))())))  # node_0 accepts, node_1 refuses: refunded
        mp.evaluate(driver, noisy_mean, 0.75)
        shown = budget_cli(cluster, "--node", "node_0")
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.splitlines()[:2] == [
            "node_0: privacy budget per source: epsilon 2", "  x.npy: spent 1.5, left 0.5"]

        cluster.kill("node_0")
        cluster.start_node("node_0")
        ledger = json.loads((base / "state" / "node_0" / LEDGER_FILE).read_text())
        assert ledger["spent"] == {"x.npy": 1.5}
        with pytest.raises(mp.MPRefusedError, match=(
                r"refused a program of \d+ ops: node_0 refuses the program: the privacy "
                r"budget is spent: its releases of "
                r"x\.npy spend epsilon 0\.75, but only 0\.5 of the budget 2 is left")):
            mp.evaluate(driver, noisy_mean, 0.75)
        mp.evaluate(driver, noisy_mean, 0.5)

    report = json.loads(budget_cli(cluster, "--node", "node_0", "--json").stdout)
    assert report["node"] == "node_0" and report["spent"] == {"x.npy": 2.0}
    assert [c["refunded"] for c in report["charges"]] == [False, True, False, False]
    stranger = budget_cli(cluster, "--node", "node_0", "--key",
                          str(cluster.keys_dir / "node_1.key"))
    assert stranger.returncode == 2
    assert stranger.stderr.startswith("mplang budget: node_0 refused the budget request: 403")
    audit = subprocess.run([*support.mplang_command(), "audit",
                            str(base / "audit" / "node_0.jsonl")],
                           capture_output=True, text=True, timeout=120)
    assert "privacy budget of node_0: x.npy: epsilon 2 spent (4 charges, 1 refunds)" in \
        audit.stdout.splitlines()
    # what each party received: secret shares only, never plaintext (the noise, its draws)
    logs = [base / "audit" / f"{node}.jsonl" for node in ("node_0", "node_1", "node_2")]
    for node in ("node_0", "node_1", "node_2"):
        assert plaintext_received(logs, node) == []
