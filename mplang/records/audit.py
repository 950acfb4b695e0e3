"""The audit log of one worker: JSON lines recording what ran here and what left or reached
this party, so each party can check what it sent and received.

A worker appends one JSON object per line to its log (``mplang worker --audit-log
PATH``; by default ``./audit/<node name>.jsonl`` under the worker's working
directory). The file is only ever appended to; each event is one write, made
as it happens (no fsync). Every line has ``"event"``, ``"time"`` (Unix seconds)
and ``"node"`` (the node that wrote it). The events:

``execution``
    A driver asked this node to run a program (``/run``): ``exec`` (execution
    id), ``scope``, ``program`` (SHA-256 of the program bytes received),
    ``driver`` (``{"name", "fingerprint"}``: the spec's name and the certificate
    fingerprint of the TLS peer), ``name`` (the program's function name as the
    driver gives it, null if it gave none),
    ``verdict`` (``"accepted"`` or ``"refused"``), ``rule`` (the policy that
    accepted it: its file, ``the default policy`` or ``no policy``), ``reason``
    (why it was refused, which names the rule; null when accepted) and ``releases``
    (what of this party's data it lets leave: `mplang.policy.check.Verdict.releases`).
``end``
    An accepted run finished: ``exec``, ``scope``, ``status`` (``"ok"``,
    ``"failed"``, ``"aborted"`` when its driver aborted the execution, or
    ``"refused"`` when it never started because the other parties' votes were not
    for the same program) and ``reason`` (the error; null when ok). A run whose
    votes did not all come, or that could not start, ends ``"failed"`` (or ``"aborted"``).
``abort``
    A driver aborted an execution: ``exec``, ``driver``, ``reason``.
``send`` / ``recv``
    One message of an execution sent to, or received from, another node:
    ``exec``, ``peer`` (the other node's name), ``op`` (the opcode of the op
    that exchanged it, null if the key names no op of the program), ``key``
    (the op key of the message tag: the op's position in the program, its
    regions and loop iterations; ``.../link#...`` for secure-device protocol
    messages), ``kind``, ``bytes`` (the message body as sent over the
    network, the same number on both sides) and ``messages`` (1). A send also
    has ``delivered`` (false when the peer refused it or could not be reached).
    A secure-device protocol's link traffic (many small messages per op) is
    summed instead: one event per op, peer, direction and kind, written when the
    run ends, with ``key`` ``<op key>/link``, the total ``bytes`` and the number
    of ``messages``.
``fetch``
    A value left this node to a driver: ``driver``, ``uri``, ``kind``, ``bytes``.
``delete``
    A driver deleted stored values: ``driver``, ``uris`` and ``deleted`` (how many
    existed).
``upload``
    This node's owner stored a tensor (``mplang put``): ``name``, ``bytes`` (the
    request body), ``type`` (``{"dtype", "shape"}``).
``describe``
    A driver learnt the type of a file in the data root or of an uploaded object
    (to trace a program that loads it; the data stays here): ``driver``, ``name``
    (the path or object name), ``type``.

``kind`` says what a value reveals of the data in it: ``"plaintext"`` (a tensor
or scalar in the clear, and any value whose codec declares no other kind),
``"secret share"`` (a secure device's share of a value, and the raw link bytes
its protocol exchanges: the traffic of a secret-sharing protocol), ``"psi"``
(the link bytes of a PSI protocol: blinded or hashed keys) or ``"ciphertext"``;
each value codec declares its kind
(`mplang.transport.wire.ValueCodec.privacy`). A list of values (a batched
message) is plaintext when any element is.

`read_events` reads logs, `summarize` summarises them (``mplang audit LOG ...``),
and `plaintext_received` lists the plaintext a node or driver received.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from mplang.edsl.graph import Graph, Operation
from mplang.flows.dp_flows import exact
from mplang.util.tables import html_table

PLAINTEXT = "plaintext"
SECRET_SHARE = "secret share"
CIPHERTEXT = "ciphertext"
PSI = "psi"
KINDS = (PLAINTEXT, SECRET_SHARE, CIPHERTEXT, PSI)
"""The kinds of values the log distinguishes."""

_REMEMBERED = 4096
"""Executions whose programs (and abort marks) the log keeps to name ops and statuses."""
_REASON_CHARS = 500

Event = dict[str, Any]


def default_path(node: str) -> Path:
    """A worker's log when ``--audit-log`` is not given: ``./audit/<node>.jsonl``."""
    return Path("audit") / f"{node}.jsonl"


