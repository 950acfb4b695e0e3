"""Tables as Arrow values: the Arrow schema of a `TableType`, the type of an Arrow table,
and the check that a table is exactly of its type.

A table's runtime value is a ``pyarrow.Table`` whose schema is exactly its type's
(`arrow_schema`): string-like columns as ``pa.string()``, no schema metadata. The
frontend uses this module to turn the small tables given while tracing into
constants; the kernels use it to check every table they receive (`conform`). Each
function imports pyarrow when called, so importing this module does not load it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.dialects.table import TABLE_DTYPES, TableType
from mplang.edsl.errors import MPTypeError

if TYPE_CHECKING:
    import pyarrow as pa


def arrow_type(dtype: str) -> pa.DataType:
    """The Arrow type of column dtype ``dtype``."""
    import pyarrow as pa

    return pa.string() if dtype == "string" else pa.from_numpy_dtype(np.dtype(dtype))


def arrow_schema(t: TableType) -> pa.Schema:
    """The exact Arrow schema of a table of type ``t``."""
    import pyarrow as pa

    return pa.schema([pa.field(name, arrow_type(dtype)) for name, dtype in t.columns])


def column_dtype(t: pa.DataType) -> str | None:
    """The column dtype of Arrow type ``t`` (string-like types are ``"string"``); None
    when a table column cannot have it."""
    import pyarrow as pa

    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t):
        return str(np.dtype(t.to_pandas_dtype()).name)
    return None


def normalized(table: pa.Table) -> pa.Table:
    """``table`` with string-like columns as ``pa.string()`` and no schema metadata."""
    import pyarrow as pa

    schema = pa.schema([pa.field(f.name, pa.string() if column_dtype(f.type) == "string"
                                 else f.type) for f in table.schema])
    if table.schema.equals(schema, check_metadata=True):
        return table
    return table.cast(schema)


def type_of_table(op: str, table: pa.Table) -> TableType:
    """The type of Arrow table ``table`` (its row count known); `MPTypeError` naming the
    first column of a type a table cannot have."""
    cols = []
    for f in table.schema:
        dtype = column_dtype(f.type)
        if dtype is None:
            raise MPTypeError(f"{op}: column {f.name!r} has Arrow type {f.type}, which a table "
                              f"cannot hold; use one of {', '.join(TABLE_DTYPES)}")
        cols.append((f.name, dtype))
    try:
        return TableType(tuple(cols), table.num_rows)
    except MPTypeError as e:
        raise MPTypeError(f"{op}: {e}") from None


def is_table_value(value: Any) -> bool:
    """Whether ``value`` is a pandas DataFrame or a pyarrow Table (neither is imported here:
    a value of one exists only once its module is loaded)."""
    pd, pa = sys.modules.get("pandas"), sys.modules.get("pyarrow")
    return (pd is not None and isinstance(value, pd.DataFrame)) or (
        pa is not None and isinstance(value, pa.Table))


def as_arrow(op: str, value: Any) -> pa.Table:
    """``value`` (a pandas DataFrame, a pyarrow Table or a dict of columns) as an Arrow
    table; `MPTypeError` naming ``op`` if it is none of them or does not convert."""
    import pyarrow as pa

    if isinstance(value, pa.Table):
        return value
    if isinstance(value, Mapping):
        try:
            return pa.table(dict(value))
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise MPTypeError(f"{op}: cannot make a table of the columns given: {e}") from None
    if is_table_value(value):
        return _from_pandas(op, value)
    raise MPTypeError(f"{op}: expected a pandas DataFrame, a pyarrow Table or a dict of "
                      f"columns, got {type(value).__name__}")


def _from_pandas(op: str, df: Any) -> pa.Table:
    """DataFrame ``df`` as an Arrow table: a named index becomes columns (an unnamed one is
    dropped); `MPTypeError` naming the first column that cannot be a table column."""
    import pyarrow as pa

    if any(name is not None for name in df.index.names):
        df = df.reset_index()
    for name in df.columns:
        column = df[name]
        try:
            dtype = column_dtype(pa.array(column, from_pandas=True).type)
            problem = None if dtype is not None else "which a table cannot hold"
        except (pa.ArrowException, TypeError, ValueError) as e:
            problem = f"which does not convert ({e})"
        if problem is not None:
            raise MPTypeError(
                f"{op}: column {str(name)!r} has pandas dtype {column.dtype}, {problem}; a "
                f"column holds one of {', '.join(TABLE_DTYPES)}: convert it first (e.g. "
                f"df[{str(name)!r}].astype('int64') or .astype(str))")
    try:
        return pa.Table.from_pandas(df, preserve_index=False)
    except (pa.ArrowException, TypeError, ValueError) as e:
        raise MPTypeError(f"{op}: cannot convert the DataFrame: {e}") from None


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` in the Arrow IPC stream format (uncompressed)."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def conform(table: pa.Table, t: TableType) -> pa.Table:
    """``table`` with the exact schema of type ``t`` (string-like columns as strings, no
    metadata); ValueError saying how it differs."""
    import pyarrow as pa

    if not isinstance(table, pa.Table):
        raise ValueError(f"expected a table, got {type(table).__name__}")
    names = tuple(table.column_names)
    if names != t.names:
        raise ValueError(f"its columns are ({', '.join(map(repr, names))}), not "
                         f"({', '.join(map(repr, t.names))})")
    table = normalized(table)
    want = arrow_schema(t)
    for field, expected in zip(table.schema, want, strict=True):
        if field.type != expected.type:
            raise ValueError(f"column {field.name!r} is {field.type}, not {expected.type} "
                             f"({t.dtype(field.name)})")
    if isinstance(t.rows, int) and table.num_rows != t.rows:  # a symbol: bound by its uses
        raise ValueError(f"it has {table.num_rows} rows, not {t.rows}")
    return table if table.schema.equals(want, check_metadata=True) else table.cast(want)
