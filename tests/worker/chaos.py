"""Chaos on real worker processes: one party killed (SIGKILL) or frozen (SIGSTOP) at a
random moment of an SPU, PSI or PHE run; shared by ``tests/worker/test_chaos.py`` (a few
runs per device) and ``benchmarks/bench_chaos.py`` (50 per device).

A run is ``mp.evaluate(..., timeout=T)`` of a `Workload` in a thread; the fault lands
``delay`` seconds after the call (0: before the program reaches the party), if the run
is still going then. The run must end within T + 2 s of the fault with an
`mp.MPCommunicationError` (or its subclass `mp.MPTimeoutError`) that blames the faulted
party (`blamed`); once the party is back (restarted, or continued) the same workload runs
again and gives the right value.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
import pyarrow as pa

import mplang as mp
from mplang import phe, simp
from mplang.cluster.local import LocalCluster
from mplang.dialects import table
from mplang.libs import psi

GRACE_S = 2.0
"""How long past the evaluation's timeout a fault may take to end the run (issue 26)."""
FAULTS = ("kill", "freeze")


@dataclass(frozen=True)
class Workload:
    """A program of one device kind, the parties it runs on (those a fault may hit) and
    a check of its fetched value."""

    device: str
    program: Callable[[], Any]
    parties: tuple[int, ...]
    check: Callable[[Any], bool]


def spu_workload(rounds: int = 150, size: int = 1000) -> Workload:
    """A product of two parties' vectors, then ``rounds`` secure comparisons (ABY3 over
    all three parties), revealed to P0. Whole numbers: fixed point computes them exactly."""
    vec = (np.arange(size) % 100).astype(np.float32)

    def step(w: Any, xp: Any) -> Any:
        for _ in range(rounds):
            w = xp.where(w > 5000.0, w - 3.0, w + 2.0)
        return w

    def program() -> Any:
        x = mp.device("P0")(lambda: jnp.asarray(vec))()
        y = mp.device("P1")(lambda: jnp.asarray(vec) * 2)()
        return mp.put("P0", mp.device("SP0")(lambda u, v: step(u * v, jnp))(x, y))

    expected = step(vec * (vec * 2), np)
    return Workload("SPU", program, (0, 1, 2),
                    lambda got: np.allclose(got, expected, atol=1e-3))


def psi_workload(rows: int = 150_000, protocol: str = "rr22", parties: int = 2) -> Workload:
    """An inner PSI join of the id columns (``rows`` ids each) of P0 and P1
    (``psi.join`` with ``protocol``), or of ``parties`` parties (``psi.join_n``)."""
    rng = np.random.default_rng(7)
    ids = [rng.choice(4 * rows, rows, replace=False) for _ in range(parties)]
    tables = [pa.table({"id": pa.array(i, pa.int64())}) for i in ids]
    shared = sorted(set.intersection(*(set(i.tolist()) for i in ids)))

    def program() -> Any:
        held = [simp.pcall((i,), lambda t=t: table.constant(t)) for i, t in enumerate(tables)]
        if parties > 2:
            return psi.join_n(held, "id", protocol=protocol)[0]
        return psi.join(held[0], held[1], "id", protocol=protocol)[0]

    name = "PSI" if (protocol, parties) == ("rr22", 2) else f"PSI-{protocol}"
    return Workload(name, program, tuple(range(parties)),
                    lambda got: sorted(got[0]["id"].to_pylist()) == shared)


def phe_workload(size: int = 2000) -> Workload:
    """P0's Paillier key; P1 encrypts ``size`` integers, doubles them under encryption
    and sends them back; P0 decrypts."""
    vec = np.arange(size, dtype=np.int32)

    def program() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
        c = simp.pcall((1,), phe.encrypt, simp.constant((1,), vec),
                       simp.shuffle_static(pk, {1: 0}))
        doubled = simp.shuffle_static(simp.pcall((1,), lambda a: a + a, c), {0: 1})
        return simp.pcall((0,), phe.decrypt, doubled, sk)

    return Workload("PHE", program, (0, 1),
                    lambda got: np.array_equal(got[0], vec * 2))


def blamed(error: BaseException) -> int | None:
    """The party an error holds responsible: the one a failed wait waited for (``peer``),
    else the one it names (``party``)."""
    peer = getattr(error, "peer", None)
    return peer if peer is not None else getattr(error, "party", None)


def names(error: BaseException | None, rank: int) -> bool:
    """Whether ``error`` is a communication failure blaming party ``rank`` by its fields
    and its message."""
    return (isinstance(error, mp.MPCommunicationError) and blamed(error) == rank
            and f"party {rank}" in str(error))


