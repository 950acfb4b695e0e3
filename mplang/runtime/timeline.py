"""Run monitors: what every interpreter of one execution did, op by op.

A `RunMonitor` hears of each op an interpreter starts and finishes (party, op,
key, time) and of each message a party's communicator sends or receives for
the execution. It keeps:

- per party: the op running now, ops done, bytes and messages moved (what a
  progress display shows);
- with ``record=True``, one event per op (a slice of a Chrome / Perfetto
  trace, see `mplang.runtime.trace_file`) carrying the op's source line and the
  messages and bytes it sent and received.

Messages are attributed to ops by their tag: a message of op key ``K`` is
tagged ``K``; a message a protocol library's own link carries for op ``K`` (a
secure device's runtime) is tagged ``K/CHANNEL#TAG`` and counted as that op's
link traffic. Communicators find the monitor of an execution with `monitor_of`;
without one registered they count nothing.

Times are microseconds on this process's clock (`now_us`: wall time at import
plus a monotonic counter), so monitors of several processes can be merged once
each process's offset is known.
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


def now_us() -> float:
    """Microseconds on this process's trace clock (wall time, advanced monotonically)."""
    return (_WALL_NS + time.perf_counter_ns() - _PERF_NS) / 1000


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


@dataclass
class OpEvent:
    """One op run by one party: a slice on that party's track."""

    party: int
    opcode: str
    key: str
    start_us: float
    end_us: float
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
        self.events: list[OpEvent] = []
        self.states: dict[int, PartyState] = {}
        self._traffic: dict[tuple[int, str], Traffic] = {}
        self._lock = threading.Lock()
        self.started_us = now_us()

    # -- called by interpreters
    def op_started(self, party: int, op: Operation, key: str) -> float:
        state = self.states.get(party)
        if state is None:
            state = self.states.setdefault(party, PartyState())
        state.running[key] = op.opcode
        return now_us()

    def op_finished(self, party: int, op: Operation, key: str, start_us: float) -> None:
        end = now_us()
        state = self.states[party]
        state.running.pop(key, None)
        state.done += 1
        traffic = self._traffic.pop((party, key), None) if self._traffic else None
        if self.record:
            self.events.append(OpEvent(party, op.opcode, key, start_us, end,
                                       threading.get_ident(), op.loc, traffic, op))

    # -- called by communicators
    def count(self, party: int, tag_key: str, direction: str, nbytes: int) -> None:
        """Count one message of ``nbytes`` that ``party`` sent (``direction="sent"``) or
        received (``"recv"``) under tag key ``tag_key``."""
        key, channel, _ = tag_key.partition("#")
        link = bool(channel)
        if link:
            key = key.rpartition("/")[0]
        with self._lock:
            traffic = self._traffic.get((party, key))
            if traffic is None:
                traffic = self._traffic[(party, key)] = Traffic()
            traffic.add(direction, nbytes, link)
            state = self.states.get(party)
            if state is None:
                state = self.states.setdefault(party, PartyState())
            state.bytes_moved += nbytes

    # -- merging
    def add_events(self, events: list[OpEvent], offset_us: float = 0.0) -> None:
        """Add events recorded elsewhere; ``offset_us`` is their clock minus this one's."""
        for e in events:
            e.start_us -= offset_us
            e.end_us -= offset_us
            self.events.append(e)
            state = self.states.setdefault(e.party, PartyState())
            state.done += 1
            if e.traffic is not None:
                state.bytes_moved += e.traffic.sent_bytes + e.traffic.link_sent_bytes

    def drain(self) -> list[OpEvent]:
        """The events recorded so far, removed from this monitor."""
        with self._lock:
            events, self.events = self.events, []
        return events

    @property
    def done(self) -> int:
        return sum(s.done for s in list(self.states.values()))

    @property
    def bytes_moved(self) -> int:
        return sum(s.bytes_moved for s in list(self.states.values()))


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

