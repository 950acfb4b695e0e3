"""No private data inside an error that leaves a party: a kernel's failure (DuckDB, JAX,
numpy, any kernel) reaches the driver as a generic error naming the op, its source line
and the node, while the party's log keeps the full text; SQL functions that raise with
text of the query's choosing are refused before anything runs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.dialects import table, table_sql
from mplang.dialects.table import TableType, sql_p
from tests.op_failures import every_text, traced_at

SECRET = "alice_secret"
"""A value of node_1's private table that no error reaching the driver may hold."""
NAMES = pd.DataFrame({"name": [SECRET, "bob_secret"], "age": [31, 45]})
"""``names.csv`` in node_1's data root."""
SIZE = 4242
"""The value in node_0's private ``x.npy``."""
ATTACK = "SELECT CAST(error(string_agg(CAST(x AS VARCHAR), ',')) AS BIGINT) FROM t"
"""A query that would raise with every row of ``t`` as its error's text."""
F32_3 = mp.TensorType.of("float32", (3,))


def line_of(tag: str) -> str:
    """``test_error_leaks.py:LINE`` of the line of this file ending with ``# @tag``."""
    return traced_at(__file__, tag)


def failed(op: str, tag: str, rank: int) -> str:
    """The error a party's failure of ``op`` (traced at the line tagged ``tag``) leaves
    the party as."""
    return f"op {op} at {line_of(tag)} failed on node_{rank} (party {rank}; its log has the " \
           "details)"


def reshape_by_first(v: np.ndarray) -> np.ndarray:
    """A host function whose JAX error quotes its input: the shape it asks for."""
    return np.asarray(jnp.zeros(3, jnp.float32).reshape(int(v[0])))


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mp.Simulator]:
    base = tmp_path_factory.mktemp("leaks")
    for node in ("node_0", "node_1"):
        (base / node).mkdir()
    NAMES.to_csv(base / "node_1" / "names.csv", index=False)
    np.save(base / "node_0" / "x.npy", np.array([SIZE], np.float32))
    # no policy: the programs reach the kernels whose failures are checked, and the values
    # they return to show a party goes on serving are fetched
    simulator = mp.Simulator(2, data_roots={n: base / n for n in ("node_0", "node_1")},
                             policies="open")
    try:
        yield simulator
    finally:
        simulator.close()


def names_on_node_1(body: Any) -> Any:
    """A program running ``body(t)`` on node_1, ``t`` its private ``names.csv``."""
    def prog() -> Any:
        return simp.pcall((1,), body, simp.pcall((1,), lambda: table.read_csv("names.csv")))

    return prog


# ---------------------------------------------------------------- refused SQL


def test_the_error_string_agg_attack_is_refused_while_tracing(sim: mp.Simulator) -> None:
    with pytest.raises(mp.MPTypeError) as info:
        mp.evaluate(sim, names_on_node_1(lambda t: table.sql(ATTACK, t=t)))  # @attack
    assert str(info.value) == (
        "table.sql: function error() is refused: it raises an error with any text, which could "
        "carry a party's data out (query \"SELECT CAST(error(string_agg(CAST(x AS VARCHAR), "
        f"',')) AS BIGINT) FROM t\") (at {line_of('attack')})")


@pytest.mark.parametrize(("query", "function"), [
    ("SELECT \"ERROR\"(name) AS e FROM t", "error"),
    ("SELECT system.main.error(name) AS e FROM t", "error"),
    ("SELECT string_agg(name, ',').error() AS e FROM t", "error"),
    ("SELECT age FROM t WHERE age IN (SELECT error(name) FROM t)", "error"),
    ("WITH a AS (SELECT error(name) AS e FROM t) SELECT * FROM a", "error"),
    ("SELECT list_transform([name], lambda n: error(n)) AS e FROM t", "error"),
    ("SELECT assert_true(age < 0, name) AS e FROM t", "assert_true"),
    ("SELECT * FROM query('SELECT error(name) FROM t')", "query"),
    ("SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
     "json_execute_serialized_sql"),
    ("SELECT * FROM histogram_values(t, age, technique := 'x')", "histogram_values"),
])
def test_every_spelling_of_a_refused_function_is_refused(query: str, function: str) -> None:
    con = table_sql.sql_connection()
    try:
        problem = table_sql.query_problem(con, query)
    finally:
        con.close()
    assert problem == f"function {function}() is refused: it " \
                      f"{table_sql.REFUSED_FUNCTIONS[function]}"


