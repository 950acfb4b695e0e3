"""The SQL rule by definition: every query `mplang.flows.sql_flows` keeps the rows of
(shape ``rows``) is row-local, checked on generated queries with DuckDB itself. Each
output row depends on the same input row only: permuting the table's rows permutes the
result the same way, and changing one row changes at most that row of the result.
Queries mixing rows (windows, aggregates, ``random()``) must not be labelled ``rows``."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from mplang.flows.sql_flows import query_shape

LEAVES = st.sampled_from(["a", "b", "1.5", "-2", "0"])
UNARY = ["abs({})", "round({})", "-({})", "CAST({} AS DOUBLE)", "coalesce({}, 0)",
         "CASE WHEN {} > 1 THEN 2.0 ELSE -1.0 END", "sqrt(abs({}))", "floor({})"]
BINARY = ["({}) + ({})", "({}) * ({})", "({}) - ({})", "greatest({}, {})",
          "least({}, {})", "CASE WHEN {} < {} THEN a ELSE b END"]
MIXING = ["sum({}) OVER ()", "lag({}) OVER ()", "({}) + random()", "avg({}) OVER ()",
          "({}) * (row_number() OVER ())", "max({}) OVER ()"]
"""Expressions whose value in a row depends on other rows (or on nothing of it)."""


def _expressions(mixing: bool) -> st.SearchStrategy[str]:
    forms = UNARY + BINARY + (MIXING if mixing else [])

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.tuples(st.sampled_from(forms), inner, inner).map(
            lambda t: t[0].format(t[1], t[2]) if t[0].count("{}") == 2 else t[0].format(t[1]))

    return st.recursive(LEAVES, extend, max_leaves=6)


def _run(query: str, frame: pd.DataFrame) -> np.ndarray:
    with duckdb.connect() as db:
        db.execute("SET threads TO 1")
        db.register("t", frame)
        return np.asarray(db.execute(query).fetchall(), dtype=float)


TABLE = pd.DataFrame({"a": np.linspace(-3, 4, 9), "b": np.arange(9.0) ** 1.3 - 2})


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.lists(_expressions(mixing=True), min_size=1, max_size=3),
       st.permutations(range(9)), st.integers(0, 8))
def test_queries_labelled_row_local_are_row_local(columns: list[str], order: list[int],
                                                  row: int) -> None:
    query = "SELECT " + ", ".join(f"{c} AS c{i}" for i, c in enumerate(columns)) + " FROM t"
    _, shape = query_shape(query)
    if any(m.split("(")[0] in query for m in ("sum", "lag", "random", "avg", "row_number",
                                               "max")):
        assert shape == "raw", query
        return
    assert shape == "rows", query
    out = _run(query, TABLE)
    permuted = _run(query, TABLE.iloc[order].reset_index(drop=True))
    np.testing.assert_array_equal(np.isnan(permuted), np.isnan(out[order]))
    np.testing.assert_allclose(np.nan_to_num(permuted), np.nan_to_num(out[order]))
    changed = TABLE.copy()
    changed.loc[row, "a"] += 7.25
    moved = np.any(np.nan_to_num(_run(query, changed)) != np.nan_to_num(out), axis=1)
    assert not moved[np.arange(9) != row].any(), query
