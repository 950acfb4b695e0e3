"""The wire codec of tables: one Arrow IPC stream (``table.arrow``), validated on decode.

A table may come from anyone (a peer, the driver, a program's constant), so it is
decoded without pickle and without trusting its framing: at most
`mplang.dialects.table.MAX_TABLE_BYTES` bytes, a schema of allowed column types
only, at most `MAX_BATCHES` uncompressed record batches (compression is read from
the message's flatbuffer, never guessed), and ``validate(full=True)`` before use.
The codec names its class (``pyarrow.lib.Table``): registering it does not import pyarrow.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

from mplang.dialects import table as T
from mplang.dialects.table_arrow import column_dtype, conform, normalized
from mplang.edsl.errors import MPSerializationError, MPTypeError
from mplang.transport.wire import ValueCodec, register_value_codec

if TYPE_CHECKING:
    import pyarrow as pa

MAX_BATCHES = 1 << 16
"""The most record batches a received table may have."""
CODEC = T.TableType.type_tag
MALFORMED = f"malformed value: {CODEC}"
_RECORD_BATCH = 3
"""``MessageHeader.RecordBatch`` in Arrow's ``Message.fbs``."""


def _flatbuffer_field(buf: bytes, table: int, index: int) -> int | None:
    """The position of field ``index`` of the flatbuffer table at ``table`` (None: absent);
    struct.error or ValueError if the offsets lead outside ``buf``."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    if not 0 <= vtable <= len(buf) - 4:
        raise ValueError("vtable outside the message")
    size = struct.unpack_from("<H", buf, vtable)[0]
    slot = 4 + 2 * index
    if slot + 2 > size:
        return None
    offset = struct.unpack_from("<H", buf, vtable + slot)[0]
    return table + offset if offset else None


def _batch_is_compressed(metadata: bytes) -> bool:
    """Whether an IPC record batch message (its flatbuffer metadata) declares compressed
    buffers (``RecordBatch.compression``, field 3); ValueError if it is not a batch."""
    root = struct.unpack_from("<I", metadata, 0)[0]
    kind_at = _flatbuffer_field(metadata, root, 1)  # Message.header_type
    header_at = _flatbuffer_field(metadata, root, 2)  # Message.header
    if kind_at is None or header_at is None or metadata[kind_at] != _RECORD_BATCH:
        raise ValueError("expected a record batch message")
    batch = header_at + struct.unpack_from("<I", metadata, header_at)[0]
    return _flatbuffer_field(metadata, batch, 3) is not None


def decode_ipc(data: bytes | memoryview) -> pa.Table:
    """A table from an Arrow IPC stream that may come from anyone: at most
    `mplang.dialects.table.MAX_TABLE_BYTES` bytes, a schema of allowed column types,
    at most `MAX_BATCHES` uncompressed record batches, fully validated."""
    import pyarrow as pa

    if len(data) > T.MAX_TABLE_BYTES:
        raise MPSerializationError(f"{MALFORMED}: {len(data)} bytes, over the limit of "
                                   f"{T.MAX_TABLE_BYTES}")
    try:
        reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(data))
        first = reader.read_next_message()
        if first.type != "schema":  # pyarrow trusts a message's declared kind: never guess
            raise ValueError(f"expected a schema message, got {first.type}")
        schema = pa.ipc.read_schema(first)
        t = T.TableType(tuple((f.name, _wire_dtype(f.type)) for f in schema))
        batches: list[pa.RecordBatch] = []
        for message in reader:
            if len(batches) >= MAX_BATCHES:
                raise ValueError(f"more than {MAX_BATCHES} record batches")
            if message.type != "record batch":
                raise ValueError(f"unexpected {message.type} message")
            if _batch_is_compressed(message.metadata.to_pybytes()):
                raise ValueError("compressed record batches are refused")
            batches.append(pa.ipc.read_record_batch(message, schema))
        table = pa.Table.from_batches(batches, schema=schema)
        if table.num_rows > T.MAX_ROWS:
            raise ValueError(f"more than {T.MAX_ROWS} rows")
        table.validate(full=True)
        return conform(table, t)
    except MPSerializationError:
        raise
    except StopIteration:
        raise MPSerializationError(f"{MALFORMED}: the Arrow IPC stream has no schema"
                                   ) from None
    except (pa.ArrowException, OSError, ValueError, struct.error, IndexError,
            MPTypeError) as e:
        raise MPSerializationError(f"{MALFORMED}: {type(e).__name__}: {e}") from None


def _wire_dtype(t: pa.DataType) -> str:
    import pyarrow as pa

    dtype = column_dtype(t)
    if dtype is None or (dtype == "string" and not pa.types.is_string(t)):
        raise ValueError(f"column type {t} is not allowed")
    return dtype


def _encode(table: pa.Table) -> list[memoryview]:
    import pyarrow as pa

    table = normalized(table)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return [memoryview(sink.getvalue())]  # no copy: the view keeps Arrow's buffer alive


def _decode(chunks: list[memoryview]) -> pa.Table:
    if len(chunks) != 1:
        raise MPSerializationError(f"{MALFORMED}: expected 1 chunk (an Arrow IPC stream), got "
                                   f"{len(chunks)}")
    return decode_ipc(chunks[0])


register_value_codec(ValueCodec(T.TableType, "pyarrow.lib.Table", _encode, _decode))
