"""The dataflow scheduler: a bounded thread pool and per-graph dependency plans.

A thread that waits for a message (`blocking`) lends its slot to other ready ops.

An op runs as soon as its inputs are ready. Ops with side effects, in their
regions too, keep their program order (`mplang.edsl.graph.op_dependencies`).
Graphs without at least two ops that can block (ops that communicate, have
regions or side effects, by their `OpTraits`) run sequentially: for them a
thread hop costs more than it could save.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mplang.edsl.graph import Graph, Operation, op_dependencies


@dataclass(frozen=True)
class DataflowPlan:
    """For each op of a graph: the ops it waits for and the ops waiting for it."""

    deps: tuple[tuple[int, ...], ...]
    users: tuple[tuple[int, ...], ...]
    parallel: bool
    """Whether running the graph as dataflow can overlap anything."""


_PLANS: weakref.WeakKeyDictionary[Graph, DataflowPlan] = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def may_block(op: Operation) -> bool:
    """Whether ``op`` may wait (on a peer's message, a region's ops or an effect)."""
    traits = op.traits
    return traits.communicates or traits.regions is not None or not traits.pure


def plan(graph: Graph) -> DataflowPlan:
    """The dependency plan of ``graph`` (computed once per graph)."""
    with _PLANS_LOCK:
        cached = _PLANS.get(graph)
    if cached is not None:
        return cached
    deps = [tuple(sorted(d)) for d in op_dependencies(graph.operations)]
    users: list[list[int]] = [[] for _ in graph.operations]
    for index, mine in enumerate(deps):
        for d in mine:
            users[d].append(index)
    blocking = sum(may_block(op) for op in graph.operations)
    result = DataflowPlan(tuple(deps), tuple(tuple(u) for u in users), blocking >= 2)
    with _PLANS_LOCK:
        _PLANS[graph] = result
    return result


_held = threading.local()
"""``slots``: the semaphore of the pool slot this thread runs an op on, if any."""


@contextlib.contextmanager
def blocking() -> Iterator[None]:
    """Around a wait for another party's message or another op: the pool slot this
    thread holds is lent to other ready ops meanwhile and taken back afterwards. Ops
    that wait on each other across parties (a share that arrives only when its
    sender's op gets a thread) so never hold every slot."""
    slots = getattr(_held, "slots", None)
    if slots is None:
        yield
        return
    _held.slots = None
    slots.release()
    try:
        yield
    finally:
        slots.acquire()
        _held.slots = slots


class Scheduler:
    """A pool running at most ``max_workers`` ready ops at once; ops waiting in
    `blocking` do not count, and their threads (up to ``THREADS_PER_SLOT`` times
    ``max_workers``) stay apart. When every slot is busy, `try_submit` says so: a
    dataflow run then runs an op that cannot wait itself, and keeps one that may (on a
    peer) until a slot is free, so its loop goes on starting the ops peers wait for."""

    THREADS_PER_SLOT = 16

    def __init__(self, max_workers: int = 64, name: str = "mplang-op"):
        self.max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers=max_workers * self.THREADS_PER_SLOT,
                                        thread_name_prefix=name)
        self._slots = threading.BoundedSemaphore(max_workers)

    def _run(self, fn: Any, args: tuple[Any, ...]) -> Any:
        _held.slots = self._slots
        try:
            return fn(*args)
        finally:
            _held.slots = None
            self._slots.release()

    def try_submit(self, fn: Any, *args: Any) -> Future[Any] | None:
        """Run ``fn(*args)`` on the pool if a slot is free; None means: run it yourself."""
        if not self._slots.acquire(blocking=False):
            return None
        try:
            return self._pool.submit(self._run, fn, args)
        except RuntimeError:  # the pool is shut down
            self._slots.release()
            return None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
