"""Dead-code elimination: drop ops whose results nobody needs.

An op is dead when it has no side effects (itself or in its regions) and none
of its outputs is used, transitively, by a live op or returned by its graph.
Every graph level is cleaned, regions included; a region's outputs are its
roots, so no op loses an input, an output or a region.
"""

from __future__ import annotations

from mplang.edsl.graph import Graph, Operation, Value, has_effects
from mplang.passes.common import map_regions, rebuild, shallow_copy


def eliminate_dead_code(graph: Graph) -> Graph:
    """``graph`` without dead ops, at every level; the input graph is not changed."""
    return shallow_copy(_eliminate(graph))


def _eliminate(graph: Graph) -> Graph:
    live: set[Value] = set(graph.outputs)
    kept: list[Operation] = []
    for op in reversed(graph.operations):
        if not has_effects(op) and not any(v in live for v in op.outputs):
            continue
        live.update(op.inputs)
        kept.append(map_regions(op, _eliminate))
    kept.reverse()
    return rebuild(graph, kept)
