"""Tables over HTTP workers: a driver learns a table file's columns from ``/describe``
(never its rows), parties read their own files, run SQL and send tables to each
other as Arrow IPC, and the same program gives the simulator's results."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import mplang as mp
from mplang import simp
from mplang.dialects import table
from mplang.dialects.table import TableType, sql_p
from mplang.edsl.serde import decode_type
from tests.worker import support

ORDERS = [pd.DataFrame({"customer": [1, 2, 1, 3, 2, 1], "amount": [5.0, 7.5, 2.5, 1.0, 4.0, 3.0]}),
          pd.DataFrame({"customer": [2, 3, 3], "amount": [10.0, 20.0, 30.0]})]
"""``orders.csv`` of node_0 and node_1."""
NAMES = pd.DataFrame({"customer": [1, 2, 3], "name": ["ann", "bob", "cy"]})
"""``names.parquet`` of node_1."""


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> support.DevCluster:
    return support.dev_cluster(tmp_path_factory.mktemp("tables"),
                               support.make_spec(support.free_ports(3)))


@pytest.fixture(scope="module")
def roots(dev: support.DevCluster) -> list[Path]:
    dirs = [dev.spec_path.parent / "data" / f"node_{r}" for r in range(3)]
    for d in dirs:
        d.mkdir(parents=True)
    for d, orders in zip(dirs, ORDERS, strict=False):
        orders.to_csv(d / "orders.csv", index=False)
    NAMES.to_parquet(dirs[1] / "names.parquet", index=False)
    return dirs


@pytest.fixture(scope="module")
def workers(dev: support.DevCluster, roots: list[Path]) -> Iterator[list[support.ThreadWorker]]:
    """node_0..node_2 in this process, each with its data root and a policy letting its
    plaintext go to the driver and to the other nodes (these tests fetch and move what
    was read) and programs write ``out/*.csv``."""
    policies = dev.spec_path.parent / "policies"
    policies.mkdir(exist_ok=True)
    for r in range(3):
        (policies / f"node_{r}.yaml").write_text(
            "plaintext_to: [driver, node_0, node_1, node_2]\nwrites: [out/*.csv]\n")
    started = [support.ThreadWorker(dev, f"node_{r}", timeout=10.0) for r in range(3)]
    for w, root in zip(started, roots, strict=True):
        w.server.worker.data_root = root
        w.start()
    yield started
    for w in started:
        w.stop()


@pytest.fixture(scope="module")
def driver(dev: support.DevCluster, workers: Any) -> Iterator[mp.Driver]:
    drv = mp.Driver(dev.spec_path, key=dev.keys / "driver.key", timeout=10.0, run_timeout=60.0)
    yield drv
    drv.close()


def describe(dev: support.DevCluster, rank: int, **fields: Any) -> Any:
    with dev.client("driver", rank) as client:
        return client.post("/describe", content=support.frame(fields))


def totals() -> Any:
    """Each of node_0 and node_1 sums its orders per customer; node_1 joins node_0's sums
    with its names and writes the report into its data root."""
    orders = simp.pcall((0, 1), lambda: table.read_csv("orders.csv"))
    sums = simp.pcall((0, 1), lambda t: table.sql(
        "SELECT customer, SUM(amount) AS total FROM o GROUP BY customer ORDER BY customer",
        o=t), orders)
    theirs = simp.shuffle_static(simp.pcall((0,), lambda s: s, sums), {1: 0})

    def report(mine: Any, other: Any) -> Any:
        r = table.sql("SELECT n.name, COALESCE(a.total, 0) + COALESCE(b.total, 0) AS total "
                      "FROM n LEFT JOIN a USING (customer) LEFT JOIN b USING (customer) "
                      "ORDER BY n.name", n=table.read_parquet("names.parquet"), a=mine, b=other)
        table.write_csv(r, "out/report.csv")
        return r, table.to_tensor(r, ["total"], rows=3)

    return sums, simp.pcall((1,), report, sums, theirs)


def test_a_table_program_over_http_matches_pandas(driver: mp.Driver,
                                                  roots: list[Path]) -> None:
    sums, (report, x) = mp.fetch(driver, mp.evaluate(driver, totals))
    for i in range(2):
        want = ORDERS[i].groupby("customer")["amount"].sum().reset_index(name="total")
        pd.testing.assert_frame_equal(sums[i].to_pandas(), want)
    assert sums[2] is None
    both = pd.concat(ORDERS).groupby("customer")["amount"].sum()
    want = NAMES.assign(total=NAMES.customer.map(both))[["name", "total"]]
    pd.testing.assert_frame_equal(report[1].to_pandas(), want)
    np.testing.assert_allclose(x[1], want[["total"]].to_numpy(), rtol=1e-6)
    pd.testing.assert_frame_equal(pd.read_csv(roots[1] / "out" / "report.csv"), want)


def test_the_simulator_gives_the_same_results(roots: list[Path]) -> None:
    sim = mp.Simulator(3, data_roots={f"node_{r}": roots[r] for r in range(3)},
                       policies="open")  # it fetches and moves what was read, as above
    try:
        sums, (report, x) = mp.fetch(sim, mp.evaluate(sim, totals))
    finally:
        sim.close()
    both = pd.concat(ORDERS).groupby("customer")["amount"].sum()
    want = list(NAMES.customer.map(both))
    assert report[1].column("total").to_pylist() == want == [10.5, 21.5, 51.0]
    np.testing.assert_allclose(x[1][:, 0], want)
    assert [s is None for s in sums] == [False, False, True]


def test_describe_answers_a_table_file_with_its_type(dev: support.DevCluster,
                                                     workers: Any) -> None:
    ok = describe(dev, 1, what="table", path="names.parquet", format="parquet")
    assert ok.status_code == 200
    assert decode_type(ok.json()["type"]) == TableType((("customer", "int64"),
                                                        ("name", "string")), len(NAMES))
    csv = describe(dev, 0, what="table", path="orders.csv", format="csv").json()
    assert csv == {"type": {"table.table": [[["customer", "int64"], ["amount", "float64"]],
                                            len(ORDERS[0])]}}
    missing = describe(dev, 2, what="table", path="orders.csv", format="csv")
    assert missing.status_code == 404
    assert missing.json()["error"] == (
        "table.read_csv: node_2 has no file 'orders.csv' in its data root; put it there (by "
        "default ./data/node_2; mp.Simulator(..., data_roots=...), `mplang run --sim N "
        "--data-root DIR` or `mplang worker --data-root DIR` choose another) or fix the path")
    escape = describe(dev, 0, what="table", path="../node_1/names.parquet", format="parquet")
    assert escape.status_code == 400
    assert "escapes the data root of node_0" in escape.json()["error"]
    assert describe(dev, 0, what="table", path="orders.csv", format="xls").status_code == 400
    assert describe(dev, 0, what="table", path=["x"], format="csv").status_code == 400


def test_a_forged_query_is_refused_by_the_worker(driver: mp.Driver, roots: list[Path]) -> None:
    target = roots[0].parent / "stolen.csv"

    def prog() -> Any:
        t = simp.pcall((0,), lambda: table.read_csv("orders.csv"))
        return simp.pcall((0,), lambda t: sql_p.bind([t], {
            "query": f"COPY o TO '{target}'", "names": ("o",),
            "type": TableType((("x", "int64"),))})[0], t)

    with pytest.raises(mp.MPRuntimeError, match=r"party 0 \(node_0 at .*\) refused to run a "
                                                r"program of 2 ops: 400 table\.sql at "
                                                r"test_tables_http\.py:\d+: only SELECT "
                                                r"statements run, not COPY"):
        mp.evaluate(driver, prog)  # refused when the program arrives: nothing runs
    assert not target.exists()


def test_constant_sql_and_tensors_on_worker_processes(ctx: mp.Simulator | mp.Driver) -> None:
    """The shared worker processes (``mplang worker``) and the simulator, on one program of
    driver constants: SQL on party 0, its result sent to party 2 as Arrow IPC."""
    def prog() -> Any:
        t = simp.pcall((0,), lambda: table.constant(ORDERS[0]))
        top = simp.pcall((0,), lambda t: table.sql(
            "SELECT customer, MAX(amount) AS top FROM o GROUP BY customer ORDER BY customer",
            o=t), t)
        moved = simp.shuffle_static(top, {2: 0})
        return moved, simp.pcall((2,), lambda m: table.to_tensor(m, rows=3), moved)

    moved, x = mp.fetch(ctx, mp.evaluate(ctx, prog))
    want = ORDERS[0].groupby("customer")["amount"].max().reset_index(name="top")
    pd.testing.assert_frame_equal(moved[2].to_pandas(), want)
    np.testing.assert_allclose(x[2], want.to_numpy(), rtol=1e-6)
    assert x[0] is None and x[1] is None


def test_a_put_dataframe_and_a_fetched_one_on_worker_processes(
        ctx: mp.Simulator | mp.Driver) -> None:
    """A DataFrame put on P0 crosses to its worker as a table constant (Arrow IPC in the
    program) and comes back from P2 as a DataFrame (Arrow IPC, never pickle)."""
    def prog() -> Any:
        people = mp.put("P0", NAMES)
        moved = mp.put("P2", people)
        return mp.device("P2")(lambda t: table.sql(
            "SELECT name, customer * 10 AS c10 FROM t ORDER BY name DESC", t=t))(moved)

    got = mp.fetch(ctx, mp.evaluate(ctx, prog))
    want = NAMES.assign(c10=NAMES.customer * 10)[["name", "c10"]].iloc[::-1]
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True))
