"""The dataflow scheduler: a bounded thread pool and per-graph dependency plans.

An op runs as soon as its inputs are ready. Ops with side effects, in their
regions too, keep their program order (`mplang.edsl.graph.op_dependencies`).
Graphs without at least two ops that can block (ops that communicate, have
regions or side effects, by their `OpTraits`) run sequentially: for them a
thread hop costs more than it could save.
"""

from __future__ import annotations

import threading
import weakref
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


def _may_block(op: Operation) -> bool:
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
    blocking = sum(_may_block(op) for op in graph.operations)
    result = DataflowPlan(tuple(deps), tuple(tuple(u) for u in users), blocking >= 2)
    with _PLANS_LOCK:
        _PLANS[graph] = result
    return result


class Scheduler:
    """A bounded pool for running ready ops. When every slot is busy the caller
    runs the op itself, so nested dataflow runs never wait for a free thread."""

    def __init__(self, max_workers: int = 64, name: str = "mplang-op"):
        self.max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=name)
        self._slots = threading.BoundedSemaphore(max_workers)

    def try_submit(self, fn: Any, *args: Any) -> Future[Any] | None:
        """Run ``fn(*args)`` on the pool if a slot is free; None means: run it yourself."""
        if not self._slots.acquire(blocking=False):
            return None
        try:
            future = self._pool.submit(fn, *args)
        except RuntimeError:  # the pool is shut down
            self._slots.release()
            return None
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
