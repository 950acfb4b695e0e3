"""Audit logs of real worker processes (`LocalCluster` with ``audit_dir``): every party
records each execution's verdict and driver, and every message it sends or receives
with its peer, op, kind and size; A's send of n bytes to B is B's receipt of n bytes
from A."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.identity import load_certificate
from mplang.cluster.local import LocalCluster
from mplang.dialects import table
from mplang.driver.upload_client import put
from mplang.libs import psi
from mplang.records.audit import format_summary, plaintext_received, read_events, summarize
from mplang.transport.wire import encode_value_bytes
from tests.worker import support

SECRET = "secret share"
X = np.arange(6, dtype=np.int32)


def _spec(n: int) -> mp.ClusterSpec:
    data = support.spec_dict(support.free_ports(n))
    if n == 2:  # ABY3 needs three parties; CHEETAH has no dealer
        data["devices"]["SP0"]["config"] = {"protocol": "CHEETAH", "field": "FM64"}
    return mp.ClusterSpec.from_dict(data)


@pytest.fixture(scope="module", params=[2, 3], ids=["2-party", "3-party"])
def audited(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    audit_dir = tmp_path_factory.mktemp("audit")
    cluster = LocalCluster(_spec(request.param), audit_dir=audit_dir)
    try:
        cluster.start(timeout=60)
        yield cluster, audit_dir
    finally:
        cluster.close()


def _logs(cluster: LocalCluster, audit_dir: Path) -> list[Path]:
    return [audit_dir / f"{n.name}.jsonl" for n in cluster.cluster.nodes]


def _of(events: list[dict[str, Any]], exec_ids: set[str]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("exec") in exec_ids]


def _run(cluster: LocalCluster, audit_dir: Path, prog: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Evaluate ``prog``, fetch its result; the events of that execution (every node's)."""
    before = {e.get("exec") for e in read_events(p for p in _logs(cluster, audit_dir)
                                                  if p.exists())}
    with support.connected_driver(cluster) as driver:
        result = mp.fetch(driver, mp.evaluate(driver, prog))
    events = read_events(_logs(cluster, audit_dir))
    new = {e["exec"] for e in events if e["event"] == "execution"} - before
    assert len(new) == 1, new
    return result, _of(events, new) + [e for e in events if e["event"] == "fetch"]


def _shuffle() -> Any:
    """Party 0 doubles X and sends it to party 1 (a plaintext message)."""
    x = simp.pcall((0,), lambda v: v * 2, simp.constant((0,), X))
    return simp.shuffle_static(x, {1: 0})


def _millionaire() -> Any:
    x = mp.device("P0")(lambda: jnp.int32(5))()
    y = mp.device("P1")(lambda: jnp.int32(7))()
    return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(x, y))


def test_a_plaintext_message_is_logged_by_sender_and_receiver(
        audited: tuple[LocalCluster, Path]) -> None:
    cluster, audit_dir = audited
    result, events = _run(cluster, audit_dir, _shuffle)
    np.testing.assert_array_equal(result[1], X * 2)
    n = len(encode_value_bytes(X * 2))  # the message body: frame header and the array
    sends = [e for e in events if e["event"] == "send"]
    recvs = [e for e in events if e["event"] == "recv"]
    assert [(e["node"], e["peer"], e["op"], e["kind"], e["bytes"], e["delivered"])
            for e in sends] == [("node_0", "node_1", "simp.shuffle_static", "plaintext", n, True)]
    assert [(e["node"], e["peer"], e["op"], e["kind"], e["bytes"]) for e in recvs] == \
        [("node_1", "node_0", "simp.shuffle_static", "plaintext", n)]
    assert sends[0]["key"] == recvs[0]["key"]
    assert plaintext_received(events, "node_1") == recvs
    assert plaintext_received(events, "node_0") == []


def test_each_party_logs_the_verdict_the_driver_and_the_end(
        audited: tuple[LocalCluster, Path]) -> None:
    cluster, audit_dir = audited
    _, events = _run(cluster, audit_dir, _shuffle)
    fingerprint = load_certificate(str(cluster.keys_dir / "driver.crt")).fingerprint
    accepted = [e for e in events if e["event"] == "execution"]
    nodes = {e["node"] for e in accepted}
    assert nodes == {"node_0", "node_1"}  # the parties of the program
    assert all(e["verdict"] == "accepted" and e["reason"] is None and
               e["driver"] == {"name": "driver", "fingerprint": fingerprint} and
               e["name"] == "_shuffle" and  # the rule: the node's policy file
               e["rule"] == str(cluster.spec_path.parent / "policies" / f"{e['node']}.yaml")
               for e in accepted)
    assert len({e["program"] for e in accepted}) == 1
    assert len(accepted[0]["program"]) == 64
    ends = [e for e in events if e["event"] == "end"]
    assert sorted((e["node"], e["status"]) for e in ends) == \
        [("node_0", "ok"), ("node_1", "ok")]


