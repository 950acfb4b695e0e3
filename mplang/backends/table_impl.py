"""Kernels, wire codec, describer and flow rule of the ``table`` dialect.

Tables are ``pyarrow.Table`` values whose schema is exactly their type's
(`mplang.dialects.table.arrow_schema`); every kernel checks its input tables
against their types, since a table may come from a peer. Files are read with
pyarrow inside the party's data root (`mplang.runtime.data_root`); DuckDB never
opens a file: it runs queries in a locked-down in-memory database that sees only
the tables registered with it (`mplang.dialects.table.sql_connection`).

On the wire a table is one Arrow IPC stream (``table.arrow``), decoded without
pickle: uncompressed record batches only, every size bounded, the schema of
allowed column types only, and ``validate(full=True)`` before use.
"""

from __future__ import annotations

import os
import re
import struct
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from mplang.backends.simp_worker.state import SimpWorker
from mplang.backends.wire import ValueCodec, register_value_codec
from mplang.dialects import table as T
from mplang.dialects.common import as_array
from mplang.edsl.graph import Operation
from mplang.edsl.typing import TensorType
from mplang.edsl.errors import MPRuntimeError, MPSerializationError, MPTypeError
from mplang.policy.flows import Analysis
from mplang.policy.labels import Label, source
from mplang.runtime import data_root
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Interpreter
from mplang.dialects import table as _table

BACKEND = register_backend("table")
MAX_BATCHES = 1 << 16
"""The most record batches a received table may have."""
SQL_BATCH_ROWS = 1 << 16

# ---------------------------------------------------------------- checks


def _fail(interp: Interpreter, op: Operation, message: str) -> MPRuntimeError:
    where = f" (traced at {op.loc})" if op.loc else ""
    return MPRuntimeError(f"party {interp.party}: op {op.opcode}{where}: {message}",
                          party=interp.party, op=op.opcode, loc=op.loc)


def conform(table: pa.Table, t: T.TableType) -> pa.Table:
    """``table`` with the exact schema of type ``t`` (string-like columns as strings, no
    metadata); ValueError saying how it differs."""
    if not isinstance(table, pa.Table):
        raise ValueError(f"expected a table, got {type(table).__name__}")
    names = tuple(table.column_names)
    if names != t.names:
        raise ValueError(f"its columns are ({', '.join(map(repr, names))}), not "
                         f"({', '.join(map(repr, t.names))})")
    table = T.normalized(table)
    want = T.arrow_schema(t)
    for field, expected in zip(table.schema, want, strict=True):
        if field.type != expected.type:
            raise ValueError(f"column {field.name!r} is {field.type}, not {expected.type} "
                             f"({t.dtype(field.name)})")
    if t.rows is not None and table.num_rows != t.rows:
        raise ValueError(f"it has {table.num_rows} rows, not {t.rows}")
    return table if table.schema.equals(want, check_metadata=True) else table.cast(want)


def _input(interp: Interpreter, op: Operation, value: Any, index: int) -> pa.Table:
    t = op.inputs[index].type
    assert isinstance(t, T.TableType)
    try:
        return conform(value, t)
    except ValueError as e:
        raise _fail(interp, op, f"input {index} does not have its type {t}: {e}") from None


def _worker(interp: Interpreter) -> SimpWorker:
    worker: SimpWorker = interp.states["simp"]
    return worker


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def redacted(message: str) -> str:
    """``message`` without quoted text: errors about data (a value that does not convert)
    reach the driver, the data does not."""
    return _QUOTED.sub("'…'", message)


# ---------------------------------------------------------------- files


def _column_types(t: T.TableType) -> dict[str, pa.DataType]:
    return {name: T.arrow_type(dtype) for name, dtype in t.columns}


def _csv_options(t: T.TableType | None) -> tuple[Any, Any, Any, list[str]]:
    """pyarrow.csv read, parse and convert options; the parse problems found go to the
    returned list (row number, expected and actual field counts)."""
    import pyarrow.csv as pcsv

    problems: list[str] = []

    def invalid_row(row: Any) -> str:
        line = f"line {row.number}" if row.number is not None else "a row"
        problems.append(f"{line} has {row.actual_columns} fields, expected "
                        f"{row.expected_columns}")
        return "error"

    read = pcsv.ReadOptions(use_threads=False)
    parse = pcsv.ParseOptions(newlines_in_values=True, invalid_row_handler=invalid_row)
    if t is None:
        convert = pcsv.ConvertOptions()
    else:
        convert = pcsv.ConvertOptions(column_types=_column_types(t), include_columns=list(t.names),
                                      include_missing_columns=False)
    return read, parse, convert, problems


def _read_csv(real: Path, t: T.TableType | None, relpath: str, node: str) -> pa.Table:
    """CSV file ``real`` read strictly (a ragged row is an error naming its line), with
    the columns and dtypes of ``t`` (None: all columns, types inferred)."""
    import pyarrow.csv as pcsv

    read, parse, convert, problems = _csv_options(t)
    try:
        return pcsv.read_csv(real, read_options=read, parse_options=parse,
                             convert_options=convert)
    except (pa.ArrowException, OSError) as e:
        line = str(e).splitlines()[0] if str(e) else type(e).__name__
        # a missing column is named by the program; other messages may quote the data
        detail = problems[0] if problems else line if isinstance(e, pa.ArrowKeyError) \
            else redacted(line)
        raise MPRuntimeError(f"table.read_csv: {relpath!r} on {node} is not a valid CSV file "
                             f"of its type: {detail}") from None


