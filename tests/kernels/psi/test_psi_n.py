"""n-party PSI (``psi.join_n``: ABY3 on secret shares, libpsi's ECDH_3PC, ECDH_NPC and
KKRT_NPC) on the simulator, against pandas: every holder gets its own rows for the keys
all n tables hold, by key; a pairwise overlap larger than the n-way one does not reach
any result, and with ABY3 nothing a holder receives depends on it; bad inputs fail every
holder at once, naming the party; type errors when tracing; the flow rule."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import mplang as mp
from mplang import simp
from mplang.dialects import psi as psi_dialect
from mplang.dialects import table
from mplang.edsl.errors import MPRefusedError
from mplang.kernels.psi import aby3 as psi_sorted
from mplang.libs import psi
from mplang.policy.check import check
from mplang.policy.policy import Policy
from tests.op_failures import assert_generic, logged_failure, traced_at
from tests.simulators import simulated

sim = simulated(4, policies="open")  # PSI's mechanics: no policy judges


def tables(n: int, seed: int = 3) -> list[pa.Table]:
    """``n`` tables of distinct int64 ids (some shared by all, some by a few) and a
    column of each holder's own."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ids = rng.choice(400, 150 + 20 * i, replace=False)
        out.append(pa.table({"id": pa.array(ids, pa.int64()),
                             f"v{i}": pa.array(rng.random(len(ids)))}))
    return out


def held(ts: list[pa.Table], parties: tuple[int, ...] | None = None) -> list[Any]:
    parties = parties or tuple(range(len(ts)))
    return [simp.pcall((p,), lambda t=t: table.constant(t)) for p, t in zip(parties, ts,
                                                                           strict=True)]


def expected(ts: list[pa.Table], key: str = "id") -> list[pa.Table]:
    """pandas' n-way inner join, split back into each holder's rows, by key."""
    frames = [t.to_pandas() for t in ts]
    common = set(frames[0][key])
    for f in frames[1:]:
        common &= set(f[key])
    return [pa.Table.from_pandas(f[f[key].isin(common)].sort_values(key), preserve_index=False)
            .cast(t.schema) for f, t in zip(frames, ts, strict=True)]


def run(sim: mp.Simulator, ts: list[pa.Table], protocol: str | None,
        parties: tuple[int, ...] | None = None) -> list[pa.Table]:
    parties = parties or tuple(range(len(ts)))

    def prog() -> Any:
        return psi.join_n(held(ts, parties), "id", protocol=protocol)

    out = mp.evaluate(sim, prog)
    return [mp.fetch(sim, o)[p] for o, p in zip(out, parties, strict=True)]


@pytest.mark.parametrize(("n", "protocol"), [(3, None), (3, "ecdh_3pc"), (3, "ecdh_npc"),
                                             (3, "kkrt_npc"), (4, None), (4, "ecdh_npc"),
                                             (2, None)])
def test_join_n_matches_pandas(sim: mp.Simulator, n: int, protocol: str | None) -> None:
    ts = tables(n)
    got, want = run(sim, ts, protocol), expected(ts)
    assert want[0].num_rows > 5
    for g, w in zip(got, want, strict=True):
        assert g.equals(w)


def test_holders_in_any_order_and_string_keys(sim: mp.Simulator) -> None:
    words = ["a,b", 'q"', "ü", "x\ny", "", "k1", "k2", "k3"]
    ts = [pa.table({"id": pa.array(words[i: i + 6]), "n": pa.array(range(6), pa.int32())})
          for i in range(3)]
    for protocol in ("aby3", "ecdh_3pc"):
        got = run(sim, ts, protocol, parties=(2, 0, 3))
        assert [g["id"].to_pylist() for g in got] == [["", "k1", "x\ny", "ü"]] * 3
        assert [g.equals(w) for g, w in zip(got, expected(ts), strict=True)] == [True] * 3


def test_a_pairwise_overlap_larger_than_the_three_way_set_is_not_in_the_results(
        sim: mp.Simulator) -> None:
    """Bank and insurer share 180 customers, all three share 150: each result has
    exactly the 150 rows, where two chained joins would give the first pair 180."""
    ids = np.arange(1000, 1400, dtype=np.int64)
    bank, insurer = ids[:200], np.concatenate([ids[:180], ids[300:340]])
    shop = np.concatenate([ids[:150], ids[350:400]])
    ts = [pa.table({"id": pa.array(x)}) for x in (bank, insurer, shop)]
    for protocol in psi.NPC_PROTOCOLS:
        got = run(sim, ts, protocol)
        assert [g["id"].to_pylist() for g in got] == [ids[:150].tolist()] * 3


