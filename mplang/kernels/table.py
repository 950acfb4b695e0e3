"""Kernels and data-root describer of the ``table`` dialect.

Tables are ``pyarrow.Table`` values whose schema is exactly their type's
(`mplang.dialects.table_arrow.arrow_schema`); every kernel checks its input tables
against their types, since a table may come from a peer. Files are read with
pyarrow inside the party's data root (`mplang.storage.data_root`); DuckDB never
opens a file: it runs queries in a locked-down in-memory database that sees only
the tables registered with it (`mplang.dialects.table_sql.sql_connection`). The
wire codec of tables is `mplang.kernels.table_wire`.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.dialects import table as T
from mplang.dialects.common import as_array
from mplang.dialects.table_arrow import arrow_type, column_dtype, conform
from mplang.dialects.table_sql import first_line, query_problem, short_query, sql_connection
from mplang.edsl.errors import MPRuntimeError, MPSerializationError, MPTypeError
from mplang.edsl.graph import Operation
from mplang.edsl.typing import TensorType
from mplang.kernels.table_wire import decode_ipc
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call
from mplang.storage import data_root
from mplang.worker.state import SimpWorker

if TYPE_CHECKING:
    import pyarrow as pa

BACKEND = register_backend("table")
SQL_BATCH_ROWS = 1 << 16
"""Rows per batch of a query's result (its row count is checked batch by batch)."""

# ---------------------------------------------------------------- checks


def _fail(call: Call, message: str, kind: type[MPRuntimeError] = MPRuntimeError
          ) -> MPRuntimeError:
    party, op = call.interp.party, call.op
    where = f" (traced at {op.loc})" if op.loc else ""
    return kind(f"party {party}: op {op.opcode}{where}: {message}", party=party,
                op=op.opcode, loc=op.loc)


def _input(call: Call, value: Any, index: int) -> pa.Table:
    t = call.in_type(index)
    assert isinstance(t, T.TableType)
    try:
        return conform(value, t)
    except ValueError as e:
        raise _fail(call, f"input {index} does not have its type {t}: {e}") from None


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def redacted(message: str) -> str:
    """``message`` without quoted text: errors about data (a value that does not convert)
    reach the driver, the data does not."""
    return _QUOTED.sub("'…'", message)


# ---------------------------------------------------------------- files


def _column_types(t: T.TableType) -> dict[str, pa.DataType]:
    return {name: arrow_type(dtype) for name, dtype in t.columns}


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
    import pyarrow as pa
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
    import pyarrow as pa
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
    import pyarrow as pa

    cols = []
    for field in table.schema:
        dtype = column_dtype(field.type)
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
    import pyarrow as pa

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


@BACKEND.kernel(T.read_p)
def _read(call: Call, *, path: str, format: str) -> list[Any]:
    worker: SimpWorker = call.state("simp")
    t = call.out_type()
    assert isinstance(t, T.TableType)
    name = f"table.read_{format}"
    try:
        real = data_root.resolve(worker.data_root, path, worker.node, op=name,
                                 extensions=(T.FORMATS[format],))
        table = _READERS[format](real, t, path, worker.node)
        return [conform(table, t)]
    except ValueError as e:
        raise _fail(call, f"{path!r} on {worker.node} does not have the type the program "
                          f"expects, {t}: {e}") from None
    except MPRuntimeError as e:  # of its kind: a missing file is told as it is
        raise _fail(call, str(e), type(e)) from None


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


@BACKEND.kernel(T.write_p)
def _write(call: Call, t: Any, *, path: str, format: str) -> list[Any]:
    import pyarrow as pa

    worker: SimpWorker = call.state("simp")
    table = _input(call, t, 0)
    name = f"table.write_{format}"
    what = f"op {name}" + (f" at {call.op.loc}" if call.op.loc else "")
    try:
        data_root.check_relpath(path, worker.node, op=name, extensions=(T.FORMATS[format],))
        worker.check_write(what, path)  # the party's policy, before a folder is made
        target = data_root.resolve_for_write(worker.data_root, path, worker.node, op=name,
                                             extensions=(T.FORMATS[format],))
        worker.check_write(what, path, target)  # where links inside the root lead
        _write_file(table, target, format)
    except MPRuntimeError as e:  # of its kind: a bad path is told as it is
        raise _fail(call, str(e), type(e)) from None
    except (pa.ArrowException, OSError) as e:
        raise _fail(call, f"cannot write {path!r} on {worker.node}: {type(e).__name__}: "
                          f"{e}") from None
    return []


