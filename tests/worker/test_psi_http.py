"""PSI across real worker processes: libpsi runs over each worker's own communicator
link, the intersection count over its messages; the same programs in the simulator
(``ctx``) give the same results, checked against pandas and Python sets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster, dev_policy
from mplang.dialects import table
from mplang.libs import psi
from mplang.policy.policy import Policy
from tests.op_failures import assert_generic, logged_failure, logged_failure_line, traced_at
from tests.worker import support

RNG = np.random.default_rng(5)
IDS = RNG.choice(100_000, 900, replace=False)
A = pa.table({"id": pa.array(IDS[:600], pa.int64()),
              "age": pa.array(RNG.integers(18, 90, 600), pa.int32())})
B = pa.table({"id": pa.array(np.concatenate([IDS[300:], IDS[300:310]]), pa.int64()),
              "city": pa.array([f"c{i % 17}" for i in range(610)])})
"""300 shared ids; B holds 10 of them twice."""


def tables(parties: tuple[int, int]) -> tuple[Any, Any]:
    return (simp.pcall((parties[0],), lambda: table.constant(A)),
            simp.pcall((parties[1],), lambda: table.constant(B)))


def reference(how: str) -> tuple[pa.Table, pa.Table]:
    """The documented result: matched pairs by (id, A row, B row), then A's unmatched rows."""
    a_rows = {v: i for i, v in enumerate(A.column("id").to_pylist())}
    pairs = sorted((v, a_rows[v], j) for j, v in enumerate(B.column("id").to_pylist())
                   if v in a_rows)
    ra: list[int | None] = [i for _, i, _ in pairs]
    rb: list[int | None] = [j for _, _, j in pairs]
    if how == "left":
        shared = set(B.column("id").to_pylist())
        only = sorted((v, i) for v, i in a_rows.items() if v not in shared)
        ra, rb = ra + [i for _, i in only], rb + [None] * len(only)
    return A.take(pa.array(ra, pa.int64())), B.take(pa.array(rb, pa.int64()))


def party_2_failure(ctx: Any, prog: Any, op: str, tag: str, request: pytest.FixtureRequest,
                    caplog: pytest.LogCaptureFixture) -> str:
    """Run ``prog``, which fails on party 2 at op ``op`` (the line tagged ``tag``): the
    driver hears the generic error; returns party 2's logged detail."""
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(ctx, prog)
    at = traced_at(__file__, tag)
    assert_generic(info.value, op, at, 2)
    if isinstance(ctx, mp.Driver):
        cluster: LocalCluster = request.getfixturevalue("local_cluster")
        return logged_failure_line(cluster.log_tail("node_2", 1 << 20), op, at, "node_2")
    return logged_failure(caplog, op, at, "node_2")


@pytest.mark.parametrize(("how", "protocol", "parties"),
                         [("inner", "rr22", (0, 1)), ("left", "ecdh", (2, 0))])
def test_join_across_workers(ctx: Any, how: str, protocol: str, parties: tuple[int, int],
                             request: pytest.FixtureRequest) -> None:
    @mp.function
    def prog() -> Any:
        return psi.join(*tables(parties), "id", how=how, protocol=protocol)

    ja, jb = mp.evaluate(ctx, prog)
    got_a, got_b = mp.fetch(ctx, ja)[parties[0]], mp.fetch(ctx, jb)[parties[1]]
    want_a, want_b = reference(how)
    assert got_a.equals(want_a) and got_b.equals(want_b)
    assert got_a.num_rows == (310 if how == "inner" else 610)
    if isinstance(ctx, mp.Driver):  # libpsi's log lines are in the worker's log
        cluster: LocalCluster = request.getfixturevalue("local_cluster")
        assert "[info] [launch.cc:" in cluster.log_tail(f"node_{parties[0]}", 1 << 20)


def test_intersection_size_across_workers(ctx: Any) -> None:
    @mp.function
    def prog() -> Any:
        a, b = tables((0, 1))
        return psi.intersection_size(a, b, "id", reveal_to=(1, 2))

    assert mp.fetch(ctx, mp.evaluate(ctx, prog)) == [None, 300, 300]


