"""The table dialect: its type, files, SQL and the tensor bridge, checked against pandas
and numpy on a two-party simulator whose parties hold their own files."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mplang as mp
from mplang import simp
from mplang.analysis.cost_model import local_cost
from mplang.dialects import table
from mplang.dialects.table import TableType
from mplang.dialects.table_arrow import ipc_bytes
from mplang.edsl.serde import decode_type, encode_type
from mplang.edsl.typing import MPType, TensorType
from mplang.flows.engine import local_conservative
from mplang.kernels.table_wire import decode_ipc
from mplang.transport import wire

RNG = np.random.default_rng(11)
SALES = [pd.DataFrame({"region": RNG.choice(["north", "south", "east"], n),
                       "units": RNG.integers(0, 100, n),
                       "price": RNG.uniform(1, 10, n).round(2)}) for n in (12, 7)]
"""Party i's ``sales.csv``."""
PEOPLE = pd.DataFrame({"id": np.arange(6, dtype=np.int64),
                       "name": ["ann", "bob", "cy", "dee", "ed", "flo"],
                       "age": [31, 45, 27, 38, 52, 29]})


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("tables")
    roots = {f"node_{i}": base / f"node_{i}" for i in range(2)}
    for i, root in enumerate(roots.values()):
        root.mkdir()
        SALES[i].to_csv(root / "sales.csv", index=False)
        PEOPLE.to_parquet(root / "people.parquet", index=False)
    (roots["node_0"] / "dates.csv").write_text("day,amount\n2024-01-02,3\n2024-02-03,4\n")
    (roots["node_0"] / "ragged.csv").write_text("a,b\n1,2\n3,4\n5\n")
    (roots["node_1"] / "other.csv").write_text("x\n1\n")
    return roots


@pytest.fixture(scope="module")
def sim(roots: dict[str, Path]) -> Iterator[mp.Simulator]:
    simulator = mp.Simulator(2, data_roots=roots, policies="open")  # mechanics, not policies
    try:
        yield simulator
    finally:
        simulator.close()


def run(sim: mp.Simulator, fn: Any) -> Any:
    return mp.fetch(sim, mp.evaluate(sim, fn))


# ---------------------------------------------------------------- the type


def test_table_type_prints_serializes_and_bounds_its_size() -> None:
    t = TableType((("id", "int64"), ("name", "string"), ("ok", "bool")))
    assert str(t) == "table<id:i64,name:str,ok:bool>"
    assert str(TableType((("a b", "float32"),), rows=3)) == "table<'a b':f32>[3]"
    assert TableType.of({"id": np.int64, "name": str, "ok": "bool"}) == t
    for vtype in (t, TableType(t.columns, 5), MPType(t, mp.Mask.of([0, 1]))):
        data = json.loads(json.dumps(encode_type(vtype)))
        assert decode_type(data) == vtype
    assert encode_type(t) == {"table.table": [[["id", "int64"], ["name", "string"],
                                               ["ok", "bool"]], None]}
    numeric = TableType((("a", "int64"), ("b", "bool")), rows=1000)
    assert 9000 <= numeric.wire_bytes() <= 9000 + 4096 + 2 * (125 + 64 + 512)
    assert t.wire_bytes() == table.MAX_TABLE_BYTES  # a string column: no bound but the cap


@pytest.mark.parametrize(("columns", "rows", "message"), [
    ((), None, r"a table has 1 to 4096 columns, got 0"),
    ((("", "int64"),), None, r"a column name must be a non-empty string"),
    ((("a", "int64"), ("a", "string")), None, r"column names must be unique, but 'a' occurs"),
    ((("a", "float16"),), None, r"column 'a' has dtype 'float16'; table columns have one of"),
    ((("a", "complex64"),), None, r"column 'a' has dtype 'complex64'"),
    ((("a", "int64"),), -1, r"row count must be None, a symbol or an int in \[0, "),
    ((("a", "int64"),), 2.0, r"row count must be None, a symbol or an int"),
])
def test_malformed_table_types_are_refused(columns: Any, rows: Any, message: str) -> None:
    with pytest.raises(mp.MPTypeError, match=message):
        TableType(columns, rows)


