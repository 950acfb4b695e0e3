"""Rows stay rows through ``table.sql``: row-local SQL keeps a table's row labels, a
``WHERE`` selects rows (gated), sums over every row are an aggregate, anything else is
raw; PSI, SQL and a group-by compose under the init policies plus an ``intersection``
rule and the key holder's approval. Each shape is checked against the definition of
`mplang.flows.sql_flows` on the label of a table of 20 rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import mplang as mp
from mplang import table
from mplang.cluster.local import init_policies
from mplang.flows.labels import UNKNOWN, source
from mplang.flows.sql_flows import query_shape, sql_labels
from mplang.libs import groupby, psi

ROWS = source("t.csv", 20, table=True)


@pytest.mark.parametrize("query, shape, label", [
    ("SELECT id, CASE WHEN balance > 5000 THEN 1 ELSE 0 END AS k FROM t", "rows",
     "row-wise (raw) values of t.csv"),
    ("SELECT CAST(x AS DOUBLE) / 2 + abs(y) AS z FROM T", "rows",
     "row-wise (raw) values of t.csv"),
    ("SELECT * FROM t WHERE x > 3", "filtered", "row-wise (raw) values of t.csv"),
    ("SELECT SUM(x), COUNT(*), AVG(x) FROM t", "sums", "aggregate over 20 rows of t.csv"),
    ("SELECT k, SUM(x) FROM t GROUP BY k", "grouped",
     "aggregate over a data-dependent number of rows of t.csv"),
    ("SELECT SUM(x) FROM t WHERE x > 3", "grouped",
     "aggregate over a data-dependent number of rows of t.csv"),
    ("SELECT SUM(x) FILTER (WHERE x > 1) FROM t", "grouped",
     "aggregate over a data-dependent number of rows of t.csv"),
    *[(q, "raw", "raw of t.csv") for q in (
        "SELECT * FROM t LIMIT 3", "SELECT x FROM t ORDER BY x", "SELECT MAX(x) FROM t",
        "SELECT random() * x FROM t", "SELECT row_number() OVER () AS r FROM t",
        "SELECT k FROM t GROUP BY k", "SELECT COUNT(DISTINCT x) FROM t",
        "SELECT (SELECT MAX(x) FROM t) FROM t", "WITH s AS (SELECT * FROM t) SELECT * FROM s",
        "SELECT a.x FROM t a JOIN t b ON a.id = b.id", "SELECT 1; SELECT 2", "not sql")],
])
def test_each_query_shape_and_its_label(query: str, shape: str, label: str) -> None:
    assert query_shape(query)[1] == shape
    out = sql_labels(7, query, ("t",), [ROWS])
    assert out is not None and str(out) == label
    if shape == "filtered":  # the rows a WHERE keeps: how many depends on data
        assert out.gated and out.window is not None and out.window.hi == UNKNOWN
        assert out.window.gate == 7


def test_another_owner_s_table_stays_foreign() -> None:
    foreign = sql_labels(1, "SELECT * FROM t", ("t",), [source("t.csv", 20).__class__(
        "foreign", pure=True)])
    assert foreign is not None and not foreign.mine


# ---------------------------------------------------------------- PSI, SQL and a group-by

def _tables(n: int = 60) -> tuple[pd.DataFrame, pd.DataFrame]:
    """node_0's spend and node_1's balances, of 50 shared customers."""
    rng = np.random.default_rng(5)
    ids = rng.permutation(1000)[:n + 10]
    spend = pd.DataFrame({"id": ids[:n], "spend": rng.normal(100, 20, n).round(2)})
    balance = pd.DataFrame({"id": ids[10:], "balance": rng.integers(0, 10000, n)})
    return spend, balance


@pytest.fixture(scope="module")
def bank_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mp.Simulator]:
    """The init policies, each bank listing the other in its ``intersection`` rule and
    approving group-bys over its keys."""
    cluster = mp.ClusterSpec.simple(2)
    roots = {n.name: tmp_path_factory.mktemp(n.name) for n in cluster.nodes}
    spend, balance = _tables()
    spend.to_csv(roots["node_0"] / "spend.csv", index=False)
    balance.to_csv(roots["node_1"] / "balance.csv", index=False)
    policies = init_policies(cluster, approve=['{library: mplang.libs.groupby, to: ["*"]}'],
                             intersection=["*"])
    with mp.Simulator(cluster, data_roots=roots, policies=policies) as sim:
        yield sim


def _joined() -> tuple[Any, Any]:
    spend = mp.device("P0")(lambda: table.read_csv("spend.csv"))()
    balance = mp.device("P1")(lambda: table.read_csv("balance.csv"))()
    return psi.join(spend, balance, "id")


def test_mean_spend_of_joint_customers_grouped_by_the_other_bank_s_balance(
        bank_sim: mp.Simulator) -> None:
    def program() -> Any:
        jspend, jbalance = _joined()
        rich = mp.device("P1")(lambda t: table.to_tensor(table.sql(
            "SELECT CASE WHEN balance > 5000 THEN 1 ELSE 0 END AS k FROM t", t=t))[:, 0])(
            jbalance)
        spend = mp.device("P0")(lambda t: table.to_tensor(t, ["spend"])[:, 0])(jspend)
        return groupby.groupby_mean(rich, spend, 2), groupby.groupby_count(rich, 2)

    means, counts = mp.fetch(bank_sim, mp.evaluate(bank_sim, program))
    spend, balance = _tables()
    both = spend.merge(balance, on="id")
    want = both.groupby(both.balance > 5000).spend.mean()
    np.testing.assert_allclose(means, [want[False], want[True]], rtol=1e-4)
    np.testing.assert_array_equal(counts, both.groupby(both.balance > 5000).size().values)


def test_without_an_intersection_rule_the_join_is_refused(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    cluster = mp.ClusterSpec.simple(2)
    roots = {n.name: tmp_path_factory.mktemp(n.name) for n in cluster.nodes}
    spend, balance = _tables()
    spend.to_csv(roots["node_0"] / "spend.csv", index=False)
    balance.to_csv(roots["node_1"] / "balance.csv", index=False)
    with mp.Simulator(cluster, data_roots=roots) as sim, \
            pytest.raises(mp.MPRefusedError) as caught:
        mp.evaluate(sim, _joined)
    message = str(caught.value)
    assert message.startswith("node_0 refuses the program: op psi.join at "), message
    assert "sends which of the receiver's keys this party's table holds, which keys the " \
        "join matched of spend.csv, to node_1; add a rule {to: [node_1], when: " \
        "intersection} to declassify" in message, message


def test_a_filter_selects_rows_whose_sum_is_refused(bank_sim: mp.Simulator,
                                                    tmp_path: Path) -> None:
    """The top spender alone: a WHERE chosen by the driver keeps a data-dependent number
    of rows, so no ``min_rows`` rule lets their sum out."""
    def program() -> Any:
        spend = mp.device("P0")(lambda: table.read_csv("spend.csv"))()
        top = mp.device("P0")(lambda t: table.sql("SELECT spend FROM t WHERE spend > 140",
                                                  t=t))(spend)
        column = mp.device("P0")(lambda t: table.to_tensor(t))(top)
        return mp.put("P1", mp.device("P0")(lambda x: x.sum())(column))

    with pytest.raises(mp.MPRefusedError, match=r"aggregate over a data-dependent number of "
                       r"rows of spend\.csv, to node_1"):
        mp.evaluate(bank_sim, program)
