"""The audit log writer (`mplang.records.audit.AuditLog`), op names from message keys,
the kinds values are logged as, the summary and ``mplang audit``."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mplang.cli.main import main
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.typing import BaseType, TypeDecoder, TypeEncoder, register_type
from mplang.records.audit import (
    AuditLog,
    default_path,
    op_at,
    plaintext_received,
    read_events,
    summarize,
)
from mplang.transport.wire import ValueCodec, privacy_kind, register_value_codec, value_codecs

NODES = ["node_0", "node_1", "node_2"]
DRIVER = ("driver", "ab" * 32)


def _op(opcode: str, *regions: Graph) -> Operation:
    return Operation(opcode, (), (), {}, regions)


def _graph(*ops: Operation) -> Graph:
    return Graph([], list(ops), [])


def _program() -> Graph:
    """/0 constant; /1 pcall { /1/0 run_jax; /1/1 shuffle }; /2 while {cond: /0 pred_op;
    body: /0 body_op}; /3 cond {branch 0: /0 then_op; branch 1: /0 else_op}; /4 spu.run."""
    return _graph(
        _op("simp.constant"),
        _op("simp.pcall", _graph(_op("tensor.run_jax"), _op("simp.shuffle_static"))),
        _op("simp.while_loop", _graph(_op("cond.pred")), _graph(_op("body.step"))),
        _op("simp.uniform_cond", _graph(_op("then.op")), _graph(_op("else.op"))),
        _op("spu.run"),
    )


def _log(tmp_path: Path, node: str = "node_0") -> AuditLog:
    return AuditLog(tmp_path / "deep" / "dir" / f"{node}.jsonl", node, NODES)


def test_op_keys_name_the_op_through_regions_iterations_and_links() -> None:
    graph = _program()
    assert op_at(graph, "/0") == "simp.constant"
    assert op_at(graph, "/1") == "simp.pcall"
    assert op_at(graph, "/1/1") == "simp.shuffle_static"
    assert op_at(graph, "/2/i3/c/0") == "cond.pred"
    assert op_at(graph, "/2/i0/b/0") == "body.step"
    assert op_at(graph, "/2/i7/pred") == "simp.while_loop"
    assert op_at(graph, "/3/b1/0") == "else.op"
    assert op_at(graph, "/3/pred") == "simp.uniform_cond"
    assert op_at(graph, "/4/link#exec/4:1:ALLGATHER") == "spu.run"
    assert op_at(graph, "/9") is None
    assert op_at(graph, "/1/5") is None


def test_events_are_json_lines_with_time_node_and_their_fields(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.execution("e1", "/0", "d" * 64, DRIVER, "accepted", graph=_program(), name="f",
                  rule="policies/node_0.yaml")
    log.message("send", "e1", 1, "/0/1/1", "plaintext", 68)
    log.message("recv", "e1", 2, "/0/4/link#x", "secret share", 37)
    log.message("send", "e1", 2, "/0/9", "plaintext", 5, delivered=False)
    log.end("e1", "/0")
    log.fetch(DRIVER, "mem://node_0/abc", "plaintext", 51)
    log.delete(DRIVER, ["mem://node_0/abc"], 1)
    log.execution("e2", "", "f" * 64, DRIVER, "refused", "op simp.load at p.py:3: no")
    log.upload("v", 120, {"dtype": "int32", "shape": [3]})
    log.describe(DRIVER, "x.npy", {"dtype": "float32", "shape": [2, 3]})
    log.close()
    events = read_events([log.path])
    assert [e["event"] for e in events] == ["execution", "send", "recv", "send", "end",
                                            "fetch", "delete", "execution", "upload",
                                            "describe"]
    assert all(e["node"] == "node_0" and isinstance(e["time"], float) for e in events)
    assert events[0] | {"time": 0} == {
        "event": "execution", "time": 0, "node": "node_0", "exec": "e1", "scope": "/0",
        "program": "d" * 64, "name": "f", "driver": {"name": "driver",
                                                     "fingerprint": "ab" * 32},
        "verdict": "accepted", "rule": "policies/node_0.yaml", "reason": None,
        "releases": []}
    assert events[1] | {"time": 0} == {
        "event": "send", "time": 0, "node": "node_0", "exec": "e1", "peer": "node_1",
        "op": "simp.shuffle_static", "key": "/0/1/1", "kind": "plaintext", "bytes": 68,
        "messages": 1, "delivered": True}
    assert (events[2]["peer"], events[2]["op"], events[2]["kind"]) == \
        ("node_2", "spu.run", "secret share")
    assert "delivered" not in events[2]
    assert (events[3]["op"], events[3]["delivered"]) == (None, False)
    assert (events[4]["status"], events[4]["reason"]) == ("ok", None)
    assert events[5]["uri"] == "mem://node_0/abc" and events[5]["bytes"] == 51
    assert (events[6]["uris"], events[6]["deleted"]) == (["mem://node_0/abc"], 1)
    assert (events[7]["verdict"], events[7]["reason"]) == ("refused", "op simp.load at p.py:3: no")
    assert (events[8]["name"], events[8]["bytes"], events[8]["type"]) == \
        ("v", 120, {"dtype": "int32", "shape": [3]})
    assert (events[9]["driver"]["name"], events[9]["name"], events[9]["type"]) == \
        ("driver", "x.npy", {"dtype": "float32", "shape": [2, 3]})


def test_link_messages_are_summed_per_op_peer_and_direction_when_the_run_ends(
        tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.execution("e1", "/0", "d" * 64, DRIVER, "accepted", graph=_program())
    for size in (10, 20, 30):
        log.message("send", "e1", 1, f"/0/4/link#exec/4:{size}", "secret share", size,
                    link=True)
    log.message("recv", "e1", 1, "/0/4/link#exec/4:9", "secret share", 7, link=True)
    log.message("send", "e1", 2, "/0/4/link#exec/4:9", "secret share", 5, link=True)
    assert read_events([log.path])[1:] == []  # nothing written before the run ends
    log.end("e1", "/0")
    log.close()
    sums = [(e["event"], e["peer"], e["op"], e["key"], e["bytes"], e["messages"])
            for e in read_events([log.path])[1:-1]]
    assert sums == [("send", "node_1", "spu.run", "/0/4/link", 60, 3),
                    ("recv", "node_1", "spu.run", "/0/4/link", 7, 1),
                    ("send", "node_2", "spu.run", "/0/4/link", 5, 1)]
    summary = summarize([log.path])["messages"]["node_0"]
    assert summary["sent"]["node_1"]["secret share"] == {"count": 3, "bytes": 60}
    assert summary["received"]["node_1"]["secret share"] == {"count": 1, "bytes": 7}


def test_the_log_is_appended_to_across_restarts(tmp_path: Path) -> None:
    first = _log(tmp_path)
    assert first.path.stat().st_mode & 0o777 == 0o600
    first.end("e1", "", None)
    first.close()
    second = _log(tmp_path)
    second.end("e2", "", "MPRuntimeError: boom")
    second.close()
    events = read_events([second.path])
    assert [(e["exec"], e["status"]) for e in events] == [("e1", "ok"), ("e2", "failed")]


def test_a_run_refused_by_the_votes_ends_refused(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.execution("e1", "", "d" * 64, DRIVER, "accepted", graph=_program())
    log.end("e1", "", "party 1 voted for another program", refused=True)
    log.close()
    assert [(e["event"], e.get("status"), e.get("reason")) for e in read_events([log.path])] \
        == [("execution", None, None), ("end", "refused", "party 1 voted for another program")]


def test_a_failed_run_of_an_aborted_execution_ends_aborted(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.execution("e1", "", "d" * 64, DRIVER, "accepted", graph=_program())
    log.abort("e1", DRIVER, "party 1 failed")
    log.end("e1", "", "MPCommunicationError: aborted")
    log.message("recv", "e1", 1, "/1/1", "plaintext", 8)  # late: the program is forgotten
    log.close()
    events = read_events([log.path])
    assert [e["event"] for e in events] == ["execution", "abort", "end", "recv"]
    assert events[1]["reason"] == "party 1 failed"
    assert events[2]["status"] == "aborted"
    assert events[3]["op"] is None


def test_concurrent_writers_give_whole_lines(tmp_path: Path) -> None:
    log = _log(tmp_path)

    def write(peer: int) -> None:
        for i in range(300):
            log.message("send", f"e{peer}", peer, f"/{i}", "plaintext", i)

    threads = [threading.Thread(target=write, args=(p % 3,)) for p in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    lines = log.path.read_text().splitlines()
    assert len(lines) == 1800
    assert all(json.loads(line)["event"] == "send" for line in lines)
    log.end("e0", "")  # after close: dropped, not an error
    assert len(log.path.read_text().splitlines()) == 1800


def test_default_path_is_under_audit() -> None:
    assert default_path("node_1") == Path("audit") / "node_1.jsonl"


class _Cipher:
    def __init__(self, data: bytes):
        self.data = data


@register_type("test_audit.cipher")
@dataclass(frozen=True)
class _CipherType(BaseType):
    """The IR type of `_Cipher` values (a test's own)."""

    def to_json(self, encode: TypeEncoder) -> Any:
        return []

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> _CipherType:
        return _CipherType()


def test_kinds_come_from_the_value_and_its_codec() -> None:
    assert privacy_kind(np.arange(3)) == "plaintext"
    assert privacy_kind(np.float32(2.0)) == "plaintext"
    assert privacy_kind(7) == "plaintext"
    assert privacy_kind(None) == "plaintext"
    assert privacy_kind(b"\x01\x02") == "secret share"  # SPU link traffic
    assert privacy_kind(memoryview(b"\x01")) == "secret share"
    assert [c.privacy for c in value_codecs() if c.kind == "share"] == ["secret share"]
    register_value_codec(ValueCodec(_CipherType, _Cipher, lambda c: [c.data],
                                    lambda parts: _Cipher(bytes(parts[0])),
                                    privacy="ciphertext"))
    assert privacy_kind(_Cipher(b"x")) == "ciphertext"
    assert privacy_kind([_Cipher(b"x"), b"y"]) == "ciphertext+secret share"
    assert privacy_kind([_Cipher(b"x"), np.zeros(2)]) == "plaintext"


def _two_logs(tmp_path: Path) -> list[Path]:
    a, b = _log(tmp_path, "node_0"), _log(tmp_path, "node_1")
    for log in (a, b):
        log.execution("e1", "", "d" * 64, DRIVER, "accepted", name="stats",
                      rule="the default policy")
    b.execution("e2", "", "f" * 64, ("driver2", "cd" * 32), "refused", "not allowed")
    a.message("send", "e1", 1, "/1", "plaintext", 100)
    b.message("recv", "e1", 0, "/1", "plaintext", 100)
    a.message("send", "e1", 1, "/2/link#t", "secret share", 40)
    a.message("send", "e1", 1, "/2/link#u", "secret share", 2)
    b.message("recv", "e1", 0, "/2/link#t", "secret share", 40)  # one missing on b's side
    b.message("send", "e1", 0, "/2/link#t", "secret share", 40)
    a.message("recv", "e1", 1, "/2/link#t", "secret share", 40)
    a.end("e1", "")
    b.end("e1", "", "MPRuntimeError: x")
    a.fetch(DRIVER, "mem://node_0/x", "plaintext", 51)
    b.fetch(("driver2", "cd" * 32), "mem://node_1/y", "secret share", 90)
    b.delete(DRIVER, ["u1", "u2"], 2)
    b.upload("v", 120, {"dtype": "int32", "shape": [3]})
    b.describe(DRIVER, "v", {"dtype": "int32", "shape": [3]})
    a.close()
    b.close()
    with open(b.path, "a") as f:
        f.write('{"event": "recv", "trunc\n')
    return [a.path, b.path]


def test_summary_counts_executions_bytes_per_peer_and_kind_and_fetches(tmp_path: Path) -> None:
    paths = _two_logs(tmp_path)
    summary = summarize(paths)
    assert summary["nodes"] == ["node_0", "node_1"]
    assert summary["executions"] == {
        "requests": 3, "distinct": 2, "by_verdict": {"accepted": 2, "refused": 1},
        "by_driver": {"driver": 2, "driver2": 1}, "by_program": {"d" * 64: 2, "f" * 64: 1},
        "by_status": {"ok": 1, "failed": 1}}
    assert summary["messages"]["node_0"] == {
        "sent": {"node_1": {"plaintext": {"count": 1, "bytes": 100},
                            "secret share": {"count": 2, "bytes": 42}}},
        "received": {"node_1": {"secret share": {"count": 1, "bytes": 40}}}}
    assert summary["messages"]["node_1"]["received"] == {
        "node_0": {"plaintext": {"count": 1, "bytes": 100},
                   "secret share": {"count": 1, "bytes": 40}}}
    assert summary["mismatches"] == [{"from": "node_0", "to": "node_1", "kind": "secret share",
                                      "sent": 42, "received": 40}]
    assert summary["fetches"] == {
        "driver": {"count": 1, "bytes": 51, "by_kind": {"plaintext": 51}},
        "driver2": {"count": 1, "bytes": 90, "by_kind": {"secret share": 90}}}
    assert summary["deletes"] == {"driver": 2}
    assert summary["uploads"] == {"node_1": {"count": 1, "bytes": 120}}
    assert summary["describes"] == {"driver": 1}
    assert summary["malformed"] == [f"{paths[1]}:{len(paths[1].read_text().splitlines())}"]
    assert summarize(read_events(paths)) == summary  # events work as well as paths


def test_plaintext_received_lists_plaintext_recvs_and_fetches(tmp_path: Path) -> None:
    paths = _two_logs(tmp_path)
    got = plaintext_received(paths, "node_1")
    assert [(e["event"], e["peer"], e["bytes"]) for e in got] == [("recv", "node_0", 100)]
    assert plaintext_received(paths, "node_0") == []  # only secret shares reached it
    assert [(e["event"], e["uri"]) for e in plaintext_received(paths, "driver")] == \
        [("fetch", "mem://node_0/x")]
    assert plaintext_received(paths, "driver2") == []


def test_mplang_audit_prints_text_and_json(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    paths = [str(p) for p in _two_logs(tmp_path)]
    assert main(["audit", *paths, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == summarize(paths)
    assert main(["audit", *paths]) == 0
    assert capsys.readouterr().out == f"""\
nodes: node_0, node_1
runs: 2 (requests accepted 2, refused 1; ended failed 1, ok 1)
run 1: stats by driver
  program sha256 dddddddddddddddd..., driver certificate sha256 abababababababab...
  node_0: accepted (the default policy); ended ok
  node_1: accepted (the default policy); ended failed: MPRuntimeError: x
  node_0 -> node_1: plaintext 100 bytes in 1 message, secret share 42 bytes in 2 messages
  node_1 -> node_0: secret share 40 bytes in 1 message
run 2: (unnamed program) by driver2 (refused by node_1)
  program sha256 ffffffffffffffff..., driver certificate sha256 cdcdcdcdcdcdcdcd...
  node_1: refused: not allowed
totals:
  node_0 -> node_1: plaintext 100 bytes in 1 message, secret share 42 bytes in 2 messages
  node_1 -> node_0: secret share 40 bytes in 1 message
mismatches: 1
  MISMATCH node_0 -> node_1 secret share: sent 42 bytes, received 40
fetches:
  driver: 1 values, 51 bytes (plaintext: 51 bytes)
  driver2: 1 values, 90 bytes (secret share: 90 bytes)
deletes by driver: 2
uploads to node_1: 1 (120 bytes)
types described to driver: 1
malformed line: {paths[1]}:{len(Path(paths[1]).read_text().splitlines())}
"""


def test_an_aborted_run_is_marked_aborted_not_a_mismatch(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    """node_0 sent 10 bytes that node_1 never took: the driver aborted the run."""
    a, b = _log(tmp_path, "node_0"), _log(tmp_path, "node_1")
    for log in (a, b):
        log.execution("e9", "", "e" * 64, DRIVER, "accepted", name="join", rule="p.yaml")
    a.message("send", "e9", 1, "/1", "plaintext", 10)
    for log in (a, b):
        log.abort("e9", DRIVER, "party 1 failed")
        log.end("e9", "", "MPRuntimeError: execution e9 was aborted")
    a.close()
    b.close()
    summary = summarize([a.path, b.path])
    assert summary["mismatches"] == []
    assert [(r["exec"], r["aborted"]) for r in summary["runs"]] == [("e9", True)]
    assert main(["audit", str(a.path), str(b.path)]) == 0
    assert capsys.readouterr().out == """\
nodes: node_0, node_1
runs: 1 (requests accepted 2; ended aborted 2)
run 1: join by driver (aborted)
  program sha256 eeeeeeeeeeeeeeee..., driver certificate sha256 abababababababab...
  node_0: accepted (p.yaml); ended aborted: MPRuntimeError: execution e9 was aborted
  node_1: accepted (p.yaml); ended aborted: MPRuntimeError: execution e9 was aborted
  node_0 -> node_1: plaintext 10 bytes in 1 message
totals:
  node_0 -> node_1: plaintext 10 bytes in 1 message
mismatches: none (sent and received bytes agree)
fetches:
"""


def test_mplang_audit_of_a_missing_log_fails_clearly(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mplang audit: ") and "nope.jsonl" in err


def test_the_budget_spent_adds_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    """Ten charges of 0.1 spend 1; 0.1 + 0.2, less a refund of 0.1, spend 0.2: no float
    noise in the report or its JSON."""
    def event(eps: float, source: str, action: str = "charge") -> dict[str, Any]:
        return {"event": "budget", "node": "node_0", "action": action, "program": "p",
                "epsilon": {source: eps}}

    summary = summarize([event(0.1, "a.npy")] * 10 + [
        event(0.1, "b.npy"), event(0.2, "b.npy"), event(0.1, "b.npy", "refund")])
    assert summary["budget"]["node_0"] == {
        "a.npy": {"spent": 1.0, "charges": 10, "refunds": 0},
        "b.npy": {"spent": 0.2, "charges": 2, "refunds": 1}}
    assert "0000000" not in json.dumps(summary)
    assert str(summary).splitlines()[-2:] == [
        "privacy budget of node_0: a.npy: epsilon 1 spent (10 charges, 0 refunds)",
        "privacy budget of node_0: b.npy: epsilon 0.2 spent (2 charges, 1 refunds)"]
