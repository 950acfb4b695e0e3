"""`SimpWorker`: one party's runtime state (rank, communicator, object store)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from mplang.edsl.graph import Graph, Operation
from mplang.runtime.interpreter import Interpreter, KernelTable
from mplang.runtime.object_store import ObjectStore
from mplang.runtime.scheduler import Scheduler

Tag = tuple[str, str]
"""A message tag: (execution id, op key). Every message of a run carries one."""


class Communicator(Protocol):
    """Point-to-point messages between the parties of one world."""

    def send(self, dst: int, tag: Tag, value: Any) -> None: ...

    def recv(self, src: int, tag: Tag) -> Any: ...


class SimpWorker:
    """The ``simp`` dialect state of one party: runs graphs against its own store."""

    dialect_name = "simp"

    def __init__(self, rank: int, world_size: int, communicator: Communicator,
                 store: ObjectStore, kernels: KernelTable,
                 states: Mapping[str, Any] | None = None):
        self.rank = rank
        self.world_size = world_size
        self.communicator = communicator
        self.store = store
        self.kernels = kernels
        self.states: dict[str, Any] = {**(states or {}), "simp": self}
        """Dialect states given to kernels (``simp`` is this worker)."""
        self.scheduler = Scheduler(64, f"mplang-party{rank}")

    def run(self, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
            scope: str = "", on_op: Callable[[Operation, str], None] | None = None,
            parallel: bool = True) -> list[str | None]:
        """Run ``graph`` on stored inputs; store the outputs this party holds, return their URIs.

        ``parallel`` runs it as dataflow on this party's scheduler.
        """
        inputs = [None if uri is None else self.store.get(uri) for uri in input_uris]
        interp = Interpreter(self.kernels, self.states, party=self.rank, exec_id=exec_id,
                             on_op=on_op, scheduler=self.scheduler if parallel else None)
        outputs = interp.run(graph, inputs, scope)
        return [None if v is None else self.store.put(v) for v in outputs]
