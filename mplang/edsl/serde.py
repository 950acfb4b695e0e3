"""Safe, deterministic serialization of graphs: JSON plus raw binary buffers.

Layout: 8-byte magic, little-endian u64 JSON length, the JSON text, then the
buffers back to back. Arrays and byte strings live in buffers; the JSON names
them by index. Decoding checks every field against the schema below and
refuses unknown ops, tags and dtypes: nothing is unpickled or evaluated.

Types (T): ``{"mp": [T, bits|null]}`` or ``{TAG: body}`` for a type registered
under TAG (`mplang.edsl.typing.register_type`; ``{"tensor": [dtype, shape]}``).
Errors name the field path (``graph.ops[3].out[0].type``).
Attributes: JSON scalars and lists, or one-key tagged objects ``$tuple``,
``$dict``, ``$bytes``, ``$array``, ``$mask``, ``$type``, ``$float``, ``$commit``
(a `Commitment`: ``[digest buffer, type or null]``).
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import numpy as np

from mplang.edsl.errors import MPSerializationError
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.primitive import get_primitive
from mplang.edsl.private import DIGEST_BYTES, Commitment
from mplang.edsl.typing import DTYPES, BaseType, Mask, MPType, ValueType, numpy_dtype, type_for_tag

MAGIC = b"MPLANG\x00\x01"
_HEADER = struct.Struct("<8sQ")
MAX_DEPTH = 64


# ---------------------------------------------------------------- types


def encode_type(t: ValueType) -> Any:
    if isinstance(t, MPType):
        return {"mp": [encode_type(t.base), None if t.pmask is None else t.pmask.bits]}
    if isinstance(t, BaseType) and type_for_tag(getattr(t, "type_tag", "")) is type(t):
        return {t.type_tag: t.to_json(encode_type)}
    raise MPSerializationError(f"cannot serialize type {t!r}: its type has no registered tag")


def _fail(what: str) -> MPSerializationError:
    return MPSerializationError(f"malformed program: {what}")


def _expect(cond: bool, what: str) -> None:
    if not cond:
        raise _fail(what)


def decode_type(data: Any, path: str = "type") -> ValueType:
    """A type from its JSON form; errors name ``path``, the field that holds it."""
    _expect(isinstance(data, dict) and len(data) == 1, f"{path}: a type is a one-key object")
    (tag, body), = data.items()
    if tag == "mp":
        _expect(isinstance(body, list) and len(body) == 2, f"{path}.mp: expected [type, pmask]")
        base, bits = body
        inner = decode_type(base, f"{path}.mp[0]")
        _expect(isinstance(inner, BaseType), f"{path}.mp[0]: an mp type over a non-base type")
        assert isinstance(inner, BaseType)
        _expect(bits is None or (type(bits) is int and bits >= 0), f"{path}.mp[1]: bad pmask")
        return MPType(inner, None if bits is None else Mask(bits))
    cls = type_for_tag(tag) if isinstance(tag, str) else None
    _expect(cls is not None, f"{path}: unknown type tag {tag!r} (a type of a plugin that is "
                             "not loaded here?)")
    assert cls is not None
    try:
        return cls.from_json(body, decode_type, f"{path}.{tag}")
    except MPSerializationError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise _fail(f"{path}.{tag}: {type(e).__name__}: {e}") from None


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

    def get(self, index: Any, path: str) -> memoryview:
        _expect(type(index) is int and 0 <= index < len(self.spans), f"{path}: buffer index")
        start, length = self.spans[index]
        return self.blob[start:start + length]


def numpy_can_hold(shape: list[int], itemsize: int) -> bool:
    """Whether numpy can make an array of ``shape`` (non-negative dims): at most 64 dims,
    and the bytes of the non-zero dims fit numpy's signed 64-bit sizes."""
    return len(shape) <= 64 and math.prod(d for d in shape if d) * itemsize < 1 << 63


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
        if value.dtype.name not in DTYPES:
            raise MPSerializationError(f"cannot serialize arrays of dtype {value.dtype}")
        data = value.astype(value.dtype.newbyteorder("<"), copy=False)
        return {"$array": [value.dtype.name, list(value.shape), buffers.add(data.tobytes())]}
    if isinstance(value, Mask):
        return {"$mask": value.bits}
    if isinstance(value, (BaseType, MPType)):
        return {"$type": encode_type(value)}
    if isinstance(value, Commitment):
        return {"$commit": [buffers.add(value.digest),
                            None if value.type is None else encode_type(value.type)]}
    if isinstance(value, tuple):
        return {"$tuple": [_encode_attr(v, buffers, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_encode_attr(v, buffers, depth + 1) for v in value]
    if isinstance(value, dict):
        return {"$dict": [[_encode_attr(k, buffers, depth + 1), _encode_attr(v, buffers, depth + 1)]
                          for k, v in value.items()]}
    raise MPSerializationError(f"cannot serialize attribute of type {type(value).__name__}")


def _decode_attr(data: Any, buffers: _BufferReader, path: str, depth: int = 0) -> Any:
    _expect(depth <= MAX_DEPTH, f"{path}: attribute nested too deeply")
    if data is None or isinstance(data, (bool, str, int, float)):
        return data
    if isinstance(data, list):
        return [_decode_attr(v, buffers, f"{path}[{i}]", depth + 1) for i, v in enumerate(data)]
    _expect(isinstance(data, dict) and len(data) == 1,
            f"{path}: an attribute object must have one tag")
    (tag, body), = data.items()
    here = f"{path}.{tag}"
    if tag == "$tuple":
        _expect(isinstance(body, list), f"{here}: expected a list")
        return tuple(_decode_attr(v, buffers, f"{here}[{i}]", depth + 1)
                     for i, v in enumerate(body))
    if tag == "$dict":
        _expect(isinstance(body, list) and all(isinstance(p, list) and len(p) == 2 for p in body),
                f"{here}: expected [key, value] pairs")
        pairs = [(_decode_attr(k, buffers, f"{here}[{i}][0]", depth + 1),
                  _decode_attr(v, buffers, f"{here}[{i}][1]", depth + 1))
                 for i, (k, v) in enumerate(body)]
        try:
            return dict(pairs)
        except TypeError:
            raise _fail(f"{here}: a key is not hashable") from None
    if tag == "$bytes":
        return bytes(buffers.get(body, here))
    if tag == "$array":
        _expect(isinstance(body, list) and len(body) == 3, f"{here}: expected [dtype, shape, buf]")
        dtype, shape, index = body
        _expect(isinstance(dtype, str) and dtype in DTYPES, f"{here}: array dtype {dtype!r}")
        _expect(isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape),
                f"{here}: array shape")
        raw = buffers.get(index, here)
        dt = numpy_dtype(dtype).newbyteorder("<")
        _expect(numpy_can_hold(shape, dt.itemsize),
                f"{here}: array shape: rank {len(shape)} or size beyond numpy's limits")
        _expect(len(raw) == dt.itemsize * math.prod(shape),
                f"{here}: array size does not match shape")
        return np.frombuffer(raw, dtype=dt).astype(numpy_dtype(dtype)).reshape(shape)
    if tag == "$mask":
        _expect(type(body) is int and body >= 0, f"{here}: a mask is a non-negative int")
        return Mask(body)
    if tag == "$type":
        return decode_type(body, here)
    if tag == "$float":
        _expect(body in ("nan", "inf", "-inf"), f"{here}: expected nan, inf or -inf")
        return float(body)
    if tag == "$commit":
        _expect(isinstance(body, list) and len(body) == 2, f"{here}: expected [digest, type]")
        digest = bytes(buffers.get(body[0], f"{here}[0]"))
        _expect(len(digest) == DIGEST_BYTES, f"{here}[0]: a digest is {DIGEST_BYTES} bytes")
        vtype = None if body[1] is None else decode_type(body[1], f"{here}[1]")
        _expect(vtype is None or isinstance(vtype, BaseType), f"{here}[1]: not a base type")
        assert vtype is None or isinstance(vtype, BaseType)
        return Commitment(digest, vtype)
    raise _fail(f"{path}: unknown attribute tag {tag!r}")


# ---------------------------------------------------------------- graphs


def _encode_op(op: Operation, buffers: _BufferWriter) -> dict[str, Any]:
    item: dict[str, Any] = {
        "op": op.opcode,
        "in": [v.name for v in op.inputs],
        "out": [[v.name, encode_type(v.type)] for v in op.outputs],
        "attrs": {k: _encode_attr(v, buffers) for k, v in sorted(op.attrs.items())},
        "regions": [_encode_graph(r, buffers) for r in op.regions],
    }
    if op.loc is not None:
        item["loc"] = op.loc
    return item


def _encode_graph(graph: Graph, buffers: _BufferWriter) -> Any:
    return {
        "inputs": [[v.name, encode_type(v.type)] for v in graph.inputs],
        "ops": [_encode_op(op, buffers) for op in graph.operations],
        "outputs": [v.name for v in graph.outputs],
    }


def _decode_values(data: Any, env: dict[str, Value], path: str) -> list[Value]:
    _expect(isinstance(data, list), f"{path}: expected a list of [name, type]")
    values = []
    for i, item in enumerate(data):
        _expect(isinstance(item, list) and len(item) == 2 and isinstance(item[0], str),
                f"{path}[{i}]: expected [name, type]")
        name, vtype = item
        _expect(name not in env, f"{path}[{i}]: value %{name} defined twice")
        value = Value(name, decode_type(vtype, f"{path}[{i}].type"))
        env[name] = value
        values.append(value)
    return values


def _lookup(env: dict[str, Value], names: Any, path: str) -> list[Value]:
    _expect(isinstance(names, list), f"{path}: expected a list of value names")
    out = []
    for i, name in enumerate(names):
        _expect(isinstance(name, str) and name in env, f"{path}[{i}]: %{name} is not defined")
        out.append(env[name])
    return out


_OP_FIELDS = frozenset(["op", "in", "out", "attrs", "regions"])


def _decode_graph(data: Any, buffers: _BufferReader, depth: int, path: str) -> Graph:
    _expect(depth <= MAX_DEPTH, f"{path}: regions nested too deeply")
    _expect(isinstance(data, dict) and set(data) == {"inputs", "ops", "outputs"},
            f"{path}: expected the fields inputs, ops, outputs")
    env: dict[str, Value] = {}
    inputs = _decode_values(data["inputs"], env, f"{path}.inputs")
    _expect(isinstance(data["ops"], list), f"{path}.ops: expected a list")
    ops = []
    for index, item in enumerate(data["ops"]):
        here = f"{path}.ops[{index}]"
        _expect(isinstance(item, dict) and _OP_FIELDS <= set(item) <= _OP_FIELDS | {"loc"},
                f"{here}: expected the fields {', '.join(sorted(_OP_FIELDS))} (and loc)")
        opcode = item["op"]
        _expect(isinstance(opcode, str), f"{here}.op: expected an op name")
        _expect(get_primitive(opcode) is not None,
                f"{here}.op: unknown op {opcode!r} (if a plugin defines dialect "
                f"{opcode.partition('.')[0]!r}, load it here: mplang worker --plugin NAME)")
        loc = item.get("loc")
        _expect(loc is None or (isinstance(loc, str) and len(loc) <= 1024), f"{here}.loc")
        op_inputs = _lookup(env, item["in"], f"{here}.in")
        _expect(isinstance(item["attrs"], dict), f"{here}.attrs: expected an object")
        attrs = {k: _decode_attr(v, buffers, f"{here}.attrs.{k}")
                 for k, v in item["attrs"].items()}
        _expect(isinstance(item["regions"], list), f"{here}.regions: expected a list")
        regions = tuple(_decode_graph(r, buffers, depth + 1, f"{here}.regions[{i}]")
                        for i, r in enumerate(item["regions"]))
        outputs = _decode_values(item["out"], env, f"{here}.out")
        ops.append(Operation(opcode, tuple(op_inputs), tuple(outputs), attrs, regions, loc))
    outputs = _lookup(env, data["outputs"], f"{path}.outputs")
    return Graph(inputs, ops, outputs)


def encode_graph_bundle(graph: Graph, meta: dict[str, Any]) -> bytes:
    """Serialize ``graph`` with JSON-able ``meta``; the same input gives the same bytes."""
    buffers = _BufferWriter()
    doc = {"version": 1, "meta": meta, "graph": _encode_graph(graph, buffers),
           "buffers": buffers.spans}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return b"".join([_HEADER.pack(MAGIC, len(text)), text, *buffers.chunks])


def encode_attrs(attrs: dict[str, Any]) -> bytes:
    """Serialize attribute values by name (the layout of a graph bundle; deterministic)."""
    buffers = _BufferWriter()
    doc = {"attrs": {k: _encode_attr(v, buffers) for k, v in attrs.items()},
           "buffers": buffers.spans}
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    return b"".join([_HEADER.pack(MAGIC, len(text)), text, *buffers.chunks])


def decode_attrs(data: bytes | memoryview, path: str = "attrs") -> dict[str, Any]:
    """Parse bytes made by `encode_attrs`; raise `MPSerializationError` naming the field."""
    view = memoryview(data)
    doc, blob = _split_bundle(view, f"{path}: ")
    _expect(isinstance(doc, dict) and set(doc) == {"attrs", "buffers"}
            and isinstance(doc["attrs"], dict), f"{path}: expected the fields attrs, buffers")
    buffers = _BufferReader(blob, doc["buffers"])
    try:
        return {k: _decode_attr(v, buffers, f"{path}.{k}") for k, v in doc["attrs"].items()}
    except MPSerializationError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError) as e:
        raise _fail(f"{path}: {type(e).__name__}: {e}") from None


