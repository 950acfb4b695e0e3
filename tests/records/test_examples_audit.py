"""From the workers' own audit logs: in the millionaire, secure-mean and logistic-regression
examples, run on real worker processes with each party's inputs loaded on its own side
(`tensor.load` from its data root) and `mplang init`'s development policies, no party and
not the driver receives another party's plaintext input: between parties only secret
shares travel, and the driver receives only the revealed results it fetches."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.cluster.local import LocalCluster
from mplang.records.audit import SECRET_SHARE, plaintext_received, read_events, summarize
from tests.examples.test_examples import load
from tests.worker import support

NODES = ("node_0", "node_1", "node_2")
REGIONS = np.random.default_rng(5).integers(0, 4, size=60).astype(np.int32)
"""node_0's region of each of 60 customers (a group of 3 is suppressed below)."""
REGIONS[np.flatnonzero(REGIONS == 3)[3:]] = 2
SPEND = np.random.default_rng(6).gamma(2.0, 50.0, size=60).astype(np.float32)
"""node_1's spend of each of the same customers."""


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """Three workers (ABY3 SPU, a mock-attested TEE on node_2) with data roots
    ``data/<node>`` and audit logs."""
    base = tmp_path_factory.mktemp("examples-audit")
    layout = support.spec_dict(support.free_ports(3))
    layout["devices"]["T0"] = {"kind": "TEE", "members": ["node_2"],
                               "config": {"attestation": "mock"}}
    spec = mp.ClusterSpec.from_dict(layout)
    roots = {node: base / "data" / node for node in NODES}
    millionaire = load("millionaire")
    millionaire.save_wealth(roots["node_0"], 2_500_000)
    millionaire.save_wealth(roots["node_1"], 1_999_999)
    stats = load("secure_mean_variance")
    for node, values in zip(NODES, stats.make_data(0), strict=True):
        stats.save_values(roots[node], values)
    regression = load("logistic_regression")
    regression.save_party_data(roots, regression.load_data())
    np.save(roots["node_0"] / "region.npy", REGIONS)
    np.save(roots["node_1"] / "spend.npy", SPEND)
    with support.audited_cluster(spec, base) as workers:
        yield workers


def run_logged(workers: tuple[LocalCluster, Path], prog: Any, *, fetched: int
               ) -> tuple[Any, list[dict[str, Any]]]:
    """Evaluate ``prog`` and fetch its results; the events of that execution and the
    driver's fetches, from every node's log."""
    cluster, audit_dir = workers
    logs = [audit_dir / f"{node.name}.jsonl" for node in cluster.cluster.nodes]
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
    answer, events = run_logged(workers, example.millionaire, fetched=1)
    assert bool(answer) is False  # 2,500,000 < 1,999,999
    _no_plaintext_between_parties(events)
    (fetch,) = plaintext_received(events, "driver")
    assert fetch["node"] == "node_0"  # the one-bit answer, revealed to P0, fetched there
    releases = {e["node"]: [(r["description"], r["receiver"], r["allowed_by"], r["kind"])
                            for r in e["releases"]] for e in events if e["event"] == "execution"}
    compare = [("compare of wealth.npy", to, 'rule {to: ["*"], when: compare}', "rule")
               for to in ("node_0", "driver")]  # node_1's wealth, compared, reaches node_0
    assert releases == {"node_0": compare[1:], "node_1": compare, "node_2": []}, releases


def test_secure_mean_and_variance(workers: tuple[LocalCluster, Path]) -> None:
    example = load("secure_mean_variance")
    (mean, variance), events = run_logged(workers, example.joint_stats, fetched=2)
    values = np.concatenate(example.make_data(0)).astype(np.float64)
    assert float(mean) == pytest.approx(values.mean(), rel=1e-3)
    assert float(variance) == pytest.approx(values.var(), rel=1e-3)
    _no_plaintext_between_parties(events)
    fetched = plaintext_received(events, "driver")
    assert [e["node"] for e in fetched] == ["node_0", "node_0"]
    assert all(e["bytes"] < 200 for e in fetched)  # two scalars, not a vector


def test_logistic_regression(workers: tuple[LocalCluster, Path]) -> None:
    """Training weights each party's rows by the other's real values: no aggregate, so
    each party approves the reviewed program by the digest its refusal prints."""
    example = load("logistic_regression")
    with support.connected_driver(workers[0]) as driver, \
            pytest.raises(mp.MPRefusedError) as refused:
        mp.evaluate(driver, lambda: example.vertical_logistic_regression(30))
    entries = set(re.findall(r"approve: - \{program: [0-9a-f]{64}\}", str(refused.value)))
    assert len(entries) == 1, refused.value
    entry = entries.pop().removeprefix("approve: ")
    support.edit_policies(workers[0], ["node_0", "node_1"],
                          lambda text: text.replace("approve: []", f"approve:\n  {entry}"))
    out, events = run_logged(workers, lambda: example.vertical_logistic_regression(30), fetched=3)
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


def _region_and_spend() -> tuple[Any, Any]:
    from mplang import tensor

    return (mp.device("P0")(lambda: tensor.load("region.npy"))(),
            mp.device("P1")(lambda: tensor.load("spend.npy"))())