@pytest.mark.parametrize("body", [None, [], [[["a"]], None], [[["a", "int64"]], "3"],
                                  [[["a", "bad"]], None], [[["a", 1]], None]])
def test_malformed_serialized_table_types_name_their_field(body: Any) -> None:
    with pytest.raises(mp.MPSerializationError, match=r"^malformed program: x\.type\.table\.table"):
        decode_type({"table.table": body}, "x.type")


# ---------------------------------------------------------------- constants and SQL


def test_constant_and_group_by_match_pandas(sim: mp.Simulator) -> None:
    df = SALES[0]

    def prog() -> Any:
        def body() -> Any:
            t = table.constant(df)
            return t, table.sql("SELECT region, CAST(SUM(units) AS BIGINT) AS units, "
                                "AVG(price) AS price, COUNT(*) AS n FROM sales GROUP BY region "
                                "ORDER BY region", sales=t)
        return simp.pcall((0,), body)

    const, grouped = run(sim, prog)
    pd.testing.assert_frame_equal(const[0].to_pandas(), df)
    assert const[1] is None
    want = df.groupby("region").agg(units=("units", "sum"), price=("price", "mean"),
                                    n=("units", "size")).reset_index()
    pd.testing.assert_frame_equal(grouped[0].to_pandas(), want, check_dtype=False)
    assert grouped[0].schema == pa.schema([("region", pa.string()), ("units", pa.int64()),
                                           ("price", pa.float64()), ("n", pa.int64())])


def test_sql_result_type_is_computed_while_tracing(sim: mp.Simulator) -> None:
    def prog() -> Any:
        return simp.pcall((0,), lambda: table.sql(
            "SELECT id, age > 30 AS senior, upper(name) AS name, age * 1.5::DOUBLE AS x, "
            "age::INTEGER AS a32, age::UTINYINT AS a8, age::FLOAT AS f FROM p",
            p=table.constant(PEOPLE)))

    out = mp.evaluate(sim, prog)
    assert str(out.base_type) == ("table<id:i64,senior:bool,name:str,x:f64,a32:i32,a8:u8,"
                                  "f:f32>[6]")  # a projection keeps p's 6 rows
    got = mp.fetch(sim, out)[0].to_pandas()
    np.testing.assert_array_equal(got["senior"], PEOPLE["age"] > 30)
    assert list(got["name"]) == [n.upper() for n in PEOPLE["name"]]
    np.testing.assert_allclose(got["x"], PEOPLE["age"] * 1.5)
    assert got["a8"].dtype == np.uint8 and got["f"].dtype == np.float32


def test_sql_joins_two_tables_like_pandas_merge(sim: mp.Simulator) -> None:
    orders = pd.DataFrame({"pid": [0, 2, 2, 5, 9], "amount": [1.5, 2.0, 3.0, 4.0, 5.0]})

    def body() -> Any:
        return table.sql("SELECT p.name, o.amount FROM p JOIN o ON p.id = o.pid "
                         "ORDER BY o.amount", p=table.constant(PEOPLE), o=table.constant(orders))

    got = run(sim, lambda: simp.pcall((1,), body))[1].to_pandas()
    want = PEOPLE.merge(orders, left_on="id", right_on="pid")[["name", "amount"]] \
        .sort_values("amount").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want)


