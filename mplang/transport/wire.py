"""Binary encoding of runtime values for transports between processes.

A frame is ``b"MPV1"``, a little-endian u32 header length, a JSON header and
the raw payload. Arrays travel as their raw bytes (no JSON lists, no pickle),
and a list of values (one message carrying several, as a batched
``simp.shuffle_static`` sends) as the sizes of its elements' frames followed by
those frames; lists do not nest. Other runtime values (a dialect's secret
shares, keys, ciphertexts) travel through the `ValueCodec` their backend
registers: a list of byte chunks, decoded by the codec's own checks. Decoding
accepts only the built-in kinds and registered codecs, and checks the payload
size against the header.
"""

from __future__ import annotations

import importlib
import json
import math
import struct
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from mplang.edsl.errors import MPSerializationError
from mplang.edsl.serde import numpy_can_hold
from mplang.edsl.typing import DTYPES, BaseType, numpy_dtype
from mplang.records.audit import PLAINTEXT, SECRET_SHARE

MAGIC = b"MPV1"
"""The four bytes that open every frame (format version 1)."""
_PREFIX = struct.Struct("<4sI")
MAX_HEADER = 1 << 20
"""The largest JSON header of a frame, in bytes; a longer one is malformed."""
_BUILTIN_KINDS = frozenset(["none", "scalar", "bytes", "array", "list"])

Buffer = bytes | memoryview
"""A chunk of encoded bytes; memoryviews let arrays go out without a copy."""


@dataclass(frozen=True)
class ValueCodec:
    """How runtime values of class ``value_class``, the values of IR type ``carries``, cross
    the wire; frames name them by that type's serialization tag (`kind`).

    ``encode(value)`` gives byte chunks; ``decode(chunks)`` rebuilds the value and
    raises (any exception) on malformed chunks: it sees bytes from the network,
    so it must check them and never unpickle or evaluate.
    """

    carries: type[BaseType]
    value_class: type | str
    """The class of the values, or its qualified name (``"pyarrow.lib.Table"``) so that
    registering the codec does not import the class's module."""
    encode: Callable[[Any], Sequence[Buffer]]
    decode: Callable[[list[memoryview]], Any]
    nbytes: Callable[[Any], int] | None = None
    """The encoded size, if cheaper to know than encoding (the network model asks)."""
    privacy: str = PLAINTEXT
    """What a value reveals of its data, as the audit log records it: ``"plaintext"``
    (the default, assumed unless a codec declares otherwise), ``"secret share"`` or
    ``"ciphertext"``."""

    @property
    def kind(self) -> str:
        """The name frames carry: the serialization tag of the type it carries."""
        return self.carries.type_tag

    @property
    def cls(self) -> type:
        """The class of the values (imports its module when given by name)."""
        if isinstance(self.value_class, type):
            return self.value_class
        module, _, name = self.value_class.rpartition(".")
        cls: type = getattr(importlib.import_module(module), name)
        return cls


_CODECS: dict[str, ValueCodec] = {}
_BY_CLASS: dict[type, ValueCodec] = {}
_BY_NAME: dict[str, ValueCodec] = {}
"""Codecs given by class name whose module is not imported yet (no value of it exists)."""


def _qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_value_codec(codec: ValueCodec) -> ValueCodec:
    """Make values of ``codec.value_class`` sendable; one codec per kind and per class."""
    name = codec.value_class if isinstance(codec.value_class, str) else \
        _qualified_name(codec.value_class)
    if codec.kind in _BUILTIN_KINDS or codec.kind in _CODECS or name in _BY_NAME or \
            any(_qualified_name(c) == name for c in _BY_CLASS):
        raise ValueError(f"a value codec for {codec.kind!r} / {name.rpartition('.')[2]} "
                         "exists")
    _CODECS[codec.kind] = codec
    if isinstance(codec.value_class, type):
        _BY_CLASS[codec.value_class] = codec
    else:
        _BY_NAME[name] = codec
    return codec


def _codec_for(cls: type) -> ValueCodec | None:
    """The codec of values of class ``cls``; codecs given by name are bound to their
    class once its module is imported."""
    codec = _BY_CLASS.get(cls)
    if codec is None and _BY_NAME:
        for name in list(_BY_NAME):
            module, _, attr = name.rpartition(".")
            if module in sys.modules:
                found = _BY_NAME.pop(name, None)
                if found is not None:
                    _BY_CLASS[getattr(sys.modules[module], attr)] = found
        codec = _BY_CLASS.get(cls)
    return codec