def test_secure_computation_sends_only_secret_shares_and_both_sides_agree(
        audited: tuple[LocalCluster, Path]) -> None:
    cluster, audit_dir = audited
    result, events = _run(cluster, audit_dir, _millionaire)
    assert bool(result) is True
    messages = [e for e in events if e["event"] in ("send", "recv")]
    assert messages and all(e["kind"] == SECRET for e in messages), \
        {(e["op"], e["kind"]) for e in messages}
    assert {e["op"] for e in messages} >= {"spu.seal", "spu.run"}
    links = [e for e in messages if e["key"].endswith("/link")]  # summed per op and peer
    assert links and all(e["messages"] >= 1 for e in links)
    summary = summarize(events)
    assert summary["mismatches"] == []
    world = len(cluster.cluster.nodes)
    for sender in range(world):
        for receiver in range(world):
            if sender == receiver:
                continue
            a, b = f"node_{sender}", f"node_{receiver}"
            sent = summary["messages"][a]["sent"].get(b, {})
            assert sent == summary["messages"][b]["received"].get(a, {})
            assert sent[SECRET]["bytes"] > 0  # every pair exchanged protocol messages
    for node in cluster.cluster.nodes:
        assert plaintext_received(events, node.name) == []
    fetched = [e for e in events if e["event"] == "fetch" and e["node"] == "node_0"]
    assert fetched and fetched[-1]["driver"]["name"] == "driver"
    assert fetched[-1]["kind"] == "plaintext"  # the revealed comparison result


def test_a_refused_program_is_logged_with_its_reason(audited: tuple[LocalCluster, Path]) -> None:
    cluster, audit_dir = audited
    dev = support.DevCluster(cluster.spec_path, cluster.keys_dir)
    body = support.frame({"exec": "refused-1", "scope": "", "inputs": [], "parties": [0]},
                         b"not a program")
    with dev.client("driver", 0) as client:
        response = client.post("/run", content=body)
    assert response.status_code == 400
    events = [e for e in read_events([audit_dir / "node_0.jsonl"])
              if e.get("exec") == "refused-1"]
    assert len(events) == 1
    assert events[0]["verdict"] == "refused"
    assert events[0]["driver"]["name"] == "driver"
    assert events[0]["reason"] == response.json()["error"]


def test_a_run_the_other_parties_did_not_vote_for_ends_refused(
        audited: tuple[LocalCluster, Path]) -> None:
    """node_1's vote (sent before the run reaches node_0) is not a signature over the
    program: node_0 logs the run accepted, then ended refused."""
    cluster, audit_dir = audited
    dev = support.DevCluster(cluster.spec_path, cluster.keys_dir)
    exec_id = uuid.uuid4().hex
    support.send_vote(dev, "node_1", 0, exec_id, b"AAAA")
    with dev.client("driver", 0) as client:
        response = client.post("/run", content=support.run_body(
            support.local_graph(), exec_id=exec_id, parties=[0, 1]))
    assert response.status_code == 409
    events = [e for e in read_events([audit_dir / "node_0.jsonl"]) if e.get("exec") == exec_id]
    assert [(e["event"], e.get("verdict"), e.get("status")) for e in events] == \
        [("execution", "accepted", None), ("end", None, "refused")]
    assert events[1]["reason"] == response.json()["error"]