@pytest.mark.parametrize(("query", "message"), [
    ("SELECT a, SUM(b) AS s FROM t GROUP BY a",
     r"table\.sql: column 's' is HUGEINT \(SUM of integers\); CAST\(SUM\(\.\.\.\) AS BIGINT\) "
     r"AS s \(query 'SELECT a, SUM\(b\) AS s FROM t GROUP BY a'\)"),
    ("SELECT zz FROM t", r"table\.sql: Binder Error: Referenced column \"zz\" not found .*"
                         r"\(query 'SELECT zz FROM t'\)"),
    ("SELECT 1.5 AS d FROM t", r"column 'd' is DECIMAL\(2,1\) .*CAST\(\.\.\. AS DOUBLE\) AS d"),
    ("SELECT current_date AS d", r"column 'd' is DATE \(a date\); CAST\(\.\.\. AS VARCHAR\)"),
    ("SELECT NULL AS n", r"column 'n' is \"NULL\" \(an untyped NULL\); CAST\(NULL AS BIGINT\)"),
    ("SELECT [a] AS l FROM t", r"column 'l' is BIGINT\[\], which no table column holds; CAST "
                               r"it to one of BOOLEAN, .*VARCHAR"),
    ("SELECT a, a FROM t", r"the result has two columns named 'a'; name them apart with AS"),
    ("SELEC 1", r"table\.sql: Parser Error: syntax error at or near \"SELEC\""),
    ("SELECT * FROM nope", r"Catalog Error: Table with name nope does not exist"),
])
def test_bad_queries_fail_while_tracing_naming_the_query(sim: mp.Simulator, query: str,
                                                         message: str) -> None:
    df = pd.DataFrame({"a": [1, 2], "b": [3, 4]})
    with pytest.raises(mp.MPTypeError, match=message):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.sql(query,
                                                                    t=table.constant(df))))


def test_sql_arguments_are_checked(sim: mp.Simulator) -> None:
    df = pd.DataFrame({"a": [1]})
    with pytest.raises(mp.MPTypeError, match=r"table\.sql: table 't' must be an MPLang table, "
                                             r"got DataFrame \(make one with table\.constant\)"):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.sql("SELECT * FROM t", t=df)))
    with pytest.raises(mp.MPTypeError, match=r"table\.sql: table 't' must be a table, got "
                                             r"i32\[2\]"):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.sql(
            "SELECT * FROM t", t=mp.tensor.constant(np.arange(2, dtype=np.int32)))))
    with pytest.raises(mp.MPTypeError, match=r"table\.sql is a party-local op; at the simp level"):
        mp.evaluate(sim, lambda: table.sql("SELECT 1 AS x"))


# ---------------------------------------------------------------- files


def test_read_csv_types_come_from_each_party_s_file(sim: mp.Simulator) -> None:
    def prog() -> Any:
        t = simp.pcall((0, 1), lambda: table.read_csv("sales.csv"))
        return t, simp.pcall((0, 1), lambda t: table.sql(
            "SELECT region, CAST(SUM(units) AS BIGINT) AS units FROM s GROUP BY region "
            "ORDER BY region", s=t), t)

    t, total = mp.evaluate(sim, prog)
    assert t.base_type == TableType((("region", "string"), ("units", "int64"),
                                     ("price", "float64")))
    got, sums = mp.fetch(sim, (t, total))
    for i in range(2):
        pd.testing.assert_frame_equal(got[i].to_pandas(), SALES[i])
        want = SALES[i].groupby("region")["units"].sum().reset_index()
        pd.testing.assert_frame_equal(sums[i].to_pandas(), want)


def test_read_csv_with_a_schema_reads_those_columns_as_those_dtypes(sim: mp.Simulator) -> None:
    out = run(sim, lambda: simp.pcall((1,), lambda: table.read_csv(
        "sales.csv", schema={"units": "int32", "region": "string"})))[1]
    assert out.schema == pa.schema([("units", pa.int32()), ("region", pa.string())])
    pd.testing.assert_frame_equal(out.to_pandas(), SALES[1][["units", "region"]],
                                  check_dtype=False)
    dates = run(sim, lambda: simp.pcall((0,), lambda: table.read_csv("dates.csv")))[0]
    assert dates.to_pylist() == [{"day": "2024-01-02", "amount": 3},
                                 {"day": "2024-02-03", "amount": 4}]  # dates as text