def _not_json(name: str) -> Any:
    """NaN and Infinity are not JSON (the encoder writes ``$float``): refused, not decoded
    into metadata that could not be encoded again."""
    raise ValueError(f"{name} is not JSON")


_SAVED = "load only files written by Program.save"


def _split_bundle(view: memoryview, where: str) -> tuple[Any, memoryview]:
    """The JSON document and the buffer bytes of a bundle."""
    _expect(len(view) >= _HEADER.size, f"{where}too short ({len(view)} bytes) to be an MPLang "
                                       f"program; {_SAVED}")
    magic, json_len = _HEADER.unpack_from(view)
    _expect(magic == MAGIC, f"{where}bad magic (not an MPLang program; {_SAVED})")
    _expect(_HEADER.size + json_len <= len(view), f"{where}truncated")
    try:
        doc = json.loads(bytes(view[_HEADER.size:_HEADER.size + json_len]),
                         parse_constant=_not_json)
    except (ValueError, RecursionError) as e:
        raise _fail(f"{where}invalid JSON: {e}") from None
    return doc, view[_HEADER.size + json_len:]


def decode_graph_bundle(data: bytes | memoryview, max_bytes: int = 1 << 32) -> tuple[Graph, Any]:
    """Parse bytes made by `encode_graph_bundle`; raise `MPSerializationError` if malformed."""
    view = memoryview(data)
    if len(view) > max_bytes:
        raise MPSerializationError(f"program of {len(view)} bytes exceeds the {max_bytes} limit")
    doc, blob = _split_bundle(view, "")
    _expect(isinstance(doc, dict) and set(doc) == {"version", "meta", "graph", "buffers"},
            "top-level fields")
    _expect(doc["version"] == 1, f"unsupported version {doc['version']!r}")
    buffers = _BufferReader(blob, doc["buffers"])
    try:
        return _decode_graph(doc["graph"], buffers, 0, "graph"), doc["meta"]
    except MPSerializationError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError) as e:
        raise _fail(f"{type(e).__name__}: {e}") from None
