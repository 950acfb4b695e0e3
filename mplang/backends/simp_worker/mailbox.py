"""A party's mailbox: messages from peers, keyed by (source, tag), with abort."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from mplang.frontend.errors import MPCommunicationError
from mplang.runtime.backend import Tag

_ABORTED_MEMORY = 4096


class Mailbox:
    """Messages addressed to one party, keyed by (source, tag)."""

    def __init__(self, rank: int):
        self.rank = rank
        self._cond = threading.Condition()
        self._messages: dict[tuple[int, Tag], Any] = {}
        self._aborted: dict[str, str] = {}
        self._aborted_order: deque[str] = deque()

    def put(self, src: int, tag: Tag, value: Any) -> None:
        with self._cond:
            if tag[0] in self._aborted:
                return
            self._messages[(src, tag)] = value
            self._cond.notify_all()

    def take(self, src: int, tag: Tag, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        slot = (src, tag)
        with self._cond:
            while True:
                if slot in self._messages:
                    return self._messages.pop(slot)
                reason = self._aborted.get(tag[0])
                if reason is not None:
                    raise MPCommunicationError(
                        f"party {self.rank}: execution {tag[0]} was abandoned ({reason}) while "
                        f"waiting for party {src}", party=self.rank)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MPCommunicationError(
                        f"party {self.rank}: no message from party {src} for {tag[1]} within "
                        f"{timeout:g} s", party=self.rank)
                self._cond.wait(remaining)

    def abort(self, exec_id: str, reason: str) -> None:
        """Fail every wait of ``exec_id`` and drop its messages, now and later."""
        with self._cond:
            self._aborted[exec_id] = reason
            self._aborted_order.append(exec_id)
            while len(self._aborted_order) > _ABORTED_MEMORY:
                self._aborted.pop(self._aborted_order.popleft(), None)
            for slot in [s for s in self._messages if s[1][0] == exec_id]:
                del self._messages[slot]
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._messages)
