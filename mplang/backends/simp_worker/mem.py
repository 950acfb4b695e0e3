"""In-memory worlds: `LocalMesh` of `SimpWorker`s talking through thread mailboxes."""

from __future__ import annotations

from typing import Any

from mplang.backends.simp_worker.mailbox import Mailbox
from mplang.backends.simp_worker.state import SimpWorker, Tag
from mplang.backends.spu_impl import MemLinkFactory, SpuState
from mplang.runtime.interpreter import KernelTable
from mplang.runtime.object_store import ObjectStore


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

    def close(self) -> None:
        for worker in self.workers:
            worker.scheduler.shutdown()
