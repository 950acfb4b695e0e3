"""`SimpDriver`: the driver (host) side of a world of parties.

It runs a program by interpreting a one-op launcher graph, ``func.call`` of
the program, with driver kernels. Launch mode's ``func.call`` kernel ships the
whole graph to every worker; standard mode interprets it on the driver and
dispatches each simp op to the workers.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import queue
import threading
import time
import uuid
import weakref
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import Any

import jax
import numpy as np

from mplang.device.cluster import ClusterSpec
from mplang.dialects.common import with_traced_lines
from mplang.dialects.func import call_p
from mplang.driver.ops import dispatch
from mplang.driver.values import DriverObject, HostVar
from mplang.edsl.context import ExecutionContext
from mplang.edsl.errors import (
    MPCommunicationError,
    MPLangError,
    MPRefusedError,
    MPRuntimeError,
    MPTimeoutError,
)
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.object import MPObject
from mplang.edsl.program import Program
from mplang.runtime.backend import driver_kernels
from mplang.runtime.interpreter import Interpreter
from mplang.runtime.options import DEFAULT_OPTIONS, Mode, RunOptions
from mplang.runtime.scheduler import Scheduler
from mplang.runtime.timeline import DRIVER, RunMonitor, monitoring
from mplang.util.lru import LRUCache

STRAGGLER_WAIT_S = 1.0
"""How long the driver waits, after an execution failed, for the abort and for
the parties still running: one busy in a long local op stops only at its next wait,
and the driver reports the failure without it (what it makes is deleted when done)."""


def to_host_value(value: Any) -> Any:
    """A fetched value as numpy: arrays as ``np.ndarray``, rank-0 as numpy scalars;
    opaque values (secret shares) unchanged."""
    if not isinstance(value, (np.ndarray, np.generic, jax.Array)):
        return value
    arr = np.asarray(value)
    return arr[()] if arr.ndim == 0 else arr


COLLECTOR_JOIN_S = 5.0
"""How long stopping a driver's collector waits for the release it is making."""
_COLLECTING: weakref.WeakSet[SimpDriver] = weakref.WeakSet()
"""Drivers whose collector runs: stopped at interpreter exit, before modules are torn
down (a release then, dropping a party's arrays on a daemon thread, aborted the
process inside JAX's array destructor)."""


@atexit.register
def _stop_collectors() -> None:
    for driver in list(_COLLECTING):
        driver.stop_collector()


