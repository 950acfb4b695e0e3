"""The psi corpus: every psi primitive (`tests.dialects.corpus`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mplang import simp
from mplang.dialects import table
from mplang.libs import psi as psi_lib


def psi_corpus() -> Any:
    """psi.join (full) and psi.intersection_size between parties 0 and 1, psi.join_n of
    three tables, psi.ub_prepare at party 1 then psi.ub_join of party 2's table."""
    a = simp.pcall((0,), lambda: table.constant({"id": np.array([1, 2, 3], np.int64)}))
    b = simp.pcall((1,), lambda: table.constant({"id": np.array([3, 2, 9], np.int64)}))
    c = simp.pcall((2,), lambda: table.constant({"id": np.array([5, 3, 2], np.int64)}))
    ja, jb = psi_lib.join(a, b, "id", how="full")
    prepared = psi_lib.ub_prepare(b, "id", name="corpus")
    return (ja, jb, psi_lib.intersection_size(a, b, "id", reveal_to=(0, 1, 2)),
            psi_lib.join_n([a, b, c], "id"), prepared,
            psi_lib.ub_join(c, "id", server=1, name="corpus"))


def check(result: Any) -> None:
    ja, jb, count, joined, prepared, client = result
    assert ja[0].column("id").to_pylist() == [2, 3, 1, None]
    assert jb[1].column("id").to_pylist() == [2, 3, None, 9]
    assert [int(c) for c in count] == [2, 2, 2]
    assert [j[p].column("id").to_pylist() for p, j in enumerate(joined)] == [[2, 3]] * 3
    assert int(prepared[1]) == 3 and client[2].column("id").to_pylist() == [2, 3]
