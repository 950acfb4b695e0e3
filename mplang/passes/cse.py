"""Common-subexpression elimination of pure ops.

Two ops compute the same values when they have the same opcode, read the same
input values (identity), have deeply equal attributes (`attrs_equal`),
structurally equivalent regions (`graphs_equivalent`), the same output types and
no side effects. The later one is dropped and its outputs are replaced by the
earlier one's, in later ops and in the graph's outputs. Regions are closed, so
each graph level is deduplicated on its own (regions included).
"""

from __future__ import annotations

from mplang.edsl.graph import Graph, Operation, Value, has_effects
from mplang.passes.common import (
    attrs_equal,
    graphs_equivalent,
    map_regions,
    rebuild,
    shallow_copy,
    substitute_inputs,
)

_Key = tuple[str, tuple[Value, ...], int, int]
"""Opcode, inputs (values hash and compare by identity), numbers of outputs and regions."""


def _same(a: Operation, b: Operation) -> bool:
    return (all(x.type == y.type for x, y in zip(a.outputs, b.outputs, strict=True))
            and attrs_equal(a.attrs, b.attrs)
            and all(graphs_equivalent(r, s) for r, s in zip(a.regions, b.regions, strict=True)))


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """``graph`` with each repeated pure computation done once; the input is not changed."""
    return shallow_copy(_eliminate(graph))


def _eliminate(graph: Graph) -> Graph:
    replaced: dict[Value, Value] = {}
    seen: dict[_Key, list[Operation]] = {}
    kept: list[Operation] = []
    for op in graph.operations:
        op = map_regions(substitute_inputs(op, replaced), _eliminate)
        if op.outputs and not has_effects(op):
            key = (op.opcode, op.inputs, len(op.outputs), len(op.regions))
            candidates = seen.setdefault(key, [])
            earlier = next((c for c in candidates if _same(c, op)), None)
            if earlier is not None:
                replaced.update(zip(op.outputs, earlier.outputs, strict=True))
                continue
            candidates.append(op)
        kept.append(op)
    return rebuild(graph, kept, [replaced.get(v, v) for v in graph.outputs])
