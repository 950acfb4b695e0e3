"""Timelines: ``mp.evaluate(..., trace=PATH)`` writes a Chrome / Perfetto trace with a
track per party and a slice per op (source line, messages and bytes), on the
simulator and across real worker processes (events merged on the driver's clock)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.cli.main import main
from mplang.edsl.errors import MPLangError
from mplang.records.trace_file import events_from_wire, load_trace, self_times

THIS = Path(__file__).name


def ring() -> Any:
    r = simp.prank()
    doubled = simp.pcall((0, 1, 2), lambda v: v * 2, r)  # line of the pcall
    return simp.shuffle_static(doubled, {0: 2, 1: 0, 2: 1})


def secure_product() -> Any:
    x = mp.device("P0")(lambda: np.arange(4, dtype=np.float32))()
    y = mp.device("P1")(lambda: np.ones(4, dtype=np.float32))()
    z = mp.device("SP0")(lambda a, b: a * b)(x, y)  # @spu
    return mp.put("P0", z)


def _line(text: str) -> int:
    return next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text in line)


def _trace(path: Path) -> tuple[dict[int, str], list[dict[str, Any]]]:
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    return names, [e for e in events if e["ph"] == "X"]


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_trace_has_a_track_per_party_and_a_slice_per_op(ctx: Any, tmp_path: Path,
                                                         mode: str) -> None:
    path = tmp_path / "run.json"
    out = mp.evaluate(ctx, ring, mode=mode, trace=path)
    assert [int(v) for v in mp.fetch(ctx, out)] == [4, 0, 2]
    names, slices = _trace(path)
    by_track = {names[s["pid"]]: [] for s in slices}
    for s in slices:
        by_track[names[s["pid"]]].append(s)
    parties = [f"party {r} (node_{r})" for r in range(3)]
    assert set(parties) <= set(by_track) and "driver" in by_track
    for party in parties:  # every party ran each op of the program once
        ops = sorted(s["name"] for s in by_track[party] if s["name"].startswith("simp."))
        assert ops == ["simp.pcall", "simp.prank", "simp.shuffle_static"]
        shuffle = next(s for s in by_track[party] if s["name"] == "simp.shuffle_static")
        # the ring: every party sends its int32 to one peer and receives one
        assert shuffle["args"]["sent_msgs"] == 1 and shuffle["args"]["recv_msgs"] == 1
        assert shuffle["args"]["sent_bytes"] == 4 and shuffle["args"]["recv_bytes"] == 4
        assert shuffle["args"]["rounds_estimate"] == 1
        pcall = next(s for s in by_track[party] if s["name"] == "simp.pcall")
        assert pcall["args"]["source"] == f"{THIS}:{_line('# line of the pcall')}"
    for s in slices:
        assert s["dur"] >= 0 and s["ts"] >= 0


def test_worker_events_share_the_drivers_clock(ctx: Any, tmp_path: Path) -> None:
    """Each party's ops lie within the driver's slice that ran them (launch: func.call)."""
    path = tmp_path / "run.json"
    mp.evaluate(ctx, ring, mode="launch", trace=path)
    names, slices = _trace(path)
    (call,) = [s for s in slices if names[s["pid"]] == "driver"]
    slack = 2000  # µs: the clock offset estimate is within half a round trip
    for s in slices:
        assert call["ts"] - slack <= s["ts"] and s["ts"] + s["dur"] <= \
            call["ts"] + call["dur"] + slack, s


def test_spu_ops_show_their_link_traffic_next_to_the_estimate(tmp_path: Path) -> None:
    cluster = mp.ClusterSpec.simple(2)
    sim = mp.Simulator(cluster)

    @mp.function
    def compare() -> Any:
        x = mp.device("P0")(lambda: np.arange(8, dtype=np.float32))()
        y = mp.device("P1")(lambda: np.ones(8, dtype=np.float32))()
        z = mp.device("SP0")(lambda a, b: (a * b).sum() > 3)(x, y)
        return mp.put("P0", z)

    path = tmp_path / "spu.json"
    try:
        assert bool(mp.fetch(sim, mp.evaluate(sim, compare, trace=path))) is True
        assert bool(mp.fetch(sim, mp.evaluate(sim, compare))) is True  # untraced: same
    finally:
        sim.close()
    names, slices = _trace(path)
    runs = [s for s in slices if s["name"] == "spu.run"]
    assert sorted(names[s["pid"]] for s in runs) == ["party 0 (node_0)", "party 1 (node_1)"]
    a, b = sorted(runs, key=lambda s: s["pid"])
    for run in runs:
        assert run["args"]["link_sent_msgs"] > 0 and run["args"]["rounds_estimate"] > 0
    # two members: what one sends over the link, the other receives
    assert a["args"]["link_sent_bytes"] == b["args"]["link_recv_bytes"]
    assert a["args"]["link_recv_msgs"] == b["args"]["link_sent_msgs"]


def test_a_failed_run_still_writes_its_trace(tmp_path: Path) -> None:
    sim = mp.Simulator(2)

    def fails() -> Any:
        x = simp.constant((0,), np.float32(1))
        return simp.pcall((0,), lambda v: mp.tensor.pyfunc("no.such:function", v), x)

    path = tmp_path / "failed.json"
    try:
        with pytest.raises(MPLangError):
            mp.evaluate(sim, fails, trace=path)
    finally:
        sim.close()
    assert path.exists()
    json.loads(path.read_text())


def test_trace_in_a_missing_folder_fails_before_running(tmp_path: Path) -> None:
    sim = mp.Simulator(2)
    missing = tmp_path / "nope" / "run.json"
    try:
        with pytest.raises(MPLangError) as info:
            mp.evaluate(sim, ring, trace=missing)
    finally:
        sim.close()
    assert str(info.value) == (f"trace={str(missing)!r}: the folder {str(missing.parent)!r} "
                               "does not exist; create it first or write the trace elsewhere")
    assert not missing.parent.exists()


def test_trace_summarize_prints_the_top_ops(sim_ctx: mp.Simulator, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.json"
    mp.evaluate(sim_ctx, ring, trace=path)
    capsys.readouterr()
    assert main(["trace", "summarize", str(path), "--top", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    slices = load_trace(path)
    assert lines[0] == f"{path}: {len(slices)} op runs in " + lines[0].split(" in ")[1]
    assert lines[1].split() == ["op", "runs", "self", "ms", "total", "ms", "max", "ms",
                                "bytes", "sent"]
    own: dict[str, float] = {}
    for s, t in zip(slices, self_times(slices), strict=True):
        own[s["name"]] = own.get(s["name"], 0.0) + t
    top = sorted(own, key=lambda n: (-own[n], n))[:2]
    assert [line.split()[0] for line in lines[2:4]] == top
    assert lines[4] == "self time per track:"


def test_trace_summarize_by_source_line(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """``--by line`` groups the ops by the user's line that made them, with their ops."""
    path = tmp_path / "run.json"
    sim = mp.Simulator(3)
    try:
        mp.evaluate(sim, secure_product, trace=path)
    finally:
        sim.close()
    capsys.readouterr()
    assert main(["trace", "summarize", str(path), "--by", "line"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["source", "line", "runs", "self", "ms", "total", "ms", "max",
                                "ms", "bytes", "sent", "ops"]
    rows = {line.split()[0]: line.split() for line in lines[2:lines.index(
        "self time per track:")] if line.startswith("test_timeline.py:")}
    line = _line("# @spu")
    assert rows[f"test_timeline.py:{line}"][-2:] == ["spu.run,", "spu.seal"]
    assert int(rows[f"test_timeline.py:{line}"][1]) == 9  # 3 parties: 2 seals, 1 run each
    slices = load_trace(path)
    sent = sum(int(v) for s in slices if s["args"].get("source") ==
               f"test_timeline.py:{line}" for k, v in s["args"].items()
               if k.endswith("sent_bytes"))
    assert int(rows[f"test_timeline.py:{line}"][5]) == sent > 0


@pytest.mark.parametrize("content, message", [
    ("not json", "is not a trace file (JSON expected)"),
    ('{"events": []}', "is not a Chrome trace: no 'traceEvents' list"),
])
def test_trace_summarize_rejects_other_files(tmp_path: Path, content: str, message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["trace", "summarize", str(path)]) == 2
    assert message in capsys.readouterr().err
    assert main(["trace", "summarize", str(tmp_path / "missing.json")]) == 2
    assert f"no such trace file: {tmp_path / 'missing.json'}" in capsys.readouterr().err


def test_self_time_subtracts_nested_slices() -> None:
    slices = [{"pid": 0, "tid": 1, "ts": 0.0, "dur": 10.0},
              {"pid": 0, "tid": 1, "ts": 2.0, "dur": 3.0},
              {"pid": 0, "tid": 1, "ts": 6.0, "dur": 1.0},
              {"pid": 0, "tid": 2, "ts": 1.0, "dur": 4.0}]
    assert self_times(slices) == [6.0, 3.0, 1.0, 4.0]


@pytest.mark.parametrize("items, field", [
    ("x", "'events' must be a list"),
    (["x"], "events[0] is not an object"),
    ([{"name": 1, "start": 0, "end": 1, "thread": 1, "args": {}}], "events[0].name"),
    ([{"name": "a", "start": 2, "end": 1, "thread": 1, "args": {}}], "events[0].start/end"),
    ([{"name": "a", "start": 0, "end": 1.5, "thread": 1, "args": {}}], "events[0].start/end"),
    ([{"name": "a", "start": 0, "end": 1, "thread": "t", "args": {}}], "events[0].thread"),
    ([{"name": "a", "start": 0, "end": 1, "thread": 1, "args": {"k": [1]}}],
     "events[0].args"),
])
def test_malformed_worker_events_are_refused_by_field(items: Any, field: str) -> None:
    with pytest.raises(MPLangError, match=rf"party 2's trace: {re.escape(field)}"):
        events_from_wire(items, 2)


def test_events_from_a_worker_keep_only_its_own_party() -> None:
    (event,) = events_from_wire([{"name": "simp.pcall", "start": 5, "end": 7, "thread": 3,
                                  "args": {"key": "/1", "source": "p.py:3", "sent_bytes": 8,
                                           "rounds_estimate": 2}}], 1)
    assert (event.party, event.opcode, event.key, event.loc) == (1, "simp.pcall", "/1", "p.py:3")
    assert event.traffic is not None and event.traffic.sent_bytes == 8
    assert event.extra == {"rounds_estimate": 2}