def op_at(graph: Graph, path: str) -> str | None:
    """The opcode of the op that an op key (``/3``, ``/2/i0/b/1``, ``/4/link#7``, with the
    run's scope removed) names in ``graph``; None if it names none."""
    ops: Sequence[Operation] = graph.operations
    op: Operation | None = None
    region: int | None = None
    for segment in path.split("/"):
        if not segment:
            continue
        if segment.isdigit():
            if op is not None:
                index = region or 0
                if index >= len(op.regions):
                    break
                ops = op.regions[index].operations
            if int(segment) >= len(ops):
                return None
            op, region = ops[int(segment)], None
        elif segment in ("c", "b"):  # a loop iteration's cond or body region
            region = 0 if segment == "c" else 1
        elif segment[0] == "b" and segment[1:].isdigit():  # a branch of a conditional
            region = int(segment[1:])
        elif not (segment[0] == "i" and segment[1:].isdigit()):  # an iteration, else the end
            break
    return op.opcode if op is not None else None


def _remember(table: OrderedDict[str, Any], key: str, value: Any) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > _REMEMBERED:
        table.popitem(last=False)


class AuditLog:
    """One node's append-only audit log at ``path`` (parent folders are created; a new
    file is readable by its owner only).

    Thread-safe: each event is one JSON line written with a single unbuffered
    write under a lock. ``nodes`` are the cluster's node names, by rank. With ``path``
    None it records nothing (a worker started without an audit log).
    """

    def __init__(self, path: str | os.PathLike[str] | None, node: str, nodes: Sequence[str]):
        self.path = None if path is None else Path(path)
        self.node = node
        self.nodes = list(nodes)
        self._file: Any = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            self._file = open(fd, "ab", buffering=0)  # noqa: SIM115 (closed by close())
        self._lock = threading.Lock()
        self._graphs: OrderedDict[str, dict[str, Graph]] = OrderedDict()
        """exec id -> scope -> program of the runs accepted here."""
        self._aborted: OrderedDict[str, None] = OrderedDict()
        self._links: OrderedDict[str, dict[tuple[str, int, str, str], list[int]]] = \
            OrderedDict()
        """exec id -> (direction, peer, op key, kind) -> [messages, bytes] of link traffic
        not written yet."""

    def write(self, event: Event) -> None:
        """Append ``event`` (with ``time`` and ``node`` added) as one line."""
        line = json.dumps({"event": event["event"], "time": round(time.time(), 6),
                           "node": self.node, **event}, separators=(",", ":"))
        with self._lock:
            if self._file is not None and not self._file.closed:  # runs ending at a stop
                self._file.write(line.encode() + b"\n")

    def execution(self, exec_id: str, scope: str, program: str, driver: tuple[str, str],
                  verdict: str, reason: str | None = None, graph: Graph | None = None,
                  name: str | None = None, rule: str | None = None,
                  releases: list[dict[str, Any]] | None = None) -> None:
        """A driver's request to run ``program`` (function ``name``, as the driver calls
        it) and this node's verdict on it by ``rule`` (or ``reason``); the ``graph`` of an
        accepted run names the ops of its messages, its ``releases`` what it lets leave."""
        if graph is not None and verdict == "accepted":
            with self._lock:
                runs = self._graphs.get(exec_id, {})
                runs[scope] = graph
                _remember(self._graphs, exec_id, runs)
        self.write({"event": "execution", "exec": exec_id, "scope": scope, "program": program,
                    "name": name, "driver": _driver(driver), "verdict": verdict, "rule": rule,
                    "reason": _short(reason), "releases": releases or []})

    def end(self, exec_id: str, scope: str, error: str | None = None,
            refused: bool = False) -> None:
        """An accepted run finished (``error`` is None when it succeeded), or was
        ``refused`` before it started."""
        self._write_links(exec_id)
        with self._lock:
            runs = self._graphs.get(exec_id, {})
            runs.pop(scope, None)
            if not runs:
                self._graphs.pop(exec_id, None)
            aborted = exec_id in self._aborted
        status = "refused" if refused else "ok" if error is None else \
            "aborted" if aborted else "failed"
        self.write({"event": "end", "exec": exec_id, "scope": scope, "status": status,
                    "reason": _short(error)})

    def abort(self, exec_id: str, driver: tuple[str, str], reason: str) -> None:
        """A driver aborted ``exec_id``."""
        self._write_links(exec_id)
        with self._lock:
            _remember(self._aborted, exec_id, None)
            self._graphs.pop(exec_id, None)
        self.write({"event": "abort", "exec": exec_id, "driver": _driver(driver),
                    "reason": _short(reason)})

    def message(self, direction: str, exec_id: str, peer: int, key: str, kind: str,
                nbytes: int, delivered: bool = True, link: bool = False) -> None:
        """A message of ``exec_id`` sent to (``"send"``) or received from (``"recv"``) the
        node of rank ``peer``. A delivered ``link`` message (a secure-device protocol's
        traffic) is summed with the others of its op, peer and direction into one event
        written when the run ends."""
        if self._file is None:
            return
        if link and delivered:
            op_key = key.split("/link#", 1)[0]
            with self._lock:
                table = self._links.get(exec_id)
                if table is None:
                    table = {}
                    _remember(self._links, exec_id, table)
                cell = table.setdefault((direction, peer, op_key, kind), [0, 0])
                cell[0] += 1
                cell[1] += nbytes
            return
        event: Event = {"event": direction, "exec": exec_id, "peer": self.nodes[peer],
                        "op": self._opcode(exec_id, key), "key": key, "kind": kind,
                        "bytes": nbytes, "messages": 1}
        if direction == "send":
            event["delivered"] = delivered
        self.write(event)

    def _write_links(self, exec_id: str) -> None:
        """One event per (direction, peer, op, kind) of ``exec_id``'s link messages so far."""
        with self._lock:
            table = self._links.pop(exec_id, None)
        for (direction, peer, op_key, kind), (count, nbytes) in (table or {}).items():
            op = self._opcode(exec_id, op_key)
            if op is not None and op.startswith("psi."):  # a PSI protocol's, not shares
                kind = PSI
            event: Event = {"event": direction, "exec": exec_id, "peer": self.nodes[peer],
                            "op": op, "key": f"{op_key}/link", "kind": kind, "bytes": nbytes,
                            "messages": count}
            if direction == "send":
                event["delivered"] = True
            self.write(event)

    def fetch(self, driver: tuple[str, str], uri: str, kind: str, nbytes: int) -> None:
        """A stored value sent to a driver."""
        self.write({"event": "fetch", "driver": _driver(driver), "uri": uri, "kind": kind,
                    "bytes": nbytes})

    def delete(self, driver: tuple[str, str], uris: list[str], deleted: int) -> None:
        """A driver deleted stored values."""
        self.write({"event": "delete", "driver": _driver(driver), "uris": uris,
                    "deleted": deleted})

    def upload(self, name: str, nbytes: int, vtype: dict[str, Any]) -> None:
        """This node's owner stored a tensor under ``name``."""
        self.write({"event": "upload", "name": name, "bytes": nbytes, "type": vtype})

    def describe(self, driver: tuple[str, str], name: str, vtype: dict[str, Any]) -> None:
        """A driver was told the type of a file or uploaded object."""
        self.write({"event": "describe", "driver": _driver(driver), "name": name,
                    "type": vtype})

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()

    def _opcode(self, exec_id: str, key: str) -> str | None:
        with self._lock:
            runs = self._graphs.get(exec_id)
            if not runs:
                return None
            scope = max((s for s in runs if key.startswith(s + "/")), key=len, default=None)
            graph = runs[scope] if scope is not None else None
        return op_at(graph, key[len(scope):]) if graph is not None and scope is not None \
            else None


