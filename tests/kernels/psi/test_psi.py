"""PSI joins (libpsi: RR22, KKRT, ECDH) and the ECDH intersection count, against pandas
and Python sets: row alignment, the documented order of inner/left/full results,
duplicate keys, exact dtypes, empty intersections and tables, who holds what, and
the trace-time and run-time errors."""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import mplang as mp
from mplang import simp
from mplang.dialects import psi as psi_dialect
from mplang.dialects import table
from mplang.edsl.errors import MPRefusedError, MPRuntimeError
from mplang.kernels.psi import count as psi_count
from mplang.kernels.psi import join as psi_impl
from mplang.kernels.psi import session as psi_session
from mplang.libs import psi
from mplang.policy.check import check
from mplang.policy.policy import Policy
from mplang.worker.mailbox import Mailbox
from mplang.worker.mem import ThreadCommunicator
from tests.op_failures import assert_generic, logged_failure, traced_at
from tests.simulators import simulated

A = pa.table({
    "id": pa.array([10, 9, 100, 2, -5, 3, 3, 42, 2**62 + 1, 8], pa.int64()),
    "x": pa.array([1.5, 2.5, 3.5, 4.0, 5.0, 6.0, 6.5, 7.0, 0.1 + 0.2, -0.0], pa.float64()),
    "flag": pa.array([True, False, True, True, False, True, False, True, True, False]),
})
"""Party 0's table: key 3 twice, keys 42 and 8 only here."""
B = pa.table({
    "id": pa.array([2, 3, 100, 9, 10, -5, 7, 3, 3, 2**62 + 1, 7], pa.int64()),
    "y": pa.array(["b2", "b3", "b100", "b9", "b10", "bm5", "b7", "b3'", "b3''", "big", "b7'"]),
    "n": pa.array(range(11), pa.int32()),
})
"""Party 1's table: key 3 three times (a 2 x 3 product with A), key 7 only here."""


sim = simulated(3, policies="open")  # PSI's mechanics: no policy judges


def held(parties: tuple[int, ...], value: Any) -> list[Any]:
    """Tables (or Arrow tables) as simp values held by one party each."""
    return [simp.pcall((p,), lambda v=v: table.constant(v)) for p, v in zip(parties, value,
                                                                           strict=True)]


def expected_rows(a: pa.Table, b: pa.Table, key: str, how: str
                  ) -> tuple[list[int | None], list[int | None]]:
    """The documented result as row numbers of ``a`` and ``b`` (None: a row of nulls):
    pairs by (key, a row, b row), then A's unmatched rows by (key, row), then B's."""
    da = pd.DataFrame({"k": a.column(key).to_pylist(), "ra": range(a.num_rows)})
    db = pd.DataFrame({"k": b.column(key).to_pylist(), "rb": range(b.num_rows)})
    pairs = da.merge(db, on="k").sort_values(["k", "ra", "rb"])
    ra: list[int | None] = pairs["ra"].tolist()
    rb: list[int | None] = pairs["rb"].tolist()
    if how in ("left", "full"):
        only = da[~da["k"].isin(db["k"])].sort_values(["k", "ra"])["ra"].tolist()
        ra, rb = ra + only, rb + [None] * len(only)
    if how == "full":
        only = db[~db["k"].isin(da["k"])].sort_values(["k", "rb"])["rb"].tolist()
        ra, rb = ra + [None] * len(only), rb + only
    return ra, rb


def run_join(sim: mp.Simulator, a: pa.Table, b: pa.Table, key: str = "id", how: str = "inner",
             protocol: str = "rr22", parties: tuple[int, int] = (0, 1)
             ) -> tuple[pa.Table, pa.Table]:
    def prog() -> Any:
        ta, tb = held(parties, (a, b))
        return psi.join(ta, tb, key, how=how, protocol=protocol)

    ja, jb = mp.evaluate(sim, prog)
    got_a, got_b = mp.fetch(sim, ja), mp.fetch(sim, jb)
    assert [i for i, v in enumerate(got_a) if v is not None] == [parties[0]]
    assert [i for i, v in enumerate(got_b) if v is not None] == [parties[1]]
    return got_a[parties[0]], got_b[parties[1]]


