"""Unbalanced PSI (``psi.ub_prepare`` once, ``psi.ub_join`` many times; libpsi's ECDH-OPRF)
on the simulator with real data roots: results against numpy, the state in the server's
data root and the copy in each client's, a copy refreshed when the server prepares
again, and the errors of a missing state, of keys of another type and of bad names."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import mplang as mp
from mplang import simp
from mplang.dialects import table
from mplang.libs import psi
from tests.op_failures import assert_generic, logged_failure, traced_at

RNG = np.random.default_rng(11)
SERVER = pa.table({"id": pa.array(RNG.choice(20_000, 5_000, replace=False), pa.int64()),
                   "secret": pa.array(RNG.random(5_000))})


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    out = {f"node_{i}": tmp_path / f"node_{i}" for i in range(3)}
    for root in out.values():
        root.mkdir()
    return out


@pytest.fixture
def sim(roots: dict[str, Path]) -> Iterator[mp.Simulator]:
    # PSI's mechanics (the clients fetch their joined rows): no policy judges
    simulator = mp.Simulator(mp.ClusterSpec.simple(3), data_roots=roots, policies="open")
    try:
        yield simulator
    finally:
        simulator.close()


def prepare(sim: mp.Simulator, t: pa.Table = SERVER, name: str = "customers") -> int:
    def prog() -> Any:
        return psi.ub_prepare(simp.pcall((0,), lambda: table.constant(t)), "id", name=name)

    return int(mp.fetch(sim, mp.evaluate(sim, prog))[0])


def query(sim: mp.Simulator, client: int, t: pa.Table, name: str = "customers") -> pa.Table:
    def prog() -> Any:
        mine = simp.pcall((client,), lambda: table.constant(t))
        return psi.ub_join(mine, "id", server=0, name=name)

    got: pa.Table = mp.fetch(sim, mp.evaluate(sim, prog))[client]
    return got


def client_table(rows: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = rng.choice(20_000, rows)  # repeats allowed
    return pa.table({"id": pa.array(ids, pa.int64()), "n": pa.array(np.arange(rows))})


def expected(client: pa.Table, server: pa.Table = SERVER) -> pa.Table:
    """The client's rows whose id the server holds, by (id, row)."""
    ids = client.column("id").to_numpy()
    rows = np.flatnonzero(np.isin(ids, server.column("id").to_numpy()))
    return client.take(pa.array(rows[np.lexsort((rows, ids[rows]))]))


def test_prepare_once_then_join_many_times(sim: mp.Simulator, roots: dict[str, Path]) -> None:
    assert prepare(sim) == 5_000
    state = roots["node_0"] / "ub-psi" / "customers"
    token = json.loads((state / "server.json").read_text())["token"]
    assert (state / "server-cache").is_dir() and (state / "server-keys.csv").is_file()
    copies: dict[int, float] = {}
    for n, client in enumerate((1, 2, 1, 1)):
        mine = client_table(300 + 50 * n, seed=n)
        got = query(sim, client, mine)
        assert got.equals(expected(mine)) and got.num_rows > 10
        copy = roots[f"node_{client}"] / "ub-psi" / "customers"
        assert json.loads((copy / "client.json").read_text()) == {"token": token}
        stamp = (copy / "client-cache").stat().st_mtime
        assert copies.setdefault(client, stamp) == stamp  # fetched once per client
    assert not (roots["node_0"] / "ub-psi" / "customers" / "client.json").exists()


def test_preparing_again_refreshes_the_clients_copy(sim: mp.Simulator,
                                                    roots: dict[str, Path]) -> None:
    prepare(sim)
    mine = client_table(200, seed=7)
    query(sim, 1, mine)
    smaller = SERVER.slice(0, 1_000)
    assert prepare(sim, smaller) == 1_000
    assert query(sim, 1, mine).equals(expected(mine, smaller))
    token = json.loads((roots["node_0"] / "ub-psi/customers/server.json").read_text())["token"]
    assert json.loads((roots["node_1"] / "ub-psi/customers/client.json").read_text()) == {
        "token": token}