@dataclass
class Outcome:
    """One faulted run and the recovery run after it."""

    device: str
    fault: str
    party: int
    delay: float
    timeout: float
    error: BaseException | None = None
    to_error: float = float("inf")
    """Seconds from the fault to the end of ``mp.evaluate``."""
    recovered: bool = False

    @property
    def in_time(self) -> bool:
        return self.to_error <= self.timeout + GRACE_S

    @property
    def named(self) -> bool:
        return names(self.error, self.party)


def timed(driver: mp.Driver, workload: Workload, timeout: float | None) -> float:
    """Seconds of one clean run (evaluate and fetch); raises if its value is wrong."""
    started = time.monotonic()
    got = mp.fetch(driver, mp.evaluate(driver, workload.program, timeout=timeout))
    if not workload.check(got):
        raise AssertionError(f"{workload.device}: wrong value {got!r}")
    return time.monotonic() - started


def struck(driver: mp.Driver, workload: Workload, delay: float, timeout: float,
           strike: Callable[[], None], heal: Callable[[], None]
           ) -> tuple[BaseException | None, float] | None:
    """Run ``workload``, call ``strike`` ``delay`` s into it and ``heal`` once the run
    ended: the run's error (None if it ended well) and the seconds from the strike to
    its end. None if the run ended before the strike was due."""
    ended: dict[str, Any] = {}

    def run() -> None:
        try:
            mp.evaluate(driver, workload.program, timeout=timeout)
        except BaseException as e:  # recorded for the caller's thread
            ended["error"] = e
        ended["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True, name="chaos-run")
    thread.start()
    thread.join(delay)
    if not thread.is_alive():
        if "error" in ended:
            raise AssertionError(f"{workload.device} failed before its fault") \
                from ended["error"]
        return None
    struck_at = time.monotonic()
    strike()
    try:
        thread.join(timeout + GRACE_S + 30)
        if thread.is_alive():
            raise AssertionError(f"{workload.device}: a fault {delay:.2f} s into the run "
                                 "left mp.evaluate waiting")
    finally:
        heal()
    return ended.get("error"), ended["at"] - struck_at


def faulted_run(cluster: LocalCluster, driver: mp.Driver, workload: Workload, fault: str,
                party: int, delay: float, timeout: float) -> Outcome | None:
    """Run ``workload`` and fault ``party`` ``delay`` s into it; restore the party and run
    the workload once more. None if the run ended before the fault was due."""
    node = cluster.cluster.nodes[party].name
    strike = cluster.kill if fault == "kill" else cluster.freeze
    heal = cluster.start_node if fault == "kill" else cluster.thaw
    ended = struck(driver, workload, delay, timeout, lambda: strike(node), lambda: heal(node))
    if ended is None:
        return None
    outcome = Outcome(workload.device, fault, party, delay, timeout, *ended)
    timed(driver, workload, None)
    outcome.recovered = True
    return outcome


@dataclass
class Draws:
    """A device's faulted runs, and the draws that did not fault a run (drawn again)."""

    outcomes: list[Outcome]
    late: int = 0
    """Faults due after the run had ended."""
    finished: int = 0
    """Runs that ended well although the fault came while they ran: the party had done
    its part (sent its last message, answered the driver)."""


def chaos(cluster: LocalCluster, driver: mp.Driver, workload: Workload, runs: int,
          timeout: float, rng: random.Random, span: float) -> Draws:
    """``runs`` faulted runs of ``workload``, each faulting a random party of it with a
    random fault at a random moment in ``[0, span)``."""
    draws = Draws([])
    while len(draws.outcomes) < runs:
        fault = rng.choice(FAULTS)
        party = rng.choice(workload.parties)
        outcome = faulted_run(cluster, driver, workload, fault, party,
                              rng.uniform(0.0, span), timeout)
        if outcome is None:
            draws.late += 1
        elif outcome.error is None:
            draws.finished += 1
        else:
            draws.outcomes.append(outcome)
    return draws


def summary(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts and times of a device's faulted runs; ``ops``: how many errors name each op
    (``func.call``: the program, before its ops ran)."""
    times = [o.to_error for o in outcomes]
    ops = Counter(str(getattr(o.error, "op", None)) for o in outcomes)
    return {"runs": len(outcomes), "ops": dict(ops.most_common()),
            "kills": sum(o.fault == "kill" for o in outcomes),
            "in_time": sum(o.in_time for o in outcomes),
            "named": sum(o.named for o in outcomes),
            "recovered": sum(o.recovered for o in outcomes),
            "median_s": statistics.median(times), "max_s": max(times)}


def describe(o: Outcome) -> str:
    """One line for a faulted run."""
    return (f"{o.device} {o.fault} party {o.party} at {o.delay:.2f} s: {o.to_error:.2f} s, "
            f"{type(o.error).__name__}: {o.error}")


def misses(outcomes: list[Outcome]) -> list[str]:
    """A line for each run that ended late or blamed another party."""
    return [describe(o) for o in outcomes if not (o.in_time and o.named)]