def check_join(ja: pa.Table, jb: pa.Table, a: pa.Table, b: pa.Table, key: str, how: str
               ) -> None:
    ra, rb = expected_rows(a, b, key, how)
    assert ja.schema == a.schema and jb.schema == b.schema  # dtypes kept exactly
    for got, want in ((ja, a.take(pa.array(ra, pa.int64()))),
                      (jb, b.take(pa.array(rb, pa.int64())))):
        pd.testing.assert_frame_equal(got.to_pandas(), want.to_pandas(), check_exact=True)


# ---------------------------------------------------------------- joins


@pytest.mark.parametrize("protocol", ["rr22", "kkrt", "ecdh"])
@pytest.mark.parametrize("how", ["inner", "left", "full"])
def test_join_matches_pandas(sim: mp.Simulator, protocol: str, how: str) -> None:
    ja, jb = run_join(sim, A, B, how=how, protocol=protocol)
    check_join(ja, jb, A, B, "id", how)


def test_inner_join_is_the_sql_join(sim: mp.Simulator) -> None:
    """Side by side, the aligned rows are pandas' inner merge (same rows, same order)."""
    ja, jb = run_join(sim, A, B)
    together = pd.concat([ja.to_pandas(), jb.to_pandas().drop(columns="id")], axis=1)
    merged = A.to_pandas().merge(B.to_pandas(), on="id", sort=True)
    pd.testing.assert_frame_equal(together, merged)
    counts = together["id"].value_counts()
    assert counts[3] == 2 * 3 and counts[2] == 1  # duplicates: the per-key product


def test_left_and_full_hold_rows_of_nulls_for_the_other_side(sim: mp.Simulator) -> None:
    ja, jb = run_join(sim, A, B, how="full")
    inner = len(expected_rows(A, B, "id", "inner")[0])
    assert ja.num_rows == jb.num_rows == inner + 2 + 2  # A's 42 and 8, B's two 7s
    assert ja.column("id").to_pylist()[inner:] == [8, 42, None, None]
    assert jb.column("id").to_pylist()[inner:] == [None, None, 7, 7]
    assert jb.column("y").to_pylist()[inner:] == [None, None, "b7", "b7'"]
    assert ja.column("id").null_count == 2 and ja.column("x").null_count == 2


def test_string_keys_with_csv_special_characters(sim: mp.Simulator) -> None:
    words = ["a,b", 'q"uote', "", "x\ny", "é", "NULL", "plain", "tab\there"]
    a = pa.table({"name": words, "i": pa.array(range(8), pa.int64())})
    b = pa.table({"name": [*words[::2], "other", "A,B"], "j": pa.array(range(6), pa.uint8())})
    for how in ("inner", "full"):
        ja, jb = run_join(sim, a, b, key="name", how=how, protocol="kkrt")
        check_join(ja, jb, a, b, "name", how)
    assert ja.column("name").to_pylist()[:4] == sorted(words[::2])


def test_float_and_bool_keys(sim: mp.Simulator) -> None:
    nan = float("nan")
    a = pa.table({"k": pa.array([0.5, -0.0, 1e-300, 2.0, nan, nan], pa.float64()),
                  "b": pa.array([True, False, True, True, False, True])})
    b = pa.table({"k": pa.array([0.0, 2.0, 1e-300, 3.0, nan], pa.float64()),
                  "b": pa.array([False, True, True, False, True])})
    ja, jb = run_join(sim, a, b, key="k", how="full", protocol="ecdh")
    check_join(ja, jb, a, b, "k", "full")  # -0.0 matches 0.0, NaN matches NaN
    assert np.signbit(ja.column("k").to_numpy()[0]) and jb.column("k").to_pylist()[0] == 0.0
    assert np.isnan(ja.column("k").to_numpy()[3:5]).all() and ja.num_rows == 5 + 1 + 1
    ja, jb = run_join(sim, a, b, key="b")
    check_join(ja, jb, a, b, "b", "inner")  # 2 x 2 falses, 4 x 3 trues
    assert ja.num_rows == 16 and ja.column("b").to_pylist() == jb.column("b").to_pylist()


