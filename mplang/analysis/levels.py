"""Op dependencies, topological levels and independent sets of one graph.

An op depends on the ops defining its inputs and, if it has side effects, on
the previous op with side effects of the same graph (the order the dataflow
scheduler keeps). Level of an op = 1 + the highest level among the ops it
depends on; graph inputs are level 0. Ops of one level never reach each other
along dependencies (a path strictly raises the level), so every level is an
independent set: its ops may run at the same time.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from mplang.edsl.errors import MPVerifyError
from mplang.edsl.graph import Graph, effect_order
from mplang.edsl.graph import op_dependencies as graph_op_dependencies


@dataclass(frozen=True)
class Dependencies:
    """For each op of a graph, by index: the ops it waits for and the ops waiting for it."""

    preds: tuple[tuple[int, ...], ...]
    succs: tuple[tuple[int, ...], ...]
    effect_preds: tuple[int | None, ...]
    """The previous op with side effects, for ops that have side effects."""


def op_dependencies(graph: Graph) -> Dependencies:
    """The dependencies of ``graph``'s ops (data, then effect order), as the scheduler
    runs them (`mplang.edsl.graph.op_dependencies`)."""
    preds = [tuple(sorted(d)) for d in graph_op_dependencies(graph.operations)]
    effect_preds = effect_order(graph.operations)
    succs: list[list[int]] = [[] for _ in graph.operations]
    for index, mine_preds in enumerate(preds):
        for p in mine_preds:
            succs[p].append(index)
    return Dependencies(tuple(preds), tuple(tuple(s) for s in succs), tuple(effect_preds))


def topological_order(graph: Graph, deps: Dependencies) -> list[int]:
    """Op indices with every op after the ops it depends on (program order among ready ops).

    Raises `MPVerifyError` naming an op on a dependency cycle.
    """
    waiting = [len(p) for p in deps.preds]
    ready = deque(i for i, n in enumerate(waiting) if n == 0)
    order: list[int] = []
    while ready:
        index = ready.popleft()
        order.append(index)
        for s in deps.succs[index]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ready.append(s)
    if len(order) < len(waiting):
        stuck = min(i for i, n in enumerate(waiting) if n > 0)
        cycle = _cycle_through(deps, stuck, {i for i, n in enumerate(waiting) if n > 0})
        names = " -> ".join(f"op #{i} {graph.operations[i].opcode}" for i in cycle)
        raise MPVerifyError(f"op #{cycle[0]} {graph.operations[cycle[0]].opcode}: "
                            f"dependency cycle {names}")
    return order


def _cycle_through(deps: Dependencies, start: int, unresolved: set[int]) -> list[int]:
    """A dependency cycle among ``unresolved`` ops reached from ``start`` (closed: last = first)."""
    path: list[int] = []
    seen: dict[int, int] = {}
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(p for p in deps.preds[node] if p in unresolved)
    cycle = path[seen[node]:]
    cycle.reverse()  # preds walk backwards; print in dataflow direction
    return [*cycle, cycle[0]]


def op_levels(graph: Graph, deps: Dependencies) -> list[int]:
    """The level of each op (1 for ops that depend on nothing)."""
    level = [0] * len(graph.operations)
    for index in topological_order(graph, deps):
        level[index] = 1 + max((level[p] for p in deps.preds[index]), default=0)
    return level


def topological_levels(graph: Graph, deps: Dependencies | None = None) -> list[list[int]]:
    """Op indices grouped by level: entry 0 holds the level-1 ops, and so on."""
    deps = deps or op_dependencies(graph)
    level = op_levels(graph, deps)
    levels: list[list[int]] = [[] for _ in range(max(level, default=0))]
    for index, lv in enumerate(level):
        levels[lv - 1].append(index)
    return levels


def independent_sets(graph: Graph, deps: Dependencies | None = None) -> list[list[int]]:
    """The levels with more than one op: sets of ops that can run in parallel."""
    return [lv for lv in topological_levels(graph, deps) if len(lv) > 1]