def value_codecs() -> list[ValueCodec]:
    """The registered codecs, by kind."""
    return [_CODECS[k] for k in sorted(_CODECS)]


def privacy_kind(value: Any) -> str:
    """What ``value`` reveals on the wire: its codec's `ValueCodec.privacy`; raw bytes are
    link traffic of a secure device's protocol (secret-sharing messages), so
    ``"secret share"``; arrays and scalars are ``"plaintext"``, and so is a list when any
    of its elements is."""
    if isinstance(value, bytes | bytearray | memoryview):
        return SECRET_SHARE
    if isinstance(value, list | tuple):
        kinds = {privacy_kind(v) for v in value}
        return PLAINTEXT if PLAINTEXT in kinds or not kinds else "+".join(sorted(kinds))
    codec = _codec_for(type(value))
    return codec.privacy if codec is not None else PLAINTEXT


def payload_bytes(value: Any) -> int:
    """The number of payload bytes ``value`` occupies on the wire."""
    if value is None:
        return 0
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        return int(value.nbytes)
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    if isinstance(value, list | tuple):
        return sum(payload_bytes(v) for v in value)
    codec = _codec_for(type(value))
    if codec is not None:
        if codec.nbytes is not None:
            return codec.nbytes(value)
        return sum(memoryview(c).nbytes for c in codec.encode(value))
    return 8


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
    codec = _codec_for(type(value))
    if codec is not None:
        chunks = list(codec.encode(value))
        return _frame({"kind": codec.kind, "sizes": [memoryview(c).nbytes for c in chunks]},
                      chunks)
    if isinstance(value, list):
        if any(isinstance(v, list) for v in value):
            raise MPSerializationError("cannot send a list of lists: lists do not nest")
        frames = [encode_value(v) for v in value]
        return _frame({"kind": "list", "sizes": [sum(map(len, f)) for f in frames]},
                      [buf for f in frames for buf in f])
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        arr = np.asarray(value)
        if arr.dtype.name not in DTYPES:
            raise MPSerializationError(f"cannot send arrays of dtype {arr.dtype}")
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        if not arr.flags.c_contiguous:
            arr = arr.copy()
        data = arr.reshape(-1).view(np.uint8).data if arr.size else b""
        return _frame({"kind": "array", "dtype": arr.dtype.name, "shape": list(arr.shape)},
                      [data])
    raise MPSerializationError(f"cannot send a value of type {type(value).__name__}")


def encode_value_bytes(value: Any) -> bytes:
    """`encode_value` joined into one ``bytes`` (copies the payload)."""
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
    except (ValueError, RecursionError) as e:
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
    codec = _CODECS.get(kind) if isinstance(kind, str) else None
    if codec is not None:
        sizes = header.get("sizes")
        if not (isinstance(sizes, list) and all(type(s) is int and s >= 0 for s in sizes)
                and sum(sizes) == len(payload)):
            raise _bad(f"{kind} sizes")
        parts, offset = [], 0
        for size in sizes:
            parts.append(payload[offset:offset + size])
            offset += size
        try:
            return codec.decode(parts)
        except MPSerializationError:
            raise
        except Exception as e:
            raise _bad(f"{kind}: {type(e).__name__}: {e}") from None
    if kind == "array":
        dtype, shape = header.get("dtype"), header.get("shape")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise _bad(f"array dtype {dtype!r}")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise _bad("array shape")
        dt = numpy_dtype(dtype).newbyteorder("<")
        if not numpy_can_hold(shape, dt.itemsize):
            raise _bad(f"array shape: rank {len(shape)} or size beyond numpy's limits")
        if len(payload) != dt.itemsize * math.prod(shape):
            raise _bad("array size does not match its shape")
        return np.frombuffer(payload, dtype=dt).astype(numpy_dtype(dtype), copy=False) \
            .reshape(shape)
    raise _bad(f"unknown kind {kind!r}")


def pack_message(meta: dict[str, Any], body: Sequence[Buffer]) -> list[Buffer]:
    """A request body: a JSON header of request fields, then an encoded value or program."""
    return _frame(meta, body)