def test_parquet_and_csv_round_trip_through_the_data_root(sim: mp.Simulator,
                                                          roots: dict[str, Path]) -> None:
    def prog() -> Any:
        def body() -> Any:
            p = table.read_parquet("people.parquet")
            old = table.sql("SELECT id, name, age FROM p WHERE age > 30 ORDER BY id", p=p)
            table.write_parquet(old, "out/old.parquet")
            table.write_csv(old, "out/old.csv")
            return p
        return simp.pcall((0,), body)

    people = run(sim, prog)[0]
    pd.testing.assert_frame_equal(people.to_pandas(), PEOPLE)
    want = PEOPLE[PEOPLE.age > 30].reset_index(drop=True)
    out = roots["node_0"] / "out"
    pd.testing.assert_frame_equal(pq.read_table(out / "old.parquet").to_pandas(), want)
    pd.testing.assert_frame_equal(pd.read_csv(out / "old.csv"), want)
    assert sorted(p.name for p in out.iterdir()) == ["old.csv", "old.parquet"]  # no temp files
    again = run(sim, lambda: simp.pcall((0,), lambda: table.read_csv("out/old.csv")))[0]
    pd.testing.assert_frame_equal(again.to_pandas(), want)


def failed_on_node_0(op: str) -> str:
    """The generic error of a run-time failure of ``op`` on node_0 (its detail is logged)."""
    return rf"^op {re.escape(op)} at test_table_ops\.py:\d+ failed on node_0 \(party 0; its " \
           r"log has the details\)$"


def test_a_ragged_csv_row_fails_naming_the_file_and_line(sim: mp.Simulator,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(mp.MPRuntimeError, match=r"table\.read_csv: 'ragged\.csv' on node_0 is "
                                                r"not a valid CSV file of its type: line 4 has 1 "
                                                r"fields, expected 2"):  # its type, while tracing
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.read_csv("ragged.csv")))
    with pytest.raises(mp.MPRuntimeError, match=failed_on_node_0("table.read")):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.read_csv(
            "ragged.csv", schema=[("a", "int64"), ("b", "int64")])))
    assert "'ragged.csv' on node_0 is not a valid CSV file of its type: line 4 has 1 fields, " \
           "expected 2" in caplog.text


def test_files_that_differ_from_their_type_fail_at_run_time(
        sim: mp.Simulator, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(mp.MPRuntimeError, match=failed_on_node_0("table.read")):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.read_csv(
            "sales.csv", schema={"region": "int64"})))
    assert "table.read_csv: 'sales.csv' on node_0 is not a valid CSV file of its type: In CSV " \
           "column #0: Row #2: CSV conversion error to int64: invalid value '…'" in caplog.text
    with pytest.raises(mp.MPRuntimeError, match=failed_on_node_0("table.read")):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.read_csv(
            "sales.csv", schema={"nope": "int64"})))
    assert "Column 'nope' in include_columns does not exist in CSV file" in caplog.text


def test_parties_with_different_schemas_fail_while_tracing(sim: mp.Simulator,
                                                            roots: dict[str, Path]) -> None:
    (roots["node_0"] / "other.csv").write_text("x\nabc\n")
    with pytest.raises(mp.MPTypeError, match=r"table\.read_csv: 'other\.csv' has different "
                                             r"types on the parties \(party 0: table<x:str>, "
                                             r"party 1: table<x:i64>\)"):
        mp.evaluate(sim, lambda: simp.pcall((0, 1), lambda: table.read_csv("other.csv")))
    with pytest.raises(mp.MPRuntimeError, match=r"table\.read_csv: node_1 has no file "
                                                r"'missing\.csv' in its data root"):
        mp.evaluate(sim, lambda: simp.pcall((1,), lambda: table.read_csv("missing.csv")))
    with pytest.raises(mp.MPTypeError, match=r"table\.read_csv: path 'a\.txt' must name a "
                                             r"\.csv file"):
        mp.evaluate(sim, lambda: simp.pcall((1,), lambda: table.read_csv("a.txt")))


