"""The text IR: a whole program as text that `mplang.edsl.text_parser` reads back exactly.

Unlike ``str(program)`` (a summary for readers), the text holds everything the
serialized form does: the program's name, world size, output tree and devices,
and every op's results, operands, attributes (defaults included), regions,
output types and source location::

    program @main {world_size = 2, out_devices = [none], out_tree = {...}}
    func(%x: f32[3]@{0}) -> (f32[3]@{0}) {
      %0 = simp.pcall(%x) {fn = "double", parties = @{0}} : (f32[3]@{0}) loc("f.py:12")
        region 0 (%1: f32[3]) {
          ...
          return %2
        }
      return %0
    }

Attribute values: ``none``, ``true``, ``false``, ints, floats (always with ``.``
or ``e``; ``nan``, ``inf``, ``-inf``), JSON strings, bytes ``b64"..."``, arrays
``array<i32[2]: [1, 2]>`` (``array<c64[2]: b64"...">`` for large or complex ones:
little-endian bytes), masks ``@{0,2}``, types, tuples ``(a,)``, lists, dicts
``{k: v}`` and commitments ``commitment<b64"DIGEST", i32[3]>``. Types: tensors
``i32[2,3]``, other base types as their serialization tag and JSON body
(``!share<["spu", ...]>``), held types ``T@{0,1}`` or ``T@?``.

A dialect may give an attribute a readable form with `register_attr_codec`
(``tensor.run_jax``'s module prints its StableHLO as MLIR text). Such a payload is
written ``#name<``, then one ``|``-prefixed line per line of the payload, then ``>``.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mplang.edsl.errors import MPSerializationError
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.primitive import Primitive
from mplang.edsl.printer import Style, print_body, typed_values
from mplang.edsl.private import Commitment
from mplang.edsl.serde import MAX_DEPTH, encode_type
from mplang.edsl.typing import DTYPES, BaseType, Mask, MPType, TensorType, ValueType, numpy_dtype

LITERAL_LIMIT = 64
"""Arrays of at most this many real, integer or bool elements print their elements."""
BARE_NAME = re.compile(r"[A-Za-z0-9_.$-]+")
"""Names (of values, the program, attributes) printed without quotes."""
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_.$-]*")
"""Opcodes and type tags printed without quotes."""
DTYPE_SHORT = {name: str(TensorType(name, ())).removesuffix("[]") for name in DTYPES}
"""Each dtype's short name (``int32`` -> ``i32``)."""


# ---------------------------------------------------------------- payload codecs


class PayloadError(ValueError):
    """A payload's text does not parse; ``line`` and ``column`` (1-based, within the
    payload's text) say where, when known."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.line = line
        self.column = column


@dataclass(frozen=True)
class AttrCodec:
    """A readable text form of one attribute's values: ``print(value) -> text`` (any
    number of lines) and ``parse(text) -> value`` (raises `PayloadError` or ValueError).

    A value prints this way only if ``parse`` gives it back exactly; otherwise it
    prints in the generic form (bytes as base64).
    """

    name: str
    print: Callable[[Any], str]
    parse: Callable[[str], Any]


_CODECS: dict[tuple[Primitive, str], AttrCodec] = {}
_CODEC_NAMES: dict[str, AttrCodec] = {}


def register_attr_codec(prim: Primitive, attr: str, codec: AttrCodec) -> None:
    """Print attribute ``attr`` of ``prim``'s ops with ``codec`` (written ``#NAME<...>``)."""
    if not IDENTIFIER.fullmatch(codec.name):
        raise ValueError(f"codec name {codec.name!r} is not an identifier")
    if (prim, attr) in _CODECS or codec.name in _CODEC_NAMES:
        raise ValueError(f"{prim.name}.{attr}: a text codec is already registered "
                         f"(or the name {codec.name!r} is taken)")
    _CODECS[prim, attr] = codec
    _CODEC_NAMES[codec.name] = codec


def codec_named(name: str) -> AttrCodec | None:
    """The codec registered under ``name``."""
    return _CODEC_NAMES.get(name)


# ---------------------------------------------------------------- scalars and names


def to_json(value: Any, separators: tuple[str, str] = (", ", ": ")) -> str:
    """``value`` as JSON text; non-ASCII characters are kept unless one cannot be encoded
    (a lone surrogate), then all are escaped."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=separators)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, allow_nan=False, separators=separators)
    return text


def quote(text: str) -> str:
    """``text`` as a JSON string literal."""
    return to_json(text)


def format_name(name: str, pattern: re.Pattern[str] = BARE_NAME) -> str:
    """``name`` bare if ``pattern`` matches all of it, else quoted."""
    return name if pattern.fullmatch(name) else quote(name)


def format_float(value: float) -> str:
    """A float that reads back exactly and never looks like an int."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float.__repr__(value)


def format_bytes(data: bytes) -> str:
    return f'b64"{base64.b64encode(data).decode()}"'


# ---------------------------------------------------------------- types


def format_type(t: ValueType) -> str:
    """``i32[2,3]``, ``!TAG<JSON>`` for other base types, ``T@{0,1}`` / ``T@?`` when held."""
    if isinstance(t, MPType):
        return format_type(t.base) + "@" + ("?" if t.pmask is None else str(t.pmask))
    if type(t) is TensorType:
        return str(t)
    encoded = encode_type(t)
    (tag, body), = encoded.items()
    return f"!{format_name(tag, IDENTIFIER)}<{to_json(body)}>"


# ---------------------------------------------------------------- arrays


_NUMPY_FLOATS = (np.float16, np.float32, np.float64)
"""Scalars whose ``str`` is the shortest text that reads back to the same value."""


