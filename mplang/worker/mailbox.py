"""A party's mailbox: messages from peers, keyed by (source, tag), with abort.

A mailbox given a capacity holds at most that many payload bytes; a message
that would exceed it is refused (`MPRefusedError`, 429) instead of queued.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from mplang.edsl.errors import MPCommunicationError, MPRefusedError, MPTimeoutError
from mplang.runtime.backend import Tag
from mplang.runtime.scheduler import blocking
from mplang.runtime.timeline import monitor_of
from mplang.transport.wire import payload_bytes

_ABORTED_MEMORY = 4096


def count_message(rank: int, tag: Tag, direction: str, value: Any) -> None:
    """Tell the run monitor of ``tag``'s execution, if this process has one, that party
    ``rank`` sent (``direction="sent"``) or received (``"recv"``) ``value``."""
    monitor = monitor_of(tag[0])
    if monitor is not None:
        monitor.count(rank, tag[1], direction, payload_bytes(value))


class Mailbox:
    """Messages addressed to one party, keyed by (source, tag)."""

    def __init__(self, rank: int, capacity_bytes: int | None = None):
        self.rank = rank
        self.capacity_bytes = capacity_bytes
        self._cond = threading.Condition()
        self._messages: dict[tuple[int, Tag], deque[tuple[Any, int]]] = {}
        """(source, tag) -> the messages under it, oldest first."""
        self._bytes = 0
        self._aborted: dict[str, tuple[str, bool]] = {}
        """exec_id -> (why it was aborted, whether by a refusal here)."""
        self._aborted_order: deque[str] = deque()

    def put(self, src: int, tag: Tag, value: Any, nbytes: int = 0) -> None:
        """Queue ``value`` (``nbytes`` on the wire) for a `take`. Messages under one slot
        are taken in the order they came: a secure device's link may send one tag twice
        (its connection test), and each send is one receive."""
        with self._cond:
            if tag[0] in self._aborted:
                return
            held = self._bytes
            if self.capacity_bytes is not None and held + nbytes > self.capacity_bytes:
                raise MPRefusedError(f"party {self.rank}'s mailbox is full ({held} of "
                                     f"{self.capacity_bytes} bytes held)", 429)
            self._messages.setdefault((src, tag), deque()).append((value, nbytes))
            self._bytes = held + nbytes
            self._cond.notify_all()

    def take(self, src: int, tag: Tag, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._messages.get((src, tag)):
                return self._wait_locked(src, tag, deadline, timeout)
        with blocking(), self._cond:  # the op's pool slot serves other ops meanwhile
            return self._wait_locked(src, tag, deadline, timeout)

    def _wait_locked(self, src: int, tag: Tag, deadline: float, timeout: float) -> Any:
        slot = (src, tag)
        while True:
            queued = self._messages.get(slot)
            if queued:
                value, nbytes = queued.popleft()
                if not queued:
                    del self._messages[slot]
                self._bytes -= nbytes
                return value
            aborted = self._aborted.get(tag[0])
            if aborted is not None:
                reason, refused = aborted
                if refused:
                    raise MPRefusedError(reason, 409)
                raise MPCommunicationError(
                    f"party {self.rank}: execution {tag[0]} was abandoned ({reason}) while "
                    f"waiting for party {src}", party=self.rank, peer=src)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MPTimeoutError(
                    f"party {self.rank}: no message from party {src} for {tag[1]} within "
                    f"{timeout:.3g} s", party=self.rank, peer=src)
            self._cond.wait(remaining)

    def abort(self, exec_id: str, reason: str, refused: bool = False) -> None:
        """Fail every wait of ``exec_id`` and drop its messages, now and later; a wait
        raises `MPRefusedError` with ``reason`` if ``refused`` (this party refused a
        message the execution needs), else `MPCommunicationError`. The first abort's
        reason stays."""
        with self._cond:
            if exec_id in self._aborted:
                return
            self._aborted[exec_id] = (reason, refused)
            self._aborted_order.append(exec_id)
            while len(self._aborted_order) > _ABORTED_MEMORY:
                self._aborted.pop(self._aborted_order.popleft(), None)
            self._drop_locked(exec_id, None)
            self._cond.notify_all()

    def drop(self, exec_id: str, scope: str) -> None:
        """Drop the queued messages of one run (``scope``) of ``exec_id``: nobody takes them."""
        with self._cond:
            self._drop_locked(exec_id, scope)

    def _drop_locked(self, exec_id: str, scope: str | None) -> None:
        for slot in [s for s in self._messages if s[1][0] == exec_id and (
                scope is None or s[1][1].startswith(scope + "/"))]:
            self._bytes -= sum(nbytes for _, nbytes in self._messages.pop(slot))

    def pending(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._messages.values())

    def pending_bytes(self) -> int:
        with self._cond:
            return self._bytes