def test_empty_tables_and_strings(sim: mp.Simulator) -> None:
    words = pa.table({"id": pa.array(["a,b", "ü", 'q"', "x\ny", "zz"])})
    prepare(sim, words, name="words")
    assert query(sim, 2, words.slice(0, 0), name="words").num_rows == 0
    mine = pa.table({"id": pa.array(["zz", "nope", "a,b", "zz"]), "n": pa.array([0, 1, 2, 3])})
    got = query(sim, 2, mine, name="words")
    assert got.to_pydict() == {"id": ["a,b", "zz", "zz"], "n": [2, 0, 3]}
    assert prepare(sim, words.slice(0, 0), name="none") == 0  # libpsi does not run
    assert query(sim, 1, mine, name="none").schema == mine.schema
    assert query(sim, 1, mine, name="none").num_rows == 0


def test_a_missing_state_names_the_server_and_what_to_do(
        sim: mp.Simulator, caplog: pytest.LogCaptureFixture) -> None:
    def prog() -> Any:
        mine = simp.pcall((1,), lambda: table.constant(client_table(10, 1)))
        return psi.ub_join(mine, "id", server=0, name="never")  # @missing

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog)
    at = traced_at(__file__, "missing")
    assert_generic(info.value, "psi.ub_join", at, 0)
    assert logged_failure(caplog, "psi.ub_join", at, "node_0").startswith(
        "MPRuntimeError: party 0: op psi.ub_join: party 0 has no usable prepared set 'never' "
        "for key 'id' in its data root (ub-psi/never); run psi.ub_prepare(table, 'id', "
        "name='never') on party 0 first")


def test_a_stale_state_is_refused(sim: mp.Simulator, roots: dict[str, Path],
                                  caplog: pytest.LogCaptureFixture) -> None:
    """A state of another format (or with files missing) is not used."""
    prepare(sim)
    manifest = roots["node_0"] / "ub-psi/customers/server.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": 0}))

    def prog() -> Any:
        mine = simp.pcall((2,), lambda: table.constant(client_table(10, 1)))
        return psi.ub_join(mine, "id", server=0, name="customers")  # @stale

    with pytest.raises(mp.MPRuntimeError):
        mp.evaluate(sim, prog)
    assert "run psi.ub_prepare(table, 'id', name='customers') on party 0 first" in \
        logged_failure(caplog, "psi.ub_join", traced_at(__file__, "stale"), "node_0")


def test_keys_of_another_type_name_both_parties(sim: mp.Simulator,
                                                caplog: pytest.LogCaptureFixture) -> None:
    prepare(sim)
    strings = pa.table({"id": pa.array(["1", "2"])})

    def prog() -> Any:
        mine = simp.pcall((1,), lambda: table.constant(strings))
        return psi.ub_join(mine, "id", server=0, name="customers")  # @types

    with pytest.raises(mp.MPRuntimeError):
        mp.evaluate(sim, prog)
    assert logged_failure(caplog, "psi.ub_join", traced_at(__file__, "types"), "node_1"
                          ).startswith(
        "MPRuntimeError: party 1: op psi.ub_join: key column 'id' of party 1's table is string, "
        "but party 0 prepared 'customers' with int64 keys; cast the key column to that type")


def test_bad_names_and_servers_fail_when_tracing() -> None:
    t = client_table(5, 0)
    for name in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(mp.MPTypeError, match=r"name=.* must be 1 to 100 letters"):
            mp.compile(lambda name=name: psi.ub_prepare(
                simp.pcall((0,), lambda: table.constant(t)), "id", name=name), world_size=2)
    with pytest.raises(mp.MPTypeError, match=r"server=1 must be a party of a 2-party world "
                                             r"other than the client \(party 1\)"):
        mp.compile(lambda: psi.ub_join(simp.pcall((1,), lambda: table.constant(t)), "id",
                                       server=1, name="x"), world_size=2)


def test_a_data_root_policy_must_allow_the_writes(tmp_path: Path, roots: dict[str, Path]) -> None:
    """Preparing writes ``ub-psi/NAME`` into the server's data root: its policy's
    ``writes`` must allow it."""
    (tmp_path / "p.yaml").write_text("writes: []\npsi_protocols: [ecdh_oprf_ub]\n")
    sim = mp.Simulator(mp.ClusterSpec.simple(3), data_roots=roots,
                       policies={n: str(tmp_path / "p.yaml") for n in roots})
    try:
        with pytest.raises(mp.MPRefusedError, match=r"op psi\.ub_prepare at test_psi_ub\.py:\d+ "
                                                    r"writes 'ub-psi/customers'"):
            prepare(sim)
    finally:
        sim.close()