def test_queries_that_only_look_alike_run(sim: mp.Simulator) -> None:
    query = "SELECT name AS error, 'error(x)' AS s, age FROM t ORDER BY age"
    got = mp.fetch(sim, mp.evaluate(sim, names_on_node_1(lambda t: table.sql(query, t=t))))[1]
    assert got.to_pandas().to_dict("list") == {"error": list(NAMES.name),
                                               "s": ["error(x)"] * 2, "age": list(NAMES.age)}


def test_the_refused_functions_cover_duckdb_s_raising_macros() -> None:
    """Every DuckDB function whose definition raises with text it is given (not a
    literal) is refused, and so is ``error`` itself."""
    con = duckdb.connect(":memory:", config=table_sql.SQL_CONFIG)
    try:
        macros = con.execute("SELECT function_name, macro_definition FROM duckdb_functions() "
                             "WHERE macro_definition IS NOT NULL").fetchall()
        names = {row[0] for row in con.execute("SELECT function_name FROM duckdb_functions()"
                                               ).fetchall()}
    finally:
        con.close()
    raising = {name for name, body in macros
               if re.search(r"\"?error\"?\((?!'[^']*'\))", body) or "query_table(" in body}
    assert raising == {"assert_true", "histogram_values"}
    assert raising | {"error", "query", "json_execute_serialized_sql"} == \
        set(table_sql.REFUSED_FUNCTIONS)
    assert set(table_sql.REFUSED_FUNCTIONS) <= names


def test_a_forged_attack_fails_at_run_time_without_the_data(
        sim: mp.Simulator, caplog: pytest.LogCaptureFixture) -> None:
    """A driver that skips tracing: the party refuses the query when it runs."""
    forged = names_on_node_1(lambda t: sql_p.bind([t], {  # @forged
        "query": ATTACK.replace("x", "name"), "names": ("t",),
        "type": TableType((("e", "int64"),))})[0])
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, forged)
    assert str(info.value) == failed("table.sql", "forged", 1)
    assert SECRET not in every_text(info.value)
    assert "function error() is refused" in caplog.text


# ---------------------------------------------------------------- failing kernels


def test_a_failing_cast_of_private_strings_reaches_the_driver_without_them(
        sim: mp.Simulator, caplog: pytest.LogCaptureFixture) -> None:
    query = "SELECT CAST(name AS INTEGER) AS n FROM t"
    cast = names_on_node_1(lambda t: table.sql(query, t=t))  # @cast
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, cast)
    err = info.value
    assert type(err) is mp.MPRuntimeError
    assert str(err) == failed("table.sql", "cast", 1)
    assert (err.op, err.party, err.loc) == ("table.sql", 1, line_of("cast"))
    assert err.__cause__ is None and err.__context__ is None
    assert SECRET not in every_text(err) and "bob_secret" not in every_text(err)
    # the party's log has the whole story, its data included
    assert re.search(rf"op table\.sql at {re.escape(line_of('cast'))} \(run /\S+\) failed on "
                     rf"node_1: MPRuntimeError: .*Conversion Error: Could not convert string "
                     rf"'{SECRET}' to INT32", caplog.text)
    # and the party goes on serving
    ok = names_on_node_1(lambda t: table.sql("SELECT name FROM t WHERE age > 40", t=t))
    assert mp.fetch(sim, mp.evaluate(sim, ok))[1].to_pandas().name.tolist() == ["bob_secret"]


