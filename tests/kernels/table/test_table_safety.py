"""What the table dialect refuses: SQL that reaches outside the tables passed in (files,
extensions, settings, Python variables), paths outside the data root, flows of a
party's table data its policy does not allow, and malformed tables from the wire."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import mplang as mp
from mplang import simp
from mplang.dialects import table, table_sql
from mplang.dialects.table import TableType, sql_p
from mplang.dialects.table_arrow import conform, ipc_bytes
from mplang.edsl.errors import MPRefusedError
from mplang.kernels.table_wire import decode_ipc
from mplang.policy import PolicyRefusedError
from mplang.transport import wire

SECRET = pd.DataFrame({"password": ["hunter2"]})
"""A Python variable a query must not see (DuckDB's replacement scans are off)."""
DF = pd.DataFrame({"a": [1, 2, 3], "b": [1.5, 2.5, 3.5]})


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("safety")
    for node in ("node_0", "node_1"):
        (base / node).mkdir()
        DF.to_csv(base / node / "a.csv", index=False)
    (base / "outside").mkdir()
    (base / "outside" / "secret.csv").write_text("pin\n1234\n")
    (base / "node_0" / "link.csv").symlink_to(base / "outside" / "secret.csv")
    (base / "node_0" / "outdir").symlink_to(base / "outside")
    return base


@pytest.fixture(scope="module")
def sim(base: Path) -> Iterator[mp.Simulator]:
    # the dialect's own checks, not a policy's (test_a_party_s_table_data_is_its_data_...)
    simulator = mp.Simulator(2, data_roots={n: base / n for n in ("node_0", "node_1")},
                             policies="open")
    try:
        yield simulator
    finally:
        simulator.close()


def on_constant(sim: mp.Simulator, body: Any) -> Any:
    """``body(t)`` on party 0, ``t`` a table it holds (an input of the body's pcall)."""
    def prog() -> Any:
        return simp.pcall((0,), body, simp.pcall((0,), lambda: table.constant(DF)))

    return mp.evaluate(sim, prog)


# ---------------------------------------------------------------- SQL


@pytest.mark.parametrize(("query", "message"), [
    ("SELECT * FROM read_csv('{secret}')", r"Permission Error: Cannot access file .*secret\.csv"
                                           r"\" - file system operations are disabled"),
    ("SELECT * FROM read_text('/etc/passwd')", r"Permission Error: Cannot access file"),
    ("SELECT * FROM read_parquet('{secret}')", r"Permission Error: Cannot access file"),
    ("SELECT * FROM glob('/etc/*')", r"Permission Error: Cannot access file \"/etc/\*\""),
    ("SELECT * FROM '{secret}'", r"Permission Error: Cannot access file .*secret\.csv"),
    ("COPY t TO '{target}'", r"only SELECT statements run, not COPY"),
    ("ATTACH '{target}.db'", r"only SELECT statements run, not ATTACH"),
    ("INSTALL httpfs", r"only SELECT statements run, not LOAD"),
    ("LOAD httpfs", r"only SELECT statements run, not LOAD"),
    ("SET enable_external_access=true", r"only SELECT statements run, not SET"),
    ("PRAGMA database_list", r"only SELECT statements run, not PRAGMA"),
    ("SELECT * FROM t; COPY t TO '{target}'", r"expected one SELECT statement, got 2"),
    ("SELECT * FROM SECRET", r"Catalog Error: Table with name SECRET does not exist"),
])
def test_sql_reaching_outside_its_tables_fails_while_tracing(sim: mp.Simulator, base: Path,
                                                             query: str, message: str) -> None:
    target = base / "outside" / "copied.csv"
    q = query.format(secret=base / "outside" / "secret.csv", target=target)
    with pytest.raises(mp.MPTypeError, match=rf"^table\.sql: {message}"):
        on_constant(sim, lambda t: table.sql(q, t=t))
    assert sorted(p.name for p in (base / "outside").iterdir()) == ["secret.csv"]


def forged_sql(query: str, out: TableType) -> Any:
    """A table.sql op whose query and result type were not checked while tracing (as a
    hostile driver could send): only the worker's own checks stand."""
    return lambda t: sql_p.bind([t], {"query": query, "names": ("t",), "type": out})[0]


@pytest.mark.parametrize(("query", "message"), [
    ("COPY t TO '{target}'", r"only SELECT statements run, not COPY"),
    ("ATTACH '{target}.db' AS x", r"only SELECT statements run, not ATTACH"),
    ("SELECT * FROM read_csv('{secret}')", r"Permission Error: Cannot access file \".*secret"
                                           r"\.csv\" - file system operations are disabled by "
                                           r"configuration"),
    ("SELECT * FROM SECRET", r"Catalog Error: Table with name SECRET does not exist"),
    ("SELECT current_setting('enable_external_access') AS pin", r"the result does not have the "
     r"type computed while tracing, table<pin:str>: column 'pin' is bool, not string"),
])
def test_the_worker_refuses_forged_queries_at_run_time(sim: mp.Simulator, base: Path,
                                                       query: str, message: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The driver hears only that the op failed; the party's log says why."""
    q = query.format(secret=base / "outside" / "secret.csv", target=base / "outside" / "x.csv")
    with pytest.raises(mp.MPRuntimeError, match=r"^op table\.sql at test_table_safety\.py:\d+ "
                                                r"failed on node_0 \(party 0; its log has the "
                                                r"details\)$"):
        on_constant(sim, forged_sql(q, TableType((("pin", "string"),))))
    assert re.search(rf"party 0: op table\.sql .*{message}", caplog.text)
    assert sorted(p.name for p in (base / "outside").iterdir()) == ["secret.csv"]


def test_the_locked_configuration_cannot_be_changed() -> None:
    con = table_sql.sql_connection()
    try:
        with pytest.raises(Exception, match="the configuration has been locked"):
            con.execute("SET enable_external_access=true")
        with pytest.raises(Exception, match="Cannot access directory"):
            con.execute("INSTALL httpfs")
        settings = dict(con.execute("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                    "('enable_external_access', 'python_enable_replacements', "
                                    "'lock_configuration', 'temp_directory')").fetchall())
    finally:
        con.close()
    assert settings == {"enable_external_access": "false", "python_enable_replacements": "false",
                        "lock_configuration": "true", "temp_directory": ""}


def test_data_errors_reach_the_driver_without_the_data(sim: mp.Simulator,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    words = pd.DataFrame({"w": ["alpha", "top-secret-value"]})
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.sql(
            "SELECT CAST(w AS INTEGER) AS n FROM t", t=table.constant(words))))
    assert re.fullmatch(r"op table\.sql at test_table_safety\.py:\d+ failed on node_0 \(party "
                        r"0; its log has the details\)", str(info.value))
    assert "alpha" not in str(info.value) and "top-secret" not in str(info.value)
    assert "Conversion Error: Could not convert string 'alpha' to INT32" in caplog.text


# ---------------------------------------------------------------- paths


@pytest.mark.parametrize(("path", "message"), [
    ("../node_1/a.csv", r"path '\.\./node_1/a\.csv' escapes the data root of node_0"),
    ("{outside}/secret.csv", r"path '.*secret\.csv' is absolute; give a path relative to the "
                             r"data root of node_0"),
    ("link.csv", r"path 'link\.csv' escapes the data root of node_0"),
    ("outdir/secret.csv", r"path 'outdir/secret\.csv' escapes the data root of node_0"),
])
def test_reads_outside_the_data_root_are_refused(sim: mp.Simulator, base: Path, path: str,
                                                 message: str) -> None:
    p = path.format(outside=base / "outside")
    with pytest.raises(mp.MPRuntimeError, match=rf"table\.read_csv: {message}"):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.read_csv(p)))
    with pytest.raises(mp.MPRuntimeError, match=rf"party 0: op table\.read .*table\.read_csv: "
                                                rf"{message}"):
        mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.read_csv(p, schema={"pin": int})))