def test_describe_input_answers_with_a_table_type(sim: mp.Simulator) -> None:
    got = sim.describe_input(1, {"what": "table", "path": "people.parquet",
                                 "format": "parquet"})
    assert got == TableType((("id", "int64"), ("name", "string"), ("age", "int64")),
                            len(PEOPLE))
    with pytest.raises(mp.MPSerializationError, match=r"field 'what' must be one of 'file', "
                                                      r"'object', 'table', got 'secrets'"):
        sim.describe_input(0, {"what": "secrets"})
    with pytest.raises(mp.MPSerializationError, match=r"field 'format' must be one of csv, "
                                                      r"parquet, got 'xls'"):
        sim.describe_input(0, {"what": "table", "path": "a.xls", "format": "xls"})


# ---------------------------------------------------------------- tensors


def test_to_tensor_and_back_match_numpy(sim: mp.Simulator) -> None:
    def body() -> Any:
        p = table.constant(PEOPLE)
        x = table.to_tensor(p, ["id", "age"])
        one = table.to_tensor(p, "age")
        y = mp.tensor.run_jax(lambda v: v * 2, x)
        return x, one, table.from_tensor(y, ["id2", "age2"]), \
            table.from_tensor(mp.tensor.run_jax(jnp.ravel, one), ["age"])

    x, one, back, flat = run(sim, lambda: simp.pcall((0,), body))
    want = PEOPLE[["id", "age"]].to_numpy()
    np.testing.assert_array_equal(x[0], want)
    assert x[0].dtype == np.int32 and x[0].shape == (6, 2)  # JAX's canonical int64
    assert one[0].shape == (6, 1)
    np.testing.assert_array_equal(back[0].to_pandas().to_numpy(), want * 2)
    assert back[0].schema == pa.schema([("id2", pa.int32()), ("age2", pa.int32())])
    assert flat[0].column("age").to_pylist() == list(PEOPLE["age"])


def test_to_tensor_of_mixed_columns_takes_their_common_dtype(sim: mp.Simulator) -> None:
    df = pd.DataFrame({"i": np.array([1, 2], np.int32), "f": np.array([0.5, 1.5], np.float32),
                       "b": [True, False]})
    out = mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.to_tensor(
        table.constant(df), ["i", "f", "b"])))
    assert out.base_type == TensorType("float32", (2, 3))  # float64 (numpy) -> JAX's f32
    np.testing.assert_array_equal(mp.fetch(sim, out)[0], [[1, 0.5, 1], [2, 1.5, 0]])


def test_to_tensor_of_a_sql_result_declares_its_rows(sim: mp.Simulator,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def prog(rows: int) -> Any:
        t = simp.pcall((0,), lambda: table.read_csv("sales.csv"))
        return simp.pcall((0,), lambda t: table.to_tensor(table.sql(
            "SELECT units, price FROM s WHERE units >= 50", s=t), rows=rows), t)

    want = SALES[0][SALES[0].units >= 50][["units", "price"]].to_numpy()
    got = run(sim, lambda: prog(len(want)))[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    with pytest.raises(mp.MPRuntimeError, match=failed_on_node_0("table.to_tensor")):
        mp.evaluate(sim, lambda: prog(len(want) + 1))
    assert f"the table has {len(want)} rows, but the program declared rows={len(want) + 1}" \
        in caplog.text


@pytest.mark.parametrize(("body", "error", "message"), [
    (lambda p: table.to_tensor(p, ["name"]), mp.MPTypeError,
     r"column 'name' of table<id:i64,name:str,age:i64>\[6\] is string; only numeric and bool"),
    (lambda p: table.to_tensor(p, ["nope"]), mp.MPTypeError,
     r"table<id:i64,name:str,age:i64>\[6\] has no column 'nope' \(it has 'id', 'name', 'age'\)"),
    (lambda p: table.to_tensor(p, ["age"], rows=5), mp.MPTypeError,
     r"table\.to_tensor: table<.*>\[6\] has 6 rows, not rows=5"),
    (lambda p: table.from_tensor(table.to_tensor(p, ["id", "age"]), ["a"]), mp.MPTypeError,
     r"table\.from_tensor: i32\[6,2\] does not have 1 columns \('a'\); pass a 2-D tensor "
     r"\[rows, 1\] or a 1-D tensor"),
    (lambda p: table.from_tensor(table.to_tensor(p, ["id", "age"]), ["a", "a"]), mp.MPTypeError,
     r"table\.from_tensor: column names must be unique, but 'a' occurs twice"),
])
def test_tensor_bridge_errors(sim: mp.Simulator, body: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: body(table.constant(PEOPLE))))


def test_null_values_fail_to_tensor_at_run_time(sim: mp.Simulator,
                                                caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(mp.MPRuntimeError, match=failed_on_node_0("table.to_tensor")):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.to_tensor(table.sql(
            "SELECT CASE WHEN age > 40 THEN age END AS a FROM p", p=table.constant(PEOPLE)),
            rows=6)))
    assert "column 'a' has 4 null values; fill them in SQL first (COALESCE)" in caplog.text


