"""The ``table`` dialect: party-local tables (Arrow), SQL on them (DuckDB), and the
bridge to tensors.

Inside ``pcall`` bodies::

    t = table.read_csv("a.csv")                 # from the party's data root
    r = table.sql("SELECT a, SUM(b) AS s FROM t GROUP BY a", t=t)
    x = table.to_tensor(r, ["a", "s"], rows=3)  # a 2-D tensor [rows, columns]
    u = table.from_tensor(x, ["a", "s"])
    table.write_parquet(u, "out/u.parquet")     # into the party's data root
    c = table.constant(pandas_df)               # small inline tables
    d = table.from_pandas(df)                   # the same, a DataFrame's columns and types

`TableType` names its columns and their dtypes, and its row count when it is known
while tracing (constants, `from_tensor`); tables read from files or made by SQL
have a row count known at run time only. A table's value is a ``pyarrow.Table``
whose schema is exactly its type's. ``table.sql`` computes its result's type
while tracing, with DuckDB binding the query against empty tables of the input
types in a locked-down in-memory database (`mplang.dialects.table_sql`); the
parties run the query in the same kind of database, which sees only the tables
passed in. The type map and what the lockdown refuses: ``docs/tables.md``.

This module declares the types, primitives and their rules, and the frontend ops;
Arrow values are in `mplang.dialects.table_arrow`, the kernels and files in
`mplang.kernels.table`, the wire codec in `mplang.kernels.table_wire`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mplang.analysis.cost_model import local_cost
from mplang.dialects.common import canonical_type
from mplang.edsl.attrs import Attr
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.graph import Operation
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Operand, Primitive, Result, Signature, of_type
from mplang.edsl.private import Commitment
from mplang.edsl.sources import InputDescriber, looked_up_type
from mplang.edsl.tracer import current_tracer
from mplang.edsl.traits import LOCAL_EFFECT, LOCAL_PURE
from mplang.edsl.typing import (
    BaseType,
    Dim,
    Mask,
    TensorType,
    TypeDecoder,
    TypeEncoder,
    ValueType,
    dim_text,
    is_symbolic,
    register_type,
)
from mplang.flows.engine import Analysis, local_conservative
from mplang.flows.labels import FOREIGN, Label, leading_rows, source, source_path, with_rows
from mplang.flows.sql_flows import sql_labels
from mplang.frontend.feop import feop

_SHORT = {"bool": "bool", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
          "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64",
          "float32": "f32", "float64": "f64", "string": "str"}
TABLE_DTYPES = tuple(_SHORT)
"""The dtypes a column may have: numpy names of the numeric and bool dtypes Arrow and
DuckDB share (no float16, bfloat16 or complex), and ``"string"`` (UTF-8 text)."""
NUMERIC_DTYPES = TABLE_DTYPES[:-1]
"""The column dtypes `to_tensor` takes (bool counts as numeric)."""
FORMATS = {"csv": ".csv", "parquet": ".parquet"}
"""File formats of `read_csv` / `read_parquet` / `write_*`, and their extensions."""
MAX_COLUMNS = 4096
MAX_NAME = 256
"""The longest column name (characters)."""
MAX_ROWS = (1 << 40) - 1
MAX_QUERY = 1 << 20
"""The longest SQL query (characters)."""
MAX_PATH = 4096
"""The longest file path (characters)."""
MAX_TABLE_BYTES = 2 << 30
"""The most bytes a table may take on the wire (the default largest request body): the
bound of a table whose size the type cannot tell (unknown rows, string columns)."""
_IPC_BYTES_PER_COLUMN = 512
_IPC_BYTES = 4096
_SQL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")

# ---------------------------------------------------------------- the type


def _check_names(names: Sequence[Any], what: str = "column name", op: str = ""
                 ) -> tuple[str, ...]:
    """``names`` checked: non-empty strings of at most `MAX_NAME` characters, unique."""
    where = f"{op}: " if op else ""
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not name or len(name) > MAX_NAME or "\x00" in name:
            raise MPTypeError(f"{where}a {what} must be a non-empty string of at most "
                              f"{MAX_NAME} characters, got {str(name)[:80]!r}")
        if name in seen:
            raise MPTypeError(f"{where}{what}s must be unique, but {name!r} occurs twice")
        seen.add(name)
    return tuple(names)


def _label(name: str) -> str:
    return name if name.isidentifier() else repr(name)


@register_type("table.table")
@dataclass(frozen=True)
class TableType(BaseType):
    """A table: named columns ``(name, dtype)`` in order, each dtype one of
    `TABLE_DTYPES`, and ``rows``: a count known while tracing, a symbol (`Dim`) shared
    with the tables and tensors of the same row count, or None (known at run time)."""

    columns: tuple[tuple[str, str], ...]
    rows: Dim | None = None

    def __post_init__(self) -> None:
        cols = self.columns
        if not isinstance(cols, tuple) or not all(
                isinstance(c, tuple) and len(c) == 2 for c in cols):
            raise MPTypeError(f"table columns must be a tuple of (name, dtype) pairs, got "
                              f"{str(cols)[:200]}")
        if not 1 <= len(cols) <= MAX_COLUMNS:
            raise MPTypeError(f"a table has 1 to {MAX_COLUMNS} columns, got {len(cols)}")
        _check_names([name for name, _ in cols])
        for name, dtype in cols:
            if dtype not in TABLE_DTYPES:
                raise MPTypeError(f"column {name!r} has dtype {dtype!r}; table columns have "
                                  f"one of {', '.join(TABLE_DTYPES)}")
        rows = self.rows
        if rows is not None and not is_symbolic(rows) and (
                type(rows) is not int or not 0 <= rows <= MAX_ROWS):
            raise MPTypeError(f"a table's row count must be None, a symbol or an int in "
                              f"[0, {MAX_ROWS}], got {rows!r}")

    @staticmethod
    def of(columns: Mapping[str, Any] | Iterable[tuple[str, Any]],
           rows: Dim | None = None) -> TableType:
        """A table type from ``{name: dtype}`` or ``[(name, dtype), ...]``; dtypes may be
        any numpy dtype spelling (``"i8"``, ``np.int64``) or ``"string"``/``str``."""
        pairs = columns.items() if isinstance(columns, Mapping) else columns
        try:
            cols = tuple((name, _dtype_name(dtype)) for name, dtype in pairs)
        except (TypeError, ValueError) as e:
            raise MPTypeError(f"a table schema is {{name: dtype}} or [(name, dtype), ...]: "
                              f"{e}") from None
        return TableType(cols, rows)

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in order."""
        return tuple(name for name, _ in self.columns)

    def dtype(self, name: str) -> str:
        """The dtype of column ``name`` (KeyError if there is none)."""
        for col, dtype in self.columns:
            if col == name:
                return dtype
        raise KeyError(name)

    def without_rows(self) -> TableType:
        """The same columns with the row count unknown."""
        return TableType(self.columns)

    def wire_bytes(self) -> int:
        """Numeric columns of a known row count: their bytes, validity bits and IPC
        framing; otherwise `MAX_TABLE_BYTES`."""
        if not isinstance(self.rows, int) or any(d == "string" for _, d in self.columns):
            return MAX_TABLE_BYTES
        width = sum(1 if d == "bool" else np.dtype(d).itemsize for _, d in self.columns)
        return (self.rows * width + len(self.columns) * (self.rows // 8 + 64
                                                         + _IPC_BYTES_PER_COLUMN)
                + _IPC_BYTES)

    def to_json(self, encode: TypeEncoder) -> Any:
        return [[[name, dtype] for name, dtype in self.columns], self.rows]

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> TableType:
        if not isinstance(body, list) or len(body) != 2 or not isinstance(body[0], list):
            raise ValueError("expected [[[name, dtype], ...], rows]")
        cols, rows = body
        if len(cols) > MAX_COLUMNS or not all(
                isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c)
                for c in cols):
            raise ValueError(f"expected at most {MAX_COLUMNS} [name, dtype] string pairs")
        return cls(tuple((name, dtype) for name, dtype in cols), rows)

    def __str__(self) -> str:
        cols = ",".join(f"{_label(n)}:{_SHORT[d]}" for n, d in self.columns)
        return f"table<{cols}>" + ("" if self.rows is None else f"[{dim_text(self.rows)}]")