def _element(x: Any, kind: str) -> str:
    if kind == "b":
        return "true" if x else "false"
    if kind in "iu":
        return str(int(x))
    value = float(x)
    if not math.isfinite(value):
        return format_float(value)
    text = str(x) if type(x) in _NUMPY_FLOATS else format_float(value)
    return text if any(c in text for c in ".e") else text + ".0"


def element_kind(dtype: str) -> str:
    """The numpy kind of dtype ``dtype`` (``bfloat16`` counts as a float): b, i, u, f or c."""
    return "f" if dtype == "bfloat16" else numpy_dtype(dtype).kind


def literal_value(text: str) -> bool | int | float:
    """The Python scalar an array element's text stands for."""
    if text in ("true", "false"):
        return text == "true"
    return float(text) if any(c in text for c in ".eEni") else int(text)


def array_of(values: list[Any], dtype: str, shape: Sequence[int]) -> np.ndarray:
    """The array of ``dtype`` and ``shape`` holding the scalars ``values`` (row-major);
    raises ValueError or OverflowError if they do not fit."""
    return np.array(values, dtype=numpy_dtype(dtype)).reshape(tuple(shape))


def _nested(texts: list[str], shape: Sequence[int]) -> str:
    if not shape:
        return texts[0]
    step = len(texts) // shape[0] if shape[0] else 0
    return "[" + ", ".join(_nested(texts[i * step:(i + 1) * step], shape[1:])
                           for i in range(shape[0])) + "]"


def format_array(array: np.ndarray) -> str:
    """``array<T: elements>`` when the elements read back exactly, else base64 bytes."""
    name = array.dtype.name
    if name not in DTYPES:
        raise MPSerializationError(f"cannot serialize arrays of dtype {array.dtype}")
    shape = tuple(int(d) for d in array.shape)
    head = f"array<{TensorType(name, shape)}: "
    native = array.astype(numpy_dtype(name), copy=False)
    kind = element_kind(name)
    if array.size <= LITERAL_LIMIT and kind in "biuf":
        texts = [_element(x, kind) for x in native.reshape(-1)]
        back = array_of([literal_value(t) for t in texts], name, shape)
        if back.tobytes() == native.tobytes():
            return head + _nested(texts, shape) + ">"
    little = array.astype(numpy_dtype(name).newbyteorder("<"), copy=False)
    return head + format_bytes(little.tobytes()) + ">"


# ---------------------------------------------------------------- attribute values


def format_value(value: Any, depth: int = 0) -> str:
    """An attribute value in the grammar of the module docstring."""
    if depth > MAX_DEPTH:
        raise MPSerializationError("attribute nested too deeply")
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return format_float(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, bytes):
        return format_bytes(value)
    if isinstance(value, np.ndarray):
        return format_array(value)
    if isinstance(value, Mask):
        return "@" + str(value)
    if isinstance(value, (BaseType, MPType)):
        return format_type(value)
    if isinstance(value, Commitment):
        tail = "" if value.type is None else ", " + format_type(value.type)
        return f"commitment<{format_bytes(value.digest)}{tail}>"
    if isinstance(value, tuple):
        items = [format_value(v, depth + 1) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v, depth + 1) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{format_value(k, depth + 1)}: "
                               f"{format_value(v, depth + 1)}"
                               for k, v in value.items()) + "}"
    raise MPSerializationError(f"cannot serialize attribute of type {type(value).__name__}")


def _payload(codec: AttrCodec, value: Any, indent: str) -> str | None:
    """``#NAME<`` payload lines ``>``, or None when ``codec`` does not give ``value`` back."""
    try:
        text = codec.print(value)
        same = codec.parse(text) == value
    except (ValueError, TypeError, MPSerializationError):
        return None
    if not same:
        return None
    lines = "".join(f"\n{indent}  |{line}" for line in text.split("\n"))
    return f"#{codec.name}<{lines}\n{indent}>"


def format_attr(op: Operation, key: str, indent: str) -> str:
    """``key = value`` of attribute ``key`` of ``op`` (a registered codec's form if any)."""
    value = op.attrs[key]
    codec = None if op.prim is None else _CODECS.get((op.prim, key))
    text = None if codec is None else _payload(codec, value, indent)
    return f"{format_name(key)} = {format_value(value) if text is None else text}"


# ---------------------------------------------------------------- graphs and programs


def _ref(v: Value) -> str:
    return "%" + format_name(v.name)


def _attrs(op: Operation, indent: str) -> str:
    attrs = ", ".join(format_attr(op, k, indent) for k in sorted(op.attrs))
    return f" {{{attrs}}}" if attrs else ""


FULL = Style(ref=_ref, type=format_type, attrs=_attrs,
             loc=lambda op: "" if op.loc is None else f" loc({quote(op.loc)})",
             opcode=lambda name: format_name(name, IDENTIFIER), empty_return="return")
"""The text IR: every attribute exactly, payloads through their codecs, locations."""


def format_program(graph: Graph, name: str, world_size: int, out_tree: Any,
                   out_devices: Sequence[str | None]) -> str:
    """The text of a program: its header (``out_tree`` is the `TreeDef` JSON), then its
    graph as ``func(inputs) -> (output types) { ops; return outputs }``."""
    devices = ", ".join("none" if d is None else quote(d) for d in out_devices)
    tree = to_json(out_tree, (",", ":"))
    out_types = ", ".join(format_type(v.type) for v in graph.outputs)
    lines = [f"program @{format_name(name)} {{world_size = {world_size}, "
             f"out_devices = [{devices}], out_tree = {tree}}}",
             f"func({typed_values(graph.inputs, FULL)}) -> ({out_types}) {{"]
    print_body(graph, "  ", lines, FULL)
    lines.append("}")
    return "\n".join(lines) + "\n"