def test_with_aby3_what_holders_see_does_not_depend_on_pairwise_overlaps(
        sim: mp.Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two worlds with the same row counts and the same 150 three-way ids: in one, bank
    and insurer share 180 ids, in the other none beyond the 150. Every holder
    reconstructs the same vector in both (a block of the 150 ids' hashes, one of -1s) and
    receives shares of the same sizes, so no holder can tell the worlds apart."""
    seen: list[tuple[int, list[int]]] = []
    real_rows, real_unpack = psi_sorted._rows, psi_sorted.unpack_share

    def rows(revealed: np.ndarray, mine: np.ndarray, bits: int, keys: Any) -> np.ndarray:
        seen.append((int(mine[0] & 3), revealed.tolist()))
        return real_rows(revealed, mine, bits, keys)

    def unpack(data: bytes, rows: int, sender: int) -> Any:
        seen.append((-1, [len(data), rows, sender]))
        return real_unpack(data, rows, sender)

    monkeypatch.setattr(psi_sorted, "_rows", rows)
    monkeypatch.setattr(psi_sorted, "unpack_share", unpack)
    ids = np.arange(1000, 1400, dtype=np.int64)
    shop = np.concatenate([ids[:150], ids[350:400]])
    worlds = [[ids[:200], np.concatenate([ids[:180], ids[300:340]]), shop],
              [ids[:200], np.concatenate([ids[:150], ids[200:270]]), shop]]
    views = []
    for bank, insurer, store in worlds:
        assert len(set(bank) & set(insurer) & set(store)) == 150
        seen.clear()
        got = run(sim, [pa.table({"id": pa.array(x)}) for x in (bank, insurer, store)], "aby3")
        assert [g["id"].to_pylist() for g in got] == [ids[:150].tolist()] * 3
        views.append(sorted(seen))
    assert views[0] == views[1]
    revealed = [v for who, v in views[0] if who >= 0]
    assert len(revealed) == 3 and revealed[0] == revealed[1] == revealed[2]
    kept = np.array(revealed[0]) >= 0
    assert kept.sum() == 150 and len(kept) == 200 + 220 + 200 - 2
    assert np.count_nonzero(np.diff(kept)) == 1  # one block of hashes, one of -1s
    assert set(np.array(revealed[0])[~kept]) == {-1}


def test_a_malformed_share_is_refused_naming_the_sender() -> None:
    share = psi_sorted.io_for(psi_sorted.device((0, 1, 2))).make_shares(
        np.arange(5, dtype=np.int64), psi_sorted._secret())[1]
    data = psi_sorted.pack_share(psi_sorted.SpuShare(share))
    assert psi_sorted.unpack_share(data, 5, 1).to_libspu().meta == share.meta
    with pytest.raises(mp.MPRuntimeError, match=r"party 2 sent a share of shape \(5,\); "
                                                r"expected \(6,\)"):
        psi_sorted.unpack_share(data, 6, 2)
    with pytest.raises(mp.MPRuntimeError, match="party 2 sent a malformed share: a chunk runs "
                                                "past the end"):
        psi_sorted.unpack_share(data[:-1], 5, 2)
    short = psi_sorted.io_for(psi_sorted.device((0, 1, 2))).make_shares(
        np.arange(4, dtype=np.int64), psi_sorted._secret())[1]
    short = psi_sorted.SpuShare.from_parts(bytes(share.meta), list(short.share_chunks))
    with pytest.raises(mp.MPRuntimeError, match="party 1 sent a share whose data is not 16 "
                                                "bytes for each of its 5 values"):
        psi_sorted.unpack_share(psi_sorted.pack_share(short), 5, 1)
    with pytest.raises(mp.MPRuntimeError, match="party 3 sent a malformed share: a share is a "
                                                "meta chunk and at least one data chunk"):
        psi_sorted.unpack_share(b"", 5, 3)


def test_empty_table_or_intersection_gives_typed_empty_tables(sim: mp.Simulator) -> None:
    ts = tables(3)
    empty = ts[1].slice(0, 0)
    for inputs in ([ts[0], empty, ts[2]],
                   [ts[0], pa.table({"id": pa.array([10_000], pa.int64()),
                                     "v1": pa.array([0.5])}), ts[2]]):
        got = run(sim, inputs, None)
        assert [g.num_rows for g in got] == [0, 0, 0]
        assert [g.schema for g in got] == [t.schema for t in inputs]


def test_repeated_keys_fail_every_holder_at_once(sim: mp.Simulator,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    ts = tables(3)
    dup = pa.concat_tables([ts[1], ts[1].slice(0, 2)])

    def prog() -> Any:
        return psi.join_n(held([ts[0], dup, ts[2]]), "id")  # @dup

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog)
    at = traced_at(__file__, "dup")
    assert_generic(info.value, "psi.join_n", at, 1)
    assert logged_failure(caplog, "psi.join_n", at, "node_1").startswith(
        "MPRuntimeError: party 1: op psi.join_n: key column 'id' of party 1's table has 2 "
        "repeated value(s); psi.join_n needs distinct keys")


def test_null_keys_name_the_party(sim: mp.Simulator, caplog: pytest.LogCaptureFixture) -> None:
    nulls = pa.table({"id": pa.array([1, None], pa.int64())})

    def prog() -> Any:
        return psi.join_n(held([tables(1)[0].select(["id"]), nulls, nulls]), "id")  # @nulls

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog)
    at = traced_at(__file__, "nulls")
    assert re.fullmatch(rf"op psi\.join_n at {at} failed on node_[12] \(party [12]; its log "
                        r"has the details\)", str(info.value))
    assert "key column 'id' of party 2's table has 1 null value(s)" in logged_failure(
        caplog, "psi.join_n", at, "node_2")


def test_type_errors_when_tracing() -> None:
    ts = tables(4)
    cases = [
        ([ts[0], ts[1].cast(pa.schema([("id", pa.int32()), ("v1", pa.float64())])), ts[2]],
         None, r"key column 'id' is int64 in table 0 \(held by party 0\) but int32 in table 1 "
               r"\(held by party 1\)"),
        (ts, "ecdh_3pc", "protocol 'ecdh_3pc' joins exactly three tables, got 4"),
        (ts[:3], "rr22", r"protocol='rr22'; use one of aby3, ecdh_3pc, ecdh_npc, kkrt_npc"),
        (ts[:2], "aby3", r"protocol 'aby3' needs at least three tables \(three holders "
                         r"compute\), got 2; two tables join with psi.join or 'kkrt_npc'"),
        ([ts[0].drop_columns(["id"]), ts[1], ts[2]], None,
         r"table 0 \(held by party 0\) has no key column 'id'"),
    ]
    for inputs, protocol, message in cases:
        with pytest.raises(mp.MPTypeError, match=message):
            mp.compile(lambda inputs=inputs, protocol=protocol: psi.join_n(
                held(inputs), "id", protocol=protocol), world_size=4)
    with pytest.raises(mp.MPTypeError, match=r"held by parties \[0, 1, 0\]; each party may "
                                             "hold one table only"):
        mp.compile(lambda: psi.join_n(held(ts[:3], (0, 1, 0)), "id"), world_size=4)


def test_op_is_declared_with_its_flow_rule() -> None:
    where = psi_dialect.join_n_p.registered_at("flow")
    assert where is not None and where.startswith("mplang/dialects/psi.py:")
    assert psi_dialect.join_n_p.attrs["protocol"].choices == psi.NPC_PROTOCOLS
    graph = mp.compile(lambda: psi.join_n(held(tables(3)), "id"), world_size=3).graph
    (op,) = [o for o in graph.walk() if o.opcode == "psi.join_n"]
    assert op.attrs == {"key": "id", "protocol": "aby3", "rows": "n0"}


def test_policy_sees_a_comparison_with_every_other_holder(tmp_path: Path) -> None:
    """Each holder may learn which of its keys another holder has (libpsi's NPC tree):
    which of p's keys the join matched reaches every other holder, judged by an
    ``intersection`` rule."""
    roots = {}
    for i, t in enumerate(tables(3)):
        (tmp_path / f"node_{i}").mkdir()
        t.select(["id"]).to_pandas().to_csv(tmp_path / f"node_{i}" / "ids.csv", index=False)
        roots[f"node_{i}"] = str(tmp_path / f"node_{i}")

    def prog() -> Any:
        ts = [simp.pcall((i,), lambda: table.read_csv("ids.csv", {"id": "int64"}))
              for i in range(3)]
        return psi.join_n(ts, "id", protocol="ecdh_npc")

    spec = mp.ClusterSpec.simple(3)
    (tmp_path / "p.yaml").write_text("psi_protocols: [ecdh_npc]\n"
                                     "declassify:\n  - to: ['*']\n    when: intersection\n")
    graph = mp.compile(prog, cluster=spec).graph
    verdict = check(graph, 3, 0, Policy.load(tmp_path / "p.yaml"), outputs_fetchable=False)
    assert verdict.accepted, verdict.reasons
    receivers = sorted(int(m.group(1)) for f in verdict.flows
                       if (m := re.match(r"which keys the join matched of ids\.csv -> "
                                         r"node_(\d) \(which of the receiver's keys the other "
                                         r"holders' tables hold, op psi\.join_n", f)))
    assert receivers == [1, 2], verdict.flows
    (tmp_path / "p.yaml").write_text("psi_protocols: [ecdh_npc]\n")
    sim = mp.Simulator(spec, data_roots=roots, policies={n: str(tmp_path / "p.yaml")
                                                         for n in roots})
    try:
        with pytest.raises(MPRefusedError, match=(
                r"refuses the program: op psi\.join_n at test_psi_n\.py:\d+ .*which keys the "
                r"join matched of ids\.csv, to node_\d; add a rule \{to: \[node_\d\], when: "
                r"intersection\} to declassify")):
            mp.evaluate(sim, prog)
    finally:
        sim.close()