def _read_parquet(real: Path, t: T.TableType | None, relpath: str, node: str) -> pa.Table:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(real, columns=None if t is None else list(t.names),
                             use_threads=False)
    except (pa.ArrowException, OSError) as e:
        raise MPRuntimeError(f"table.read_parquet: {relpath!r} on {node} is not a readable "
                             f"Parquet file of its type: {redacted(str(e).splitlines()[0])}"
                             ) from None


_READERS = {"csv": _read_csv, "parquet": _read_parquet}


def inferred_type(table: pa.Table, fmt: str, relpath: str, node: str,
                  rows: int | None = None) -> T.TableType:
    """The type of a table read without a schema (with ``rows`` rows, if given). CSV
    columns pyarrow infers as dates, times or all-empty are read as strings; other types
    no table holds are refused."""
    cols = []
    for field in table.schema:
        dtype = T.column_dtype(field.type)
        if dtype is None and fmt == "csv" and (pa.types.is_temporal(field.type)
                                              or pa.types.is_null(field.type)):
            dtype = "string"
        if dtype is None:
            raise MPRuntimeError(f"table.read_{fmt}: column {field.name!r} of {relpath!r} on "
                                 f"{node} is {field.type}, which a table cannot hold; pass "
                                 f"schema= with one of {', '.join(T.TABLE_DTYPES)} for it")
        cols.append((field.name, dtype))
    try:
        return T.TableType(tuple(cols), rows)
    except MPTypeError as e:
        raise MPRuntimeError(f"table.read_{fmt}: {relpath!r} on {node}: {e}") from None


def describe_table(root: Path, fields: Mapping[str, Any], node: str) -> T.TableType:
    """The type of table file ``fields["path"]`` (``fields["format"]``: csv or parquet)
    in data root ``root``: a Parquet file's own schema, a CSV file's columns as
    pyarrow infers them over the whole file (what `read_csv` then reads them as)."""
    path, fmt = fields.get("path"), fields.get("format")
    if not isinstance(path, str):
        raise MPSerializationError(f"field 'path' must be a string, got {str(path)[:40]!r}")
    if fmt not in T.FORMATS:
        raise MPSerializationError(f"field 'format' must be one of {', '.join(T.FORMATS)}, "
                                   f"got {str(fmt)[:40]!r}")
    op = f"table.read_{fmt}"
    real = data_root.resolve(root, path, node, op=op, extensions=(T.FORMATS[fmt],))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(real)
            rows = pq.read_metadata(real).num_rows
        except (pa.ArrowException, OSError) as e:
            raise MPRuntimeError(f"{op}: {path!r} on {node} is not a Parquet file: "
                                 f"{redacted(str(e).splitlines()[0])}") from None
        return inferred_type(schema.empty_table(), fmt, path, node, rows)
    table = _read_csv(real, None, path, node)
    return inferred_type(table, fmt, path, node, table.num_rows)


data_root.register_describer("table", describe_table)