def test_every_op_is_declared_with_its_rules() -> None:
    prims = [table.constant_p, table.read_p, table.write_p, table.sql_p, table.to_tensor_p,
             table.from_tensor_p]
    for prim in prims:
        assert prim.targets == ("PPU",), prim.name
        assert prim.rule("cost") is local_cost and prim.rule("type") is not None, prim.name
        # constants hold no party's data; reads are sources, writes are checked against
        # the policy's writes, SQL and conversions keep the rows (`mplang.flows.sql_flows`)
        assert (prim.rule("local_flow") is local_conservative) is \
            (prim is table.constant_p), prim.name
    where = table.read_p.registered_at("local_flow")
    assert where is not None and where.startswith("mplang/dialects/table.py:")
    assert table.read_p.attrs["format"].choices == ("csv", "parquet")
    assert [o.name for o in table.sql_p.operands] == ["tables"] and table.sql_p.operands[0].variadic


@pytest.mark.parametrize(("body", "message"), [
    (lambda t: table.to_tensor(t, ["id"], rows=-1),
     r"^table\.to_tensor: rows must be a count in \[0, 1099511627775\] or a symbol, got -1"),
    (lambda t: table.write_p.bind([t], {"path": "x.json", "format": "json"}),
     r"^table\.write: attribute 'format' must be one of \['csv', 'parquet'\], got 'json'"),
    (lambda t: table.write_p.bind([t, t], {"path": "x.csv", "format": "csv"}),
     r"^table\.write: takes 1 operands \(t\), got 2"),
    (lambda t: table.from_tensor_p.bind([t], {"columns": ("a",)}),
     r"^table\.from_tensor: operand x must be a local tensor, got table<"),
    (lambda t: table.sql_p.bind([t], {"query": "SELECT 1", "names": ("t",)}),
     r"^table\.sql: attribute 'type' is required"),
])
def test_ops_are_checked_against_their_declarations(body: Any, message: str) -> None:
    with pytest.raises(mp.MPTypeError, match=message):
        mp.compile(lambda: simp.pcall((0,), lambda: body(table.constant(PEOPLE))),
                   world_size=2)


# ---------------------------------------------------------------- the program and the wire


def test_branches_returning_different_table_types_fail_while_tracing(sim: mp.Simulator) -> None:
    def prog() -> Any:
        t = simp.pcall((0, 1), lambda: table.constant(PEOPLE))
        flag = simp.constant((0, 1), True)
        return simp.uniform_cond(
            flag, lambda t: simp.pcall(None, lambda t: table.sql("SELECT id FROM t", t=t), t),
            lambda t: simp.pcall(None, lambda t: table.sql("SELECT name FROM t", t=t), t), t)

    with pytest.raises(mp.MPTypeError, match=r"simp\.uniform_cond: branches must return the same "
                                             r"types; then-branch returns "
                                             r"\(table<id:i64>\[6\]@\{0,1\}\), else-branch "
                                             r"returns \(table<name:str>\[6\]@\{0,1\}\)"):
        mp.evaluate(sim, prog)


