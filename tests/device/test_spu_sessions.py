"""Kept secure sessions (`mplang.kernels.spu.sessions`): an SPU device's link and runtime
serve every evaluation of one driver, stay in step after failures, and hold nothing of a
finished run."""

from __future__ import annotations

import struct
import time
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects.spu import SpuConfig
from mplang.edsl.errors import MPTimeoutError
from mplang.kernels.spu.sessions import SLOTS, Session, SessionPool, SessionPools
from tests.simulators import simulated


def _pools(sim: mp.Simulator) -> list[SessionPools]:
    return [w.states["spu"].sessions for w in sim.mesh.workers]


def _slots(sim: mp.Simulator) -> list[list[tuple[int, int]]]:
    """Every party's (generation, uses) of each slot of its only pool."""
    out = []
    for pools in _pools(sim):
        (pool,) = pools._pools.values()
        out.append([slot.state() for slot in pool.slots])
    return out


def _on(sim: mp.Simulator, party: str, value: np.ndarray) -> Any:
    return mp.evaluate(sim, lambda: mp.put(party, value))


def _compare(sim: mp.Simulator) -> Any:
    @mp.function
    def prog(a: Any, b: Any) -> Any:
        return mp.put("P0", mp.device("SP0")(jnp.less)(a, b))
    return mp.compile(prog, _on(sim, "P0", np.zeros(3, np.float32)),
                      _on(sim, "P1", np.zeros(3, np.float32)), cluster=sim.cluster)


sim = simulated(mp.ClusterSpec.simple(2), scope="function")  # CHEETAH: costly setup


def test_every_evaluation_reuses_one_session(sim: mp.Simulator) -> None:
    rng = np.random.default_rng(5)
    compiled = _compare(sim)
    times = []
    for _ in range(5):
        x, y = (rng.normal(size=3).astype(np.float32) for _ in range(2))
        start = time.perf_counter()
        got = mp.fetch(sim, mp.evaluate(sim, compiled, _on(sim, "P0", x),
                                        _on(sim, "P1", y)))
        times.append(time.perf_counter() - start)
        np.testing.assert_array_equal(got, x < y)
    assert _slots(sim) == [[(1, 5)] + [(0, -1)] * (SLOTS - 1)] * 2  # one session, 5 runs
    assert min(times[1:]) < times[0] / 4, times  # CHEETAH's setup is paid once


def test_a_session_holds_no_variable_of_a_finished_run(sim: mp.Simulator) -> None:
    mp.fetch(sim, mp.evaluate(sim, _compare(sim), _on(sim, "P0", np.ones(3, np.float32)),
                              _on(sim, "P1", np.ones(3, np.float32))))
    for pools in _pools(sim):
        (pool,) = pools._pools.values()
        session = pool.slots[0].session
        assert session is not None
        for name in ("in0", "in1", "out0"):
            with pytest.raises(RuntimeError):
                session.runtime.get_var(name)


def test_a_party_whose_session_is_out_of_step_gets_a_new_one_everywhere(
        sim: mp.Simulator) -> None:
    """One party lost its session (a run failed only there): the next run's states
    differ, so every member starts a new generation and the result is right."""
    compiled = _compare(sim)
    x, y = np.array([1, 5, 3], np.float32), np.array([2, 4, 3], np.float32)

    def run() -> Any:
        return mp.fetch(sim, mp.evaluate(sim, compiled, _on(sim, "P0", x),
                                         _on(sim, "P1", y)))
    run()
    (lost,) = _pools(sim)[1]._pools.values()
    lost.release(lost.claim() or 0, ok=False)  # party 1 drops its session
    np.testing.assert_array_equal(run(), x < y)
    assert _slots(sim) == [[(2, 1)] + [(0, -1)] * (SLOTS - 1)] * 2
    np.testing.assert_array_equal(run(), x < y)
    assert _slots(sim) == [[(2, 2)] + [(0, -1)] * (SLOTS - 1)] * 2


def test_three_members_stay_in_step_whichever_loses_its_session() -> None:
    """ABY3: the leader and a member in step start at once; the third lost its session.
    Both abandon that start, and all three run on a new session, rightly."""
    sim = mp.Simulator(mp.ClusterSpec.simple(3))
    compiled = _compare(sim)
    x, y = np.array([1, 5, 3], np.float32), np.array([2, 4, 3], np.float32)
    for generation, lost in enumerate([2, 1, 0, 2], start=2):
        got = mp.fetch(sim, mp.evaluate(sim, compiled, _on(sim, "P0", x), _on(sim, "P1", y)))
        np.testing.assert_array_equal(got, x < y)
        (pool,) = _pools(sim)[lost]._pools.values()
        pool.release(pool.claim() or 0, ok=False)
        np.testing.assert_array_equal(mp.fetch(sim, mp.evaluate(
            sim, compiled, _on(sim, "P0", x), _on(sim, "P1", y))), x < y)
        assert {slots[0] for slots in _slots(sim)} == {(generation, 1)}