def _dtype_name(dtype: Any) -> str:
    if dtype is str or (isinstance(dtype, str) and dtype in ("string", "str")):
        return "string"
    name = np.dtype(dtype).name
    if name not in NUMERIC_DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(TABLE_DTYPES)}")
    return name


def table_type(op: str, t: ValueType, what: str = "the input") -> TableType:
    """``t`` as a `TableType`, or an `MPTypeError` naming ``op`` and ``what``."""
    if not isinstance(t, TableType):
        raise MPTypeError(f"{op}: {what} must be a table, got {t}")
    return t


# ---------------------------------------------------------------- primitives

TABLE = of_type(TableType, name="a table")
TENSOR = of_type(TensorType, name="a local tensor")
_TABLE = [Result("out", TABLE)]
_TYPE = Attr(TableType, required=True, doc="the result's type")
_PATH = Attr(str, required=True, doc="a file in the party's data root")
_FORMAT = Attr(str, required=True, choices=tuple(FORMATS), doc="the file's format")
_COLUMNS = Attr(tuple, required=True, doc="column names, in order")

constant_p = Primitive(
    "table.constant", kind="source", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[], results=_TABLE, targets=("PPU",), cost=local_cost,
    attrs={"data": Attr((bytes, Commitment), required=True,
                        doc="the rows as an Arrow IPC stream (a commitment for parties that "
                            "may not see them)"),
           "type": _TYPE},
    local_flow=local_conservative, doc="A small table given while tracing.")
