"""`SimpWorker`: one party's runtime state (rank, communicator, object store)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mplang.cluster.commitments import Openings, open_program, program_digest
from mplang.edsl.graph import Graph
from mplang.policy.check import Guard, PolicyRefusedError
from mplang.records.audit import PLAINTEXT
from mplang.runtime.backend import Communicator, WorkerEnv, WorkerStates, worker_kernels
from mplang.runtime.interpreter import Interpreter, KernelTable
from mplang.runtime.object_store import LOCAL_OWNER, ObjectStore
from mplang.runtime.options import DEFAULT_OPTIONS, RunOptions
from mplang.runtime.scheduler import Scheduler
from mplang.storage.data_root import default_root
from mplang.storage.named_objects import NamedObjects
from mplang.transport.wire import privacy_kind
from mplang.worker.failures import Containment


class SimpWorker:
    """The ``simp`` dialect state of one party: runs graphs against its own store.

    Kernels and the other dialects' states come from the backend registry
    (`mplang.runtime.backend`), created once per worker.
    """

    def __init__(self, rank: int, world_size: int, communicator: Communicator,
                 store: ObjectStore, *, timeout: float, in_process: bool,
                 node: str | None = None, data_root: str | os.PathLike[str] | None = None):
        self.rank = rank
        self.world_size = world_size
        self.communicator = communicator
        self.store = store
        self.timeout = timeout
        self.node = node or f"node_{rank}"
        """This party's node name (in errors about its data)."""
        self.data_root = Path(data_root) if data_root is not None else default_root(self.node)
        """Where ``tensor.load`` reads this party's files."""
        self.named = NamedObjects(self.node)
        """The objects this party's owner uploaded (``simp.load``)."""
        self.guard: Guard | None = None
        """This party's policy enforcement (None: every program and fetch is accepted)."""
        env = WorkerEnv(rank, world_size, communicator, timeout, in_process)
        self.states = WorkerStates(env, simp=self)
        """Dialect states given to kernels (``simp`` is this worker; the others are made
        on first use)."""
        self.scheduler = Scheduler(64, f"mplang-party{rank}")

    @property
    def kernels(self) -> KernelTable:
        """The worker kernels registered now (a plugin loaded later adds its own)."""
        return worker_kernels()

    def accept(self, graph: Graph, openings: Openings, driver: str = LOCAL_OWNER,
               whole: bool = False) -> Graph:
        """Accept a committed program for this party: check its openings against their
        commitments and put them in (`open_program`), then `vet` it (``whole``: it is the
        whole program body, whose outputs are the results). Returns the graph this party
        runs; raises `PolicyRefusedError` (an `MPRefusedError`; nothing runs) if its
        policy refuses it."""
        opened = open_program(graph, openings, self.rank, self.world_size)
        reason = self.vet(opened, program_digest(graph, self.world_size), driver, whole)
        if reason is not None:
            raise PolicyRefusedError(f"{self.node} refuses the program: {reason}")
        return opened

    def vet(self, graph: Graph, digest: str, driver: str, whole: bool) -> str | None:
        """This party's verdict on running ``graph`` (program digest ``digest``; ``whole``:
        the whole program body) for the driver with certificate fingerprint ``driver``:
        None accepts, a reason refuses."""
        if self.guard is None:
            return None
        verdict = self.guard.vet(graph, digest, driver, whole, uses=self.named.uses)
        return None if verdict.accepted else "; ".join(dict.fromkeys(verdict.reasons))

    def refund(self, graph: Graph) -> None:
        """Give back the privacy budget accepted ``graph`` was charged: its run never
        starts (`mplang.policy.ledger`)."""
        if self.guard is not None:
            self.guard.refund(graph)

    def run(self, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
            scope: str = "", options: RunOptions = DEFAULT_OPTIONS,
            owner: str = LOCAL_OWNER,
            on_failure: Callable[[str], None] | None = None) -> list[str | None]:
        """Run ``graph`` on stored inputs of ``owner``; store the outputs this party holds
        for ``owner`` and return their URIs.

        With ``options.parallel`` it runs as dataflow on this party's scheduler. An op
        failure leaves as a generic error unless it holds no data (`Containment`);
        ``on_failure`` hears its full text.
        """
        guard = self.guard
        verdict = None if guard is None else guard.admit(graph, input_uris)
        inputs = [None if uri is None else self.store.get(uri, owner) for uri in input_uris]
        interp = Interpreter(self.kernels, self.states, party=self.rank, exec_id=exec_id,
                             options=options, scheduler=self.scheduler,
                             contain=Containment(self.rank, self.node, exec_id, on_failure),
                             owner=owner)
        outputs = interp.run(graph, inputs, scope)
        uris = [None if v is None else self.store.put(v, owner) for v in outputs]
        if guard is not None and verdict is not None:
            guard.record(uris, verdict)
        return uris

    def check_write(self, op: str, path: str, real: Path | None = None) -> None:
        """Refuse (`PolicyRefusedError`) ``op`` (``op table.write_csv at f.py:3``)
        writing ``path`` into this party's data root, and ``real`` (where ``path``
        leads, after links inside the root) if given, unless the policy's ``writes``
        allows it. Without a guard every write is allowed."""
        if self.guard is None:
            return
        policy = self.guard.policy
        shown = [path]
        if real is not None:
            inside = real.relative_to(self.data_root.resolve()).as_posix()
            shown += [inside] if inside != path else []
        refused = [p for p in shown if not policy.may_write(p)]
        if not refused:
            return
        leads = f" (which leads to {shown[1]!r})" if len(shown) > 1 else ""
        raise PolicyRefusedError(
            f"{self.node} refuses {op} writing {path!r}{leads} into its "
            f"data root: writes: [{', '.join(policy.writes)}] in {policy.source} does not "
            f"allow {refused[0]!r}; add it (or a pattern matching it) to writes")

    def fetch(self, uri: str, owner: str = LOCAL_OWNER) -> Any:
        """Stored object ``uri`` of ``owner``, for the driver: refused (`PolicyRefusedError`)
        if it is a secret share or a ciphertext (those leave a party only inside their
        protocol: the program reveals what the driver may see), or if this party's policy
        does not let its data in it go to the driver."""
        if self.guard is not None:
            self.guard.check_fetch(uri)
        value = self.store.get(uri, owner)
        kind = privacy_kind(value)
        if kind != PLAINTEXT:
            raise PolicyRefusedError(
                f"party {self.rank}: object {uri[:200]} is a {kind}, which leaves this party "
                "only inside its protocol; reveal the value in the program instead, e.g. "
                "return mp.put('P0', z)")
        return value

    def delete(self, uri: str, owner: str = LOCAL_OWNER) -> bool:
        """Drop stored object ``uri`` of ``owner`` and its label; whether it existed."""
        deleted = self.store.delete(uri, owner)
        if deleted and self.guard is not None:
            self.guard.labels.forget(uri)
        return deleted

    def recv(self, interp: Interpreter, src: int, key: str) -> Any:
        """The message of party ``src`` for op key ``key`` of ``interp``'s execution,
        waiting at most the execution's timeout (else the worker's)."""
        timeout = interp.options.timeout
        return self.communicator.recv(src, (interp.exec_id, key),
                                      self.timeout if timeout is None else timeout)
