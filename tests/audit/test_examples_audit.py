"""From the workers' own audit logs: in the millionaire, secure-mean and logistic-regression
examples, run on real worker processes with each party's inputs loaded on its own side
(`tensor.load` from its data root) and `mplang init`'s development policies, no party and
not the driver receives another party's plaintext input: between parties only secret
shares travel, and the driver receives only the revealed results it fetches."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang.cluster.local import LocalCluster
from mplang.records.audit import SECRET_SHARE, plaintext_received, read_events, summarize
from tests.examples.test_examples import load
from tests.http import support

NODES = ("node_0", "node_1", "node_2")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """Three workers (ABY3 SPU) with data roots ``data/<node>`` and audit logs."""
    base = tmp_path_factory.mktemp("examples-audit")
    spec = mp.ClusterSpec.from_dict(support.spec_dict(support.free_ports(3)))
    roots = {node: base / "data" / node for node in NODES}
    millionaire = load("millionaire")
    millionaire.save_wealth(roots["node_0"], 2_500_000)
    millionaire.save_wealth(roots["node_1"], 1_999_999)
    stats = load("secure_mean_variance")
    for node, values in zip(NODES, stats.make_data(0), strict=True):
        stats.save_values(roots[node], values)
    regression = load("logistic_regression")
    regression.save_party_data(roots, regression.load_data())
    cluster = LocalCluster(spec, audit_dir=base / "audit", data_root=base / "data")
    try:
        cluster.start(timeout=120)
        yield cluster, base / "audit"
    finally:
        cluster.close()


def _run(workers: tuple[LocalCluster, Path], prog: Any, *, fetched: int
         ) -> tuple[Any, list[dict[str, Any]]]:
    """Evaluate ``prog`` and fetch its results; the events of that execution and the
    driver's fetches, from every node's log."""
    cluster, audit_dir = workers
    logs = [audit_dir / f"{node}.jsonl" for node in NODES]
    before = read_events(p for p in logs if p.exists())
    with support.connected_driver(cluster) as driver:
        result = mp.fetch(driver, mp.evaluate(driver, prog))
    after = read_events(logs)
    execs = {e["exec"] for e in after if e["event"] == "execution"} - \
        {e["exec"] for e in before if e["event"] == "execution"}
    assert execs, "the run left no execution in the logs"
    old_fetches = sum(e["event"] == "fetch" for e in before)
    fetches = [e for e in after if e["event"] == "fetch"][old_fetches:]
    assert len(fetches) == fetched, fetches
    return result, [e for e in after if e.get("exec") in execs] + fetches


def _no_plaintext_between_parties(events: list[dict[str, Any]]) -> None:
    verdicts = {(e["node"], e["verdict"]) for e in events if e["event"] == "execution"}
    assert {v for _, v in verdicts} == {"accepted"}, verdicts
    assert {e["driver"]["name"] for e in events if e["event"] == "execution"} == {"driver"}
    messages = [e for e in events if e["event"] in ("send", "recv")]
    assert messages, "the program exchanged no message"
    assert {e["kind"] for e in messages} == {SECRET_SHARE}, \
        [e for e in messages if e["kind"] != SECRET_SHARE][:3]
    for node in NODES:
        assert plaintext_received(events, node) == []
    assert summarize(events)["mismatches"] == []


def test_millionaire(workers: tuple[LocalCluster, Path]) -> None:
    example = load("millionaire")
    answer, events = _run(workers, example.millionaire, fetched=1)
    assert bool(answer) is False  # 2,500,000 < 1,999,999
    _no_plaintext_between_parties(events)
    (fetch,) = plaintext_received(events, "driver")
    assert fetch["node"] == "node_0"  # the one-bit answer, revealed to P0, fetched there


def test_secure_mean_and_variance(workers: tuple[LocalCluster, Path]) -> None:
    example = load("secure_mean_variance")
    (mean, variance), events = _run(workers, example.joint_stats, fetched=2)
    values = np.concatenate(example.make_data(0)).astype(np.float64)
    assert float(mean) == pytest.approx(values.mean(), rel=1e-3)
    assert float(variance) == pytest.approx(values.var(), rel=1e-3)
    _no_plaintext_between_parties(events)
    fetched = plaintext_received(events, "driver")
    assert [e["node"] for e in fetched] == ["node_0", "node_0"]
    assert all(e["bytes"] < 200 for e in fetched)  # two scalars, not a vector


def test_logistic_regression(workers: tuple[LocalCluster, Path]) -> None:
    example = load("logistic_regression")
    out, events = _run(workers, lambda: example.vertical_logistic_regression(30), fetched=3)
    data = example.load_data()
    assert out["w0"].shape == (example.P0_FEATURES,)
    assert out["w1"].shape == (data["x1_train"].shape[1],)
    assert example.accuracy(data, out["w0"], out["w1"], float(out["b"])) > 0.85
    _no_plaintext_between_parties(events)
    fetched = plaintext_received(events, "driver")
    # the driver gets the model parts and results, each from the party it was revealed to
    assert sorted(e["node"] for e in fetched) == ["node_0", "node_1", "node_1"]
    inputs = min(data[k].nbytes for k in ("x0_train", "x1_train"))
    assert all(e["bytes"] < inputs // 10 for e in fetched)
