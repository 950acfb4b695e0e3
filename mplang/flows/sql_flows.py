"""Labels through ``table.sql``: the query read with DuckDB's own parser
(``json_serialize_sql``) and judged by the definitions of `mplang.flows.labels`.

- A query over one table whose every expression is row-local (columns, constants,
  ``CASE``, casts, comparisons, ``AND``/``OR``/``NOT``, ``IN`` and ``BETWEEN``,
  arithmetic and the scalar functions of `_ROW_LOCAL`) keeps the table's rows.
- A ``WHERE`` keeps the rows it selects: how many depends on data (gated, as a
  mask's rows are), so no aggregate over them passes a ``min_rows`` rule.
- ``SUM``, ``COUNT`` and ``AVG`` over every row (no ``GROUP BY``, no ``WHERE``) are an
  aggregate over the table's rows; over groups or selected rows, an aggregate over a
  data-dependent number of rows.
- Anything else (joins, ``ORDER BY``, ``LIMIT``, ``DISTINCT``, windows, subqueries,
  other functions) is raw.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Any

from mplang.flows.labels import UNKNOWN, Label, Rows, aggregated, impure, masked, raw

_ROW_LOCAL = frozenset([
    "+", "-", "*", "/", "//", "%", "abs", "round", "floor", "ceil", "ceiling", "sign",
    "sqrt", "ln", "log", "log2", "log10", "exp", "pow", "power", "least", "greatest",
    "coalesce", "ifnull", "nullif", "lower", "upper", "length", "substring", "substr",
    "concat", "trim", "year", "month", "day", "date_part", "date_trunc"])
"""Scalar functions of one row's values, the same for every row."""
_SUMS = frozenset(["sum", "count", "count_star", "avg", "mean"])
_EXPRESSIONS = frozenset(["COLUMN_REF", "CONSTANT", "CASE", "CAST", "TYPE", "COMPARISON",
                          "CONJUNCTION", "OPERATOR", "BETWEEN", "STAR", "FUNCTION"])


@functools.lru_cache(maxsize=256)
def query_shape(query: str) -> tuple[str, str]:
    """``(table, shape)``: the one table ``query`` reads (lower case) and what it does
    with its rows: ``rows`` (row-local), ``filtered`` (a ``WHERE``), ``sums`` (sums over
    every row), ``grouped`` (sums over groups or selected rows) or ``raw``."""
    import duckdb

    try:
        with duckdb.connect() as db:
            row = db.execute("SELECT json_serialize_sql(?)", [query]).fetchone()
        tree: dict[str, Any] = json.loads(row[0]) if row else {"error": True}
    except (duckdb.Error, ValueError):
        return "", "raw"
    if tree.get("error") or len(tree.get("statements", ())) != 1:
        return "", "raw"
    node = tree["statements"][0]["node"]
    source = node.get("from_table") or {}
    if node.get("type") != "SELECT_NODE" or node.get("modifiers") or \
            node.get("cte_map", {}).get("map") or source.get("type") != "BASE_TABLE" or \
            source.get("sample") or node.get("sample") or node.get("having") or \
            node.get("qualify"):
        return "", "raw"
    found: set[str] = set()
    if not _row_local([node.get("select_list"), node.get("where_clause"),
                       node.get("group_expressions")], found):
        return "", "raw"
    table, where, groups = str(source.get("table_name", "")).lower(), \
        node.get("where_clause") is not None, bool(node.get("group_expressions"))
    if not found:
        return table, "raw" if groups else "filtered" if where else "rows"
    return table, "sums" if found == {"sum"} and not where and not groups else "grouped"


def _row_local(tree: Any, found: set[str]) -> bool:
    """Whether every expression in ``tree`` is row-local or one of `_SUMS` (added to
    ``found``: ``sum``, or ``filter`` for one with a ``FILTER`` clause)."""
    if isinstance(tree, list):
        return all(_row_local(v, found) for v in tree)
    if not isinstance(tree, dict):
        return True
    kind = tree.get("class")
    if kind is not None and kind not in _EXPRESSIONS:
        return False
    if kind == "FUNCTION":
        name = tree.get("function_name")
        if name in _SUMS:
            if tree.get("distinct") or tree.get("order_bys", {}).get("orders"):
                return False
            found.add("filter" if tree.get("filter") else "sum")
        elif name not in _ROW_LOCAL:
            return False
    return all(_row_local(v, found) for v in tree.values())


def sql_labels(gate: int, query: str, names: tuple[str, ...], ins: list[Label]) -> Label:
    """The label of ``query``'s result over tables ``names`` labelled ``ins`` (``gate``:
    the op, which chose the rows a ``WHERE`` keeps)."""
    table, shape = query_shape(query)
    lowered = [n.lower() for n in names]
    label = ins[lowered.index(table)] if table in lowered else None
    if shape == "raw" or label is None or not label.mine:
        return raw(ins)
    if label.form != "rowwise":
        return impure(label) if shape == "rows" else raw([label])
    if shape == "rows":
        return impure(label)
    if shape == "sums":
        return aggregated(label, whole=True)
    if shape == "grouped":
        return aggregated(masked(label), whole=True)
    window = Rows(label.sources, 0, UNKNOWN, gate=gate)
    return replace(label, window=window, at=0, pure=False, gated=True, enforced=None)
