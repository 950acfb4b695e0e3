"""From the audit logs alone: in a millionaire's comparison whose inputs each owner loads
from its own data root, no party receives another party's plaintext, and the driver
receives only the revealed result."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cluster.local import LocalCluster
from mplang.records.audit import plaintext_received, read_events, summarize
from tests.worker import support

WEALTH = {"node_0": 5_000_000, "node_1": 7_000_000}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("data")
    for node in ("node_0", "node_1", "node_2"):
        (root / node).mkdir()
    for node, wealth in WEALTH.items():
        np.save(root / node / "wealth.npy", np.array(wealth, dtype=np.int32))
    local = LocalCluster(support.make_spec(support.free_ports(3)), data_root=root,
                         audit_dir=tmp_path_factory.mktemp("audit"))
    try:
        local.start(timeout=60)
        yield local
    finally:
        local.close()


def _millionaire() -> Any:
    alice = mp.device("P0")(lambda: tensor.load("wealth.npy"))()
    bob = mp.device("P1")(lambda: tensor.load("wealth.npy"))()
    return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(alice, bob))


def test_no_party_receives_another_partys_plaintext(cluster: LocalCluster) -> None:
    with support.connected_driver(cluster) as driver:
        poorer = mp.fetch(driver, mp.evaluate(driver, _millionaire))
    assert bool(poorer) is True
    logs = sorted(cluster.audit_dir.glob("*.jsonl"))
    events = read_events(logs)
    for node in ("node_0", "node_1", "node_2"):
        assert plaintext_received(events, node) == [], node
    received = [e for e in events if e["event"] == "recv"]
    assert received and {e["kind"] for e in received} == {"secret share"}
    fetched = plaintext_received(events, "driver")
    assert [e["node"] for e in fetched] == ["node_0"]
    assert fetched[0]["bytes"] < 100  # the one revealed boolean, not a wealth
    summary = summarize(logs)
    assert summary["mismatches"] == []
    assert summary["executions"]["by_verdict"] == {"accepted": 3}
