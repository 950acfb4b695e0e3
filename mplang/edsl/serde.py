"""Safe, deterministic serialization of graphs: JSON plus raw binary buffers.

Layout: 8-byte magic, little-endian u64 JSON length, the JSON text, then the
buffers back to back. Arrays and byte strings live in buffers; the JSON names
them by index. Decoding checks every field against the schema below and
refuses unknown ops, tags and dtypes: nothing is unpickled or evaluated.

Types (T): ``{"tensor": [dtype, shape]}``, ``{"table": [[name, dtype], ...]}``,
``{"share" | "cipher": [scheme, T]}``, ``{"key": kind}``, ``{"mp": [T, bits|null]}``.
Attributes: JSON scalars and lists, or one-key tagged objects ``$tuple``,
``$dict``, ``$bytes``, ``$array``, ``$mask``, ``$type``, ``$float``.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.typing import (
    BaseType,
    CiphertextType,
    KeyType,
    Mask,
    MPType,
    SecretShareType,
    TableType,
    TensorType,
    ValueType,
    numpy_dtype,
)
from mplang.frontend.errors import MPSerializationError
from mplang.frontend.registry import is_registered

MAGIC = b"MPLANG\x00\x01"
_HEADER = struct.Struct("<8sQ")
MAX_DEPTH = 64
_ALLOWED_DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
     "float16", "bfloat16", "float32", "float64", "complex64", "complex128"]
)


# ---------------------------------------------------------------- types


def encode_type(t: ValueType) -> Any:
    if isinstance(t, MPType):
        return {"mp": [encode_type(t.base), None if t.pmask is None else t.pmask.bits]}
    if isinstance(t, TensorType):
        return {"tensor": [t.dtype, list(t.shape)]}
    if isinstance(t, TableType):
        return {"table": [[n, d] for n, d in t.columns]}
    if isinstance(t, SecretShareType):
        return {"share": [t.scheme, encode_type(t.plaintext)]}
    if isinstance(t, CiphertextType):
        return {"cipher": [t.scheme, encode_type(t.plaintext)]}
    if isinstance(t, KeyType):
        return {"key": t.kind}
    raise MPSerializationError(f"cannot serialize type {t!r}")


def _fail(what: str) -> MPSerializationError:
    return MPSerializationError(f"malformed program: {what}")


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise _fail(what)


def _tensor(data: Any) -> TensorType:
    t = decode_type(data)
    _expect(isinstance(t, TensorType), "expected a tensor type")
    assert isinstance(t, TensorType)
    return t


def decode_type(data: Any) -> ValueType:
    _expect(isinstance(data, dict) and len(data) == 1, "type must be a one-key object")
    (tag, body), = data.items()
    try:
        if tag == "mp":
            base, bits = body
            inner = decode_type(base)
            _expect(isinstance(inner, BaseType), "mp type over a non-base type")
            assert isinstance(inner, BaseType)
            _expect(bits is None or (isinstance(bits, int) and bits >= 0), "bad pmask")
            return MPType(inner, None if bits is None else Mask(bits))
        if tag == "tensor":
            dtype, shape = body
            _expect(dtype in _ALLOWED_DTYPES, f"dtype {dtype!r}")
            _expect(isinstance(shape, list) and all(type(d) is int for d in shape), "shape")
            return TensorType(dtype, tuple(shape))
        if tag == "table":
            _expect(all(isinstance(n, str) and isinstance(d, str) for n, d in body), "columns")
            return TableType(tuple((n, d) for n, d in body))
        if tag in ("share", "cipher"):
            scheme, plain = body
            _expect(isinstance(scheme, str), "scheme")
            cls = SecretShareType if tag == "share" else CiphertextType
            return cls(scheme, _tensor(plain))
        if tag == "key":
            _expect(isinstance(body, str), "key kind")
            return KeyType(body)
    except (TypeError, ValueError) as e:
        if isinstance(e, MPSerializationError):
            raise
        raise _fail(f"type {tag!r}: {e}") from None
    raise _fail(f"unknown type tag {tag!r}")


# ---------------------------------------------------------------- buffers


class _BufferWriter:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.spans: list[list[int]] = []
        self._offset = 0
        self._index: dict[bytes, int] = {}

    def add(self, data: bytes) -> int:
        known = self._index.get(data)
        if known is not None:
            return known
        index = len(self.spans)
        self._index[data] = index
        self.chunks.append(data)
        self.spans.append([self._offset, len(data)])
        self._offset += len(data)
        return index


class _BufferReader:
    def __init__(self, blob: memoryview, spans: Any):
        _expect(isinstance(spans, list), "buffers")
        self.blob = blob
        self.spans: list[tuple[int, int]] = []
        for span in spans:
            _expect(isinstance(span, list) and len(span) == 2
                    and all(type(x) is int and x >= 0 for x in span), "buffer span")
            start, length = span
            _expect(start + length <= len(blob), "buffer span past the end")
            self.spans.append((start, length))

    def get(self, index: Any) -> memoryview:
        _expect(type(index) is int and 0 <= index < len(self.spans), "buffer index")
        start, length = self.spans[index]
        return self.blob[start:start + length]


# ---------------------------------------------------------------- attributes


def _encode_attr(value: Any, buffers: _BufferWriter, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise MPSerializationError("attribute nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, bytes):
        return {"$bytes": buffers.add(value)}
    if isinstance(value, np.ndarray):
        if value.dtype.name not in _ALLOWED_DTYPES:
            raise MPSerializationError(f"cannot serialize arrays of dtype {value.dtype}")
        data = value.astype(value.dtype.newbyteorder("<"), copy=False)
        return {"$array": [value.dtype.name, list(value.shape), buffers.add(data.tobytes())]}
    if isinstance(value, Mask):
        return {"$mask": value.bits}
    if isinstance(value, (BaseType, MPType)):
        return {"$type": encode_type(value)}
    if isinstance(value, tuple):
        return {"$tuple": [_encode_attr(v, buffers, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_encode_attr(v, buffers, depth + 1) for v in value]
    if isinstance(value, dict):
        return {"$dict": [[_encode_attr(k, buffers, depth + 1), _encode_attr(v, buffers, depth + 1)]
                          for k, v in value.items()]}
    raise MPSerializationError(f"cannot serialize attribute of type {type(value).__name__}")


def _decode_attr(data: Any, buffers: _BufferReader, depth: int = 0) -> Any:
    _expect(depth <= MAX_DEPTH, "attribute nested too deeply")
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if isinstance(data, list):
        return [_decode_attr(v, buffers, depth + 1) for v in data]
    _expect(isinstance(data, dict) and len(data) == 1, "attribute object must have one tag")
    (tag, body), = data.items()
    if tag == "$tuple":
        _expect(isinstance(body, list), "$tuple body")
        return tuple(_decode_attr(v, buffers, depth + 1) for v in body)
    if tag == "$dict":
        _expect(isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body),
                "$dict body")
        return {_decode_attr(k, buffers, depth + 1): _decode_attr(v, buffers, depth + 1)
                for k, v in body}
    if tag == "$bytes":
        return bytes(buffers.get(body))
    if tag == "$array":
        _expect(isinstance(body, list) and len(body) == 3, "$array body")
        dtype, shape, index = body
        _expect(dtype in _ALLOWED_DTYPES, f"array dtype {dtype!r}")
        _expect(isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape),
                "array shape")
        raw = buffers.get(index)
        dt = numpy_dtype(dtype).newbyteorder("<")
        _expect(len(raw) == dt.itemsize * math.prod(shape), "array size does not match shape")
        return np.frombuffer(raw, dtype=dt).astype(numpy_dtype(dtype)).reshape(shape)
    if tag == "$mask":
        _expect(type(body) is int and body >= 0, "$mask body")
        return Mask(body)
    if tag == "$type":
        return decode_type(body)
    if tag == "$float":
        _expect(body in ("nan", "inf", "-inf"), "$float body")
        return float(body)
    raise _fail(f"unknown attribute tag {tag!r}")


# ---------------------------------------------------------------- graphs


def _encode_graph(graph: Graph, buffers: _BufferWriter) -> Any:
    return {
        "inputs": [[v.name, encode_type(v.type)] for v in graph.inputs],
        "ops": [
            {
                "op": op.opcode,
                "in": [v.name for v in op.inputs],
                "out": [[v.name, encode_type(v.type)] for v in op.outputs],
                "attrs": {k: _encode_attr(v, buffers) for k, v in sorted(op.attrs.items())},
                "regions": [_encode_graph(r, buffers) for r in op.regions],
            }
            for op in graph.operations
        ],
        "outputs": [v.name for v in graph.outputs],
    }


def _decode_values(data: Any, env: dict[str, Value]) -> list[Value]:
    _expect(isinstance(data, list), "value list")
    values = []
    for item in data:
        _expect(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str),
                "value entry")
        name, vtype = item
        _expect(name not in env, f"value %{name} defined twice")
        value = Value(name, decode_type(vtype))
        env[name] = value
        values.append(value)
    return values


def _lookup(env: dict[str, Value], names: Any, where: str) -> list[Value]:
    _expect(isinstance(names, list), f"{where}: value name list")
    out = []
    for name in names:
        _expect(isinstance(name, str) and name in env, f"{where}: %{name} is not defined")
        out.append(env[name])
    return out


def _decode_graph(data: Any, buffers: _BufferReader, depth: int) -> Graph:
    _expect(depth <= MAX_DEPTH, "regions nested too deeply")
    _expect(isinstance(data, dict) and set(data) == {"inputs", "ops", "outputs"}, "graph fields")
    env: dict[str, Value] = {}
    inputs = _decode_values(data["inputs"], env)
    _expect(isinstance(data["ops"], list), "ops")
    ops = []
    for index, item in enumerate(data["ops"]):
        _expect(isinstance(item, dict) and set(item) == {"op", "in", "out", "attrs", "regions"},
                f"op #{index} fields")
        opcode = item["op"]
        _expect(isinstance(opcode, str) and is_registered(opcode), f"unknown op {opcode!r}")
        where = f"op #{index} {opcode}"
        op_inputs = _lookup(env, item["in"], where)
        _expect(isinstance(item["attrs"], dict), f"{where}: attrs")
        attrs = {k: _decode_attr(v, buffers) for k, v in item["attrs"].items()}
        _expect(isinstance(item["regions"], list), f"{where}: regions")
        regions = tuple(_decode_graph(r, buffers, depth + 1) for r in item["regions"])
        outputs = _decode_values(item["out"], env)
        ops.append(Operation(opcode, tuple(op_inputs), tuple(outputs), attrs, regions))
    outputs = _lookup(env, data["outputs"], "graph outputs")
    return Graph(inputs, ops, outputs)


def encode_graph_bundle(graph: Graph, meta: dict[str, Any]) -> bytes:
    """Serialize ``graph`` with JSON-able ``meta``; the same input gives the same bytes."""
    buffers = _BufferWriter()
    doc = {"version": 1, "meta": meta, "graph": _encode_graph(graph, buffers),
           "buffers": buffers.spans}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return b"".join([_HEADER.pack(MAGIC, len(text)), text, *buffers.chunks])


def decode_graph_bundle(data: bytes | memoryview, max_bytes: int = 1 << 32) -> tuple[Graph, Any]:
    """Parse bytes made by `encode_graph_bundle`; raise `MPSerializationError` if malformed."""
    view = memoryview(data)
    if len(view) > max_bytes:
        raise MPSerializationError(f"program of {len(view)} bytes exceeds the {max_bytes} limit")
    _expect(len(view) >= _HEADER.size, "too short")
    magic, json_len = _HEADER.unpack_from(view)
    _expect(magic == MAGIC, "bad magic (not an MPLang program)")
    _expect(_HEADER.size + json_len <= len(view), "truncated")
    try:
        doc = json.loads(bytes(view[_HEADER.size:_HEADER.size + json_len]))
    except (ValueError, RecursionError) as e:
        raise _fail(f"invalid JSON: {e}") from None
    _expect(isinstance(doc, dict) and set(doc) == {"version", "meta", "graph", "buffers"},
            "top-level fields")
    _expect(doc["version"] == 1, f"unsupported version {doc['version']!r}")
    buffers = _BufferReader(view[_HEADER.size + json_len:], doc["buffers"])
    try:
        return _decode_graph(doc["graph"], buffers, 0), doc["meta"]
    except MPSerializationError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError) as e:
        raise _fail(f"{type(e).__name__}: {e}") from None
