"""Use-def chains of one graph: where each value is defined and which ops read it.

Values are keyed by identity (`Value` compares by identity). Region graphs are
closed, so the chains of a graph never mention its regions' values; analyse a
region with its own `UseDef`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from mplang.edsl.errors import MPVerifyError
from mplang.edsl.graph import Graph, Value

GRAPH_INPUT = -1
"""The definer index of a graph input."""


@dataclass(frozen=True)
class UseDef:
    """Definitions and uses of the values of one graph, by op index.

    ``definer[v]`` is the index of the op defining ``v`` or `GRAPH_INPUT`;
    ``users[v]`` lists the ops reading ``v`` in program order (an op reading a
    value twice is listed once); ``output_uses[v]`` is how often the graph returns ``v``.
    """

    graph: Graph
    definer: dict[Value, int]
    users: dict[Value, tuple[int, ...]]
    output_uses: dict[Value, int]

    def def_of(self, value: Value) -> int:
        """The index of the op defining ``value``, or `GRAPH_INPUT`."""
        try:
            return self.definer[value]
        except KeyError:
            raise KeyError(f"%{value.name} is not a value of this graph") from None

    def users_of(self, value: Value) -> tuple[int, ...]:
        """The indices of the ops reading ``value``."""
        if value not in self.definer:
            raise KeyError(f"%{value.name} is not a value of this graph")
        return self.users.get(value, ())

    def operands_of(self, index: int) -> tuple[int, ...]:
        """The distinct definers of op ``index``'s inputs (op indices, without graph inputs)."""
        found = {self.definer[v] for v in self.graph.operations[index].inputs}
        found.discard(GRAPH_INPUT)
        return tuple(sorted(found))

    def values(self) -> Iterator[Value]:
        """Every value of the graph: the inputs, then each op's outputs in program order."""
        return iter(self.definer)

    def dead_values(self) -> list[Value]:
        """Values that no op reads and the graph does not return."""
        return [v for v in self.definer if not self.users.get(v) and v not in self.output_uses]


def build_use_def(graph: Graph) -> UseDef:
    """The use-def chains of ``graph`` (its own ops, not its regions').

    Raises `MPVerifyError`, naming the op, if a value is read but never
    defined or is defined twice. A value used before its definition (a cycle)
    is accepted here; `levels.op_dependencies` reports the cycle.
    """
    definer: dict[Value, int] = {}
    for v in graph.inputs:
        if v in definer:
            raise MPVerifyError(f"graph input %{v.name} is listed twice")
        definer[v] = GRAPH_INPUT
    for index, op in enumerate(graph.operations):
        for v in op.outputs:
            if v in definer:
                raise MPVerifyError(f"op #{index} {op.opcode}: output %{v.name} is defined twice")
            definer[v] = index
    users: dict[Value, list[int]] = {}
    for index, op in enumerate(graph.operations):
        for v in op.inputs:
            if v not in definer:
                raise MPVerifyError(
                    f"op #{index} {op.opcode}: input %{v.name} is not defined in the graph")
            readers = users.setdefault(v, [])
            if not readers or readers[-1] != index:
                readers.append(index)
    output_uses: dict[Value, int] = {}
    for v in graph.outputs:
        if v not in definer:
            raise MPVerifyError(f"graph output %{v.name} is not defined in the graph")
        output_uses[v] = output_uses.get(v, 0) + 1
    return UseDef(graph, definer, {v: tuple(u) for v, u in users.items()}, output_uses)