@pytest.mark.parametrize("how", ["inner", "left", "full"])
def test_many_repeated_keys_of_either_type(sim: mp.Simulator, how: str) -> None:
    """Keys repeated up to a dozen times on both sides, some on one side only."""
    rng = np.random.default_rng(27)
    ka, kb = rng.integers(0, 60, 300), rng.integers(30, 90, 200)
    for col in (pa.array(ka, pa.int32()), pa.array([f"k{v}" for v in ka])):
        other = pa.array(kb, pa.int32()) if col.type == pa.int32() else \
            pa.array([f"k{v}" for v in kb])
        a = pa.table({"k": col, "i": pa.array(range(300), pa.int64())})
        b = pa.table({"k": other, "j": pa.array(range(200), pa.int16())})
        ja, jb = run_join(sim, a, b, key="k", how=how)
        check_join(ja, jb, a, b, "k", how)


def test_empty_intersection_gives_typed_empty_tables(sim: mp.Simulator) -> None:
    b = pa.table({"id": pa.array([1000, 2000], pa.int64()), "y": ["p", "q"],
                  "n": pa.array([1, 2], pa.int32())})
    ja, jb = run_join(sim, A, b)
    assert ja.num_rows == jb.num_rows == 0
    assert ja.schema == A.schema and jb.schema == b.schema
    ja, jb = run_join(sim, A, b, how="left", protocol="ecdh")
    check_join(ja, jb, A, b, "id", "left")
    assert jb.num_rows == A.num_rows and jb.column("id").null_count == A.num_rows


@pytest.mark.parametrize("how", ["inner", "left", "full"])
def test_empty_input_table(sim: mp.Simulator, how: str) -> None:
    empty = B.slice(0, 0)
    ja, jb = run_join(sim, A, empty, how=how)
    check_join(ja, jb, A, empty, "id", how)
    ja, jb = run_join(sim, empty, A.rename_columns(["id", "y", "n"]).slice(0, 3), how=how)
    assert ja.num_rows == jb.num_rows == (0 if how != "full" else 3)


def test_join_on_other_parties_and_eagerly(sim: mp.Simulator) -> None:
    ja, jb = run_join(sim, B, A, parties=(2, 0), how="left", protocol="ecdh")
    check_join(ja, jb, B, A, "id", "left")
    with sim:
        ta, tb = held((1, 2), (A, B))
        ea, eb = psi.join(ta, tb, "id")
        want_a, want_b = run_join(sim, A, B)
        assert mp.fetch(sim, ea)[1].equals(want_a) and mp.fetch(sim, eb)[2].equals(want_b)


def test_standard_mode_runs_the_op_on_the_parties(sim: mp.Simulator) -> None:
    """The driver dispatches the multi-party op instead of every party running the graph."""
    def prog() -> Any:
        ta, tb = held((0, 1), (A, B))
        return psi.join(ta, tb, "id", how="left"), psi.intersection_size(ta, tb, "id")

    (ja, jb), n = mp.evaluate(sim, prog, mode="standard")
    check_join(mp.fetch(sim, ja)[0], mp.fetch(sim, jb)[1], A, B, "id", "left")
    assert mp.fetch(sim, n) == [7, 7, None]


def test_join_on_devices_keeps_the_devices() -> None:
    sim = mp.Simulator(mp.ClusterSpec.simple(2), policies="open")
    try:
        def prog() -> Any:
            ta = mp.device("P0")(lambda: table.constant(A))()
            tb = mp.device("P1")(lambda: table.constant(B))()
            return psi.join(ta, tb, "id", how="left")

        ja, jb = mp.evaluate(sim, prog)
        assert (mp.get_dev_attr(ja), mp.get_dev_attr(jb)) == ("P0", "P1")
        check_join(sim.held(ja)[0], sim.held(jb)[1], A, B, "id", "left")
        fetched = mp.fetch(sim, ja)  # a party's table reaches the driver as a DataFrame
        pd.testing.assert_frame_equal(fetched, sim.held(ja)[0].to_pandas())
    finally:
        sim.close()


def test_join_over_the_communicator_links() -> None:
    """With a network model the parties are not in_process: libpsi's link then runs over
    the workers' own communicator (the path HTTP workers take)."""
    sim = mp.Simulator(3, latency_ms=0.05, policies="open")
    try:
        ja, jb = run_join(sim, A, B, how="full", protocol="rr22")
        check_join(ja, jb, A, B, "id", "full")
    finally:
        sim.close()