read_p = Primitive(
    "table.read", kind="source", execution_model="single_rank", traits=LOCAL_EFFECT,
    operands=[], attrs={"path": _PATH, "format": _FORMAT, "type": _TYPE}, results=_TABLE,
    targets=("PPU",), cost=local_cost,
    doc="Read a table (CSV or Parquet) from the party's own data root.")
write_p = Primitive(
    "table.write", kind="compute", execution_model="single_rank", traits=LOCAL_EFFECT,
    operands=[Operand("t", TABLE)], attrs={"path": _PATH, "format": _FORMAT}, results=[],
    targets=("PPU",), cost=local_cost,
    doc="Write a table (CSV or Parquet) into the party's own data root.")
sql_p = Primitive(
    "table.sql", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("tables", TABLE, variadic=True)],
    attrs={"query": Attr(str, required=True, doc="one SELECT statement (DuckDB's dialect)"),
           "names": Attr(tuple, required=True, doc="each input table's name in the query"),
           "type": _TYPE},
    results=_TABLE, targets=("PPU",), cost=local_cost,
    doc="Run one SQL SELECT on local tables (DuckDB).")
to_tensor_p = Primitive(
    "table.to_tensor", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("t", TABLE)],
    attrs={"columns": _COLUMNS,
           "rows": Attr((int, str), required=True,
                        doc="the table's row count, or the symbol of a count known at run "
                            "time")},
    results=[Result("out", TENSOR)], targets=("PPU",), cost=local_cost,
    doc="Numeric columns of a table as a 2-D tensor.")
from_tensor_p = Primitive(
    "table.from_tensor", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("x", TENSOR)], attrs={"columns": _COLUMNS}, results=_TABLE,
    targets=("PPU",), cost=local_cost, doc="A tensor's columns as a table.")


def _check_path(op: str, path: Any, fmt: str) -> None:
    if not isinstance(path, str) or not path or len(path) > MAX_PATH:
        raise MPTypeError(f"{op}: the path must be a non-empty string, got {path!r}")
    if not path.endswith(FORMATS[fmt]):
        raise MPTypeError(f"{op}: path {path!r} must name a {FORMATS[fmt]} file")


@constant_p.def_type_rule
def _constant_rule(sig: Signature) -> list[ValueType]:
    t: TableType = sig.type
    if t.rows is None:
        raise MPTypeError(f"table.constant: a constant's row count is known: {t} has none")
    return [t]


@constant_p.def_private
def _constant_private(op: Operation) -> dict[str, Mask | None]:
    """The rows are seen by the parties that run the body (the type is public)."""
    return {"data": None}


@read_p.def_type_rule
def _read_rule(sig: Signature) -> list[ValueType]:
    _check_path(f"table.read_{sig.format}", sig.path, sig.format)
    return [sig.type]


@read_p.def_local_flow
def _read_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """A table read from p's data root is p's data (raw), like ``tensor.load``."""
    if not own:
        return [FOREIGN]
    name = source_path(str(op.attrs["path"]))
    a.source(op, name)
    return [source(name, leading_rows(op.outputs[0].type), table=True)]


@write_p.def_local_flow
def _write_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """A write into the party's data root, which its policy's ``writes`` must allow."""
    if own:
        a.write(op, str(op.attrs["path"]), a.party)
    return []