def _driver(driver: tuple[str, str]) -> dict[str, str]:
    return {"name": driver[0], "fingerprint": driver[1]}


def _short(text: str | None) -> str | None:
    return text if text is None or len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "..."


# ---------------------------------------------------------------- reading logs


def read_events(paths: Iterable[str | os.PathLike[str]]) -> list[Event]:
    """The events of the logs at ``paths``, in order; a line that is not a JSON object
    (a log cut short by a crash) becomes ``{"event": "malformed", "where": "PATH:LINE"}``."""
    events: list[Event] = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                if not isinstance(event, dict) or not isinstance(event.get("event"), str):
                    event = {"event": "malformed", "where": f"{path}:{number}"}
                events.append(event)
    return events


def _events(logs: Iterable[str | os.PathLike[str]] | Iterable[Event]) -> list[Event]:
    items = list(logs)
    if all(isinstance(item, dict) for item in items):
        return items  # type: ignore[return-value]
    return read_events(items)  # type: ignore[arg-type]


def _driver_name(event: Event) -> str:
    driver = event.get("driver")
    return str(driver.get("name")) if isinstance(driver, dict) else str(driver)


class AuditSummary(dict[str, Any]):
    """`summarize`'s result: a dict (as JSON), printed as a report (`format_summary`) and
    shown in a notebook as tables (`html_summary`)."""

    def __str__(self) -> str:
        return format_summary(self)

    def _repr_html_(self) -> str:
        return html_summary(self)