def test_result_types_and_ir(sim: mp.Simulator) -> None:
    def prog() -> Any:
        ta, tb = held((0, 1), (A, B))
        return psi.join(ta, tb, "id", how="full", protocol="kkrt")

    text = str(mp.compile(prog, world_size=3))
    assert "psi.join(%1, %3) {how='full', key='id', protocol='kkrt', rows='n0'} : " \
           "(table<id:i64,x:f64,flag:bool>[?n0]@{0}, table<id:i64,y:str,n:i32>[?n0]@{1})" \
        in text  # one row count, known at run time: a symbol both results share


# ---------------------------------------------------------------- intersection size


@pytest.mark.parametrize("reveal_to", [(0, 1), (1,), (2,), (0, 2), (1, 2)])
def test_intersection_size_reaches_only_reveal_to(sim: mp.Simulator,
                                                  reveal_to: tuple[int, ...]) -> None:
    def prog() -> Any:
        ta, tb = held((0, 1), (A, B))
        return psi.intersection_size(ta, tb, "id", reveal_to=reveal_to)

    got = mp.fetch(sim, mp.evaluate(sim, prog))
    shared = len(set(A.column("id").to_pylist()) & set(B.column("id").to_pylist()))
    assert shared == 7
    assert got == [shared if r in reveal_to else None for r in range(3)]


def test_intersection_size_of_strings_empty_and_default_receivers(sim: mp.Simulator) -> None:
    rng = np.random.default_rng(3)
    words = [f"w{i}" for i in rng.choice(10_000, 600, replace=False)]
    a = pa.table({"w": words[:400] + words[:50]})  # duplicates count once
    b = pa.table({"w": words[300:]})

    def prog(x: pa.Table, y: pa.Table) -> Any:
        ta, tb = held((2, 0), (x, y))
        return psi.intersection_size(ta, tb, "w")

    assert mp.fetch(sim, mp.evaluate(sim, prog, a, b)) == [100, None, 100]
    assert mp.fetch(sim, mp.evaluate(sim, prog, a, b.slice(0, 0))) == [0, None, 0]


