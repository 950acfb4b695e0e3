"""pandas and Arrow on the owner's side: a DataFrame or an Arrow table put on a party is a
table with its column names and types, ``table.from_pandas`` makes one inside a device
function, ``mp.fetch`` of a party's table gives a DataFrame, and a column a table cannot
hold is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import mplang as mp
from mplang.dialects import table
from mplang.dialects.table import TableType
from tests.docs.markdown_blocks import parse_blocks, run_blocks
from tests.simulators import simulated

PEOPLE = pd.DataFrame({"id": np.arange(5, dtype=np.int64),
                       "name": ["ann", "bob", "cy", "dee", "ed"],
                       "income": [31.5, 45.0, 27.25, 38.0, 52.5],
                       "member": [True, False, True, True, False],
                       "visits": np.array([3, 0, 7, 1, 2], dtype=np.int32)})
TYPE = TableType((("id", "int64"), ("name", "string"), ("income", "float64"),
                  ("member", "bool"), ("visits", "int32")), 5)
DTYPES = "bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64, string"


sim = simulated(mp.ClusterSpec.simple(2))


def test_a_put_dataframe_is_a_table_with_its_columns_and_fetches_as_a_dataframe(
        sim: mp.Simulator) -> None:
    def prog() -> Any:
        t = mp.put("P0", PEOPLE)
        assert t.base_type == TYPE and mp.get_dev_attr(t) == "P0"
        rich = mp.device("P0")(lambda p: table.sql(
            "SELECT name, income FROM p WHERE income > 30 ORDER BY name", p=p))(t)
        return t, rich

    back, rich = mp.fetch(sim, mp.evaluate(sim, prog))
    assert isinstance(back, pd.DataFrame)
    pd.testing.assert_frame_equal(back, PEOPLE)
    want = PEOPLE[PEOPLE.income > 30][["name", "income"]].sort_values("name")
    pd.testing.assert_frame_equal(rich, want.reset_index(drop=True))


def test_an_arrow_table_and_a_pytree_of_frames_are_put_as_tables(sim: mp.Simulator) -> None:
    arrow = pa.table({"k": pa.array([1, 2], pa.int16()), "v": pa.array(["x", None])})

    def prog() -> Any:
        return mp.put("P1", {"a": arrow, "b": [PEOPLE.head(2)]})

    out = mp.fetch(sim, mp.evaluate(sim, prog))
    pd.testing.assert_frame_equal(out["a"], arrow.to_pandas())
    assert out["a"]["k"].dtype == np.int16 and out["a"]["v"].isna().tolist() == [False, True]
    pd.testing.assert_frame_equal(out["b"][0], PEOPLE.head(2))


def test_from_pandas_inside_a_device_function_and_a_named_index(sim: mp.Simulator) -> None:
    by_member = PEOPLE.groupby("member")[["income"]].sum()  # index "member"

    def prog() -> Any:
        t = mp.device("P0")(lambda: table.from_pandas(by_member))()
        assert t.base_type == TableType((("member", "bool"), ("income", "float64")), 2)
        return mp.device("P0")(lambda u: table.to_tensor(u, ["income"]))(t)

    got = mp.fetch(sim, mp.evaluate(sim, prog))
    np.testing.assert_allclose(got[:, 0], by_member["income"].to_numpy(), rtol=1e-6)


def test_a_simp_level_fetch_of_a_table_stays_an_arrow_table(sim: mp.Simulator) -> None:
    def prog() -> Any:
        return mp.simp.pcall((0,), lambda: table.from_pandas(PEOPLE))

    got = mp.fetch(sim, mp.evaluate(sim, prog))
    assert isinstance(got[0], pa.Table) and got[1] is None
    assert got[0].to_pandas().equals(PEOPLE)


@pytest.mark.parametrize(("column", "values", "pandas_dtype", "problem"), [
    ("day", pd.to_datetime(["2024-01-01", "2024-01-02"]), "datetime64[us]",
     "which a table cannot hold"),
    ("grade", pd.Categorical(["a", "b"]), "category", "which a table cannot hold"),
    ("mixed", pd.Series([1, "a"], dtype=object), "object",
     "which does not convert (Could not convert 'a' with type str: tried to convert to int64)"),
    ("z", np.array([1 + 1j, 2]), "complex128", "which does not convert (Unsupported numpy "
                                               "type 15)"),
    ("half", np.array([1, 2], dtype=np.float16), "float16", "which a table cannot hold"),
])
def test_a_column_a_table_cannot_hold_is_named(column: str, values: Any, pandas_dtype: str,
                                               problem: str) -> None:
    df = pd.DataFrame({"ok": [1, 2], column: values})
    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(lambda: mp.put("P0", df), cluster=mp.ClusterSpec.simple(2))
    assert str(info.value).split(" (at ")[0] == (
        f"put('P0'): table.from_pandas: column {column!r} has pandas dtype {pandas_dtype}, "
        f"{problem}; a column holds one of {DTYPES}: convert it first (e.g. "
        f"df[{column!r}].astype('int64') or .astype(str))")


def test_a_dataframe_put_on_a_secure_device_says_where_tables_go() -> None:
    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(lambda: mp.put("SP0", PEOPLE), cluster=mp.ClusterSpec.simple(2))
    assert str(info.value).split(" (at ")[0] == (
        "put('SP0'): a DataFrame is a table, which one party holds: put it on a party's PPU "
        "(mp.put('P0', df)), then move a tensor of its numeric columns (table.to_tensor) to "
        "SPU SP0")


def test_the_pandas_example_of_docs_tables_md_prints_what_it_shows(tmp_path: Path) -> None:
    doc = Path(__file__).resolve().parents[3] / "docs" / "tables.md"
    blocks = [b for b in parse_blocks(doc.read_text()) if "mp.put(\"P0\", people)" in b.body]
    assert len(blocks) == 1 and blocks[0].expected is not None
    (outcome,) = run_blocks(doc, blocks, tmp_path)  # checks the printed frame
    assert "ann" in outcome.stdout