def test_uploads_and_the_types_told_to_a_driver_are_logged(
        audited: tuple[LocalCluster, Path]) -> None:
    cluster, audit_dir = audited
    vec = np.array([3, 1, 2], dtype=np.int32)
    name = f"v{uuid.uuid4().hex[:8]}"
    put(cluster.spec_path, "node_1", name, vec)
    # node_1's policy keeps its data from the driver: node_1 keeps it, refused at fetch
    with support.connected_driver(cluster) as driver:
        kept = mp.evaluate(driver, lambda: simp.pcall((1,), lambda v: v * 10,
                                                      simp.load(1, name)))
        with pytest.raises(mp.MPRefusedError, match=(
                rf"node_1 refuses to send object \S+ to the driver: it is row-wise \(raw\) "
                rf"values of {name}; ")):
            mp.fetch(driver, kept)
    log = read_events([audit_dir / "node_1.jsonl"])
    events = [e for e in log if e["event"] in ("upload", "describe") and e["name"] == name]
    assert [(e["event"], e["type"]) for e in events] == \
        [("upload", {"dtype": "int32", "shape": [3]}),
         ("describe", {"dtype": "int32", "shape": [3]})]
    assert events[0]["bytes"] == len(encode_value_bytes(vec))
    assert events[1]["driver"]["name"] == "driver"
    after = log[log.index(events[1]):]
    assert [(e["verdict"], e["name"]) for e in after if e["event"] == "execution"] == \
        [("accepted", "<lambda>")]  # the program is named
    assert [e for e in after if e["event"] == "fetch"] == []  # nothing left


def _join() -> Any:
    """A PSI join of 30 and 25 ids (20 shared); node_0 sums its joined ids (an aggregate
    of at least 10 rows, which the development policies let out)."""
    a = simp.pcall((0,), lambda: table.constant(pa.table({"id": pa.array(range(30))})))
    b = simp.pcall((1,), lambda: table.constant(pa.table({"id": pa.array(range(10, 35))})))
    left, _ = psi.join(a, b, "id")
    ids = simp.pcall((0,), lambda t: table.to_tensor(t, ["id"]), left)
    return simp.pcall((0,), lambda m: jnp.sum(m), ids)


def test_psi_traffic_is_logged_as_psi_not_as_secret_shares(
        audited: tuple[LocalCluster, Path]) -> None:
    cluster, audit_dir = audited
    result, events = _run(cluster, audit_dir, _join)
    assert int(result[0]) == sum(range(10, 30))
    links = [e for e in events if e["event"] in ("send", "recv") and e["op"] == "psi.join"]
    assert links and {e["kind"] for e in links} == {"psi"}
    assert not [e for e in events if e.get("kind") == SECRET]
    summary = summarize(events)
    assert summary["mismatches"] == []
    [run] = summary["runs"]
    assert (run["name"], run["driver"], run["aborted"]) == ("_join", "driver", False)
    assert set(run["bytes"]) == {"node_0 -> node_1", "node_1 -> node_0"}
    assert all(set(cells) == {"psi"} for cells in run["bytes"].values())
    text = format_summary(summary)
    assert "run 1: _join by driver\n" in text
    policy = cluster.spec_path.parent / "policies" / "node_0.yaml"
    assert f"  node_0: accepted ({policy}); ended ok\n" in text


def test_a_party_whose_policy_accepted_a_run_another_refused_is_not_counted_as_refusing(
        audited: tuple[LocalCluster, Path]) -> None:
    """node_0 refuses the run; its driver aborts it at node_1 before node_1's request
    arrives (the order a driver's concurrent requests may take). node_1 accepted the
    program: its log says so, then that the run ended aborted, and the audit counts one
    refusal, node_0's."""
    cluster, audit_dir = audited
    dev = support.DevCluster(cluster.spec_path, cluster.keys_dir)
    exec_id = uuid.uuid4().hex
    with dev.client("driver", 0) as client:
        assert client.post("/run", content=support.frame(
            {"exec": exec_id, "scope": "", "inputs": [], "parties": [0, 1]},
            b"not a program")).status_code == 400
    with dev.client("driver", 1) as client:
        client.post("/abort", content=support.frame(
            {"exec": exec_id, "reason": "party 0 refused it"})).raise_for_status()
        assert client.post("/run", content=support.run_body(
            support.local_graph(), exec_id=exec_id, parties=[0, 1])).status_code == 409
    summary = summarize(_logs(cluster, audit_dir)[:2])
    (run,) = [r for r in summary["runs"] if r["exec"] == exec_id]
    assert run["nodes"]["node_0"]["verdict"] == "refused"
    assert (run["nodes"]["node_1"]["verdict"], run["nodes"]["node_1"]["status"]) == \
        ("accepted", "aborted")
    assert f"by driver (aborted; refused by node_0)\n  program sha256 {run['program'][:16]}" \
        in format_summary(summary)