@sql_p.def_local_flow
def _sql_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Row-local SQL keeps the rows, a ``WHERE`` selects some, sums aggregate them
    (`mplang.flows.sql_flows`)."""
    return [sql_labels(id(op), str(op.attrs["query"]), tuple(op.attrs["names"]), ins)]


@to_tensor_p.def_local_flow
@from_tensor_p.def_local_flow
def _rows_kept(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Columns as a tensor (or back): the rows stay the rows, now of a known count."""
    (label,) = ins
    rows = op.attrs.get("rows")
    return [with_rows(label, rows) if isinstance(rows, int) else label]


@write_p.def_type_rule
def _write_rule(sig: Signature) -> list[ValueType]:
    _check_path(f"table.write_{sig.format}", sig.path, sig.format)
    return []


@sql_p.def_type_rule
def _sql_rule(sig: Signature) -> list[ValueType]:
    op = "table.sql"
    query: str = sig.query
    names: tuple[Any, ...] = sig.names
    if not query.strip() or len(query) > MAX_QUERY:
        raise MPTypeError(f"{op}: the query must be a non-empty string of at most "
                          f"{MAX_QUERY} characters")
    if len(names) != len(sig.tables):
        raise MPTypeError(f"{op}: expected one name per input table ({len(sig.tables)}), got "
                          f"{names!r}")
    for name in names:
        _check_sql_name(op, name)
    _check_names(names, "table name", op)
    return [sig.type]


def _check_sql_name(op: str, name: Any) -> str:
    if not isinstance(name, str) or not _SQL_NAME.fullmatch(name):
        raise MPTypeError(f"{op}: table name {name!r} must be an identifier of at most 64 "
                          "letters, digits and underscores")
    return name


def to_tensor_type(op: str, t: TableType, columns: tuple[str, ...], rows: Dim) -> TensorType:
    """The tensor ``table.to_tensor`` makes of ``columns`` of ``t``: ``[rows,
    len(columns)]`` of the columns' common dtype (numpy promotion), canonical for JAX.
    ``rows`` is a count (checked at run time when ``t``'s is not known) or ``t``'s
    symbol."""
    if not is_symbolic(rows) and (type(rows) is not int or not 0 <= rows <= MAX_ROWS):
        raise MPTypeError(f"{op}: rows must be a count in [0, {MAX_ROWS}] or a symbol, got "
                          f"{rows!r}")
    if not columns:
        raise MPTypeError(f"{op}: name at least one column")
    dtypes = []
    for name in columns:
        try:
            dtype = t.dtype(name)
        except KeyError:
            raise MPTypeError(f"{op}: {t} has no column {name!r} (it has "
                              f"{', '.join(map(repr, t.names))})") from None
        if dtype not in NUMERIC_DTYPES:
            raise MPTypeError(f"{op}: column {name!r} of {t} is {dtype}; only numeric and "
                              "bool columns become tensors (encode strings in SQL first)")
        dtypes.append(np.dtype(dtype))
    if t.rows is not None and t.rows != rows and not isinstance(rows, int):
        raise MPTypeError(f"{op}: {t} has {dim_text(t.rows)} rows, not {dim_text(rows)}")
    if isinstance(t.rows, int) and t.rows != rows:
        raise MPTypeError(f"{op}: {t} has {t.rows} rows, not rows={rows}")
    common = np.result_type(*dtypes)
    return canonical_type(TensorType(common.name, (rows, len(columns))))


@to_tensor_p.def_type_rule
def _to_tensor_rule(sig: Signature) -> list[ValueType]:
    op = "table.to_tensor"
    return [to_tensor_type(op, sig.t, _check_names(sig.columns, op=op), sig.rows)]


def from_tensor_type(op: str, x: TensorType, columns: tuple[str, ...]) -> TableType:
    """The table ``table.from_tensor`` makes of tensor ``x``: column ``i`` of a 2-D
    ``x``, or a 1-D ``x`` as the one column."""
    if x.dtype not in NUMERIC_DTYPES:
        raise MPTypeError(f"{op}: {x} has dtype {x.dtype}; table columns take "
                          f"{', '.join(NUMERIC_DTYPES)}")
    names = _check_names(columns, op=op)
    if not names:
        raise MPTypeError(f"{op}: name at least one column")
    one_column = len(x.shape) == 1 and len(names) == 1
    if not one_column and (len(x.shape) != 2 or x.shape[1] != len(names)):
        raise MPTypeError(f"{op}: {x} does not have {len(names)} columns "
                          f"({', '.join(map(repr, names))}); pass a 2-D tensor [rows, "
                          f"{len(names)}]" + (" or a 1-D tensor" if len(names) == 1 else ""))
    return TableType(tuple((n, x.dtype) for n in names), x.shape[0])


