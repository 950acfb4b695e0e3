"""SQL on tables in a locked-down DuckDB database, and the type of a query's result.

Every DuckDB database of the table dialect is made by `sql_connection`: in memory,
with no files, network, extensions, secrets or temporary files (`SQL_CONFIG`), and
it sees only the tables registered with it. ``table.sql`` types its result while
tracing (`sql_result_type`: DuckDB binds the query against empty tables of the
input types); the parties run the query in the same kind of database. The type
map and what the lockdown refuses: ``docs/tables.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from mplang.dialects.table import TableType
from mplang.dialects.table_arrow import arrow_schema
from mplang.edsl.errors import MPTypeError
from mplang.util.lru import LRUCache

if TYPE_CHECKING:
    import duckdb

SQL_CONFIG: dict[str, Any] = {
    "enable_external_access": False,
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "allow_community_extensions": False,
    "allow_unsigned_extensions": False,
    "allow_persistent_secrets": False,
    "python_enable_replacements": False,
    "enable_external_file_cache": False,
    "temp_directory": "",
    "memory_limit": "4GB",
    "preserve_insertion_order": True,
    "lock_configuration": True,
}
"""The configuration of every DuckDB database of the table dialect: no files, network,
extensions, secrets or temporary files; no Python variables as tables (replacement
scans); a memory limit; results in their tables' row order unless the query orders
them (a projection of joined rows stays aligned with the other side's, `kept_rows`);
and the configuration locked (``SET`` is refused)."""

DUCKDB_DTYPES = {
    "BOOLEAN": "bool", "TINYINT": "int8", "SMALLINT": "int16", "INTEGER": "int32",
    "BIGINT": "int64", "UTINYINT": "uint8", "USMALLINT": "uint16", "UINTEGER": "uint32",
    "UBIGINT": "uint64", "FLOAT": "float32", "DOUBLE": "float64", "VARCHAR": "string",
}
"""DuckDB result types -> column dtypes (``REAL`` is DuckDB's ``FLOAT``); any other type
of a result column is refused while tracing, with the CAST that fixes it."""

_CAST_HINTS = {
    "hugeint": ("SUM of integers", "CAST(SUM(...) AS BIGINT)"),
    "uhugeint": ("SUM of unsigned integers", "CAST(SUM(...) AS UBIGINT)"),
    "decimal": ("a decimal literal such as 1.5, or SUM/AVG of decimals",
                "CAST(... AS DOUBLE)"),
    "date": ("a date", "CAST(... AS VARCHAR)"),
    "time": ("a time of day", "CAST(... AS VARCHAR)"),
    "timestamp": ("a timestamp", "CAST(... AS VARCHAR)"),
    "timestamp with time zone": ("a timestamp", "CAST(... AS VARCHAR)"),
    "interval": ("an interval", "CAST(... AS VARCHAR)"),
    "null": ("an untyped NULL", "CAST(NULL AS BIGINT)"),
}
"""DuckDB type id -> (what usually makes it, the CAST that fixes it)."""


def sql_connection() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB database, locked down by `SQL_CONFIG`."""
    import duckdb

    return duckdb.connect(":memory:", config=SQL_CONFIG)


REFUSED_FUNCTIONS = {
    "error": "raises an error with any text, which could carry a party's data out",
    "assert_true": "raises an error with any message, which could carry a party's data out",
    "histogram_values": "raises an error naming its technique, which could carry a party's "
                        "data out",
    "query": "runs SQL given as a string, which this check does not see",
    "json_execute_serialized_sql": "runs SQL given as a string, which this check does not "
                                   "see",
}
"""DuckDB functions a query may not call, and why: an error's text can carry a party's
data to the driver, and SQL hidden in a string escapes this check."""


def query_problem(con: duckdb.DuckDBPyConnection, query: str) -> str | None:
    """Why ``query`` may not run (None: it is one SELECT statement that calls none of
    `REFUSED_FUNCTIONS`)."""
    import duckdb

    try:
        statements = con.extract_statements(query)
    except duckdb.Error as e:
        return first_line(e)
    if len(statements) != 1:
        return f"expected one SELECT statement, got {len(statements)} statements"
    kind = statements[0].type.name
    if kind != "SELECT":
        return f"only SELECT statements run, not {kind}"
    return _refused_call(con, query)


def _refused_call(con: duckdb.DuckDBPyConnection, query: str) -> str | None:
    """Why ``query`` may not run if it calls one of `REFUSED_FUNCTIONS` (DuckDB's parse
    tree names every function a query calls, however it is spelt)."""
    import duckdb

    try:
        rows = con.execute("SELECT json_serialize_sql(?)", [query]).fetchall()
        tree = json.loads(rows[0][0]) if rows else None
    except (duckdb.Error, ValueError, RecursionError) as e:
        return f"the query's functions cannot be checked: {type(e).__name__}"
    if not isinstance(tree, dict) or tree.get("error") is not False:
        message = tree.get("error_message") if isinstance(tree, dict) else None
        return f"the query's functions cannot be checked: {message or 'no parse tree'}"
    nodes: list[Any] = [tree]
    while nodes:
        node = nodes.pop()
        if isinstance(node, dict):
            name = node.get("function_name")
            if isinstance(name, str) and name.lower() in REFUSED_FUNCTIONS:
                return f"function {name.lower()}() is refused: it " \
                       f"{REFUSED_FUNCTIONS[name.lower()]}"
            nodes.extend(node.values())
        elif isinstance(node, list):
            nodes.extend(node)
    return None


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (DuckDB adds the query and a caret below)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def short_query(query: str) -> str:
    """``query`` quoted for an error message, cut after 200 characters."""
    return repr(query if len(query) <= 200 else query[:200] + "...")


def _result_dtype(query: str, name: str, duck_type: Any) -> str:
    dtype = DUCKDB_DTYPES.get(str(duck_type))
    if dtype is not None:
        return dtype
    hint = _CAST_HINTS.get(str(getattr(duck_type, "id", "")))
    fix = f" ({hint[0]}); {hint[1]} AS {name}" if hint is not None else \
        f", which no table column holds; CAST it to one of {', '.join(DUCKDB_DTYPES)}"
    raise MPTypeError(f"table.sql: column {name!r} is {duck_type}{fix} (query "
                      f"{short_query(query)})")


ROW_MAKING_FUNCTIONS = frozenset(["unnest", "generate_series", "range", "generate_subscripts"])
"""Functions that make rows in a select list (a query calling one keeps no row count)."""


def kept_rows(con: duckdb.DuckDBPyConnection, query: str) -> str | None:
    """The input table whose rows ``query`` keeps one for one, in order, if it is a plain
    projection of it: one SELECT from that table with no WHERE, GROUP BY, HAVING,
    QUALIFY, SAMPLE, ORDER BY, LIMIT or DISTINCT, no CTE, subquery or join, and no
    aggregate or row-making function outside a window. None otherwise."""
    import duckdb

    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [query]).fetchall()[0][0])
        node = tree["statements"][0]["node"]
        source = node["from_table"]
    except (duckdb.Error, ValueError, RecursionError, KeyError, IndexError, TypeError):
        return None
    if tree.get("error") is not False or len(tree["statements"]) != 1 or \
            node.get("type") != "SELECT_NODE" or source.get("type") != "BASE_TABLE" or \
            source.get("schema_name") or node.get("modifiers") or \
            node.get("cte_map", {}).get("map") or any(node.get(k) for k in (
                "where_clause", "group_expressions", "group_sets", "having", "sample", "qualify")):
        return None
    aggregates = {row[0] for row in con.execute(
        "SELECT DISTINCT function_name FROM duckdb_functions() "
        "WHERE function_type = 'aggregate'").fetchall()}
    nodes: list[Any] = list(node["select_list"])
    while nodes:
        item = nodes.pop()
        if isinstance(item, dict):
            if item.get("class") == "WINDOW":
                continue  # a window function gives every row a value
            name = str(item.get("function_name", "")).lower()
            if item.get("class") == "SUBQUERY" or name in aggregates or \
                    name in ROW_MAKING_FUNCTIONS:
                return None
            nodes.extend(item.values())
        elif isinstance(item, list):
            nodes.extend(item)
    table = source.get("table_name")
    return table if isinstance(table, str) else None