def test_independent_ops_beyond_the_slots_run_on_links_of_their_own(
        sim: mp.Simulator) -> None:
    ops = SLOTS + 2

    @mp.function
    def prog(a: Any, b: Any) -> Any:
        return [mp.put("P0", mp.device("SP0")(lambda u, v, k=k: u * k < v)(a, b))
                for k in range(ops)]
    x, y = np.arange(4, dtype=np.float32), np.full(4, 2.5, np.float32)
    for _ in range(2):
        outs = mp.evaluate(sim, prog, _on(sim, "P0", x),
                           _on(sim, "P1", y))
        for k, out in enumerate(outs):
            np.testing.assert_array_equal(mp.fetch(sim, out), x * k < y)
    uses = [sum(max(u, 0) for _, u in party) for party in _slots(sim)]
    assert uses[0] == uses[1] and 2 <= uses[0] <= 2 * ops


def test_a_failed_run_discards_the_session_and_frees_its_slot() -> None:
    pool = SessionPool("SP0:test")
    assert [pool.claim() for _ in range(SLOTS)] == list(range(SLOTS))
    assert pool.claim() is None  # every slot busy: the run gets a link of its own
    for index in range(1, SLOTS):
        pool.release(index, ok=True)
    pool.release(0, ok=False)
    assert [s.state() for s in pool.slots] == [(0, -1)] + [(0, 0)] * (SLOTS - 1)
    assert not pool.busy


def test_a_member_waits_for_the_runs_the_leader_served_before() -> None:
    pool = SessionPool("SP0:test")
    pool.slots[0].generation, pool.slots[0].uses = 3, 1
    with pytest.raises(MPTimeoutError, match=r"SP0:test/0 was not free in time"):
        pool.wait_turn(0, 3, 2, time.monotonic() + 0.2)  # run 2 of generation 3: not yet
    pool.wait_turn(0, 3, 1, time.monotonic() + 0.2)  # its turn
    assert pool.slots[0].busy


def test_pools_are_per_driver_and_dropped_when_the_spec_changes(sim: mp.Simulator) -> None:
    pools = SessionPools(lambda *args: None)  # type: ignore[arg-type]
    config = SpuConfig("SP0", (0, 1), "CHEETAH", "FM64")
    assert pools.pool("driver-a", config) is pools.pool("driver-a", config)
    assert pools.pool("driver-a", config) is not pools.pool("driver-b", config)
    assert len(pools) == 2
    pools.clear()
    assert len(pools) == 0
    mp.fetch(sim, mp.evaluate(sim, _compare(sim), _on(sim, "P0", np.ones(3, np.float32)),
                              _on(sim, "P1", np.ones(3, np.float32))))
    for worker in sim.mesh.workers:
        worker.states.spec_changed()
    assert [len(p) for p in _pools(sim)] == [0, 0]


def test_idle_sessions_beyond_the_cap_are_dropped_least_recently_used_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mplang.kernels.spu import sessions as spu_sessions

    monkeypatch.setattr(spu_sessions, "_REGISTRIES", __import__("weakref").WeakSet())
    pools = SessionPools(lambda *args: None)  # type: ignore[arg-type]
    config = SpuConfig("SP0", (0, 1), "CHEETAH", "FM64")
    made = [pools.pool(f"driver-{i}", config) for i in range(spu_sessions.MAX_SESSIONS + 2)]
    for i, pool in enumerate(made):
        assert pool.claim() == 0
        pool.session(0, [(0, -1)], lambda g, i=i: f"session {i}")  # type: ignore
        if i != 0:
            pool.release(0, ok=True)
    # driver-0's session is in use and stays; the two least recently used idle ones
    # (driver-1's and driver-2's) go when the next run starts, in any registry
    SessionPools(lambda *args: None).pool("driver-x", config)  # type: ignore[arg-type]
    kept = [pool.slots[0].session for pool in made]
    assert kept == ["session 0", None, None,
                    *(f"session {i}" for i in range(3, len(made)))]