@from_tensor_p.def_type_rule
def _from_tensor_rule(sig: Signature) -> list[ValueType]:
    return [from_tensor_type("table.from_tensor", sig.x, sig.columns)]


# ---------------------------------------------------------------- the frontend


def _local(op: str) -> None:
    if not current_tracer(op).local:
        raise MPTypeError(f"{op} is a party-local op; at the simp level run it inside "
                          "simp.pcall(parties, fn, ...)")


def _columns(op: str, columns: Any) -> tuple[str, ...]:
    if isinstance(columns, str):
        columns = [columns]
    if not isinstance(columns, list | tuple):
        raise MPTypeError(f"{op}: columns must be a list of names, got {columns!r}")
    return tuple(columns)


@feop(constant_p,
      example='c = table.constant(pd.DataFrame({"id": [1, 2], "name": ["a", "b"]}))')
@function
def constant(value: Any) -> MPObject:
    """A small table given while tracing (a pandas DataFrame, a pyarrow Table or a dict of
    columns); its rows travel in the program to the parties that run the body only."""
    return _constant("table.constant", value)


def _constant(op: str, value: Any) -> MPObject:
    from mplang.dialects.table_arrow import (  # they import this module
        arrow_schema,
        as_arrow,
        ipc_bytes,
        normalized,
        type_of_table,
    )

    _local(op)
    table = normalized(as_arrow(op, value))
    t = type_of_table(op, table)
    return constant_p.bind([], {"data": ipc_bytes(table.cast(arrow_schema(t))),
                                "type": t})[0]


@feop(constant_p, name="table.from_pandas", example="t = table.from_pandas(df)")
@function
def from_pandas(df: Any) -> MPObject:
    """A pandas DataFrame (or a pyarrow Table) as a table with its column names and
    types, given while tracing (as `constant`); a named index becomes columns. A column
    of another type (dates, categories, mixed objects) is refused by name."""
    return _constant("table.from_pandas", df)


def _schema_type(op: str, schema: Any) -> TableType:
    if not isinstance(schema, Mapping | list | tuple):
        raise MPTypeError(f"{op}: schema must be {{name: dtype}} or [(name, dtype), ...], "
                          f"got {type(schema).__name__}")
    try:
        return TableType.of(schema)
    except MPTypeError as e:
        raise MPTypeError(f"{op}: schema: {e}") from None


def _read(fmt: str, path: str, schema: Any) -> MPObject:
    op = f"table.read_{fmt}"
    _local(op)
    _check_path(op, path, fmt)
    tracer = current_tracer(op)
    if schema is not None:
        t = _schema_type(op, schema)
    else:
        # one party: its file's row count is part of the type (to_tensor needs no rows=);
        # several: each reads its own file, and only the columns must agree
        single = tracer.parties is not None and len(tracer.parties) == 1

        def describe(ctx: Any, rank: int) -> Any:
            found = ctx.describe_input(rank, {"what": "table", "path": path, "format": fmt})
            return found if single or not isinstance(found, TableType) else found.without_rows()

        found = looked_up_type(op, repr(path), tracer, tracer.parties, describe,
                               source=InputDescriber, declare="pass schema={name: dtype, ...}")
        t = table_type(op, found, f"the type of {path!r} a party reported")
    return read_p.bind([], {"path": path, "format": fmt, "type": t})[0]


@feop(read_p, name="table.read_csv",
      example='t = simp.pcall((0,), lambda: table.read_csv("a.csv"))')
@function
def read_csv(path: str, schema: Any = None) -> MPObject:
    """A private input: a CSV file (a header line of column names, then rows) in the data
    root of the party running this body.

    ``schema`` (``{name: dtype}`` or ``[(name, dtype), ...]``) gives the columns to read
    and their dtypes; without it, the simulator or driver asks each party for the
    file's columns as pyarrow infers them (dates and times as strings), and all must
    agree. The row count is known at run time only.
    """
    return _read("csv", path, schema)


@feop(read_p, name="table.read_parquet",
      example='t = simp.pcall((0,), lambda: table.read_parquet("a.parquet"))')
@function
def read_parquet(path: str, schema: Any = None) -> MPObject:
    """A private input: a Parquet file in the data root of the party running this body
    (``schema`` as in `read_csv`; without it, the file's own schema)."""
    return _read("parquet", path, schema)


def _write(fmt: str, t: MPObject, path: str) -> None:
    op = f"table.write_{fmt}"
    _local(op)
    _check_path(op, path, fmt)
    write_p.bind([t], {"path": path, "format": fmt})