def test_a_program_of_tables_round_trips_and_runs_the_same(sim: mp.Simulator) -> None:
    def prog() -> Any:
        t = simp.pcall((0,), lambda: table.read_csv(
            "sales.csv", schema={"region": "string", "units": "int64"}))
        c = simp.pcall((0,), lambda: table.constant({"region": ["north", "south"],
                                                     "w": [2.0, 3.0]}))
        r = simp.pcall((0,), lambda t, c: table.sql(
            "SELECT s.region, CAST(SUM(s.units * c.w) AS DOUBLE) AS v FROM s JOIN c "
            "USING (region) GROUP BY s.region ORDER BY s.region", s=t, c=c), t, c)
        return simp.pcall((0,), lambda r: table.to_tensor(r, ["v"], rows=2), r)

    program = mp.compile(prog, cluster=sim.cluster)
    text = str(program)
    assert "table.read(" in text and "table<region:str,units:i64>" in text
    assert "table<region:str,w:f64>[2]" in text and "data=<" in text
    loaded = mp.Program.from_bytes(program.to_bytes())
    assert loaded.to_bytes() == program.to_bytes()
    df = SALES[0].merge(pd.DataFrame({"region": ["north", "south"], "w": [2.0, 3.0]}))
    want = (df.units * df.w).groupby(df.region).sum().to_numpy().reshape(2, 1)
    np.testing.assert_allclose(run(sim, loaded)[0], want, rtol=1e-6)


def test_tables_cross_the_wire_as_arrow_ipc(sim: mp.Simulator) -> None:
    value = pa.table({"id": pa.array([1, 2, None], pa.int64()), "s": ["x", None, "z"],
                      "f": pa.array([0.5, 1.5, 2.5], pa.float32()), "b": [True, False, True]})
    data = wire.encode_value_bytes(value)
    header, _ = wire.split_frame(data)
    assert header["kind"] == "table.table"
    back = wire.decode_value(data)
    assert back.equals(value) and wire.encode_value_bytes(back) == data
    moved = run(sim, lambda: simp.shuffle_static(
        simp.pcall((0,), lambda: table.constant(value)), {1: 0}))
    assert moved[0] is None and moved[1].equals(value)
    large = pa.table({"s": pa.array(["a", "b"], pa.large_string())})
    sent = wire.decode_value(wire.encode_value_bytes(large))
    assert sent.schema == pa.schema([("s", pa.string())])
    with pytest.raises(mp.MPSerializationError, match=r"table\.table: ValueError: column type "
                                                      r"large_string is not allowed"):
        decode_ipc(ipc_bytes(large))


def test_the_example_of_docs_tables_md_runs(sim: mp.Simulator) -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "tables.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/tables.md", "exec"), scope)  # the doc's own example, verbatim
    x = run(sim, scope["prog"])[0]
    want = SALES[0].groupby("region")["units"].sum()
    assert sorted(x[:, 0].tolist()) == sorted(want.tolist())
    written = pq.read_table(sim.mesh.workers[0].data_root / "out" / "units.parquet")
    assert dict(zip(*written.to_pydict().values(), strict=True)) == want.to_dict()


def test_one_party_s_file_has_its_row_count_in_the_type(sim: mp.Simulator) -> None:
    """Read on one party, a table's rows are known while tracing: to_tensor needs no rows=."""
    def prog() -> Any:
        t = simp.pcall((0,), lambda: table.read_csv("sales.csv"))
        return simp.pcall((0,), lambda t: table.to_tensor(t, ["units", "price"]), t)

    x = mp.evaluate(sim, prog)
    assert x.base_type.shape == (len(SALES[0]), 2)
    np.testing.assert_allclose(mp.fetch(sim, x)[0],
                               SALES[0][["units", "price"]].to_numpy(np.float32))
