"""In-memory worlds: `LocalMesh` of `SimpWorker`s talking through thread mailboxes."""

from __future__ import annotations

from typing import Any

from mplang.backends.simp_worker.mailbox import Mailbox
from mplang.backends.simp_worker.network import DelayedNetwork, NetworkModel
from mplang.backends.simp_worker.state import SimpWorker, Tag
from mplang.backends.spu_channel import ChannelLinkFactory
from mplang.backends.spu_impl import MemLinkFactory, SpuState
from mplang.runtime.interpreter import KernelTable
from mplang.runtime.object_store import ObjectStore


class ThreadCommunicator:
    """A party's view of the mesh: sends go into the peer's mailbox, at once or
    when the network model says the message arrives."""

    def __init__(self, rank: int, mailboxes: list[Mailbox], timeout: float,
                 network: DelayedNetwork | None = None):
        self.rank = rank
        self._mailboxes = mailboxes
        self.timeout = timeout
        self._network = network

    def send(self, dst: int, tag: Tag, value: Any) -> None:
        if self._network is None:
            self._mailboxes[dst].put(self.rank, tag, value)
        else:
            self._network.send(self._mailboxes[dst], self.rank, dst, tag, value)

    def recv(self, src: int, tag: Tag) -> Any:
        return self._mailboxes[self.rank].take(src, tag, self.timeout)


class LocalMesh:
    """``world_size`` workers in this process, one mailbox each.

    SPU traffic goes through libspu's in-memory links, created when an SPU op
    first runs; with a network model it goes through the modelled links instead
    (libspu channels over the party communicator), so protocol rounds pay latency.
    """

    def __init__(self, world_size: int, kernels: KernelTable, timeout: float,
                 network: NetworkModel | None = None):
        self.world_size = world_size
        self.mailboxes = [Mailbox(r) for r in range(world_size)]
        self.network = None if network is None else DelayedNetwork(network)
        self.workers = []
        for r in range(world_size):
            comm = ThreadCommunicator(r, self.mailboxes, timeout, self.network)
            links = MemLinkFactory(timeout) if network is None \
                else ChannelLinkFactory(comm, timeout)
            self.workers.append(SimpWorker(r, world_size, comm, ObjectStore(f"party{r}"),
                                           kernels, {"spu": SpuState(links)}))

    def abort(self, exec_id: str, reason: str) -> None:
        for box in self.mailboxes:
            box.abort(exec_id, reason)

    def close(self) -> None:
        for worker in self.workers:
            worker.scheduler.shutdown()
        if self.network is not None:
            self.network.close()
