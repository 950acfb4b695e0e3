"""What the passes share: effects, attribute equality, graph equivalence, dependencies.

Every helper is a pure function of the IR; nothing here mutates a graph.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mplang.edsl.graph import Graph, Operation, Value, communicates, op_dependencies


def is_local(op: Operation) -> bool:
    """Whether ``op`` runs without any message between parties (by its traits; unknown
    ops count as communicating, which only makes the passes more cautious)."""
    return not communicates(op)


def map_regions(op: Operation, fn: Callable[[Graph], Graph]) -> Operation:
    """``op`` with ``fn`` applied to each of its regions (``op`` itself if none changed)."""
    if not op.regions:
        return op
    regions = tuple(fn(region) for region in op.regions)
    if all(new is old for new, old in zip(regions, op.regions, strict=True)):
        return op
    return op.replace(regions=regions)


def rebuild(graph: Graph, operations: Sequence[Operation],
            outputs: Sequence[Value] | None = None) -> Graph:
    """``graph`` with new ops (and outputs), or ``graph`` itself if they are the same
    objects, so unchanged regions keep their identity and their ops stay untouched."""
    outputs = graph.outputs if outputs is None else outputs
    if (len(operations) == len(graph.operations)
            and all(a is b for a, b in zip(operations, graph.operations, strict=True))
            and all(a is b for a, b in zip(outputs, graph.outputs, strict=True))):
        return graph
    return Graph(list(graph.inputs), list(operations), list(outputs))


def substitute_inputs(op: Operation, mapping: Mapping[Value, Value]) -> Operation:
    """``op`` reading ``mapping[v]`` in place of each mapped input ``v``."""
    if not any(v in mapping for v in op.inputs):
        return op
    return op.replace(inputs=tuple(mapping.get(v, v) for v in op.inputs))


def shallow_copy(graph: Graph) -> Graph:
    """A new `Graph` with the same inputs, ops and outputs (what each pass returns, so
    the caller never gets its own graph object back)."""
    return Graph(list(graph.inputs), list(graph.operations), list(graph.outputs))


# ---------------------------------------------------------------- equality


def attr_equal(a: Any, b: Any) -> bool:
    """Deep, type-strict equality of attribute values.

    Arrays are equal when dtype, shape and bytes are; floats when their ``repr``
    is (so ``-0.0 != 0.0`` and ``nan == nan``); ``True`` never equals ``1``.
    Objects without a known structure are equal when ``==`` says ``True``.
    """
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray | np.generic):
        x, y = np.asarray(a), np.asarray(b)
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(attr_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        xs = {(type(k), k): v for k, v in a.items()}
        ys = {(type(k), k): v for k, v in b.items()}
        return xs.keys() == ys.keys() and all(attr_equal(xs[k], ys[k]) for k in xs)
    try:
        same = a == b
    except Exception:
        return False
    return same is True


def attrs_equal(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two ops' attribute dicts are deeply equal (`attr_equal`)."""
    return a.keys() == b.keys() and all(attr_equal(a[k], b[k]) for k in a)


def graphs_equivalent(a: Graph, b: Graph) -> bool:
    """Whether ``a`` and ``b`` are the same graph up to the identity of their values:
    same input types, the same ops in the same order over corresponding values
    (attributes `attrs_equal`, regions equivalent), corresponding outputs."""
    if len(a.inputs) != len(b.inputs) or len(a.operations) != len(b.operations) \
            or len(a.outputs) != len(b.outputs):
        return False
    match: dict[Value, Value] = {}
    for x, y in zip(a.inputs, b.inputs, strict=True):
        if x.type != y.type:
            return False
        match[x] = y
    for p, q in zip(a.operations, b.operations, strict=True):
        if (p.opcode != q.opcode or len(p.inputs) != len(q.inputs)
                or len(p.outputs) != len(q.outputs) or len(p.regions) != len(q.regions)):
            return False
        if any(match.get(x) is not y for x, y in zip(p.inputs, q.inputs, strict=True)):
            return False
        if any(x.type != y.type for x, y in zip(p.outputs, q.outputs, strict=True)):
            return False
        if not attrs_equal(p.attrs, q.attrs):
            return False
        if not all(graphs_equivalent(r, s) for r, s in zip(p.regions, q.regions, strict=True)):
            return False
        match.update(zip(p.outputs, q.outputs, strict=True))
    return all(match.get(x) is y for x, y in zip(a.outputs, b.outputs, strict=True))


# ---------------------------------------------------------------- dependencies


def rounds(ops: Sequence[Operation], deps: Sequence[set[int]] | None = None) -> list[int]:
    """For each op, the most communicating ops on any dependency path that ends at it
    (the op itself excluded): the communication round in which it can start."""
    deps = op_dependencies(ops) if deps is None else deps
    result: list[int] = []
    for index in range(len(ops)):
        result.append(max((result[d] + (not is_local(ops[d])) for d in deps[index]),
                          default=0))
    return result


def users(ops: Sequence[Operation]) -> dict[Value, set[int]]:
    """The indices of the ops reading each value."""
    found: dict[Value, set[int]] = {}
    for index, op in enumerate(ops):
        for v in op.inputs:
            found.setdefault(v, set()).add(index)
    return found


def stable_topological_order(ops: Sequence[Operation], keys: Sequence[float]
                             ) -> list[Operation] | None:
    """``ops`` ordered so every op follows the definers of its inputs and ops with
    effects keep their order by key, preferring smaller ``keys`` first.

    Ops whose keys already form a valid order keep it; None if no order exists
    (the dependencies have a cycle).
    """
    ranked = [ops[i] for i in sorted(range(len(ops)), key=lambda i: keys[i])]
    followers: list[list[int]] = [[] for _ in ranked]
    waiting = [0] * len(ranked)
    for index, mine in enumerate(op_dependencies(ranked)):
        waiting[index] = len(mine)
        for d in mine:
            followers[d].append(index)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    result: list[Operation] = []
    while ready:
        index = heapq.heappop(ready)
        result.append(ranked[index])
        for f in followers[index]:
            waiting[f] -= 1
            if waiting[f] == 0:
                heapq.heappush(ready, f)
    return result if len(result) == len(ranked) else None
