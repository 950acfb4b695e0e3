"""Run monitors: what every interpreter of one execution did, op by op.

A `RunMonitor` hears of each op an interpreter starts and finishes (party, op,
key, time) and of each message a party's communicator sends or receives for
the execution. It keeps:

- per party: the op running now, ops done, bytes and messages moved (what a
  progress display shows);
- with ``record=True``, one event per op (a slice of a Chrome / Perfetto
  trace, see `mplang.records.trace_file`) carrying the op's source line and the
  messages and bytes it sent and received.

Messages are attributed to ops by their tag: a message of op key ``K`` is
tagged ``K``; a message a protocol library's own link carries for op ``K`` (a
secure device's runtime) is tagged ``K/CHANNEL#TAG`` and counted as that op's
link traffic. Communicators find the monitor of an execution with `monitor_of`;
without one registered they count nothing.

Times are integer nanoseconds on this process's clock (`now_ns`: wall time at
import plus a monotonic counter; integers, since a float of nanoseconds or
microseconds since 1970 is only exact to a quarter of a microsecond), so
monitors of several processes can be merged once each process's offset is known.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from mplang.edsl.graph import Operation

_WALL_NS = time.time_ns()
_PERF_NS = time.perf_counter_ns()

DRIVER = -1
"""The party number of the driver's track."""


def now_ns() -> int:
    """Nanoseconds on this process's trace clock (wall time, advanced monotonically)."""
    return to_ns(time.perf_counter_ns())


def to_ns(perf_ns: int) -> int:
    """A ``time.perf_counter_ns()`` reading on this process's trace clock."""
    return _WALL_NS + perf_ns - _PERF_NS


@dataclass
class Traffic:
    """Messages and bytes one op sent and received, directly and over protocol links."""

    sent_msgs: int = 0
    sent_bytes: int = 0
    recv_msgs: int = 0
    recv_bytes: int = 0
    link_sent_msgs: int = 0
    link_sent_bytes: int = 0
    link_recv_msgs: int = 0
    link_recv_bytes: int = 0

    def add(self, direction: str, nbytes: int, link: bool) -> None:
        prefix = "link_" if link else ""
        name = f"{prefix}{direction}"
        setattr(self, f"{name}_msgs", getattr(self, f"{name}_msgs") + 1)
        setattr(self, f"{name}_bytes", getattr(self, f"{name}_bytes") + nbytes)

    def fields(self) -> dict[str, int]:
        """The non-zero counters, by name."""
        return {k: v for k, v in self.__dict__.items() if v}


@dataclass(slots=True)
class OpEvent:
    """One op run by one party: a slice on that party's track."""

    party: int
    opcode: str
    key: str
    start_ns: int
    end_ns: int
    thread: int
    loc: str | None
    traffic: Traffic | None
    op: Operation | None = None
    """The op itself while in this process (for estimates); None once serialized."""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PartyState:
    """What a progress display shows of one party."""

    running: dict[str, str] = field(default_factory=dict)
    """Op key -> op name, for the ops running now."""
    done: int = 0
    bytes_moved: int = 0