# ---------------------------------------------------------------- SQL and tensors


def run_sql(query: str, tables: Mapping[str, pa.Table], max_rows: int = T.MAX_ROWS
            ) -> pa.Table:
    """``query`` over ``tables`` (by name) in a locked-down DuckDB database; ValueError
    if it may not run, fails (DuckDB's message, which may quote the data), or gives over
    ``max_rows`` rows."""
    import duckdb
    import pyarrow as pa

    con = sql_connection()
    try:
        problem = query_problem(con, query)
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
        except duckdb.Error as e:  # it may quote the data: it stays in this party's log
            raise ValueError(first_line(e)) from None
    finally:
        con.close()


@BACKEND.payload_check(T.sql_p)
def _check_sql(op: Operation) -> None:
    """A received ``table.sql`` is refused unless its query may run (`query_problem`)."""
    query = op.attrs["query"]
    con = sql_connection()
    try:
        problem = query_problem(con, query)
    finally:
        con.close()
    if problem is not None:
        where = f" at {op.loc}" if op.loc else ""
        raise MPSerializationError(f"{op.opcode}{where}: {problem} (query "
                                   f"{short_query(query)})")


@BACKEND.kernel(T.sql_p)
def _sql(call: Call, *tables: Any, query: str, names: tuple[str, ...]) -> list[Any]:
    inputs = {name: _input(call, value, i)
              for i, (name, value) in enumerate(zip(names, tables, strict=True))}
    t = call.out_type()
    assert isinstance(t, T.TableType)
    try:
        result = run_sql(query, inputs)
    except ValueError as e:
        raise _fail(call, f"{e} (query {short_query(query)})") from None
    try:
        return [conform(result, t)]
    except ValueError as e:
        raise _fail(call, f"the result does not have the type computed while tracing, {t}: "
                          f"{e}") from None


@BACKEND.kernel(T.to_tensor_p)
def _to_tensor(call: Call, t: Any, *, columns: tuple[str, ...], rows: int | str
               ) -> list[Any]:
    table, out = _input(call, t, 0), call.out_type()
    assert isinstance(out, TensorType)
    count = table.num_rows
    if isinstance(rows, int) and count != rows:
        raise _fail(call, f"the table has {count} rows, but the program declared rows={rows}")
    arrays = []
    for name in columns:
        column = table.column(name)
        if column.null_count:
            raise _fail(call, f"column {name!r} has {column.null_count} null values; fill "
                              "them in SQL first (COALESCE)")
        arrays.append(column.to_numpy())
    common = np.result_type(*(a.dtype for a in arrays))
    stacked = np.stack([a.astype(common, copy=False) for a in arrays], axis=1) if arrays \
        else np.zeros((count, 0), common)
    try:
        value = as_array(call.op.opcode, stacked.reshape(count, len(columns)))
    except MPTypeError as e:
        raise _fail(call, str(e)) from None
    if value.dtype.name != out.dtype:
        raise _fail(call, f"made a {value.dtype} tensor, but the program expects {out}")
    return [value]


@BACKEND.kernel(T.from_tensor_p)
def _from_tensor(call: Call, x: Any) -> list[Any]:
    import pyarrow as pa

    x, t = np.asarray(x), call.out_type()
    assert isinstance(t, T.TableType)
    expected = call.in_type(0)
    if not isinstance(expected, TensorType) or TensorType.of(x.dtype, x.shape) != expected:
        raise _fail(call, f"the input is {x.dtype}{list(x.shape)}, but the program expects "
                          f"{expected}")
    columns = [x] if x.ndim == 1 else [np.ascontiguousarray(x[:, i]) for i in range(x.shape[1])]
    return [pa.Table.from_arrays([pa.array(c) for c in columns], names=list(t.names))]


@BACKEND.kernel(T.constant_p)
def _constant(call: Call, *, data: bytes) -> list[Any]:
    t = call.out_type()
    assert isinstance(t, T.TableType)
    try:
        return [conform(decode_ipc(data), t)]
    except (MPSerializationError, ValueError) as e:
        raise _fail(call, f"the constant is not a table of its type {t}: {e}") from None