_SQL_TYPES = LRUCache(1024)
"""(query, input names and types) -> the result's `TableType`."""


def sql_result_type(query: str, inputs: Mapping[str, TableType]) -> TableType:
    """The type of ``query``'s result on tables of types ``inputs`` (by name), as DuckDB
    binds it in a locked-down database of empty tables; `MPTypeError` naming the query
    if it does not bind or a result column has no table dtype (`DUCKDB_DTYPES`). A plain
    projection of one input (`kept_rows`) keeps that input's row count or symbol."""
    import duckdb
    import pyarrow as pa

    key = (query, tuple((name, t.columns, t.rows) for name, t in inputs.items()))
    found: TableType | None = _SQL_TYPES.lookup(key)
    if found is not None:
        return found
    con = sql_connection()
    try:
        problem = query_problem(con, query)
        if problem is not None:
            raise MPTypeError(f"table.sql: {problem} (query {short_query(query)})")
        for name, t in inputs.items():
            con.register(name, pa.Table.from_batches([], schema=arrow_schema(t)))
        try:
            rel = con.sql(query)
            columns, types = rel.columns, rel.types
            kept = kept_rows(con, query)
        except duckdb.Error as e:
            raise MPTypeError(f"table.sql: {first_line(e)} (query {short_query(query)})"
                              ) from None
    finally:
        con.close()
    if len(set(columns)) != len(columns):
        dup = next(c for c in columns if columns.count(c) > 1)
        raise MPTypeError(f"table.sql: the result has two columns named {dup!r}; name them "
                          f"apart with AS (query {short_query(query)})")
    rows = inputs[kept].rows if kept is not None and kept in inputs else None
    result = TableType(tuple((name, _result_dtype(query, name, t))
                             for name, t in zip(columns, types, strict=True)), rows)
    _SQL_TYPES.store(key, result)
    return result