@pytest.mark.parametrize(("path", "message"), [
    ("../escape.csv", r"path '\.\./escape\.csv' escapes the data root of node_0"),
    ("{outside}/new.csv", r"path '.*new\.csv' is absolute"),
    ("outdir/new.csv", r"path 'outdir/new\.csv' escapes the data root of node_0"),
    ("link.csv", r"path 'link\.csv' escapes the data root of node_0"),
    ("sub", r"path 'sub' must name a \.csv file"),
])
def test_writes_outside_the_data_root_are_refused(sim: mp.Simulator, base: Path, path: str,
                                                  message: str) -> None:
    p = path.format(outside=base / "outside")
    before = (base / "outside" / "secret.csv").read_text()
    error = mp.MPTypeError if path == "sub" else mp.MPRuntimeError
    with pytest.raises(error, match=rf"table\.write_csv: {message}"):
        on_constant(sim, lambda t: table.write_csv(t, p))
    assert sorted(p.name for p in (base / "outside").iterdir()) == ["secret.csv"]
    assert (base / "outside" / "secret.csv").read_text() == before
    assert not (base / "escape.csv").exists()


def test_writing_over_a_folder_is_refused(sim: mp.Simulator, base: Path) -> None:
    (base / "node_0" / "dir.csv").mkdir()
    with pytest.raises(mp.MPRuntimeError, match=r"table\.write_csv: path 'dir\.csv' in the data "
                                                r"root of node_0 is not a regular file"):
        on_constant(sim, lambda t: table.write_csv(t, "dir.csv"))


