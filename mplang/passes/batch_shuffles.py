"""Batching of independent shuffles on the same links in the same round.

``simp.shuffle_static`` ops with identical routes that start in the same
communication round (`rounds`: the most communicating ops on a path to them)
become one shuffle with several inputs and outputs, which sends all its values
in one message per route. Ops of one round cannot depend on each other (a path
from one to the other would pass a communicating op), so merging them never
creates a cycle, and it adds no round to anyone's path: at worst an op waits for
local computation feeding another member.

The merged op takes the place of the group's last member; ops are then put in
a stable topological order (`stable_topological_order`), so an op that read an
earlier member's output moves after the merged op, and every other op keeps its
relative order (ops with effects always do). The outputs are the members'
output values, so no use changes. Shuffles with different routes, in different
rounds, or reading a value another member already moves (CSE's job) are left
alone.
"""

from __future__ import annotations

from mplang.edsl.graph import Graph, Operation, Value
from mplang.passes.common import (
    map_regions,
    rebuild,
    rounds,
    shallow_copy,
    stable_topological_order,
)

_Routes = tuple[tuple[int, int], ...]


def _routes(op: Operation) -> _Routes | None:
    """The routes of a well-formed batchable move (``simp.shuffle_static``) as sorted
    pairs, else None."""
    if not op.traits.batchable or op.regions or set(op.attrs) != {"routes"} \
            or not op.inputs or len(op.inputs) != len(op.outputs):
        return None
    routes = op.attrs["routes"]
    if not isinstance(routes, dict) or not all(type(k) is int and type(v) is int
                                               for k, v in routes.items()):
        return None
    return tuple(sorted(routes.items()))


def batch_shuffles(graph: Graph) -> Graph:
    """``graph`` with each group of batchable shuffles merged, at every level; the
    input graph is not changed."""
    return shallow_copy(_batch(graph))


def _batch(graph: Graph) -> Graph:
    ops = [map_regions(op, _batch) for op in graph.operations]
    start = rounds(ops)
    groups: dict[tuple[str, _Routes, int], list[int]] = {}
    for index, op in enumerate(ops):
        routes = _routes(op)
        if routes is not None:
            groups.setdefault((op.opcode, routes, start[index]), []).append(index)
    merged_at: dict[int, Operation] = {}
    dropped: set[int] = set()
    for members in groups.values():
        chosen: list[int] = []
        moved: set[Value] = set()
        for index in members:
            inputs = ops[index].inputs
            if len(set(inputs)) == len(inputs) and moved.isdisjoint(inputs):
                chosen.append(index)
                moved.update(inputs)
        if len(chosen) < 2:
            continue
        merged_at[chosen[-1]] = Operation(
            ops[chosen[0]].opcode, tuple(v for i in chosen for v in ops[i].inputs),
            tuple(v for i in chosen for v in ops[i].outputs),
            {"routes": dict(ops[chosen[0]].attrs["routes"])})
        dropped.update(chosen[:-1])
    if not merged_at:
        return rebuild(graph, ops)
    kept = [(index, merged_at.get(index, op)) for index, op in enumerate(ops)
            if index not in dropped]
    order = stable_topological_order([op for _, op in kept], [index for index, _ in kept])
    if order is None:  # unreachable: ops of one round are independent
        return rebuild(graph, ops)
    return rebuild(graph, order)
