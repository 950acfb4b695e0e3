"""Text forms of a graph, one op per line with regions indented: the readable form
(`format_graph`, ``str(program)``) here, and the walk that the full text IR
(`mplang.edsl.text_printer`) shares with it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.typing import BaseType, Mask, MPType, ValueType

_INLINE_ARRAY_LIMIT = 8


def format_attr(value: Any) -> str:
    """An attribute in the readable form (payloads and large arrays elided)."""
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


@dataclass(frozen=True)
class Style:
    """How one text form writes the parts of a graph; `print_body` walks the graph.

    ``attrs(op, indent)`` gives the attribute block (`` {k=v, ...}`` or ""), ``loc(op)``
    the location suffix, ``empty_return`` the line that returns nothing."""

    ref: Callable[[Value], str]
    type: Callable[[ValueType], str]
    attrs: Callable[[Operation, str], str]
    loc: Callable[[Operation], str]
    opcode: Callable[[str], str]
    empty_return: str


def print_op(op: Operation, indent: str, lines: list[str], style: Style) -> None:
    """Append ``op`` (and its regions, indented) to ``lines``."""
    refs = ", ".join(style.ref(v) for v in op.outputs)
    lhs = f"{refs} = " if op.outputs else ""
    args = ", ".join(style.ref(v) for v in op.inputs)
    types = ", ".join(style.type(v.type) for v in op.outputs)
    lines.append(f"{indent}{lhs}{style.opcode(op.opcode)}({args}){style.attrs(op, indent)} : "
                 f"({types}){style.loc(op)}")
    for i, region in enumerate(op.regions):
        lines.append(f"{indent}  region {i} ({typed_values(region.inputs, style)}) {{")
        print_body(region, indent + "    ", lines, style)
        lines.append(f"{indent}  }}")


def print_body(graph: Graph, indent: str, lines: list[str], style: Style) -> None:
    """Append ``graph``'s ops and its ``return`` line to ``lines``."""
    for op in graph.operations:
        print_op(op, indent, lines, style)
    outs = ", ".join(style.ref(v) for v in graph.outputs)
    lines.append(f"{indent}return {outs}" if outs else f"{indent}{style.empty_return}")


def typed_values(values: Sequence[Value], style: Style) -> str:
    """``%name: type, ...`` of ``values``."""
    return ", ".join(f"{style.ref(v)}: {style.type(v.type)}" for v in values)


def _brief_attrs(op: Operation, indent: str) -> str:
    attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in sorted(op.attrs.items())
                      if k != "module")
    return f" {{{attrs}}}" if attrs else ""


BRIEF = Style(ref=lambda v: f"%{v.name}", type=str, attrs=_brief_attrs, loc=lambda op: "",
              opcode=lambda name: name, empty_return="return ")
"""The readable form: payloads elided, no locations (``str(program)``)."""


def format_graph(graph: Graph, name: str = "main") -> str:
    """The whole graph as text, headed by ``func @name(inputs) -> (output types)``."""
    out_types = ", ".join(str(v.type) for v in graph.outputs)
    lines = [f"func @{name}({typed_values(graph.inputs, BRIEF)}) -> ({out_types}) {{"]
    print_body(graph, "  ", lines, BRIEF)
    lines.append("}")
    return "\n".join(lines)