# ---------------------------------------------------------------- policies


def test_a_party_s_table_data_is_its_data_for_its_policy(base: Path) -> None:
    policy = base / "strict.yaml"
    policy.write_text("plaintext_to: []\n")
    roots = {n: base / n for n in ("node_0", "node_1")}
    strict = mp.Simulator(2, data_roots=roots, policies={"node_0": str(policy)})
    try:
        def read() -> Any:
            return simp.pcall((0,), lambda: table.read_csv("a.csv"))

        for mode in ("launch", "standard"):  # kept by node_0: judged at fetch
            kept = mp.evaluate(strict, read, mode=mode)
            with pytest.raises(PolicyRefusedError, match=r"node_0 refuses to send object .* to "
                                                         r"the driver: it is row-wise \(raw\) "
                                                         r"values of a\.csv; approve this "
                                                         r"program alone with approve: "):
                mp.fetch(strict, kept)
        summed = mp.evaluate(strict, lambda: simp.pcall((0,), lambda: table.sql(  # 3 rows
            "SELECT SUM(b) AS s FROM t", t=table.read_csv("a.csv"))))
        with pytest.raises(PolicyRefusedError, match=r"node_0 refuses to send object .* to the "
                                                     r"driver: it is aggregate over 3 rows of "
                                                     r"a\.csv; "):
            mp.fetch(strict, summed)
        with pytest.raises(MPRefusedError, match=r"node_0 refuses the program: op "
                                                     r"simp\.shuffle_static .*\(raw\) values of "
                                                     r"a\.csv, to node_1"):
            mp.evaluate(strict, lambda: simp.shuffle_static(
                simp.pcall((0,), lambda: table.read_csv("a.csv")), {1: 0}))
        own = mp.evaluate(strict, lambda: simp.pcall((0,), lambda: table.sql(
            "SELECT SUM(b) AS s FROM t", t=table.constant(DF))))
        assert mp.fetch(strict, own)[0].column("s").to_pylist() == [DF.b.sum()]
    finally:
        strict.close()


# ---------------------------------------------------------------- the wire