def test_bad_keys_fail_both_workers_at_once(ctx: Any, request: pytest.FixtureRequest,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Party 2's check of its keys fails the run on both workers; the driver hears which
    op failed on party 2, party 2's log (its worker's log file) says why."""
    nulls = pa.table({"id": pa.array([1, None], pa.int64())})

    @mp.function
    def prog() -> Any:
        a = simp.pcall((0,), lambda: table.constant(A))
        b = simp.pcall((2,), lambda: table.constant(nulls))
        return psi.join(a, b, "id")  # @join

    detail = party_2_failure(ctx, prog, "psi.join", "join", request, caplog)
    assert detail.startswith("MPRuntimeError: party 2: op psi.join: key column 'id' of party "
                             "2's table has 1 null value(s)")
    test_intersection_size_across_workers(ctx)  # the workers are fine afterwards


def _n_tables() -> list[pa.Table]:
    """Three tables of distinct ids: 120 shared by all, 60 more by parties 0 and 1."""
    ids = RNG.choice(100_000, 600, replace=False)
    parts = [np.concatenate([ids[:180], ids[200:300]]), np.concatenate([ids[:180], ids[300:350]]),
             np.concatenate([ids[:120], ids[400:600]])]
    return [pa.table({"id": pa.array(p, pa.int64()),
                      f"v{i}": pa.array(np.arange(len(p)) * (i + 1))}) for i, p in enumerate(parts)]


NPC = ("psi_protocols: [", "psi_protocols: [ecdh_3pc, kkrt_npc, ")
"""The edit of a development policy that also lists libpsi's n-party protocols."""


@pytest.fixture(scope="module")
def npc_driver() -> Iterator[mp.Driver]:
    """A driver of workers whose policies also list libpsi's n-party protocols, which the
    development policies leave out (they reveal pairwise overlaps)."""
    local = LocalCluster(support.make_spec(support.free_ports(3)))
    for node in ("node_0", "node_1", "node_2"):
        policy = local.spec_path.parent / "policies" / f"{node}.yaml"
        policy.write_text(policy.read_text().replace(*NPC))
    try:
        local.start(timeout=120)
        with support.connected_driver(local) as driver:
            yield driver
    finally:
        local.close()


@pytest.fixture(scope="module")
def npc_sim(cluster_spec: mp.ClusterSpec) -> Iterator[mp.Simulator]:
    """A simulator of ``ctx``'s spec judging by the policies of ``npc_driver``'s workers."""
    with mp.Simulator(cluster_spec, policies={
            n.name: Policy.parse(dev_policy(cluster_spec, n.name).replace(*NPC))
            for n in cluster_spec.nodes}) as sim:
        yield sim


@pytest.mark.parametrize("protocol", ["aby3", "ecdh_3pc", "kkrt_npc"])
def test_join_n_across_workers(ctx: Any, protocol: str, request: pytest.FixtureRequest
                               ) -> None:
    """Each worker gets its own rows for the 120 ids all three hold, not the 180 that
    parties 0 and 1 share. The development policies refuse libpsi's protocols; workers
    (or simulated parties) whose policies list them run them."""
    ts = _n_tables()

    @mp.function
    def prog() -> Any:
        held = [simp.pcall((i,), lambda t=t: table.constant(t)) for i, t in enumerate(ts)]
        return psi.join_n(held, "id", protocol=protocol)

    if protocol != "aby3":
        with pytest.raises(mp.MPRefusedError, match=rf"op psi\.join_n at test_psi_http\.py:"
                           rf"\d+ uses PSI protocol {protocol}, which psi_protocols"):
            mp.evaluate(ctx, prog)
        ctx = request.getfixturevalue("npc_driver" if isinstance(ctx, mp.Driver) else "npc_sim")
    out = mp.evaluate(ctx, prog)
    shared = sorted(set(ts[0]["id"].to_pylist()) & set(ts[2]["id"].to_pylist()))
    for i, (o, t) in enumerate(zip(out, ts, strict=True)):
        got = mp.fetch(ctx, o)[i]
        rows = {v: j for j, v in enumerate(t["id"].to_pylist())}
        assert len(shared) == 120
        assert got.equals(t.take(pa.array([rows[v] for v in shared], pa.int64())))


def test_join_n_repeated_keys_fail_every_worker_at_once(ctx: Any, request: pytest.FixtureRequest,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    ts = _n_tables()
    ts[2] = pa.concat_tables([ts[2], ts[2].slice(0, 1)])

    @mp.function
    def prog() -> Any:
        held = [simp.pcall((i,), lambda t=t: table.constant(t)) for i, t in enumerate(ts)]
        return psi.join_n(held, "id")  # @join_n

    detail = party_2_failure(ctx, prog, "psi.join_n", "join_n", request, caplog)
    assert detail.startswith("MPRuntimeError: party 2: op psi.join_n: key column 'id' of party "
                             "2's table has 1 repeated value(s)")
    test_join_n_across_workers(ctx, "aby3", request)  # the workers are fine afterwards

