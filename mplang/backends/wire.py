"""Binary encoding of runtime values for transports between processes.

A frame is ``b"MPV1"``, a little-endian u32 header length, a JSON header and
the raw payload. Arrays travel as their raw bytes (no JSON lists, no pickle),
secret shares as libspu's own byte chunks, and a list of values (one message
carrying several, as a batched ``simp.shuffle_static`` sends) as the sizes of
its elements' frames followed by those frames; lists do not nest. Decoding
checks the header against a closed set of kinds and dtypes and the payload
size against the header.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from mplang.backends.spu_impl import SpuShare
from mplang.edsl.typing import numpy_dtype
from mplang.frontend.errors import MPSerializationError

MAGIC = b"MPV1"
_PREFIX = struct.Struct("<4sI")
MAX_HEADER = 1 << 20
ARRAY_DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                          "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
                          "complex128"])

Buffer = bytes | memoryview


def _frame(header: dict[str, Any], payload: Sequence[Buffer]) -> list[Buffer]:
    text = json.dumps(header, separators=(",", ":")).encode()
    return [_PREFIX.pack(MAGIC, len(text)) + text, *payload]


def encode_value(value: Any) -> list[Buffer]:
    """``value`` as a list of buffers to send back to back (arrays are not copied)."""
    if value is None:
        return _frame({"kind": "none"}, [])
    if isinstance(value, bool | int | float) and not isinstance(value, np.generic):
        return _frame({"kind": "scalar", "value": value}, [])
    if isinstance(value, bytes):
        return _frame({"kind": "bytes", "size": len(value)}, [value])
    if isinstance(value, SpuShare):
        meta, chunks = value.to_parts()
        return _frame({"kind": "share", "sizes": [len(meta), *map(len, chunks)]}, [meta, *chunks])
    if isinstance(value, list):
        if any(isinstance(v, list) for v in value):
            raise MPSerializationError("cannot send a list of lists: lists do not nest")
        frames = [encode_value(v) for v in value]
        return _frame({"kind": "list", "sizes": [sum(map(len, f)) for f in frames]},
                      [buf for f in frames for buf in f])
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        arr = np.asarray(value)
        if arr.dtype.name not in ARRAY_DTYPES:
            raise MPSerializationError(f"cannot send arrays of dtype {arr.dtype}")
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        if not arr.flags.c_contiguous:
            arr = arr.copy()
        data = arr.reshape(-1).view(np.uint8).data if arr.size else b""
        return _frame({"kind": "array", "dtype": arr.dtype.name, "shape": list(arr.shape)},
                      [data])
    raise MPSerializationError(f"cannot send a value of type {type(value).__name__}")


def encode_value_bytes(value: Any) -> bytes:
    return b"".join(encode_value(value))


def _bad(what: str) -> MPSerializationError:
    return MPSerializationError(f"malformed value: {what}")


def split_frame(data: Buffer) -> tuple[dict[str, Any], memoryview]:
    """The JSON header and the payload of one frame."""
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise _bad("too short")
    magic, size = _PREFIX.unpack_from(view)
    if magic != MAGIC or size > MAX_HEADER or _PREFIX.size + size > len(view):
        raise _bad("bad frame header")
    try:
        header = json.loads(bytes(view[_PREFIX.size:_PREFIX.size + size]))
    except ValueError as e:
        raise _bad(f"invalid JSON header: {e}") from None
    if not isinstance(header, dict):
        raise _bad("header is not an object")
    return header, view[_PREFIX.size + size:]


def decode_value(data: Buffer) -> Any:
    """Inverse of `encode_value`; raises `MPSerializationError` on anything unexpected."""
    return _decode(data, in_list=False)


def _decode(data: Buffer, in_list: bool) -> Any:
    header, payload = split_frame(data)
    kind = header.get("kind")
    if kind == "list":
        sizes = header.get("sizes")
        if in_list:
            raise _bad("a list inside a list")
        if not (isinstance(sizes, list) and all(type(s) is int and s >= 0 for s in sizes)
                and sum(sizes) == len(payload)):
            raise _bad("list sizes")
        items, offset = [], 0
        for size in sizes:
            items.append(_decode(payload[offset:offset + size], in_list=True))
            offset += size
        return items
    if kind == "none" and not payload:
        return None
    if kind == "scalar" and not payload:
        value = header.get("value")
        if not isinstance(value, bool | int | float):
            raise _bad("scalar value")
        return value
    if kind == "bytes":
        if header.get("size") != len(payload):
            raise _bad("bytes size")
        return bytes(payload)
    if kind == "share":
        sizes = header.get("sizes")
        if not (isinstance(sizes, list) and sizes and all(type(s) is int and s >= 0
                                                          for s in sizes)
                and sum(sizes) == len(payload)):
            raise _bad("share sizes")
        parts, offset = [], 0
        for size in sizes:
            parts.append(bytes(payload[offset:offset + size]))
            offset += size
        return SpuShare.from_parts(parts[0], parts[1:])
    if kind == "array":
        dtype, shape = header.get("dtype"), header.get("shape")
        if dtype not in ARRAY_DTYPES:
            raise _bad(f"array dtype {dtype!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise _bad("array shape")
        dt = numpy_dtype(dtype).newbyteorder("<")
        if len(payload) != dt.itemsize * math.prod(shape):
            raise _bad("array size does not match its shape")
        return np.frombuffer(payload, dtype=dt).astype(numpy_dtype(dtype), copy=False) \
            .reshape(shape)
    raise _bad(f"unknown kind {kind!r}")


def pack_message(meta: dict[str, Any], body: Sequence[Buffer]) -> list[Buffer]:
    """A request body: a JSON header of request fields, then an encoded value or program."""
    return _frame(meta, body)