def test_decoding_refuses_malformed_tables() -> None:
    good = ipc_bytes(pa.table({"a": [1, 2, 3], "s": ["x", "y", None]}))
    sink = pa.BufferOutputStream()
    value = pa.table({"a": [1, 2, 3]})
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, value.schema, options=options) as writer:
        writer.write_table(value)
    cases = {
        "the Arrow IPC stream has no schema": b"",
        "compressed record batches are refused": sink.getvalue().to_pybytes(),
        "column type dictionary<values=string, indices=int32, ordered=0> is not allowed":
            ipc_bytes(pa.table({"s": pa.array(["a", "b"]).dictionary_encode()})),
        "column type list<item: int64> is not allowed": ipc_bytes(pa.table({"l": [[1], [2]]})),
        "column type timestamp": ipc_bytes(pa.table({"t": pa.array([0], pa.timestamp("s"))})),
        "column names must be unique": ipc_bytes(pa.table([[1], [2]], names=["a", "a"])),
        "Expected to be able to read 56 bytes for message body, got 16": good[:-48],
    }
    for message, data in cases.items():
        with pytest.raises(mp.MPSerializationError,
                           match=rf"^malformed value: table\.table: .*{message}"):
            decode_ipc(data)
    frame = wire._frame({"kind": "table.table", "sizes": [len(good), 0]}, [good, b""])
    with pytest.raises(mp.MPSerializationError, match=r"expected 1 chunk \(an Arrow IPC "
                                                      r"stream\), got 2"):
        wire.decode_value(b"".join(bytes(b) for b in frame))


def test_random_damage_gives_serialization_errors_only() -> None:
    rng = np.random.default_rng(3)
    good = ipc_bytes(pa.table({"a": np.arange(50), "f": np.linspace(0, 1, 50),
                               "s": [f"v{i}" for i in range(50)], "b": [True, False] * 25}))
    refused = 0
    for _ in range(300):
        data = bytearray(good)
        for i in rng.integers(0, len(data), rng.integers(1, 6)):
            data[i] = int(rng.integers(0, 256))
        cut = bytes(data[:rng.integers(1, len(data) + 1)])
        try:
            table_ = decode_ipc(cut)
        except mp.MPSerializationError:
            refused += 1
            continue
        table_.validate(full=True)  # what is accepted is a well-formed table
    assert refused > 100


def test_oversized_tables_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = ipc_bytes(pa.table({"a": np.arange(1000)}))
    monkeypatch.setattr(table, "MAX_TABLE_BYTES", 1024)
    with pytest.raises(mp.MPSerializationError, match=rf"malformed value: table\.table: "
                                                      rf"{len(data)} bytes, over the limit of "
                                                      r"1024"):
        decode_ipc(data)


def test_values_are_conformed_to_their_types() -> None:
    t = TableType((("a", "int64"), ("s", "string")), rows=2)
    value = pa.table({"a": [1, 2], "s": pa.array(["x", "y"], pa.large_string())})
    assert conform(value, t).schema == pa.schema([("a", pa.int64()), ("s", pa.string())])
    for bad, message in [(pa.table({"s": ["x"], "a": [1]}), r"its columns are \('s', 'a'\), "
                                                            r"not \('a', 's'\)"),
                         (pa.table({"a": [1.0, 2.0], "s": ["x", "y"]}),
                          r"column 'a' is double, not int64"),
                         (pa.table({"a": [1], "s": ["x"]}), r"it has 1 rows, not 2"),
                         (np.zeros(2), r"expected a table, got ndarray")]:
        with pytest.raises(ValueError, match=message):
            conform(bad, t)


def test_docs_tables_md_states_the_lockdown_in_force() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "tables.md").read_text()
    section = doc.split("## What DuckDB may do", 1)[1].split("|", 1)[0]
    stated = dict(re.findall(r"`(\w+)=([^`]*)`", section))
    assert stated == {k: repr(v) if isinstance(v, str) else str(v).lower()
                      for k, v in table_sql.SQL_CONFIG.items()}
