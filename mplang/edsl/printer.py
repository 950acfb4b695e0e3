"""Readable text form of a graph: one op per line, regions indented."""

from __future__ import annotations

from typing import Any

import numpy as np

from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.typing import BaseType, Mask, MPType

_INLINE_ARRAY_LIMIT = 8


def format_attr(value: Any) -> str:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, np.ndarray):
        if value.size <= _INLINE_ARRAY_LIMIT:
            body = np.array2string(value, separator=",").replace("\n", "")
            if value.ndim == 0:
                return f"{value.item()!r}:{value.dtype.name}"
            return f"{body}:{value.dtype.name}"
        return f"array<{value.dtype.name}{list(value.shape)}>"
    if isinstance(value, (Mask, BaseType, MPType)):
        return str(value)
    if isinstance(value, dict):
        items = ", ".join(f"{format_attr(k)}: {format_attr(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, tuple):
        items = ", ".join(format_attr(v) for v in value)
        return "(" + items + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(format_attr(v) for v in value) + "]"
    return repr(value)


def _values(values: list[Value] | tuple[Value, ...]) -> str:
    return ", ".join(f"%{v.name}" for v in values)


def _typed(values: list[Value] | tuple[Value, ...]) -> str:
    return ", ".join(f"%{v.name}: {v.type}" for v in values)


def _print_op(op: Operation, indent: str, lines: list[str]) -> None:
    lhs = f"{_values(op.outputs)} = " if op.outputs else ""
    attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in sorted(op.attrs.items()) if k != "module")
    attrs = f" {{{attrs}}}" if attrs else ""
    types = ", ".join(str(v.type) for v in op.outputs)
    lines.append(f"{indent}{lhs}{op.opcode}({_values(op.inputs)}){attrs} : ({types})")
    for i, region in enumerate(op.regions):
        lines.append(f"{indent}  region {i} ({_typed(region.inputs)}) {{")
        _print_body(region, indent + "    ", lines)
        lines.append(f"{indent}  }}")


def _print_body(graph: Graph, indent: str, lines: list[str]) -> None:
    for op in graph.operations:
        _print_op(op, indent, lines)
    lines.append(f"{indent}return {_values(graph.outputs)}")


def format_graph(graph: Graph, name: str = "main") -> str:
    """The whole graph as text, headed by ``func @name(inputs) -> (output types)``."""
    out_types = ", ".join(str(v.type) for v in graph.outputs)
    lines = [f"func @{name}({_typed(graph.inputs)}) -> ({out_types}) {{"]
    _print_body(graph, "  ", lines)
    lines.append("}")
    return "\n".join(lines)