class SimpDriver(ExecutionContext, ABC):
    """Abstract driver: subclasses move graphs and values to and from the parties."""

    kind = "driver"
    """What the context is called in messages ("this driver is closed")."""

    def __init__(self, cluster: ClusterSpec, *, default_mode: Mode = "launch",
                 pool_size: int = 32, pool_name: str = "mplang-driver"):
        self.cluster = cluster
        self._pool = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix=pool_name)
        """Threads that carry requests to the parties."""
        self._closed = False
        self._causes: LRUCache = LRUCache(64)
        """exec_id -> the failure that aborted it, for the waits it abandoned."""
        self._causes_lock = threading.Lock()
        self.world_size = cluster.world_size
        self.default_mode: Mode = default_mode
        self._lock = threading.Lock()
        self._refs: Counter[str] = Counter()
        self._created: dict[str, list[HostVar]] = {}
        self._run_prefix = f"{uuid.uuid4().hex[:16]}-"
        self._run_ids = itertools.count()
        """Execution ids: unique per driver (random prefix) and per run (counter)."""
        self.runs = 0
        """How many programs this context has started (``mplang run`` checks a script ran one)."""
        self.scheduler = Scheduler(64, "mplang-driver")
        self._garbage: queue.SimpleQueue[Sequence[str | None] | None] = queue.SimpleQueue()
        self._collector = threading.Thread(target=self._collect_garbage,
                                           name="mplang-collector", daemon=True)
        self._collector.start()
        _COLLECTING.add(self)

    def _check_open(self) -> None:
        if self._closed:
            raise MPLangError(f"this {self.kind} is closed")

    def close(self) -> None:
        """Stop this context's threads and transport; it cannot run programs afterwards."""
        if not self._closed:
            self._closed = True
            self._pool.shutdown(wait=True, cancel_futures=True)
            self.scheduler.shutdown()
            self.stop_collector()
            self._close_transport()

    def _close_transport(self) -> None:
        """Release what the transport holds (connections, in-process parties)."""

    def discard(self, uris: Sequence[str | None]) -> None:
        """Called by a collected `DriverObject`'s finalizer: only queues its URIs.

        A finalizer may run inside any allocation, while this thread holds a
        lock (an executor's, a store's); so the release happens on the
        collector thread, never here.
        """
        self._garbage.put(uris)

    def _collect_garbage(self) -> None:
        while (uris := self._garbage.get()) is not None:
            try:
                self.release(uris)
            except Exception:  # freeing is best effort; keep collecting
                continue

    def stop_collector(self) -> None:
        """Stop the thread that releases the objects of collected handles, and wait a
        little for it to finish what it is releasing."""
        _COLLECTING.discard(self)
        self._garbage.put(None)
        if self._collector is not threading.current_thread():
            self._collector.join(COLLECTOR_JOIN_S)

    # -- transport, provided by subclasses
    @abstractmethod
    def submit(self, rank: int, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
               scope: str, parties: Sequence[int], options: RunOptions
               ) -> Future[list[str | None]]:
        """Run ``graph`` on party ``rank``, one of the run's ``parties``; the future gives
        the URIs of its outputs."""

    def submit_here(self, rank: int, graph: Graph, input_uris: Sequence[str | None],
                    exec_id: str, scope: str, parties: Sequence[int], options: RunOptions
                    ) -> Future[list[str | None]]:
        """Like `submit`, for a run on one party alone; transports may run it in the
        calling thread (no thread hand-off)."""
        return self.submit(rank, graph, input_uris, exec_id, scope, parties, options)

    def prepare(self, ranks: list[int], graph: Graph, input_uris: list[list[str | None]],
                exec_id: str, scope: str, options: RunOptions) -> None:
        """Have every party of a multi-party run accept it before any party starts it;
        raises (and nothing runs) if one refuses. Workers do this among themselves when
        they start (their votes); the in-process simulator does it here."""

    @abstractmethod
    def fetch(self, rank: int, uri: str) -> Future[Any]:
        """Get the value at ``uri`` from party ``rank``."""

    @abstractmethod
    def delete(self, uris: Sequence[str | None]) -> None:
        """Tell each party to drop its object (``uris[rank]``); best effort."""

    @abstractmethod
    def abort(self, exec_id: str, reason: str) -> None:
        """Make every party abandon execution ``exec_id`` and free its messages."""

    # -- ownership: a party's object lives while a driver handle or a running execution uses it
    def _retain(self, var: HostVar) -> None:
        with self._lock:
            self._refs.update(u for u in var.uris if u is not None)

    def release(self, uris: Sequence[str | None]) -> None:
        """Drop one reference to each URI; delete the objects no one references any more."""
        dead: list[str | None] = [None] * len(uris)
        with self._lock:
            for rank, uri in enumerate(uris):
                if uri is None:
                    continue
                self._refs[uri] -= 1
                if self._refs[uri] <= 0:
                    del self._refs[uri]
                    dead[rank] = uri
        if any(u is not None for u in dead):
            self.delete(dead)

    # -- shared logic
    def collect(self, futures: Sequence[Future[Any]], exec_id: str) -> list[Any]:
        """Wait for all futures; on the first failure abort the execution and raise its cause."""
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        first = [e for f in done if (e := f.exception()) is not None]
        if not first:
            return [f.result() for f in futures]
        self._record_cause(exec_id, first[0])
        deadline = time.monotonic() + STRAGGLER_WAIT_S
        self.abort(exec_id, f"{first[0]}")
        # the others stop at their next wait; one busy in a long local op is not waited for
        wait(pending, timeout=max(0.0, deadline - time.monotonic()))
        errors = [e for f in futures if f.done() and (e := f.exception()) is not None]
        # the cause is what failed first; failures of parties waiting on it come later
        root = next((e for e in [*first, *errors] if not isinstance(e, MPCommunicationError)),
                    None)
        if root is None:  # abandoned because another op of the execution failed: its cause
            with self._causes_lock:
                root = self._causes.lookup(exec_id) or _end_of_waits(errors) or first[0]
        assert root is not None
        if isinstance(root, MPRuntimeError) and root.op is None:
            # a party was lost without saying where: report where the others stopped
            stops = [f"party {e.party} in op {e.op}" for e in errors
                     if isinstance(e, MPRuntimeError) and e is not root and e.op is not None]
            if stops:
                root.op = next(e.op for e in errors if isinstance(e, MPRuntimeError) and e.op)
                root.args = (f"{root.args[0]}; the other parties stopped at: "
                             f"{', '.join(stops)}", *root.args[1:])
        raise root

    def _record_cause(self, exec_id: str, error: BaseException) -> None:
        """Keep the first failure of ``exec_id`` that is not a wait it abandoned."""
        if not isinstance(error, MPCommunicationError):
            with self._causes_lock:
                if self._causes.lookup(exec_id) is None:
                    self._causes.store(exec_id, error)

    def run_on_parties(self, graph: Graph, args: Sequence[HostVar], exec_id: str, scope: str,
                       parties: Sequence[int] | None = None,
                       options: RunOptions = DEFAULT_OPTIONS) -> list[HostVar]:
        """Run ``graph`` on ``parties`` (default: all); one HostVar per graph output."""
        ranks = range(self.world_size) if parties is None else parties
        submit = self.submit_here if len(ranks) == 1 else self.submit
        if len(ranks) > 1:
            try:
                self.prepare(list(ranks), graph, [[a.uris[r] for a in args] for r in ranks],
                             exec_id, scope, options)
            except Exception as e:
                self._record_cause(exec_id, e)
                raise
        futures = [submit(r, graph, [a.uris[r] for a in args], exec_id, scope, ranks, options)
                   for r in ranks]
        try:
            results = self.collect(futures, exec_id)
        except BaseException:
            for r, f in zip(ranks, futures, strict=True):
                f.add_done_callback(functools.partial(self._drop_outputs, r))
            raise
        per_party: list[list[str | None]] = [[None] * len(graph.outputs)
                                             for _ in range(self.world_size)]
        for r, uris in zip(ranks, results, strict=True):
            per_party[r] = uris
        out = [HostVar(tuple(per_party[r][i] for r in range(self.world_size)))
               for i in range(len(graph.outputs))]
        with self._lock:
            created = self._created.get(exec_id)
            if created is not None:
                created.extend(out)
        for var in out:
            self._retain(var)
        return out

    def _drop_outputs(self, rank: int, future: Future[Any]) -> None:
        """Delete what party ``rank``'s run of a failed execution made, once it is done."""
        if future.cancelled() or future.exception() is not None:
            return
        with contextlib.suppress(MPLangError):  # the driver may be closing
            for uri in future.result():
                self.delete([uri if p == rank else None for p in range(self.world_size)])

    def fetch_var(self, var: HostVar) -> list[Any]:
        """Each party's value of ``var`` (``None`` where it holds nothing)."""
        futures = {r: self.fetch(r, u) for r, u in enumerate(var.uris) if u is not None}
        values = dict(zip(futures, self.collect(list(futures.values()), "fetch"), strict=True))
        return [to_host_value(values[r]) if r in values else None
                for r in range(self.world_size)]

    def fetch_object(self, obj: MPObject) -> Any:
        return self.fetch_var(self._own(obj).var)

    def _own(self, obj: MPObject) -> DriverObject:
        if not isinstance(obj, DriverObject) or obj.owner is not self:
            raise MPRuntimeError(f"{obj!r} does not belong to this context")
        return obj

    def run_program(self, program: Program, inputs: list[MPObject],
                    options: RunOptions = DEFAULT_OPTIONS) -> list[MPObject]:
        """Run ``program`` under ``options`` (`RunOptions`: mode, parallel, timeout, progress).

        In launch mode the parties report their ops (in the simulator through the
        same reporter; HTTP workers in their own log); in standard mode the driver does.
        """
        if program.world_size != self.world_size:
            raise MPLangError(f"program {program.name!r} was compiled for {program.world_size} "
                              f"parties; this context has {self.world_size}")
        expected = program.input_types
        if len(inputs) != len(expected):
            raise MPLangError(f"program {program.name!r} takes {len(expected)} runtime inputs, "
                              f"got {len(inputs)}")
        for i, (obj, t) in enumerate(zip(inputs, expected, strict=True)):
            if obj.mptype != t:
                raise MPLangError(f"program {program.name!r}: runtime input {i} must be {t}, "
                                  f"got {obj.mptype}")
        args = [self._own(obj).var for obj in inputs]
        launcher_inputs = [Value(f"arg{i}", t) for i, t in enumerate(expected)]
        launcher_outputs = tuple(Value(f"out{i}", v.type)
                                 for i, v in enumerate(program.graph.outputs))
        call = Operation(call_p.name, tuple(launcher_inputs), launcher_outputs,
                         {"callee": program.name}, (program.graph,))
        launcher = Graph(launcher_inputs, [call], list(launcher_outputs))
        mode: Mode = options.mode or self.default_mode
        kernels = driver_kernels(mode == "launch", dispatch)
        exec_id = f"{self._run_prefix}{next(self._run_ids)}"
        interp = Interpreter(kernels, {"simp": self}, party=None, exec_id=exec_id,
                             options=options, scheduler=self.scheduler)
        monitor = options.monitor
        if monitor is not None:
            self._describe_run(monitor, program, mode)
        with self._lock:
            self.runs += 1
            self._created[exec_id] = []
        try:
            with monitoring(exec_id, monitor) if monitor is not None else contextlib.nullcontext():
                results: list[HostVar] = interp.run(launcher, args)
            outputs: list[MPObject] = [self._handle(var, v.type, device) for var, v, device
                       in zip(results, program.graph.outputs, program.out_devices, strict=True)]
        except MPRefusedError as e:  # name the lines in device functions it names ops of
            e.args = (with_traced_lines(str(e), program.graph), *e.args[1:])
            raise
        finally:
            with self._lock:
                created = self._created.pop(exec_id)
            for var in created:
                self.release(var.uris)
        return outputs

    def _describe_run(self, monitor: RunMonitor, program: Program, mode: Mode) -> None:
        """Name the monitor's tracks after the cluster's nodes; add the op runs expected
        (every party runs every op in launch mode; the driver too in standard mode)."""
        monitor.parties.setdefault(DRIVER, "driver")
        for rank, node in enumerate(self.cluster.nodes):
            monitor.parties.setdefault(rank, f"party {rank} ({node.name})")
        runners = self.world_size + (mode == "standard")
        monitor.total_ops += sum(1 for _ in program.graph.walk()) * runners + 1

    def _handle(self, var: HostVar, vtype: Any, device: str | None) -> DriverObject:
        self._retain(var)
        return DriverObject(self, var, vtype, self.discard, device)


def _end_of_waits(errors: Sequence[BaseException]) -> MPTimeoutError | None:
    """When parties' waits failed, each waiting for another (party 0 for 1, 1 for 2) and
    one ran out of time, the party at the end of that chain, which reported nothing: an
    error naming it rather than a party that was itself waiting (None: no such chain)."""
    waits = [e for e in errors if isinstance(e, MPCommunicationError) and e.peer is not None]
    timeout = next((e for e in waits if isinstance(e, MPTimeoutError)), None)
    waiting = {e.party for e in waits}
    if timeout is None:
        return None
    end = timeout if timeout.peer not in waiting else next(
        (e for e in waits if e.peer not in waiting), None)
    if end is None:
        return None
    waited = "" if end is timeout else f"party {end.party} was waiting for it when "
    return MPTimeoutError(f"party {end.peer} sent nothing in time: {waited}{timeout}",
                          party=end.peer, op=end.op, key=end.key, loc=end.loc)