def test_intersection_size_protocol_alone() -> None:
    """The count protocol at the function level: three parties, the third one counts."""
    boxes = [Mailbox(r) for r in range(3)]
    keys = [pa.array([1, 2, 3, 4, 4]), pa.array([3, 4, 5])]
    out: dict[int, int | None] = {}

    def party(rank: int) -> None:
        comm = ThreadCommunicator(rank, boxes, 10.0)
        plan = psi_count.size_plan(rank, (0, 1), (2,))
        session = psi_session.Session(comm, "e1", "/0", 10.0, plan)
        out[rank] = psi_count.count_shared(rank, (0, 1), (2,),
                                          keys[rank] if rank < 2 else None, session)
        assert session.pending == []

    threads = [threading.Thread(target=party, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {0: None, 1: None, 2: 2}


# ---------------------------------------------------------------- kernels


def test_encoded_keys_are_injective_and_sort_like_the_keys() -> None:
    words = ["", "a", "a\x00", "ab", "b", "é", "€", "x,y", "\n"]
    encoded = psi_session.encode_keys(pa.array(words)).to_pylist()
    assert encoded[:3] == ["x", "x61", "x6100"]
    assert len(set(encoded)) == len(words)
    assert sorted(encoded) == [encoded[words.index(w)] for w in
                               sorted(words, key=lambda w: w.encode())]
    sliced = psi_session.encode_keys(pa.chunked_array([pa.array(words).slice(3, 4)]))
    assert sliced.to_pylist() == encoded[3:7]
    assert psi_session.encode_keys(pa.array([-0.0, 1.5])).to_pylist() == [0.0, 1.5]


@pytest.mark.parametrize("side", [0, 1])
def test_shared_rows_become_the_per_key_product(side: int) -> None:
    """Each shared key gives every pair of rows once: A's rows as the outer loop."""
    keys = pa.array([9, 7, 5, 7, 5, 7, 4, 5])  # this party's rows 0..7; key 4 not shared
    peer = {5: 3, 7: 2, 9: 1}  # how many rows the peer has per shared key
    groups = psi_impl.group_keys(keys)
    assert groups.keys.to_pylist() == [4, 5, 7, 9]
    assert groups.rows.tolist() == [6, 2, 4, 7, 1, 3, 5, 0]
    shared = np.array([1, 2, 3])
    counts = np.array([peer[k] for k in (5, 7, 9)])
    got = psi_impl.shared_product(groups, shared, counts, side).tolist()
    mine = {k: [r for r, v in enumerate(keys.to_pylist()) if v == k] for k in peer}
    want = []
    for k in sorted(peer):
        for i in range(len(mine[k]) * peer[k]):
            want.append(mine[k][i // peer[k]] if side == 0 else mine[k][i % len(mine[k])])
    assert got == want


def test_counts_messages_are_checked() -> None:
    counts = np.array([1, 3, 1])
    assert psi_impl.decode_counts(psi_impl.encode_counts(counts), 3, 5).tolist() == [1, 3, 1]
    assert psi_impl.encode_counts(np.ones(4, np.int64)) == b""
    assert psi_impl.decode_counts(b"", 4, 4).tolist() == [1, 1, 1, 1]
    with pytest.raises(MPRuntimeError, match=r"counts: expected 2 counts, got 24 bytes"):
        psi_impl.decode_counts(psi_impl.encode_counts(counts), 2, 5)
    with pytest.raises(MPRuntimeError, match=r"do not fit its 4 rows"):
        psi_impl.decode_counts(psi_impl.encode_counts(counts), 3, 4)
    with pytest.raises(MPRuntimeError, match=r"do not fit its 9 rows"):
        psi_impl.decode_counts(np.array([2, 0], "<u8").tobytes(), 2, 9)


# ---------------------------------------------------------------- errors


def test_different_key_dtypes_fail_when_tracing() -> None:
    def prog() -> Any:
        ta, tb = held((0, 1), (A, B.set_column(0, "id", B.column("id").cast(pa.string()))))
        return psi.join(ta, tb, "id")

    with pytest.raises(mp.MPTypeError, match=r"psi\.join: key column 'id' is int64 in a \(held "
                       r"by party 0\) but string in b \(held by party 1\); cast one side"):
        mp.compile(prog, world_size=3)


def test_missing_key_column_fails_when_tracing() -> None:
    def prog() -> Any:
        ta, tb = held((0, 1), (A, B.rename_columns(["key", "y", "n"])))
        return psi.intersection_size(ta, tb, "id")

    with pytest.raises(mp.MPTypeError, match=r"psi\.intersection_size: b \(held by party 1\) "
                       r"has no key column 'id'; its columns: key, y, n"):
        mp.compile(prog, world_size=3)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"how": "right"}, r"psi\.join: how='right'; use one of inner, left, full"),
    ({"protocol": "dh"}, r"psi\.join: protocol='dh'; use one of rr22, kkrt, ecdh"),
])
def test_bad_join_options(kwargs: dict[str, str], message: str) -> None:
    def prog() -> Any:
        ta, tb = held((0, 1), (A, B))
        return psi.join(ta, tb, "id", **kwargs)

    with pytest.raises(mp.MPTypeError, match=message):
        mp.compile(prog, world_size=3)


def test_tables_of_one_party_and_bad_receivers_fail_when_tracing() -> None:
    def same() -> Any:
        ta, tb = held((1, 1), (A, B))
        return psi.join(ta, tb, "id")

    with pytest.raises(mp.MPTypeError, match=r"psi\.join: a and b are both held by party 1; "
                       "PSI runs between two parties"):
        mp.compile(same, world_size=3)

    def far() -> Any:
        ta, tb = held((0, 1), (A, B))
        return psi.intersection_size(ta, tb, "id", reveal_to=(0, 5))

    with pytest.raises(mp.MPTypeError, match=r"reveal_to must be distinct parties of a "
                       r"3-party world in increasing order, got \(0, 5\)"):
        mp.compile(far, world_size=3)


