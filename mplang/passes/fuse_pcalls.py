"""Fusion of consecutive ``simp.pcall``s on the same parties.

Two pcalls adjacent in the op list whose ``parties`` are the same known mask
become one pcall: its region runs the first body, then the second. The second
body's inputs that were the first op's outputs read the first body's results;
inputs the first op already takes share its region input; the others become
new region inputs. The fused op's outputs are the first op's outputs followed
by the second's, the very same values, so no later op changes. Chains fuse
into one op (``fn`` becomes e.g. ``"f+g+h"``).

Fusion never makes an op wait for more communication than before: when the
two pcalls start in different communication rounds (`rounds`), they fuse only
if the one from the earlier round has no user besides the other one, since its
users would otherwise wait for the later round too.

Limits: pcalls with ``parties=None`` (decided at run time) are not fused, nor
pcalls that are only adjacent after reordering; independent pcalls that are
fused run one after the other on each party instead of side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.typing import Mask
from mplang.passes.common import (
    map_regions,
    rebuild,
    rounds,
    shallow_copy,
    substitute_inputs,
    users,
)

_PCALL_ATTRS = frozenset(["parties", "fn"])


@dataclass
class _Group:
    """A run of adjacent pcalls fused so far."""

    op: Operation
    members: set[int]
    round: int


def _parties(op: Operation) -> Mask | None:
    """The known parties of a well-formed pcall, else None."""
    if not op.traits.fusable or len(op.regions) != 1 \
            or not set(op.attrs) <= _PCALL_ATTRS:
        return None
    body = op.regions[0]
    if len(body.inputs) != len(op.inputs) or len(body.outputs) != len(op.outputs):
        return None
    parties = op.attrs.get("parties")
    return parties if isinstance(parties, Mask) else None


def fuse_pcalls(graph: Graph) -> Graph:
    """``graph`` with runs of adjacent same-party pcalls fused, at every level; the
    input graph is not changed."""
    return shallow_copy(_fuse_all(graph))


def _fuse_all(graph: Graph) -> Graph:
    ops = [map_regions(op, _fuse_all) for op in graph.operations]
    starts = rounds(ops)
    readers = users(ops)

    def used_outside(values: tuple[Value, ...], members: set[int]) -> bool:
        return any(u not in members for v in values for u in readers.get(v, ()))

    groups: list[_Group] = []
    for index, op in enumerate(ops):
        last = groups[-1] if groups else None
        parties = _parties(op)
        if last is not None and parties is not None and last.op.opcode == op.opcode \
                and _parties(last.op) == parties:
            members = last.members | {index}
            delays = False
            if last.round != starts[index]:
                early = last.op if last.round < starts[index] else op
                delays = used_outside(early.outputs, members)
            if not delays:
                last.op = _fuse(last.op, op)
                last.members = members
                last.round = max(last.round, starts[index])
                continue
        groups.append(_Group(op, {index}, starts[index]))
    return rebuild(graph, [g.op for g in groups])


def _fuse(first: Operation, second: Operation) -> Operation:
    """One pcall running ``first``'s body and then ``second``'s."""
    body_a = first.regions[0]
    body_b = _disjoint(second.regions[0], body_a)
    from_first = {v: k for k, v in enumerate(first.outputs)}
    outer = list(first.inputs)
    region_inputs = list(body_a.inputs)
    position: dict[Value, int] = {}
    for k, v in enumerate(outer):
        position.setdefault(v, k)
    wiring: dict[Value, Value] = {}
    for inner, arg in zip(body_b.inputs, second.inputs, strict=True):
        if arg in from_first:
            wiring[inner] = body_a.outputs[from_first[arg]]
        elif arg in position:
            wiring[inner] = region_inputs[position[arg]]
        else:
            position[arg] = len(outer)
            outer.append(arg)
            region_inputs.append(inner)
    body = Graph(region_inputs,
                 [*body_a.operations, *(substitute_inputs(o, wiring) for o in body_b.operations)],
                 [*body_a.outputs, *(wiring.get(v, v) for v in body_b.outputs)])
    name = f"{first.attrs.get('fn', 'fn')}+{second.attrs.get('fn', 'fn')}"
    return Operation(first.opcode, tuple(outer), first.outputs + second.outputs,
                     {"parties": first.attrs["parties"], "fn": name}, (body,))


def _defined(graph: Graph) -> list[Value]:
    return [*graph.inputs, *(v for op in graph.operations for v in op.outputs)]


def _disjoint(body: Graph, other: Graph) -> Graph:
    """``body``, with fresh values wherever its top-level values clash with ``other``'s
    (the same value object, or the same name, which serialization needs unique)."""
    taken = _defined(other)
    ids = set(taken)
    names = {v.name for v in taken}
    mine = _defined(body)
    if not any(v in ids or v.name in names for v in mine):
        return body
    names.update(v.name for v in mine)
    fresh: dict[Value, Value] = {}
    for v in mine:
        name, k = v.name, 1
        while name in names:
            name, k = f"{v.name}.{k}", k + 1
        names.add(name)
        fresh[v] = Value(name, v.type)
    ops = [substitute_inputs(op, fresh).replace(outputs=tuple(fresh[v] for v in op.outputs))
           for op in body.operations]
    return Graph([fresh[v] for v in body.inputs], ops, [fresh[v] for v in body.outputs])
