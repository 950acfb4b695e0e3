"""Hand-built graphs for the analysis tests (type rules are not run on them)."""

from __future__ import annotations

from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.typing import Mask, MPType, ValueType, scalar

I32 = scalar("int32")
I32_01 = MPType(I32, Mask.of([0, 1]))


def val(name: str, t: ValueType = I32_01) -> Value:
    return Value(name, t)


def const(out: Value) -> Operation:
    return Operation("simp.constant", (), (out,), {"parties": Mask.of([0, 1])})


def converge(inputs: list[Value], out: Value) -> Operation:
    """A local op with any number of inputs (type rules are not checked on hand-built graphs)."""
    return Operation("simp.converge", tuple(inputs), (out,))


def pcall(inputs: list[Value], outputs: list[Value], region: Graph) -> Operation:
    return Operation("simp.pcall", tuple(inputs), tuple(outputs),
                     {"parties": None, "fn": "f"}, (region,))
