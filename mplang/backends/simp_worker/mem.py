"""In-memory worlds: `LocalMesh` of `SimpWorker`s talking through thread mailboxes."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

from mplang.backends.simp_worker.state import SimpWorker, Tag
from mplang.backends.spu_impl import MemLinkFactory, SpuState
from mplang.frontend.errors import MPCommunicationError
from mplang.runtime.interpreter import KernelTable
from mplang.runtime.object_store import ObjectStore

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


class ThreadCommunicator:
    """A party's view of the mesh: sends go straight into the peer's mailbox."""

    def __init__(self, rank: int, mailboxes: list[Mailbox], timeout: float):
        self.rank = rank
        self._mailboxes = mailboxes
        self.timeout = timeout

    def send(self, dst: int, tag: Tag, value: Any) -> None:
        self._mailboxes[dst].put(self.rank, tag, value)

    def recv(self, src: int, tag: Tag) -> Any:
        return self._mailboxes[self.rank].take(src, tag, self.timeout)


class LocalMesh:
    """``world_size`` workers in this process, one mailbox each; SPU traffic goes
    through libspu's in-memory links, created when an SPU op first runs."""

    def __init__(self, world_size: int, kernels: KernelTable, timeout: float):
        self.world_size = world_size
        self.mailboxes = [Mailbox(r) for r in range(world_size)]
        spu_links = MemLinkFactory(timeout)
        self.workers = [
            SimpWorker(r, world_size, ThreadCommunicator(r, self.mailboxes, timeout),
                       ObjectStore(f"party{r}"), kernels, {"spu": SpuState(spu_links)})
            for r in range(world_size)
        ]

    def abort(self, exec_id: str, reason: str) -> None:
        for box in self.mailboxes:
            box.abort(exec_id, reason)