def test_group_by_over_another_party_s_keys(workers: tuple[LocalCluster, Path]) -> None:
    """node_1's spend averaged per node_0's region: node_1 cannot count node_0's groups,
    the device zeroes the group of 3 customers, node_1's policy accepts the rest, and
    node_0's once it approves group-bys over its regions (node_1's spend weights them)."""
    from mplang.libs.groupby import groupby_mean

    counts = np.bincount(REGIONS, minlength=4)
    assert counts[3] == 3 and (counts[:3] >= 10).all()
    policy = workers[0].spec_path.parent / "policies" / "node_0.yaml"
    before = policy.read_text()
    support.edit_policies(workers[0], ["node_0"], lambda t: t.replace(
        "approve: []\n", "approve:\n").replace(
        "approve:\n", 'approve:\n  - {library: mplang.libs.groupby, to: ["*"]}\n', 1))
    try:
        means, events = run_logged(workers, lambda: groupby_mean(*_region_and_spend(), 4),
                                   fetched=1)
    finally:
        support.edit_policies(workers[0], ["node_0"], lambda _: before)
    want = [SPEND[np.equal(REGIONS, g)].mean() if counts[g] >= 10 else 0.0 for g in range(4)]
    np.testing.assert_allclose(means, want, rtol=1e-3)
    _no_plaintext_between_parties(events)


def test_two_group_bys_that_may_differ_by_a_row_are_refused(
        workers: tuple[LocalCluster, Path]) -> None:
    """Both refuse: node_1 (its spend in groups that may differ by a row) and node_0 (its
    regions select the rows of each group)."""
    from mplang.libs.groupby import groupby_sum

    def program() -> Any:
        regions, spend = _region_and_spend()
        merged = mp.device("P0")(lambda r: jnp.minimum(r, 2))(regions)
        return groupby_sum(regions, spend, 4), groupby_sum(merged, spend, 4)

    cluster, _ = workers
    with support.connected_driver(cluster) as driver, \
            pytest.raises(mp.MPRefusedError, match=r"(node_0|node_1) refuses the program: op "
                          r"spu\.reveal at test_examples_audit\.py:\d+ sends .*, aggregate over "
                          r"groups of at least 10 rows \(smaller ones suppressed at run time\) "
                          r"of (region|spend)\.npy, which overlaps another release"):
        mp.evaluate(driver, program)


def _phe_release(evaluate: Any) -> Any:
    """node_1's spend encrypted under node_0's key, ``evaluate``d by node_2, decrypted by
    node_0."""
    from mplang import phe, simp, tensor

    def program() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
        spend = simp.pcall((1,), lambda: tensor.load("spend.npy"))
        c = simp.pcall((1,), phe.encrypt, spend, simp.shuffle_static(pk, {1: 0}))
        out = simp.pcall((2,), evaluate, simp.shuffle_static(c, {2: 1}))
        return simp.pcall((0,), phe.decrypt, simp.shuffle_static(out, {0: 2}), sk)

    return program


def test_phe_sum_of_another_party_s_rows(workers: tuple[LocalCluster, Path]) -> None:
    pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")
    from mplang import phe

    total, events = run_logged(workers, _phe_release(lambda c: phe.sum(c)), fetched=1)
    assert float(total[0]) == pytest.approx(float(SPEND.astype(np.float64).sum()), rel=1e-6)
    assert {e["verdict"] for e in events if e["event"] == "execution"} == {"accepted"}
    cluster, _ = workers
    with support.connected_driver(cluster) as driver, \
            pytest.raises(mp.MPRefusedError, match=r"node_1 refuses the program: op "
                          r"phe\.decrypt at test_examples_audit\.py:\d+ sends the plaintext it "
                          r"decrypts, raw of spend\.npy, to node_0"):
        mp.evaluate(driver, _phe_release(lambda c: phe.sum(c * np.eye(60, dtype=np.float32)[7])))


def test_tee_sum_of_two_parties_rows(workers: tuple[LocalCluster, Path]) -> None:
    """node_0's regions and node_1's spend sealed to the TEE (attestation SIMULATED), summed
    there, and the sum sealed to P0: both owners accept; the rows themselves are refused."""
    def on_t0(fn: Any) -> Any:
        return lambda: mp.put("P0", mp.device("T0")(fn)(*_region_and_spend()))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
        total, events = run_logged(workers, on_t0(lambda r, s: jnp.sum(r) + jnp.sum(s)), fetched=1)
        assert float(total) == pytest.approx(float(REGIONS.sum() + SPEND.sum()), rel=1e-5)
        assert {e["verdict"] for e in events if e["event"] == "execution"} == {"accepted"}
        cluster, _ = workers
        with support.connected_driver(cluster) as driver, \
                pytest.raises(mp.MPRefusedError, match=r"node_1 refuses the program: op "
                              r"crypto\.aes_decrypt at test_examples_audit\.py:\d+ sends the "
                              r"plaintext it decrypts, row-wise \(raw\) values of spend\.npy, "
                              r"to node_0"):
            mp.evaluate(driver, on_t0(lambda r, s: s * 2))