def summarize(logs: Iterable[str | os.PathLike[str]] | Iterable[Event]) -> AuditSummary:
    """A summary of audit logs (paths, or events from `read_events`):

    - ``nodes``: the nodes whose logs these are;
    - ``executions``: ``requests`` (execution events), ``distinct`` execution ids, and
      counts ``by_verdict``, ``by_driver``, ``by_program`` and (of ended runs) ``by_status``;
    - ``messages``: per node, ``sent`` and ``received``: per peer, per kind,
      ``{"count", "bytes"}``;
    - ``runs``: per execution, in the order of the logs: ``exec``, ``name`` (the
      program's function), ``program`` (digest), ``driver`` and ``fingerprint``, per
      node its ``verdict``, ``rule`` or ``reason``, ``status`` and ``error`` (`nodes`),
      ``bytes`` (``"SRC -> DST"``: per kind, ``{"count", "bytes"}``, from the sender's log
      if given, else the receiver's), ``aborted`` and ``releases`` (with ``node``, ``time``);
    - ``mismatches``: for each pair of nodes whose logs are both given, each
      kind whose bytes sent by one differ from the bytes received by the other, over the
      runs not aborted (an abort drops messages in flight);
    - ``fetches``: per driver, ``count``, ``bytes`` and ``by_kind`` (bytes);
    - ``deletes``: per driver, the number of values deleted;
    - ``uploads``: per node, ``count`` and ``bytes`` its owner uploaded;
    - ``describes``: per driver, how many types of data it was told;
    - ``budget``: per node, per source of its data, the privacy budget (epsilon) its
      accepted programs ``spent`` (charges less refunds), ``charges`` and ``refunds``;
    - ``malformed``: the lines that could not be read (``PATH:LINE``).
    """
    events = _events(logs)
    nodes = sorted({str(e["node"]) for e in events if "node" in e})
    runs = _runs(events, nodes)
    aborted = {r["exec"] for r in runs if r["aborted"]}
    verdicts: Counter[str] = Counter()
    drivers: Counter[str] = Counter()
    programs: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    exec_ids: set[str] = set()
    messages = _messages(events, nodes)
    fetches: dict[str, dict[str, Any]] = {}
    deletes: Counter[str] = Counter()
    uploads: dict[str, dict[str, int]] = {}
    describes: Counter[str] = Counter()
    budget: dict[str, dict[str, dict[str, Any]]] = {}
    malformed = []
    for e in events:
        name = e["event"]
        if name == "execution":
            exec_ids.add(str(e.get("exec")))
            verdicts[str(e.get("verdict"))] += 1
            drivers[_driver_name(e)] += 1
            programs[str(e.get("program"))] += 1
        elif name == "end":
            statuses[str(e.get("status"))] += 1
        elif name == "fetch":
            entry = fetches.setdefault(_driver_name(e), {"count": 0, "bytes": 0, "by_kind": {}})
            nbytes = int(e.get("bytes") or 0)
            entry["count"] += 1
            entry["bytes"] += nbytes
            entry["by_kind"][str(e.get("kind"))] = entry["by_kind"].get(str(e.get("kind")),
                                                                        0) + nbytes
        elif name == "delete":
            deletes[_driver_name(e)] += int(e.get("deleted") or 0)
        elif name == "upload":
            cell = uploads.setdefault(str(e.get("node")), {"count": 0, "bytes": 0})
            cell["count"] += 1
            cell["bytes"] += int(e.get("bytes") or 0)
        elif name == "describe":
            describes[_driver_name(e)] += 1
        elif name == "budget" and isinstance(e.get("epsilon"), dict):
            refund = e.get("action") == "refund"
            for source, eps in e["epsilon"].items():
                spend = budget.setdefault(str(e.get("node")), {}).setdefault(
                    str(source), {"spent": Fraction(), "charges": 0, "refunds": 0})
                spend["spent"] += -exact(eps) if refund else exact(eps)
                spend["refunds" if refund else "charges"] += 1
        elif name == "malformed":
            malformed.append(e["where"])
    for spends in budget.values():  # added exactly, shown as the float nearest the sum
        spends.update({s: {**c, "spent": float(c["spent"])} for s, c in spends.items()})
    return AuditSummary({
        "nodes": nodes,
        "executions": {"requests": sum(verdicts.values()), "distinct": len(exec_ids),
                       "by_verdict": dict(verdicts), "by_driver": dict(drivers),
                       "by_program": dict(programs), "by_status": dict(statuses)},
        "runs": runs,
        "messages": messages,
        "mismatches": _mismatches(_messages(
            [e for e in events if e.get("exec") not in aborted], nodes)),
        "fetches": fetches,
        "deletes": dict(deletes),
        "uploads": uploads,
        "describes": dict(describes),
        "budget": budget,
        "malformed": malformed,
    })