def test_both_ops_are_declared_with_their_flow_rules() -> None:
    for prim in (psi_dialect.join_p, psi_dialect.size_p):
        assert [o.name for o in prim.operands] == ["a", "b"]
        where = prim.registered_at("flow")
        assert where is not None and where.startswith("mplang/dialects/psi.py:"), prim.name
    attrs = psi_dialect.join_p.attrs
    assert (attrs["how"].default, attrs["protocol"].default) == ("inner", "rr22")
    assert attrs["how"].choices == psi.JOINS and attrs["protocol"].choices == psi.PROTOCOLS

    def local_table() -> Any:
        _, tb = held((0, 1), (A, B))
        return psi_dialect.join(simp.constant((0,), np.arange(3)), tb, key="id")

    with pytest.raises(mp.MPTypeError, match=r"^psi\.join: operand a must be a table at the "
                                             r"simp level, got i\d+\[3\]@\{0\}"):
        mp.compile(local_table, world_size=3)


@pytest.mark.parametrize("op", ["join", "size"])
def test_null_keys_fail_both_parties_at_once(sim: mp.Simulator, op: str,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """Party 1's check of its keys fails the run (party 0 does not wait for it); the
    driver hears which op failed on party 1, party 1's log says why."""
    nulls = pa.table({"id": pa.array([1, None, 3], pa.int64())})

    def prog() -> Any:
        ta, tb = held((0, 1), (A.select(["id"]), nulls))
        if op == "join":
            return psi.join(ta, tb, "id", how="full")  # @join
        return psi.intersection_size(ta, tb, "id", reveal_to=(0, 1, 2))  # @size

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog)
    opcode, at = {"join": "psi.join", "size": "psi.intersection_size"}[op], traced_at(__file__, op)
    assert_generic(info.value, opcode, at, 1)
    assert logged_failure(caplog, opcode, at, "node_1").startswith(
        f"MPRuntimeError: party 1: op {opcode}: key column 'id' of party 1's table has 1 null "
        "value(s); drop or fill them before the PSI")


# ---------------------------------------------------------------- policies


def test_policy_sees_the_join_as_a_comparison(tmp_path: Path) -> None:
    """Each holder learns which of its keys the other holds: a comparison of the other's
    data judged as an intersection, allowed by an ``intersection`` rule and refused
    without one (a ``compare`` rule does not allow it)."""
    roots = {}
    for node, t in (("node_0", A), ("node_1", B)):
        (tmp_path / node).mkdir()
        t.select(["id"]).to_pandas().to_csv(tmp_path / node / "ids.csv", index=False)
        roots[node] = str(tmp_path / node)

    def prog() -> Any:
        ta = simp.pcall((0,), lambda: table.read_csv("ids.csv", {"id": "int64"}))
        tb = simp.pcall((1,), lambda: table.read_csv("ids.csv", {"id": "int64"}))
        return psi.join(ta, tb, "id")

    for rules, ok in (("declassify:\n  - to: ['*']\n    when: intersection\n", True),
                      ("declassify:\n  - to: ['*']\n    when: compare\n", False), ("", False)):
        (tmp_path / "p.yaml").write_text(rules or "{}\n")
        sim = mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots,
                           policies={n: str(tmp_path / "p.yaml") for n in roots})
        try:
            if ok:  # the join is an intersection; the joined tables stay with their holders
                graph = mp.compile(prog, cluster=mp.ClusterSpec.simple(2)).graph
                for rank in (0, 1):
                    verdict = check(graph, 2, rank, Policy.load(tmp_path / "p.yaml"),
                                    outputs_fetchable=False)
                    assert verdict.accepted, verdict.reasons
                    assert [f for f in verdict.flows if re.fullmatch(
                        rf"which keys the join matched of ids\.csv -> node_{1 - rank} \(which "
                        r"of the receiver's keys this party's table holds, op psi\.join at "
                        r"test_psi\.py:\d+\): allowed: rule .*intersection.*", f)] != [], \
                        verdict.flows
            else:
                with pytest.raises(MPRefusedError, match=(
                        r"refuses the program: op psi\.join at test_psi\.py:\d+ .*which keys "
                        r"the join matched of ids\.csv, to node_[01]; add a rule \{to: "
                        r"\[node_[01]\], when: intersection\} to declassify")):
                    mp.evaluate(sim, prog)
        finally:
            sim.close()


