"""No private data inside an error that leaves a worker process: a kernel's failure
reaches the driver (and the other parties, in the abort) as a generic error naming the
op, its source line and the node; the worker's log and audit log keep the full text; a
query calling ``error()`` is refused when the program arrives."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.cluster.local import LocalCluster
from mplang.dialects import table
from mplang.dialects.table import TableType, sql_p
from mplang.records.audit import read_events
from tests.op_failures import every_text, traced_at
from tests.worker import support

SECRET = "alice_secret"
"""A value of node_1's private table that must not leave node_1."""
NAMES = pd.DataFrame({"name": [SECRET, "bob_secret"], "age": [31, 45]})
"""``names.csv`` in node_1's data root."""
SIZE = 4242
"""The value in node_0's private ``x.npy``."""
ATTACK = "SELECT CAST(error(string_agg(CAST(name AS VARCHAR), ',')) AS BIGINT) FROM t"
"""A query that would raise with every name of ``t`` as its error's text."""
NODES = ("node_0", "node_1", "node_2")


def reshape_by_first(v: np.ndarray) -> np.ndarray:
    """A host function (registered on the workers) whose JAX error quotes its input."""
    return np.asarray(jnp.zeros(3, jnp.float32).reshape(int(v[0])))


def line_of(tag: str) -> str:
    """``test_error_leaks_http.py:LINE`` of the line of this file ending with ``# @tag``."""
    return traced_at(__file__, tag)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """Worker processes for node_0..node_2 (policies let their plaintext go to the driver:
    only the errors are under test), node_1 holding ``names.csv``, node_0 ``x.npy``."""
    base = tmp_path_factory.mktemp("leaks_http")
    dev = support.dev_cluster(base, support.make_spec(support.free_ports(3)))
    for node in NODES:
        (dev.spec_path.parent / "policies" / f"{node}.yaml").write_text(
            "plaintext_to: [driver, node_0, node_1, node_2]\n")
        (base / "data" / node).mkdir(parents=True)
    NAMES.to_csv(base / "data" / "node_1" / "names.csv", index=False)
    np.save(base / "data" / "node_0" / "x.npy", np.array([SIZE], np.float32))
    cluster = LocalCluster(dev.spec_path, keys=dev.keys, audit_dir=base / "audit",
                           data_root=base / "data",
                           register=[f"{__name__}:{reshape_by_first.__name__}"])
    try:
        cluster.start(timeout=120)
        yield cluster, base / "audit"
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def driver(workers: tuple[LocalCluster, Path]) -> Iterator[mp.Driver]:
    with support.connected_driver(workers[0]) as d:
        yield d


def names_on_node_1(body: Any) -> Any:
    """A program running ``body(t)`` on node_1, ``t`` its private ``names.csv``."""
    def prog() -> Any:
        return simp.pcall((1,), body, simp.pcall((1,), lambda: table.read_csv("names.csv")))

    return prog


def logs(cluster: LocalCluster, audit: Path) -> dict[str, str]:
    """Each node's worker log and audit log, as text."""
    return {node: cluster.log_tail(node, 1 << 20) + (audit / f"{node}.jsonl").read_text()
            for node in NODES}


def test_the_error_string_agg_attack_is_refused(driver: mp.Driver) -> None:
    reason = ("function error() is refused: it raises an error with any text, which could "
              "carry a party's data out (query \"SELECT CAST(error(string_agg(CAST(name AS "
              "VARCHAR), ',')) AS BIGINT) FROM t\")")
    with pytest.raises(mp.MPTypeError) as traced:  # by the driver, while tracing
        mp.evaluate(driver, names_on_node_1(lambda t: table.sql(ATTACK, t=t)))  # @traced
    assert str(traced.value) == f"table.sql: {reason} (at {line_of('traced')})"

    forged = names_on_node_1(lambda t: sql_p.bind([t], {  # @forged
        "query": ATTACK, "names": ("t",), "type": TableType((("e", "int64"),))})[0])
    with pytest.raises(mp.MPRuntimeError) as refused:  # by the worker, before anything runs
        mp.evaluate(driver, forged)
    assert re.fullmatch(rf"party 1 \(node_1 at https://127\.0\.0\.1:\d+\) refused to run a "
                        rf"program of \d+ ops: 400 table\.sql at {re.escape(line_of('forged'))}:"
                        rf" {re.escape(reason)}( \(in op .*\))?", str(refused.value))
    assert SECRET not in every_text(refused.value)


def test_a_failing_cast_reaches_the_driver_without_the_private_value(
        workers: tuple[LocalCluster, Path], driver: mp.Driver) -> None:
    cluster, audit = workers
    query = "SELECT CAST(name AS INTEGER) AS n FROM t"
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(driver, names_on_node_1(lambda t: table.sql(query, t=t)))  # @cast
    err = info.value
    assert type(err) is mp.MPRuntimeError
    assert str(err) == f"op table.sql at {line_of('cast')} failed on node_1 (party 1; its log " \
                       "has the details)"
    assert (err.op, err.party, err.loc) == ("table.sql", 1, line_of("cast"))
    assert SECRET not in every_text(err) and "bob_secret" not in every_text(err)
    texts = logs(cluster, audit)
    # node_1's log and audit log have the whole story; the other parties heard nothing of it
    assert f"Could not convert string '{SECRET}' to INT32" in cluster.log_tail("node_1", 1 << 20)
    ends = [e for e in read_events([audit / "node_1.jsonl"]) if e["event"] == "end"]
    assert ends[-1]["status"] == "failed" and SECRET in ends[-1]["reason"]
    assert SECRET not in texts["node_0"] and SECRET not in texts["node_2"]
    # node_1 goes on serving
    ok = names_on_node_1(lambda t: table.sql("SELECT name FROM t WHERE age > 40", t=t))
    assert mp.fetch(driver, mp.evaluate(driver, ok))[1].to_pandas().name.tolist() == \
        ["bob_secret"]


def test_a_jax_error_quoting_private_data_stays_on_the_worker(
        workers: tuple[LocalCluster, Path], driver: mp.Driver) -> None:
    cluster, _ = workers
    out = mp.TensorType.of("float32", (3,))

    def prog() -> Any:
        x = simp.pcall((0,), lambda: tensor.load("x.npy"))
        return simp.pcall((0,), lambda v: tensor.pyfunc(reshape_by_first, v, out=out), x)  # @jax

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(driver, prog)
    assert str(info.value) == f"op tensor.pyfunc at {line_of('jax')} failed on node_0 (party 0; " \
                              "its log has the details)"
    assert str(SIZE) not in every_text(info.value)
    assert f"TypeError: cannot reshape array of shape (3,) (size 3) into shape {SIZE} " \
           f"(size {SIZE})" in cluster.log_tail("node_0", 1 << 20)
    again = mp.evaluate(driver, lambda: simp.pcall(
        (0,), lambda v: v * 2, simp.pcall((0,), lambda: tensor.load("x.npy"))))
    np.testing.assert_array_equal(mp.fetch(driver, again)[0], [2 * SIZE])
