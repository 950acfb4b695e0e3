"""Timelines as Chrome / Perfetto trace files, worker events on the wire, and summaries.

A trace file is Chrome's JSON trace format (``{"traceEvents": [...]}``), which
Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open. Each party is a
process track (named ``party R (NODE)``, the driver ``driver``), each thread an
interpreter ran on is a thread track, and each op is a complete slice (``ph:
"X"``) whose arguments give its op key, source line, the messages and bytes it
sent and received (``link_*``: those of a protocol library's own links),
and, for ops with a cost rule, ``rounds_estimate``: the protocol rounds that
`mplang.analysis` estimates for it, an estimate next to the counted messages.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from mplang.edsl.errors import MPLangError
from mplang.edsl.graph import Operation
from mplang.runtime.timeline import DRIVER, OpEvent, RunMonitor, Traffic, to_ns

MAX_WIRE_EVENTS = 1_000_000
"""The most events a worker's answer may carry."""
_TRAFFIC_FIELDS = frozenset(f.name for f in fields(Traffic))


def check_trace_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a `Path`, if a trace file can be written there (its folder exists)."""
    target = Path(path)
    if target.is_dir():
        raise MPLangError(f"trace={str(path)!r} is a directory; give a file name such as "
                          f"{str(target / 'run.json')!r}")
    if not target.parent.is_dir():
        raise MPLangError(f"trace={str(path)!r}: the folder {str(target.parent)!r} does not "
                          "exist; create it first or write the trace elsewhere")
    return target


def estimated_rounds(op: Operation) -> int | None:
    """The protocol rounds the analysis estimates for ``op`` (None: a local op)."""
    rule = _communication_cost(op)
    if rule is None:
        return None
    from mplang.analysis.cost_model import CostModel

    try:
        return int(rule(op, CostModel()).rounds)
    except Exception:  # an estimate that cannot be made is left out
        return None


def _communication_cost(op: Operation) -> Any:
    """The cost rule of an op that communicates (None for local ops and unknown ones)."""
    if op.prim is None or not op.traits.communicates:
        return None
    return op.prim.rule("cost")


_quote = json.encoder.encode_basestring
"""A string as a JSON string literal (the standard library's C encoder)."""


class _OpArgs:
    """The arguments of slices fixed by their op: its source line and estimated rounds
    (looked up once per op name whether it has a cost rule at all)."""

    def __init__(self) -> None:
        self._locs: dict[str | None, str] = {}
        self._costed: dict[str, bool] = {}

    def rounds(self, op: Operation) -> int | None:
        """The rounds the analysis estimates for ``op`` (None: none, or no cost rule)."""
        costed = self._costed.get(op.opcode)
        if costed is None:
            costed = self._costed[op.opcode] = _communication_cost(op) is not None
        return estimated_rounds(op) if costed else None

    def json(self, op: Operation) -> str:
        """Those arguments as JSON object members, each with a leading comma."""
        loc = self._locs.get(op.loc)
        if loc is None:
            loc = self._locs[op.loc] = f',"source":{_quote(op.loc)}' if op.loc else ""
        rounds = self.rounds(op)
        return f'{loc},"rounds_estimate":{rounds}' if rounds else loc


def event_args(event: OpEvent, op_args: _OpArgs) -> dict[str, Any]:
    """The arguments of an event's slice: its op key, source line, traffic, estimated
    rounds (while its op is in this process) and whatever else it carries."""
    args: dict[str, Any] = {"key": event.key}
    if event.loc:
        args["source"] = event.loc
    if event.traffic is not None:
        args.update(event.traffic.fields())
    if event.op is not None:
        rounds = op_args.rounds(event.op)
        if rounds:
            args["rounds_estimate"] = rounds
    args.update(event.extra)
    return args


def events_to_wire(events: Sequence[OpEvent]) -> list[dict[str, Any]]:
    """A worker's events as JSON objects for its ``/run`` answer."""
    op_args = _OpArgs()
    return [{"name": e.opcode, "start": e.start_ns, "end": e.end_ns, "thread": e.thread,
             "args": event_args(e, op_args)} for e in events]


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def events_from_wire(items: Any, party: int) -> list[OpEvent]:
    """Events party ``party`` reported, checked field by field (a party reports only its
    own ops); raises `MPLangError` naming the first malformed field."""
    if not isinstance(items, list) or len(items) > MAX_WIRE_EVENTS:
        raise MPLangError(f"party {party}'s trace: 'events' must be a list of at most "
                          f"{MAX_WIRE_EVENTS} events")
    events = []
    for i, item in enumerate(items):
        where = f"party {party}'s trace: events[{i}]"
        if not isinstance(item, dict):
            raise MPLangError(f"{where} is not an object")
        name, args, thread = item.get("name"), item.get("args"), item.get("thread")
        start: Any = item.get("start")
        end: Any = item.get("end")
        if not isinstance(name, str) or len(name) > 200:
            raise MPLangError(f"{where}.name must be a string of at most 200 characters")
        if not (type(start) is int and type(end) is int and start <= end):
            raise MPLangError(f"{where}.start/end must be integers (ns), start <= end")
        if type(thread) is not int:
            raise MPLangError(f"{where}.thread must be an integer")
        if not isinstance(args, dict) or len(args) > 32 or not all(
                isinstance(k, str) and len(k) <= 64
                and (_number(v) or (isinstance(v, str) and len(v) <= 4096))
                for k, v in args.items()):
            raise MPLangError(f"{where}.args must map at most 32 names to numbers or strings")
        traffic = Traffic(**{k: int(v) for k, v in args.items() if k in _TRAFFIC_FIELDS})
        key = args.get("key")
        loc = args.get("source")
        extra = {k: v for k, v in args.items()
                 if k not in _TRAFFIC_FIELDS and k not in ("key", "source")}
        events.append(OpEvent(party, name, str(key) if key is not None else "", start, end,
                              thread, loc if isinstance(loc, str) else None,
                              traffic if traffic.fields() else None, None, extra))
    return events


def trace_json(monitor: RunMonitor) -> str:
    """The monitor's events as Chrome trace JSON (times in µs from the run's first op).

    Written by hand, one slice at a time, from the monitor's raw records, with each op's
    constant part encoded once: exporting a trace then costs about a microsecond per op."""
    raw, merged = monitor.recorded()
    starts = [e.start_ns for e in merged]
    if raw:
        starts.append(to_ns(min(r[3] for r in raw)))
    origin = min(starts, default=monitor.started_ns)
    parties = sorted({r[0] for r in raw} | {e.party for e in merged} | set(monitor.parties))
    driver_pid = max([p for p in parties if p != DRIVER], default=-1) + 1
    pids = {party: driver_pid if party == DRIVER else party for party in parties}
    out: list[str] = []
    for party in parties:
        name = monitor.parties.get(party, "driver" if party == DRIVER else f"party {party}")
        out.append(json.dumps({"name": "process_name", "ph": "M", "pid": pids[party], "tid": 0,
                               "args": {"name": name}}))
        out.append(json.dumps({"name": "process_sort_index", "ph": "M", "pid": pids[party],
                               "tid": 0, "args": {"sort_index": pids[party]}}))
    threads: dict[tuple[int, int], int] = {}

    def thread(party: int, ident: int) -> int:
        tid = threads.get((party, ident))
        if tid is None:
            threads[(party, ident)] = tid = sum(1 for p, _ in threads if p == party) + 1
            out.append(json.dumps({"name": "thread_name", "ph": "M", "pid": pids[party],
                                   "tid": tid, "args": {"name": f"thread {tid}"}}))
        return tid

    heads: dict[tuple[int, str], str] = {}
    """By (party, op name): the slice's first members."""
    op_args = _OpArgs()
    offset_ns = to_ns(0) - origin  # a perf_counter_ns reading + offset_ns: ns from the origin
    for party, op, key, start, end, ident, traffic in raw:
        head = heads.get((party, op.opcode))
        if head is None:
            head = heads[(party, op.opcode)] = \
                f'{{"name":{_quote(op.opcode)},"cat":"op","ph":"X","pid":{pids[party]}'
        tid = threads.get((party, ident)) or thread(party, ident)
        moved = "".join(f',"{k}":{v}' for k, v in traffic.fields().items()) \
            if traffic is not None else ""
        out.append(f'{head},"tid":{tid},"ts":{(start + offset_ns) / 1000:.3f},'
                   f'"dur":{(end - start) / 1000:.3f},'
                   f'"args":{{"key":{_quote(key)}{op_args.json(op)}{moved}}}}}')
    for e in merged:
        out.append(json.dumps({"name": e.opcode, "cat": "op", "ph": "X", "pid": pids[e.party],
                               "tid": thread(e.party, e.thread),
                               "ts": (e.start_ns - origin) / 1000,
                               "dur": (e.end_ns - e.start_ns) / 1000,
                               "args": event_args(e, op_args)}))
    other = json.dumps({"program": monitor.name, "clock": "microseconds from the run's first "
                        "op; workers' clocks aligned to the driver's"})
    return ('{"traceEvents":[\n' + ",\n".join(out)
            + f'\n],"displayTimeUnit":"ms","otherData":{other}}}\n')


def write_trace(monitor: RunMonitor, path: Path) -> None:
    """Write the monitor's timeline to ``path`` (Chrome / Perfetto JSON)."""
    path.write_text(trace_json(monitor))


def load_trace(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The op slices of a trace file; `MPLangError` if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise MPLangError(f"no such trace file: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MPLangError(f"{path} is not a trace file (JSON expected): {error}") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise MPLangError(f"{path} is not a Chrome trace: no 'traceEvents' list")
    names = {e["pid"]: e["args"]["name"] for e in events if isinstance(e, dict)
             and e.get("ph") == "M" and e.get("name") == "process_name"
             and isinstance(e.get("args"), dict) and "name" in e["args"]}
    slices = []
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("name"), str) \
                and _number(e.get("dur")):
            slices.append({**e, "track": names.get(e.get("pid"), f"pid {e.get('pid')}")})
    return slices


def self_times(slices: list[dict[str, Any]]) -> list[float]:
    """Each slice's duration minus that of the slices nested in it on its thread."""
    own = [float(s["dur"]) for s in slices]
    by_thread: dict[tuple[Any, Any], list[int]] = {}
    for i, s in enumerate(slices):
        by_thread.setdefault((s.get("pid"), s.get("tid")), []).append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (slices[i]["ts"], -slices[i]["dur"]))
        stack: list[int] = []
        for i in indices:
            start = slices[i]["ts"]
            while stack and slices[stack[-1]]["ts"] + slices[stack[-1]]["dur"] <= start:
                stack.pop()
            if stack:
                own[stack[-1]] -= float(slices[i]["dur"])
            stack.append(i)
    return [max(t, 0.0) for t in own]


NO_LINE = "(no source line)"
"""The key of slices without a source line, with ``--by line``."""


def _key(s: dict[str, Any], by: str) -> str:
    if by == "op":
        return str(s["name"])
    source = s["args"].get("source") if isinstance(s.get("args"), dict) else None
    return source if isinstance(source, str) else NO_LINE


def summarize(path: str | os.PathLike[str], top: int = 10,
              echo: Callable[[str], None] = print, by: str = "op") -> None:
    """Print the ops of a trace file that took the most time (self time: without the ops
    nested in them), grouped by op name (``by="op"``) or by the user's source line that
    made them (``by="line"``), and each track's busy time."""
    if by not in ("op", "line"):
        raise MPLangError(f"summarize groups by 'op' or 'line', not {by!r}")
    slices = load_trace(path)
    if not slices:
        echo(f"{path}: no op slices")
        return
    own = self_times(slices)
    groups: dict[str, list[tuple[float, float]]] = {}
    sent: dict[str, int] = {}
    ops: dict[str, set[str]] = {}
    tracks: dict[str, float] = {}
    for s, t in zip(slices, own, strict=True):
        key = _key(s, by)
        groups.setdefault(key, []).append((t, float(s["dur"])))
        ops.setdefault(key, set()).add(str(s["name"]))
        args = s["args"] if isinstance(s.get("args"), dict) else {}
        moved = sum(int(v) for k, v in args.items() if k.endswith("sent_bytes") and _number(v))
        sent[key] = sent.get(key, 0) + moved
        tracks[s["track"]] = tracks.get(s["track"], 0.0) + t
    span = (max(s["ts"] + s["dur"] for s in slices) - min(s["ts"] for s in slices)) / 1000
    ranked = sorted(groups.items(), key=lambda kv: (-sum(t for t, _ in kv[1]), kv[0]))[:top]
    width = 28 if by == "op" else min(60, max(28, *(len(k) for k, _ in ranked)))
    echo(f"{path}: {len(slices)} op runs in {span:.3f} ms")
    echo(f"{'op' if by == 'op' else 'source line':<{width}} {'runs':>6} {'self ms':>10} "
         f"{'total ms':>10} {'max ms':>9} {'bytes sent':>11}" + ("  ops" if by == "line" else ""))
    for key, times in ranked:
        echo(f"{key[-width:]:<{width}} {len(times):>6} {sum(t for t, _ in times) / 1000:>10.3f} "
             f"{sum(d for _, d in times) / 1000:>10.3f} {max(d for _, d in times) / 1000:>9.3f}"
             f" {sent[key]:>11}" + (f"  {', '.join(sorted(ops[key]))}" if by == "line" else ""))
    echo("self time per track:")
    for track in sorted(tracks):
        echo(f"  {track}: {tracks[track] / 1000:.3f} ms")
