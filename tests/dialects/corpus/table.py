"""The table corpus: every table primitive (`tests.dialects.corpus`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mplang as mp
from mplang import simp
from mplang.dialects import table


def table_corpus() -> Any:
    """Every table primitive: a constant, a file read (schema declared), SQL, both tensor
    bridges and a write, on party 0."""
    def body() -> Any:
        c = table.constant({"k": np.array([1, 2, 3], np.int64), "v": [0.5, 1.5, 2.5]})
        t = table.read_csv("t.csv", schema={"k": "int64", "w": "float64"})
        r = table.sql("SELECT c.k, c.v * t.w AS p FROM c JOIN t USING (k) ORDER BY c.k",
                      c=c, t=t)
        table.write_csv(r, "out/r.csv")
        x = table.to_tensor(r, rows=3)
        return x, table.from_tensor(x, ["a", "b"])
    return simp.pcall((0,), body)


TABLE_EXPECTED = [[1.0, 5.0], [2.0, 30.0], [3.0, 125.0]]


def check(result: Any) -> None:
    x, t = result
    assert np.asarray(x[0]).tolist() == TABLE_EXPECTED and x[1] is None
    assert t[0].to_pandas().to_numpy().tolist() == TABLE_EXPECTED


def table_value(sim: mp.Simulator) -> tuple[list[Any], Callable[[list[Any]], None]]:
    """A table made by SQL on party 0."""
    out = mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.sql(
        "SELECT k, upper(s) AS s FROM c", c=table.constant({"k": [1, 2], "s": ["a", None]}))))
    values = [sim.held(out)[0]]

    def check(decoded: list[Any]) -> None:
        assert [d.to_pylist() for d in decoded] == [[{"k": 1, "s": "A"}, {"k": 2, "s": None}]]

    return values, check


VALUES = {"table.table": table_value}
"""Codec kind -> a run giving values of that kind, and a check of decoded values."""