Messages = dict[str, dict[str, dict[str, dict[str, dict[str, int]]]]]
"""node -> ``sent``/``received`` -> peer -> kind -> ``{"count", "bytes"}``."""


def _add(cell: dict[str, int], e: Event) -> None:
    cell["count"] += int(e.get("messages") or 1)
    cell["bytes"] += int(e.get("bytes") or 0)


def _messages(events: list[Event], nodes: list[str]) -> Messages:
    messages: Messages = {n: {"sent": {}, "received": {}} for n in nodes}
    for e in events:
        if e["event"] in ("send", "recv") and "node" in e:
            side = messages[str(e["node"])]["sent" if e["event"] == "send" else "received"]
            _add(side.setdefault(str(e.get("peer")), {}).setdefault(
                str(e.get("kind")), {"count": 0, "bytes": 0}), e)
    return messages


def _runs(events: list[Event], nodes: list[str]) -> list[dict[str, Any]]:
    """Per execution: the program, its driver, each node's verdict and end, the bytes
    between nodes by kind, and whether it was aborted."""
    runs: dict[str, dict[str, Any]] = {}

    def run(exec_id: str) -> dict[str, Any]:
        return runs.setdefault(exec_id, {"exec": exec_id, **dict.fromkeys(
            ("name", "program", "driver", "fingerprint")), "nodes": {}, "bytes": {},
            "aborted": False, "abort": False, "releases": []})

    for e in events:
        exec_id, node = e.get("exec"), str(e.get("node"))
        if not isinstance(exec_id, str):
            continue
        r, name = run(exec_id), e["event"]
        if name == "execution":
            driver: dict[str, Any] = e["driver"] if isinstance(e.get("driver"), dict) else {}
            r.update({k: v for k, v in (("name", e.get("name")), ("program", e.get("program")),
                                        ("driver", driver.get("name")),
                                        ("fingerprint", driver.get("fingerprint")))
                      if v is not None})
            r["nodes"].setdefault(node, {}).update(
                {"verdict": e.get("verdict"), "rule": e.get("rule"), "reason": e.get("reason")})
            r["releases"] += [{"node": node, "time": e.get("time"), **release}
                              for release in e.get("releases") or () if isinstance(release, dict)]
        elif name == "end":
            r["nodes"].setdefault(node, {}).update({"status": e.get("status"),
                                                    "error": e.get("reason")})
            r["aborted"] = r["aborted"] or e.get("status") == "aborted"
        elif name == "abort":
            r["abort"] = True
        elif name in ("send", "recv"):
            src, dst = (node, str(e.get("peer")))[:: 1 if name == "send" else -1]
            if name == "recv" and src in nodes:
                continue  # the sender's log has it
            cells = r["bytes"].setdefault(f"{src} -> {dst}", {})
            _add(cells.setdefault(str(e.get("kind")), {"count": 0, "bytes": 0}), e)
    for r in runs.values():  # a driver's abort of a run no logged node accepted is cleanup
        accepted = any(n.get("verdict") == "accepted" for n in r["nodes"].values())
        r["aborted"] = r["aborted"] or (r.pop("abort") and accepted)
    return list(runs.values())