def _aggregate_policy(tmp_path: Path) -> Path:
    """A policy file of aggregates over at least 10 rows, comparisons and which keys a PSI
    join matched, to anyone."""
    policy = tmp_path / "p.yaml"
    policy.write_text("declassify:\n  - {to: ['*'], when: aggregate, min_rows: 10}\n"
                      "  - {to: ['*'], when: compare}\n  - {to: ['*'], when: intersection}\n")
    return policy


def _id_tables(base: Path, ids: dict[str, np.ndarray]) -> dict[str, str]:
    """Each node's data root under ``base`` holding ``t.csv``: its ``ids`` and ``v = 2 id``."""
    roots = {}
    for node, node_ids in ids.items():
        root = base / node
        root.mkdir()
        pd.DataFrame({"id": node_ids, "v": node_ids * 2.0}).to_csv(root / "t.csv", index=False)
        roots[node] = str(root)
    return roots


def _node_0_joined() -> Any:
    """node_0's rows of its ``t.csv`` that a join with node_1's keeps (traced)."""
    schema = {"id": "int64", "v": "float64"}
    ta = simp.pcall((0,), lambda: table.read_csv("t.csv", schema))
    tb = simp.pcall((1,), lambda: table.read_csv("t.csv", schema))
    return psi.join(ta, tb, "id")[0]


def test_an_aggregate_over_joined_rows_needs_min_rows_of_them(tmp_path: Path) -> None:
    """The rows a join keeps are chosen by the other party's keys, so the analysis cannot
    count them: each holder's kernel refuses a join that keeps fewer rows than its
    min_rows, and an aggregate over a large enough join is released."""
    policy = _aggregate_policy(tmp_path)
    for shared, ok in ((30, True), (5, False)):
        roots = {}
        for i, node in enumerate(("node_0", "node_1")):
            ids = np.arange(100 * i, 100 * i + 40) if i == 0 else \
                np.concatenate([np.arange(shared), np.arange(1000, 1040 - shared)])
            root = tmp_path / f"{node}-{shared}"
            root.mkdir()
            pd.DataFrame({"id": ids, "v": ids * 2.0}).to_csv(root / "t.csv", index=False)
            roots[node] = str(root)

        def prog() -> Any:
            ta = simp.pcall((0,), lambda: table.read_csv("t.csv", {"id": "int64", "v": "float64"}))
            tb = simp.pcall((1,), lambda: table.read_csv("t.csv", {"id": "int64", "v": "float64"}))
            ja, _ = psi.join(ta, tb, "id")
            column = simp.pcall((0,), lambda t: table.to_tensor(t, ["v"], rows=30), ja)
            return simp.pcall((0,), jnp.sum, column)  # node_0's joined rows

        with mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots,
                          policies={n: str(policy) for n in roots}) as sim:
            if ok:
                total = mp.fetch(sim, mp.evaluate(sim, prog))[0]
                assert float(total) == 2.0 * sum(range(shared))
            else:
                with pytest.raises(MPRefusedError, match=(
                        r"node_[01] refuses op psi\.join at test_psi\.py:\d+: the join of "
                        r"its table \(inner\) has fewer than min_rows 10 rows \(\{to: "
                        r"\[\"\*\"\], when: aggregate, min_rows: 10\} in .*p\.yaml\), so no "
                        r"aggregate over them may leave it")):
                    mp.evaluate(sim, prog)


def test_joined_rows_selected_by_a_driver_constant_are_refused(tmp_path: Path) -> None:
    """node_0's rows a join kept, selected again by ``id == 25`` (the driver's choice): the
    run-time check counted the join, not the selection, which holds one row."""
    policy = _aggregate_policy(tmp_path)
    roots = _id_tables(tmp_path, {"node_0": np.arange(40), "node_1": np.arange(20, 60)})

    def prog() -> Any:
        ja = _node_0_joined()
        ids = simp.pcall((0,), lambda t: table.to_tensor(t, ["id"], rows=20), ja)
        values = simp.pcall((0,), lambda t: table.to_tensor(t, ["v"], rows=20), ja)
        return simp.pcall((0,), lambda i, v: jnp.sum((i == 25) * v), ids, values)

    what = r"aggregate over a data-dependent number of rows of t\.csv"
    with mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots,
                      policies={n: str(policy) for n in roots}) as sim, \
            pytest.raises(MPRefusedError, match=(
                r"^node_1 refuses the program: op simp\.pcall at test_psi\.py:\d+ sends program "
                rf"output 0, held by node_0, {what}, to driver")):
        mp.evaluate(sim, prog)  # node_0 keeps it; node_1 cannot judge node_0's fetch
    lenient = tmp_path / "lenient.yaml"
    lenient.write_text("plaintext_to: ['*']\n")
    with mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots,
                      policies={"node_0": str(policy), "node_1": str(lenient)}) as sim:
        kept = mp.evaluate(sim, prog)
        with pytest.raises(MPRefusedError, match=(
                rf"^node_0 refuses to send object \S+ to the driver: it is {what}; ")):
            mp.fetch(sim, kept)