def test_a_jax_error_quoting_private_data_stays_on_the_party(
        sim: mp.Simulator, caplog: pytest.LogCaptureFixture) -> None:
    def prog() -> Any:
        x = simp.pcall((0,), lambda: tensor.load("x.npy"))
        return simp.pcall((0,), lambda v: tensor.pyfunc(reshape_by_first, v, out=F32_3),  # @jax
                          x)

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog)
    assert str(info.value) == failed("tensor.pyfunc", "jax", 0)
    assert str(SIZE) not in every_text(info.value)
    assert f"TypeError: cannot reshape array of shape (3,) (size 3) into shape {SIZE} " \
           f"(size {SIZE})" in caplog.text
    out = mp.evaluate(sim, lambda: simp.pcall(  # the party goes on serving
        (0,), lambda v: v * 2, simp.pcall((0,), lambda: tensor.load("x.npy"))))
    np.testing.assert_array_equal(mp.fetch(sim, out)[0], [2 * SIZE])


def test_errors_about_the_program_keep_their_text(sim: mp.Simulator) -> None:
    """A missing file and a path outside the data root hold no data: told as they are."""
    with pytest.raises(mp.MPRuntimeError, match=r"^party 0: tensor\.load: node_0 has no file "
                                                r"'nope\.npy' in its data root"):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: tensor.load(
            "nope.npy", dtype=np.float32, shape=(1,))))
    with pytest.raises(mp.MPRuntimeError, match=r"^party 1: op table\.read .*: table\.read_csv: "
                                                r"path '\.\./node_0/x\.csv' escapes the data "
                                                r"root of node_1"):
        mp.evaluate(sim, lambda: simp.pcall((1,), lambda: table.read_csv(
            "../node_0/x.csv", schema={"a": "int64"})))


def test_a_host_function_s_program_errors_keep_their_text(sim: mp.Simulator) -> None:
    """A host function name nobody registered, or a result of another type than the
    program declares: text of the program's own (the actual shape, which data may set,
    is not told)."""
    def three(v: np.ndarray) -> np.ndarray:
        return np.zeros(int(v[0]) % 7 + 1, np.float32)  # shape (1,): SIZE % 7 == 0

    def calling(fn: Any) -> Any:
        x = simp.pcall((0,), lambda: tensor.load("x.npy"))
        return simp.pcall((0,), lambda v: tensor.pyfunc(fn, v, out=F32_3), x)

    with pytest.raises(mp.MPRuntimeError, match=r"^host function 'nowhere' is not registered "
                       r"on this party; start the worker with --register nowhere \(in op "
                       r"tensor\.pyfunc at /\S+, traced at test_error_leaks\.py:\d+\)$"):
        mp.evaluate(sim, lambda: calling("nowhere"))
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, lambda: calling(three))
    assert re.fullmatch(r"\S+\.three#\w+ result 0 does not have the declared type f32\[3\] "
                        r"\(in op tensor\.pyfunc at /\S+, traced at test_error_leaks\.py:\d+\)",
                        str(info.value)), str(info.value)
    assert "(1,)" not in str(info.value)


def test_a_failure_s_full_text_reaches_the_worker_s_own_records(tmp_path: Path) -> None:
    """`SimpWorker.run` hands the full text to its caller's hook (the HTTP worker writes it
    in its audit log) and raises the generic error."""
    NAMES.to_csv(tmp_path / "names.csv", index=False)
    sim = mp.Simulator(1, data_roots={"node_0": tmp_path})
    try:
        program = mp.compile(lambda: simp.pcall((0,), lambda: table.sql(
            "SELECT CAST(name AS INTEGER) AS n FROM t",
            t=table.read_csv("names.csv", schema={"name": "string", "age": "int64"}))),
            world_size=1)
        heard: list[str] = []
        with pytest.raises(mp.MPRuntimeError) as info:
            sim.mesh.workers[0].run(program.graph, [], "exec-1", on_failure=heard.append)
    finally:
        sim.close()
    assert SECRET not in every_text(info.value)
    assert len(heard) == 1 and f"Could not convert string '{SECRET}' to INT32" in heard[0]