def _mismatches(messages: dict[str, dict[str, dict[str, dict[str, dict[str, int]]]]]
                ) -> list[dict[str, Any]]:
    found = []
    for src in messages:
        for dst in messages:
            if src == dst:
                continue
            sent = messages[src]["sent"].get(dst, {})
            received = messages[dst]["received"].get(src, {})
            for kind in sorted(set(sent) | set(received)):
                out = sent.get(kind, {}).get("bytes", 0)
                into = received.get(kind, {}).get("bytes", 0)
                if out != into:
                    found.append({"from": src, "to": dst, "kind": kind, "sent": out,
                                  "received": into})
    return found


def plaintext_received(logs: Iterable[str | os.PathLike[str]] | Iterable[Event],
                       party: str) -> list[Event]:
    """The events in which ``party`` received plaintext: messages a node's own log
    records it received, and values fetched by a driver of that name (from any log)."""
    return [e for e in _events(logs) if e.get("kind") == PLAINTEXT and (
        (e["event"] == "recv" and e.get("node") == party)
        or (e["event"] == "fetch" and _driver_name(e) == party))]


def _bytes(cells: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{kind} {c['bytes']} bytes in {c['count']} "
                     f"message{'s' if c['count'] != 1 else ''}"
                     for kind, c in sorted(cells.items()))


def _verdict(node: str, seen: dict[str, Any]) -> str:
    text = f"  {node}: {seen.get('verdict') or 'no request logged'}"
    if seen.get("verdict") == "refused":
        text += f": {seen.get('reason')}"
    elif seen.get("rule"):
        text += f" ({_relative(seen['rule'])})"
    if seen.get("status"):
        text += f"; ended {seen['status']}" + (f": {seen['error']}" if seen.get("error") else "")
    return text


def _relative(path: str) -> str:
    """``path`` relative to the working folder if it is a file inside it."""
    here = Path.cwd()
    return str(Path(path).relative_to(here)) if Path(path).is_relative_to(here) else path


def _tags(run: dict[str, Any]) -> str:
    refused = sorted(n for n, seen in run["nodes"].items() if seen.get("verdict") == "refused")
    tags = (["aborted"] if run["aborted"] else []) + (
        [f"refused by {', '.join(refused)}"] if refused else [])
    return f" ({'; '.join(tags)})" if tags else ""