class RunMonitor:
    """Observes one execution's interpreters and messages (see the module docstring).

    ``total_ops``: the number of op runs expected (for progress; 0 if unknown).
    """

    def __init__(self, name: str, *, record: bool = False, total_ops: int = 0,
                 parties: dict[int, str] | None = None):
        self.name = name
        self.record = record
        self.total_ops = total_ops
        self.parties: dict[int, str] = dict(parties or {})
        """Track names by party number (``DRIVER`` for the driver)."""
        self._events: list[OpEvent] = []
        self._raw: list[tuple[int, Operation, str, int, int, int, Traffic | None]] = []
        """Ops recorded here: (party, op, key, start ns, end ns, thread, traffic), made into
        `OpEvent`s only when read (recording stays cheap)."""
        self.states: dict[int, PartyState] = {}
        self._traffic: dict[tuple[int, str], Traffic] = {}
        self._lock = threading.Lock()
        self.started_ns = now_ns()

    # -- called by interpreters
    def op_started(self, party: int, op: Operation, key: str) -> int:
        """Note that ``party`` started ``op`` (op key ``key``); returns the start time."""
        self._state(party).running[key] = op.opcode
        return time.perf_counter_ns()

    def op_finished(self, party: int, op: Operation, key: str, started: int) -> None:
        """Note that ``party`` finished ``op``, started at ``started`` (`op_started`)."""
        end = time.perf_counter_ns()
        state = self.states[party]
        state.running.pop(key, None)
        state.done += 1
        if self.record:
            traffic = self._traffic.pop((party, key), None) if self._traffic else None
            self._raw.append((party, op, key, started, end, threading.get_ident(), traffic))

    def recorded(self) -> tuple[list[tuple[int, Operation, str, int, int, int, Traffic | None]],
                                list[OpEvent]]:
        """What was recorded so far, unconverted: ops run here as (party, op, key, start ns
        of ``time.perf_counter_ns``, end ns, thread, traffic), and events merged from
        elsewhere. Writers use it to skip building an `OpEvent` per op."""
        with self._lock:
            return list(self._raw), list(self._events)

    # -- called by communicators
    def count(self, party: int, tag_key: str, direction: str, nbytes: int) -> None:
        """Count one message of ``nbytes`` that ``party`` sent (``direction="sent"``) or
        received (``"recv"``) under tag key ``tag_key``."""
        key, channel, _ = tag_key.partition("#")
        link = bool(channel)
        if link:
            key = key.rpartition("/")[0]
        with self._lock:
            if self.record:
                traffic = self._traffic.get((party, key))
                if traffic is None:
                    traffic = self._traffic[(party, key)] = Traffic()
                traffic.add(direction, nbytes, link)
            self._state(party).bytes_moved += nbytes

    # -- merging
    def add_events(self, events: list[OpEvent], offset_ns: int = 0) -> None:
        """Add events recorded elsewhere; ``offset_ns`` is their clock minus this one's."""
        with self._lock:
            for e in events:
                e.start_ns -= offset_ns
                e.end_ns -= offset_ns
                self._events.append(e)
                state = self._state(e.party)
                state.done += 1
                if e.traffic is not None:
                    state.bytes_moved += e.traffic.sent_bytes + e.traffic.link_sent_bytes

    def drain(self) -> list[OpEvent]:
        """Every event recorded so far (merged ones, then this process's), removed from
        this monitor."""
        with self._lock:
            raw, self._raw = self._raw, []
            merged, self._events = self._events, []
        return merged + [OpEvent(party, op.opcode, key, to_ns(start), to_ns(end), thread,
                                 op.loc, traffic, op)
                         for party, op, key, start, end, thread, traffic in raw]

    @property
    def done(self) -> int:
        """Op runs finished so far, by every party."""
        return sum(s.done for s in list(self.states.values()))

    def _state(self, party: int) -> PartyState:
        state = self.states.get(party)
        return state if state is not None else self.states.setdefault(party, PartyState())


_ACTIVE: dict[str, tuple[RunMonitor, int]] = {}
_ACTIVE_LOCK = threading.Lock()


def monitor_of(exec_id: str) -> RunMonitor | None:
    """The monitor registered for execution ``exec_id`` in this process, if any."""
    entry = _ACTIVE.get(exec_id) if _ACTIVE else None
    return None if entry is None else entry[0]


@contextmanager
def monitoring(exec_id: str, monitor: RunMonitor) -> Iterator[RunMonitor]:
    """Register ``monitor`` for ``exec_id`` while the block runs (nested registrations of
    one execution share the first monitor, which is what the block gets)."""
    with _ACTIVE_LOCK:
        entry = _ACTIVE.get(exec_id)
        shared = monitor if entry is None else entry[0]
        _ACTIVE[exec_id] = (shared, 1 if entry is None else entry[1] + 1)
    try:
        yield shared
    finally:
        with _ACTIVE_LOCK:
            current, uses = _ACTIVE[exec_id]
            if uses == 1:
                del _ACTIVE[exec_id]
            else:
                _ACTIVE[exec_id] = (current, uses - 1)