@BACKEND.kernel(_table.read_p)
def _read(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    path, fmt = op.attrs["path"], op.attrs["format"]
    t = op.outputs[0].type
    assert isinstance(t, T.TableType)
    name = f"table.read_{fmt}"
    try:
        real = data_root.resolve(worker.data_root, path, worker.node, op=name,
                                 extensions=(T.FORMATS[fmt],))
        table = _READERS[fmt](real, t, path, worker.node)
        return [conform(table, t)]
    except ValueError as e:
        raise _fail(interp, op, f"{path!r} on {worker.node} does not have the type the "
                                f"program expects, {t}: {e}") from None
    except MPRuntimeError as e:
        raise _fail(interp, op, str(e)) from None


def _write_file(table: pa.Table, target: Path, fmt: str) -> None:
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        if fmt == "csv":
            import pyarrow.csv as pcsv

            pcsv.write_csv(table, tmp)
        else:
            import pyarrow.parquet as pq

            pq.write_table(table, tmp)
        os.replace(tmp, target)  # replaces a link inside the root, never follows it
    finally:
        tmp.unlink(missing_ok=True)


@BACKEND.kernel(_table.write_p)
def _write(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    path, fmt = op.attrs["path"], op.attrs["format"]
    table = _input(interp, op, args[0], 0)
    try:
        target = data_root.resolve_for_write(worker.data_root, path, worker.node,
                                             op=f"table.write_{fmt}",
                                             extensions=(T.FORMATS[fmt],))
        _write_file(table, target, fmt)
    except MPRuntimeError as e:
        raise _fail(interp, op, str(e)) from None
    except (pa.ArrowException, OSError) as e:
        raise _fail(interp, op, f"cannot write {path!r} on {worker.node}: "
                                f"{type(e).__name__}: {e}") from None
    return []


# ---------------------------------------------------------------- SQL and tensors


def run_sql(query: str, tables: Mapping[str, pa.Table], max_rows: int = T.MAX_ROWS
            ) -> pa.Table:
    """``query`` over ``tables`` (by name) in a locked-down DuckDB database; ValueError
    (its message free of data) if it may not run, fails, or gives over ``max_rows`` rows."""
    import duckdb

    con = T.sql_connection()
    try:
        problem = T.query_problem(con, query)
        if problem is not None:
            raise ValueError(problem)
        for name, table in tables.items():
            con.register(name, table)
        try:
            reader = con.sql(query).to_arrow_reader(SQL_BATCH_ROWS)
            batches: list[pa.RecordBatch] = []
            rows = 0
            for batch in reader:
                rows += batch.num_rows
                if rows > max_rows:
                    raise ValueError(f"the result has over {max_rows} rows")
                batches.append(batch)
            return pa.Table.from_batches(batches, schema=reader.schema)
        except duckdb.Error as e:
            raise ValueError(redacted(T.first_line(e))) from None
    finally:
        con.close()


@BACKEND.kernel(_table.sql_p)
def _sql(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    tables = {name: _input(interp, op, value, i)
              for i, (name, value) in enumerate(zip(op.attrs["names"], args, strict=True))}
    t = op.outputs[0].type
    assert isinstance(t, T.TableType)
    try:
        result = run_sql(op.attrs["query"], tables)
    except ValueError as e:
        raise _fail(interp, op, f"{e} (query {T.short_query(op.attrs['query'])})") from None
    try:
        return [conform(result, t)]
    except ValueError as e:
        raise _fail(interp, op, f"the result does not have the type computed while tracing, "
                                f"{t}: {e}") from None


@BACKEND.kernel(_table.to_tensor_p)
def _to_tensor(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    table = _input(interp, op, args[0], 0)
    out = op.outputs[0].type
    assert isinstance(out, TensorType)
    columns, rows = op.attrs["columns"], op.attrs["rows"]
    if table.num_rows != rows:
        raise _fail(interp, op, f"the table has {table.num_rows} rows, but the program "
                                f"declared rows={rows}")
    arrays = []
    for name in columns:
        column = table.column(name)
        if column.null_count:
            raise _fail(interp, op, f"column {name!r} has {column.null_count} null values; "
                                    "fill them in SQL first (COALESCE)")
        arrays.append(column.to_numpy())
    common = np.result_type(*(a.dtype for a in arrays))
    stacked = np.stack([a.astype(common, copy=False) for a in arrays], axis=1) if arrays \
        else np.zeros((rows, 0), common)
    try:
        value = as_array(op.opcode, stacked.reshape(rows, len(columns)))
    except MPTypeError as e:
        raise _fail(interp, op, str(e)) from None
    if value.dtype.name != out.dtype:
        raise _fail(interp, op, f"made a {value.dtype} tensor, but the program expects {out}")
    return [value]


@BACKEND.kernel(_table.from_tensor_p)
def _from_tensor(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    x = np.asarray(args[0])
    t = op.outputs[0].type
    assert isinstance(t, T.TableType)
    expected = op.inputs[0].type
    if not isinstance(expected, TensorType) or TensorType.of(x.dtype, x.shape) != expected:
        raise _fail(interp, op, f"the input is {x.dtype}{list(x.shape)}, but the program "
                                f"expects {expected}")
    columns = [x] if x.ndim == 1 else [np.ascontiguousarray(x[:, i]) for i in range(x.shape[1])]
    return [pa.Table.from_arrays([pa.array(c) for c in columns], names=list(t.names))]


@BACKEND.kernel(_table.constant_p)
def _constant(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    t = op.outputs[0].type
    assert isinstance(t, T.TableType)
    try:
        return [conform(decode_ipc(op.attrs["data"]), t)]
    except (MPSerializationError, ValueError) as e:
        raise _fail(interp, op, f"the constant is not a table of its type {t}: {e}") from None


# ---------------------------------------------------------------- the wire codec

CODEC = "table.arrow"
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
    dtype = T.column_dtype(t)
    if dtype is None or (dtype == "string" and not pa.types.is_string(t)):
        raise ValueError(f"column type {t} is not allowed")
    return dtype


def _encode(table: pa.Table) -> list[memoryview]:
    table = T.normalized(table)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return [memoryview(sink.getvalue())]  # no copy: the view keeps Arrow's buffer alive


def _decode(chunks: list[memoryview]) -> pa.Table:
    if len(chunks) != 1:
        raise MPSerializationError(f"{MALFORMED}: expected 1 chunk (an Arrow IPC stream), got "
                                   f"{len(chunks)}")
    return decode_ipc(chunks[0])


register_value_codec(ValueCodec(CODEC, pa.Table, _encode, _decode))


# ---------------------------------------------------------------- the flow rule


@T.read_p.def_local_flow
def _read_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """A table read from p's data root is p's data (raw), like ``tensor.load``."""
    if not own:
        return [None]
    name = str(op.attrs["path"])
    a.source(op, name)
    return [source(name)]