def format_runs(summary: dict[str, Any]) -> list[str]:
    """One block per run of `summarize`'s result: program, driver, each node's verdict
    and end, the bytes between nodes by kind, and what each party let leave."""
    ex = summary["executions"]
    tally = ", ".join(f"{k} {v}" for k, v in sorted(ex["by_verdict"].items()))
    ends = ", ".join(f"{k} {v}" for k, v in sorted(ex["by_status"].items()))
    lines = [f"runs: {ex['distinct']} (requests {tally}" + (f"; ended {ends}" if ends else "")
             + ")"]
    for number, run in enumerate(summary["runs"], 1):
        lines.append(f"run {number}: {run['name'] or '(unnamed program)'} by "
                     f"{run['driver']}{_tags(run)}")
        lines.append(f"  program sha256 {str(run['program'])[:16]}..., driver certificate "
                     f"sha256 {str(run['fingerprint'])[:16]}...")
        lines += [_verdict(node, seen) for node, seen in sorted(run["nodes"].items())]
        lines += [f"  {pair}: {_bytes(cells)}" for pair, cells in sorted(run["bytes"].items())]
        lines += [f" {'*' if r['kind'] in ('approval', 'digest') else ' '}{r['node']} released at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%SZ', time.gmtime(r['time']))}: "
                  f"{r['description']} -> {r['receiver']}, allowed by {r['allowed_by']} "
                  f"({r['kind']}; epsilon {r['epsilon']:g})" for r in run["releases"]]
    return lines


def html_summary(summary: dict[str, Any]) -> str:
    """`summarize`'s result as HTML tables: the runs, the mismatches and the fetches."""
    runs = [(number, run["name"] or "(unnamed)", f"{str(run['program'])[:16]}...",
             run["driver"], _tags(run).strip(" ()") or "-",
             "; ".join(_verdict(n, seen).strip() for n, seen in sorted(run["nodes"].items())),
             "; ".join(f"{pair}: {_bytes(cells)}" for pair, cells in sorted(run["bytes"].items()))
             or "-")
            for number, run in enumerate(summary["runs"], 1)]
    parts = [html_table(("run", "program", "sha256", "driver", "marks", "nodes", "bytes"), runs,
                        f"audit of {', '.join(summary['nodes']) or 'no nodes'}")]
    if summary["mismatches"]:
        parts.append(html_table(("from", "to", "kind", "sent", "received"),
                                [tuple(m.values()) for m in summary["mismatches"]],
                                "mismatches"))
    parts.append(html_table(("driver", "values", "bytes"),
                            [(d, e["count"], e["bytes"])
                             for d, e in sorted(summary["fetches"].items())], "fetches"))
    return "".join(parts)


def format_summary(summary: dict[str, Any]) -> str:
    """`summarize`'s result as a report (what ``mplang audit`` prints): the runs, then the
    totals, the mismatches and what left to drivers."""
    lines = [f"nodes: {', '.join(summary['nodes']) or '(none)'}", *format_runs(summary),
             "totals:"]
    for node, sides in summary["messages"].items():
        for peer, kinds in sorted(sides["sent"].items()):
            lines.append(f"  {node} -> {peer}: {_bytes(kinds)}")
    mismatches = summary["mismatches"]
    lines.append("mismatches: " + ("none (sent and received bytes agree)" if not mismatches
                                   else str(len(mismatches))))
    for m in mismatches:
        lines.append(f"  MISMATCH {m['from']} -> {m['to']} {m['kind']}: sent {m['sent']} "
                     f"bytes, received {m['received']}")
    lines.append("fetches:")
    for driver, entry in sorted(summary["fetches"].items()):
        kinds = ", ".join(f"{k}: {b} bytes" for k, b in sorted(entry["by_kind"].items()))
        lines.append(f"  {driver}: {entry['count']} values, {entry['bytes']} bytes ({kinds})")
    for driver, count in sorted(summary["deletes"].items()):
        lines.append(f"deletes by {driver}: {count}")
    for node, cell in sorted(summary["uploads"].items()):
        lines.append(f"uploads to {node}: {cell['count']} ({cell['bytes']} bytes)")
    for driver, count in sorted(summary["describes"].items()):
        lines.append(f"types described to {driver}: {count}")
    for node, sources in sorted(summary["budget"].items()):
        for source, cell in sorted(sources.items()):
            lines.append(f"privacy budget of {node}: {source}: epsilon {cell['spent']:g} spent "
                         f"({cell['charges']} charges, {cell['refunds']} refunds)")
    for where in summary["malformed"]:
        lines.append(f"malformed line: {where}")
    return "\n".join(lines)
