"""In-memory worlds: `LocalMesh` of `SimpWorker`s talking through thread mailboxes."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from mplang.runtime.backend import Tag
from mplang.runtime.object_store import LOCAL_OWNER, ObjectStore
from mplang.worker.mailbox import Mailbox, count_message
from mplang.worker.network import DelayedNetwork, NetworkModel
from mplang.worker.state import SimpWorker


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
        count_message(self.rank, tag, "sent", value)
        if self._network is None:
            self._mailboxes[dst].put(self.rank, tag, value)
        else:
            self._network.send(self._mailboxes[dst], self.rank, dst, tag, value)

    def recv(self, src: int, tag: Tag, timeout: float | None = None) -> Any:
        value = self._mailboxes[self.rank].take(src, tag,
                                                self.timeout if timeout is None else timeout)
        count_message(self.rank, tag, "recv", value)
        return value


class LocalMesh:
    """``world_size`` workers in this process, one mailbox each.

    Without a network model the workers are ``in_process``: dialects may connect
    them through in-memory links of their own; with one, every message goes
    through the modelled links, so protocol rounds pay latency.
    """

    def __init__(self, world_size: int, timeout: float, network: NetworkModel | None = None,
                 nodes: Sequence[str] | None = None,
                 data_roots: Mapping[str, str | os.PathLike[str]] | None = None):
        self.world_size = world_size
        self.mailboxes = [Mailbox(r) for r in range(world_size)]
        self.network = None if network is None else DelayedNetwork(network)
        self.workers = []
        names = list(nodes) if nodes is not None else [f"node_{r}" for r in range(world_size)]
        roots = dict(data_roots or {})
        for r in range(world_size):
            comm = ThreadCommunicator(r, self.mailboxes, timeout, self.network)
            self.workers.append(SimpWorker(r, world_size, comm, ObjectStore(f"party{r}"),
                                           timeout=timeout, in_process=network is None,
                                           node=names[r], data_root=roots.get(names[r])))

    def abort(self, exec_id: str, reason: str) -> None:
        for box in self.mailboxes:
            box.abort(exec_id, reason)

    def close(self) -> None:
        for worker in self.workers:
            worker.scheduler.shutdown()
            worker.states.driver_closed(LOCAL_OWNER)  # kept secure sessions go
        if self.network is not None:
            self.network.close()