class _Peers:
    """What `_States` needs of a worker: its rank and messages, here queued by hand."""

    def __init__(self, rank: int):
        self.rank = rank
        self.communicator = self
        self.sent: list[tuple[int, str, bytes]] = []
        self.inbox: dict[tuple[int, str], bytes] = {}

    def send(self, dst: int, tag: tuple[str, str], value: bytes) -> None:
        self.sent.append((dst, tag[1], value))

    def recv(self, src: Any, tag: Any, timeout: Any = None) -> bytes:
        if isinstance(src, int):  # the communicator's, which polls
            value = self.inbox.pop((src, tag[1]), None)
            if value is None:
                raise MPTimeoutError(f"no message from party {src} for {tag[1]}")
            return value
        return self.inbox.pop((tag, timeout))  # the worker's: (interp, src, key)


def _agreement(rank: int, mine: tuple[int, int], leader_state: tuple[int, int]
               ) -> tuple[Any, _Peers, SessionPool]:
    from mplang.kernels.spu import sessions as spu_sessions

    peers = _Peers(rank)
    pool = SessionPool("SP0:test")
    pool.slots[0].session = Session("old runtime", lambda *a: None)
    pool.slots[0].generation, pool.slots[0].uses = mine
    interp = type("Interp", (), {"exec_id": "e1"})()
    states = spu_sessions._States(peers, interp, (0, 1), "/0/4/session-state",  # type: ignore
                                  leader_state, mine)
    return states, peers, pool


def _run(pool: SessionPool, states: Any, body: Any, made: list[int],
         bound: list[tuple[str, bool]]) -> list[Any]:
    from mplang.kernels.spu import sessions as spu_sessions

    def make(generation: int) -> Session:
        made.append(generation)
        return Session("new runtime", lambda *a: None)

    def bind(session: Session, attempt: str, settled: Any) -> None:
        bound.append((attempt, settled is not None))
    return spu_sessions._agreed_run(pool, 0, states, body, make, bind)


def test_the_leader_starts_on_its_session_before_the_members_states_arrive() -> None:
    states, peers, pool = _agreement(0, (1, 3), (1, 3))
    heard: list[bool] = []

    def body(runtime: str) -> list[Any]:
        heard.append(states.settled())  # party 1's state is not in yet
        peers.inbox[(1, "/0/4/session-state")] = struct.pack("<qq", 1, 3)
        return [runtime]
    made: list[int] = []
    bound: list[tuple[str, bool]] = []
    assert _run(pool, states, body, made, bound) == ["old runtime"]
    assert heard == [False] and made == [] and bound == [("1.3/", True)]


def test_a_member_out_of_step_stops_the_optimistic_attempt_and_all_run_on_a_new_session(
        ) -> None:
    """The leader started on its session; party 1 lost its own. The attempt's receives
    (here a loop like `_CommChannel.Recv`'s) stop when party 1's state arrives, and the
    run is made again on a new session of the next generation, tagged apart."""
    states, peers, pool = _agreement(0, (1, 3), (1, 3))

    def body(runtime: str) -> list[Any]:
        if runtime == "old runtime":
            peers.inbox[(1, "/0/4/session-state")] = struct.pack("<qq", 1, -1)
            while not states.settled():
                pass
        return [runtime]
    made: list[int] = []
    bound: list[tuple[str, bool]] = []
    assert _run(pool, states, body, made, bound) == ["new runtime"]
    assert made == [2] and bound == [("1.3/", True), ("2.0/", False)]


def test_outputs_of_an_attempt_that_needed_no_message_are_dropped_if_a_state_differs(
        ) -> None:
    states, peers, pool = _agreement(0, (1, 3), (1, 3))
    peers.inbox[(1, "/0/4/session-state")] = struct.pack("<qq", 1, 2)
    made: list[int] = []
    bound: list[tuple[str, bool]] = []
    assert _run(pool, states, lambda runtime: [runtime], made, bound) == ["new runtime"]
    assert made == [2]


def test_a_member_out_of_step_does_not_start_and_a_real_failure_is_not_retried() -> None:
    states, peers, pool = _agreement(1, (1, -1), (1, 3))  # party 1 lost its session
    assert peers.sent == [(0, "/0/4/session-state", struct.pack("<qq", 1, -1))]
    assert not states.optimistic()
    made: list[int] = []
    bound: list[tuple[str, bool]] = []
    assert _run(pool, states, lambda runtime: [runtime], made, bound) == ["new runtime"]
    assert made == [2] and bound == [("2.0/", False)]

    states, peers, pool = _agreement(0, (1, 3), (1, 3))

    def failing(runtime: str) -> list[Any]:
        raise RuntimeError("party 1 vanished")
    with pytest.raises(RuntimeError, match="party 1 vanished"):
        _run(pool, states, failing, made, bound)
