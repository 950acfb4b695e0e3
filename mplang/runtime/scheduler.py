"""The dataflow scheduler: a bounded thread pool and per-graph dependency plans.

An op runs as soon as its inputs are ready. Ops with side effects keep their
program order (each depends on the previous effectful op of its graph).
Graphs without at least two ops that can block (communication, calls with
regions, control flow, host callbacks) run sequentially: for them a thread hop
costs more than it could save.
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mplang.edsl.graph import Graph, Value
from mplang.frontend.registry import get_op, is_registered

_BLOCKING_KINDS = frozenset(["communication", "call", "control_flow"])


@dataclass(frozen=True)
class DataflowPlan:
    """For each op of a graph: the ops it waits for and the ops waiting for it."""

    deps: tuple[tuple[int, ...], ...]
    users: tuple[tuple[int, ...], ...]
    parallel: bool
    """Whether running the graph as dataflow can overlap anything."""


_PLANS: weakref.WeakKeyDictionary[Graph, DataflowPlan] = weakref.WeakKeyDictionary()
_PLANS_LOCK = threading.Lock()


def _may_block(opcode: str) -> bool:
    if not is_registered(opcode):
        return False
    info = get_op(opcode)
    return info.kind in _BLOCKING_KINDS or info.side_effects


def plan(graph: Graph) -> DataflowPlan:
    """The dependency plan of ``graph`` (computed once per graph)."""
    with _PLANS_LOCK:
        cached = _PLANS.get(graph)
    if cached is not None:
        return cached
    producer: dict[Value, int] = {}
    deps: list[tuple[int, ...]] = []
    users: list[list[int]] = [[] for _ in graph.operations]
    last_effect: int | None = None
    blocking = 0
    for index, op in enumerate(graph.operations):
        mine = {producer[v] for v in op.inputs if v in producer}
        if is_registered(op.opcode) and get_op(op.opcode).side_effects:
            if last_effect is not None:
                mine.add(last_effect)
            last_effect = index
        blocking += _may_block(op.opcode)
        deps.append(tuple(sorted(mine)))
        for d in mine:
            users[d].append(index)
        for v in op.outputs:
            producer[v] = index
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