@feop(write_p, name="table.write_csv",
      example='simp.pcall((0,), lambda t: table.write_csv(t, "out/r.csv"), t)')
@function
def write_csv(t: MPObject, path: str) -> None:
    """Write table ``t`` as CSV (a header line, then rows) to ``path`` in the data root of
    the party running this body; missing folders inside the root are made, and a file
    already there is replaced."""
    _write("csv", t, path)


@feop(write_p, name="table.write_parquet",
      example='simp.pcall((0,), lambda t: table.write_parquet(t, "r.parquet"), t)')
@function
def write_parquet(t: MPObject, path: str) -> None:
    """Write table ``t`` as Parquet to ``path`` in the party's data root (as `write_csv`)."""
    _write("parquet", t, path)


@feop(sql_p, example='r = table.sql("SELECT a, SUM(b) AS s FROM t GROUP BY a", t=t)')
@function
def sql(query: str, **tables: MPObject) -> MPObject:
    """The result of SQL ``query`` (one SELECT, DuckDB's dialect) over the tables passed
    by keyword, each visible to the query under its keyword.

    The result's columns and dtypes are computed while tracing; a query that does
    not bind (a missing column, a refused statement or function) or whose result has
    a column no table can hold (HUGEINT, DECIMAL, DATE, ...: CAST it) is an
    `MPTypeError` naming the query. Its row count is known at run time only.
    """
    from mplang.dialects.table_sql import sql_result_type  # it imports this module

    op = "table.sql"
    _local(op)
    if not isinstance(query, str) or not query.strip():
        raise MPTypeError(f"{op}: the query must be a non-empty string, got {query!r}")
    tracer = current_tracer(op)
    inputs: dict[str, TableType] = {}
    for name, value in tables.items():
        _check_sql_name(op, name)
        if not isinstance(value, MPObject):
            raise MPTypeError(f"{op}: table {name!r} must be an MPLang table, got "
                              f"{type(value).__name__} (make one with table.constant)")
        inputs[name] = table_type(op, tracer.lift(value).type, f"table {name!r}")
    result = sql_result_type(query, inputs)
    return sql_p.bind(list(tables.values()), {"query": query, "names": tuple(tables),
                                              "type": result})[0]


@feop(to_tensor_p, example='x = table.to_tensor(t, ["a", "b"])')
@function
def to_tensor(t: MPObject, columns: Sequence[str] | None = None, *,
              rows: int | None = None) -> MPObject:
    """Numeric (or bool) ``columns`` of ``t`` (default: all) as a 2-D tensor ``[rows,
    len(columns)]`` of their common dtype (numpy promotion, then JAX's canonical dtype:
    32-bit unless x64 is enabled); a one-column call still gives ``[rows, 1]``.

    A row count known only at run time (files read by several parties, a SQL result, a
    PSI join) is a symbol in the tensor's type, ``f32[?n0,2]``, shared by every tensor
    and table of those rows (both sides of one join). ``rows=N`` asserts the count
    instead, checked when it runs. Null values are a run-time error.
    """
    op = "table.to_tensor"
    _local(op)
    if not isinstance(t, MPObject):
        raise MPTypeError(f"{op}: expected a table, got {type(t).__name__}")
    tt = table_type(op, current_tracer(op).lift(t).type)
    names = tt.names if columns is None else _columns(op, columns)
    counted: Dim = (rows if rows is not None else tt.rows if tt.rows is not None
                    else current_tracer(op).row_symbol(t))
    return to_tensor_p.bind([t], {"columns": names, "rows": counted})[0]


@feop(from_tensor_p, example='t = table.from_tensor(x, ["a", "b"])')
@function
def from_tensor(x: MPObject, columns: Sequence[str]) -> MPObject:
    """A table whose column ``columns[i]`` is column ``i`` of 2-D tensor ``x`` ``[rows,
    k]`` (a 1-D ``x`` for one column); the columns keep ``x``'s dtype."""
    op = "table.from_tensor"
    _local(op)
    if not isinstance(x, MPObject):
        raise MPTypeError(f"{op}: expected an MPLang tensor, got {type(x).__name__}")
    return from_tensor_p.bind([x], {"columns": _columns(op, columns)})[0]


__all__ = [
    "TABLE_DTYPES",
    "TableType",
    "constant",
    "from_pandas",
    "from_tensor",
    "read_csv",
    "read_parquet",
    "sql",
    "to_tensor",
    "write_csv",
    "write_parquet",
]