def test_rows_repeated_by_the_other_s_repeated_keys_count_once(tmp_path: Path) -> None:
    """node_1 (with the driver) repeats one of node_0's keys 12 times: node_0's join keeps
    12 copies of that one row, whose sum would reveal it, so node_0 counts it once and
    refuses the join at run time."""
    policy = _aggregate_policy(tmp_path)
    roots = _id_tables(tmp_path, {"node_0": np.arange(40), "node_1": np.full(12, 7)})

    def prog() -> Any:
        ja = _node_0_joined()
        column = simp.pcall((0,), lambda t: table.to_tensor(t, ["v"], rows=12), ja)
        return simp.pcall((0,), jnp.sum, column)

    lenient = tmp_path / "lenient.yaml"  # node_1 sides with the driver
    lenient.write_text("plaintext_to: ['*']\n")
    with mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots,
                      policies={"node_0": str(policy), "node_1": str(lenient)}) as sim, \
            pytest.raises(MPRefusedError, match=(
                r"node_0 refuses op psi\.join at test_psi\.py:\d+: the join of its table "
                r"\(inner\) has fewer than min_rows 10 rows")):
        mp.evaluate(sim, prog)


def test_aggregates_over_rows_two_joins_kept_are_refused_together(tmp_path: Path) -> None:
    """Two joins of node_0's table (or a join and the whole table) keep rows that data
    chose differently: their sums could differ by one row, so node_0 refuses both."""
    policy = _aggregate_policy(tmp_path)
    roots = {}
    for i, node in enumerate(("node_0", "node_1")):
        root = tmp_path / node
        root.mkdir()
        ids = np.arange(40) if i == 0 else np.arange(20, 60)
        pd.DataFrame({"id": ids, "v": ids * 2.0}).to_csv(root / "t.csv", index=False)
        pd.DataFrame({"id": ids[1:], "v": ids[1:] * 2.0}).to_csv(root / "u.csv", index=False)
        roots[node] = str(root)
    schema = {"id": "int64", "v": "float64"}

    def joined_sum(other: str) -> Any:
        ta = simp.pcall((0,), lambda: table.read_csv("t.csv", schema))
        tb = simp.pcall((1,), lambda: table.read_csv(other, schema))
        ja, _ = psi.join(ta, tb, "id")
        column = simp.pcall((0,), lambda t: table.to_tensor(t, ["v"], rows=20), ja)
        return simp.pcall((0,), jnp.sum, column)

    def whole_sum() -> Any:
        ta = simp.pcall((0,), lambda: table.read_csv("t.csv", schema))
        column = simp.pcall((0,), lambda t: table.to_tensor(t, ["v"], rows=40), ta)
        return simp.pcall((0,), jnp.sum, column)

    with mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots,
                      policies={n: str(policy) for n in roots}) as sim:
        assert float(mp.fetch(sim, mp.evaluate(sim, lambda: joined_sum("t.csv")))[0]) == \
            2.0 * sum(range(20, 40))
        for program in (lambda: (joined_sum("t.csv"), joined_sum("u.csv")),
                        lambda: (joined_sum("t.csv"), whole_sum())):
            with pytest.raises(MPRefusedError, match=(
                    r"^node_0 refuses the program: .* which overlaps another release of this "
                    r"party's data: subtracting them may isolate as few as one row of t\.csv")):
                mp.evaluate(sim, program)
