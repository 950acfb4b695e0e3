"""The graph IR: SSA values, operations with nested regions, and graphs.

One node shape: ``Operation(opcode, inputs, outputs, attrs, regions)``. Every
op names a declared `Primitive` (resolved once, when the op is made), never a
subclass. Regions are closed: a region graph reads only its own inputs and the
outputs of its own ops, so captured outer values arrive as explicit region inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mplang.edsl.errors import MPVerifyError
from mplang.edsl.registry import PRIMITIVES
from mplang.edsl.traits import OpTraits
from mplang.edsl.typing import ValueType

if TYPE_CHECKING:
    from mplang.edsl.primitive import Primitive


@dataclass(eq=False)
class Value:
    """An SSA value: defined once (graph input or op output), compared by identity."""

    name: str
    type: ValueType

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(frozen=True, eq=False)
class Operation:
    """One op: ``outputs = opcode(inputs) {attrs} [regions]``.

    Immutable; use `replace` to derive a changed copy.
    """

    opcode: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    regions: tuple[Graph, ...] = ()
    loc: str | None = None
    """``file.py:LINE`` of the user code that traced the op (None if unknown)."""
    prim: Primitive | None = field(init=False, repr=False, compare=False)
    """The op's primitive (None: no dialect declares ``opcode``; the verifier refuses it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prim", PRIMITIVES.get(self.opcode))

    @property
    def traits(self) -> OpTraits:
        """The traits of the op's primitive (the safe defaults for an unknown op)."""
        return _UNKNOWN if self.prim is None else self.prim.traits

    def replace(self, **changes: Any) -> Operation:
        return dataclasses.replace(self, **changes)


@dataclass(eq=False)
class Graph:
    """A list of operations over SSA values, with explicit inputs and outputs."""

    inputs: list[Value]
    operations: list[Operation]
    outputs: list[Value]

    def walk(self) -> Iterator[Operation]:
        """Every op of this graph and its regions, outer ops before their regions' ops."""
        for op in self.operations:
            yield op
            for region in op.regions:
                yield from region.walk()

    def verify(self) -> None:
        """Check SSA well-formedness; raise `MPVerifyError` naming the offending op."""
        _verify(self, "graph")


_UNKNOWN = OpTraits()


def has_effects(op: Operation) -> bool:
    """Whether ``op`` or any op of its regions has side effects (unknown ops do)."""
    if not op.traits.pure:
        return True
    return any(has_effects(inner) for region in op.regions for inner in region.operations)


def communicates(op: Operation) -> bool:
    """Whether running ``op`` may exchange messages between parties (unknown ops may).

    An op whose regions run in place (``regions="call"``) and that does not
    communicate itself is local exactly when every op of its regions is.
    """
    if op.traits.communicates:
        return True
    return any(communicates(inner) for region in op.regions for inner in region.operations)


def effect_order(ops: Sequence[Operation]) -> list[int | None]:
    """For each op with effects, the index of the previous op with effects (else None).

    Ops with effects keep their program order: each waits for that op.
    """
    previous: list[int | None] = []
    last: int | None = None
    for index, op in enumerate(ops):
        if has_effects(op):
            previous.append(last)
            last = index
        else:
            previous.append(None)
    return previous


def op_dependencies(ops: Sequence[Operation]) -> list[set[int]]:
    """For each op, the indices of the ops it must follow: the definers of its inputs
    and, for an op with effects, the previous op with effects.

    Definers count wherever they stand in ``ops``, so an op list out of order
    (or with a cycle) shows its true dependencies.
    """
    producer = {v: index for index, op in enumerate(ops) for v in op.outputs}
    deps: list[set[int]] = []
    for op, effect in zip(ops, effect_order(ops), strict=True):
        mine = {producer[v] for v in op.inputs if v in producer}
        if effect is not None:
            mine.add(effect)
        deps.append(mine)
    return deps


def _verify(graph: Graph, where: str) -> None:
    defined: set[int] = set()
    for v in graph.inputs:
        if id(v) in defined:
            raise MPVerifyError(f"{where}: input %{v.name} is listed twice")
        defined.add(id(v))
    for index, op in enumerate(graph.operations):
        label = f"{where}: op #{index} {op.opcode}"
        if op.prim is None:
            raise MPVerifyError(f"{label}: unknown op")
        for v in op.inputs:
            if id(v) not in defined:
                raise MPVerifyError(f"{label}: input %{v.name} is used before it is defined")
        for region_index, region in enumerate(op.regions):
            _verify(region, f"{label} region {region_index}")
        for v in op.outputs:
            if id(v) in defined:
                raise MPVerifyError(f"{label}: output %{v.name} is defined twice")
            defined.add(id(v))
    for v in graph.outputs:
        if id(v) not in defined:
            raise MPVerifyError(f"{where}: output %{v.name} is not defined in the graph")
