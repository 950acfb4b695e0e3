"""Faults: a worker killed mid-run, many evaluations at once, a busy port.

A worker killed with SIGKILL while party 1 runs a slow op (and the others wait
for its messages) makes `mp.evaluate` raise `MPRuntimeError` naming party 1
and an op, quickly; the surviving workers abandon the execution (their
mailboxes keep nothing of it, their next program runs) and a restarted worker
joins the next program.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import mplang as mp
from mplang import simp, tensor
from mplang.cluster.local import LocalCluster
from mplang.edsl.primitive import primitives
from tests.worker import support

FAIL_WITHIN_S = 10.0


def _spin(x: Any) -> Any:
    """A loop that never ends (``c`` converges to 2): the worker running it gets killed."""
    return lax.while_loop(lambda c: c > -1.0, lambda c: c * 0.5 + 1.0, x)


def stuck_on_party_1() -> Any:
    """Party 1 runs an endless op; parties 0 and 2 wait for its result. Party 2 also sends
    party 0 a message that party 0 can take only after party 1's result arrived (its
    receiving op depends on that result), so the message stays queued at party 0
    however the parties schedule their ops."""
    slow = simp.pcall((1,), lambda v: tensor.run_jax(_spin, v),
                      simp.constant((1,), np.float32(1.0)))
    to_0 = simp.shuffle_static(slow, {0: 1})
    joined = simp.converge(to_0, simp.constant((2,), np.float32(5.0)))  # held by 0 and 2
    queued = simp.shuffle_static(joined, {0: 2})  # party 2 sends at once
    to_2 = simp.shuffle_static(slow, {2: 1})
    return queued, to_2


def evaluate_in_thread(ctx: Any, fn: Callable[[], Any], mode: str
                       ) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = mp.evaluate(ctx, fn, mode=mode)
        except BaseException as e:  # recorded for the test thread
            outcome["error"] = e
        outcome["finished"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def assert_names_party_1_and_an_op(error: BaseException) -> None:
    assert isinstance(error, mp.MPRuntimeError), repr(error)
    message = str(error)
    assert "party 1" in message, message
    assert error.op in {prim.name for prim in primitives()}, (error.op, message)
    assert f"op {error.op}" in message, message


def ring_values(ctx: Any, mode: str) -> list[int]:
    out = mp.evaluate(ctx, lambda: simp.shuffle_static(simp.prank() * 7 + 1, {0: 2, 1: 0, 2: 1}),
                      mode=mode)
    return [int(v) for v in mp.fetch(ctx, out)]


# ---------------------------------------------------------------- a worker killed mid-run


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_worker_killed_mid_run(local_cluster: LocalCluster, http_driver: mp.Driver,
                               mode: str) -> None:
    thread, outcome = evaluate_in_thread(http_driver, stuck_on_party_1, mode)
    time.sleep(1.5)  # trace, ship, and let party 1 get into its loop
    try:
        running = thread.is_alive()
        killed_at = time.monotonic()
        local_cluster.kill("node_1")
        assert running, outcome
        thread.join(FAIL_WITHIN_S + 5)
        assert not thread.is_alive(), "evaluate did not return after the worker was killed"
        assert outcome["finished"] - killed_at < FAIL_WITHIN_S
        assert "error" in outcome, outcome
        assert_names_party_1_and_an_op(outcome["error"])

        # the survivors abandoned the execution: a program on them alone runs normally
        def on_0_and_2() -> Any:
            x = simp.constant((0,), np.array([1.5, 2.5], dtype=np.float32))
            y = simp.shuffle_static(x, {2: 0})
            return simp.pcall((2,), lambda v: v * 2.0, y)

        out = mp.evaluate(http_driver, on_0_and_2, mode=mode)
        got = mp.fetch(http_driver, out)
        assert got[0] is None and got[1] is None
        assert got[2].tolist() == [3.0, 5.0]
        # a program that needs the dead party fails fast and names it
        with pytest.raises(mp.MPRuntimeError, match="party 1"):
            mp.evaluate(http_driver, simp.prank, mode=mode)
    finally:
        local_cluster.start_node("node_1")
    # the restarted worker joins the next programs
    assert ring_values(http_driver, mode) == [15, 1, 8]
    out = mp.evaluate(http_driver, lambda: mp.put("P2", mp.device("SP0")(lambda a, b: a * b)(
        mp.put("P0", np.int32(6)), mp.put("P1", np.int32(7)))), mode=mode)
    assert int(mp.fetch(http_driver, out)) == 42


def test_worker_killed_during_an_spu_op(local_cluster: LocalCluster,
                                        http_driver: mp.Driver) -> None:
    """Killing an SPU member mid-protocol (its peers block in libspu's receives) fails
    the run fast; after a restart the SPU works again."""
    data = np.random.default_rng(3).standard_normal(40000).astype(np.float32)

    def heavy() -> Any:  # a few seconds of ABY3 traffic between the three workers
        x = mp.put("P0", data)
        y = mp.put("P1", data[::-1].copy())
        z = mp.device("SP0")(lambda u, v: jnp.sort(u * v + jnp.exp(u)))(x, y)
        return mp.put("P2", z)

    thread, outcome = evaluate_in_thread(http_driver, heavy, "launch")
    time.sleep(1.0)
    try:
        running = thread.is_alive()
        killed_at = time.monotonic()
        local_cluster.kill("node_1")
        assert running, outcome
        thread.join(FAIL_WITHIN_S + 5)
        assert not thread.is_alive()
        assert outcome["finished"] - killed_at < FAIL_WITHIN_S
        assert_names_party_1_and_an_op(outcome["error"])
    finally:
        local_cluster.start_node("node_1")
    small = data[:8]
    out = mp.evaluate(http_driver, lambda: mp.put("P2", mp.device("SP0")(
        lambda u, v: jnp.sort(u * v))(mp.put("P0", small), mp.put("P1", small[::-1].copy()))))
    np.testing.assert_allclose(mp.fetch(http_driver, out), np.sort(small * small[::-1]),
                               atol=2e-3)


def test_survivors_drop_the_abandoned_execution_messages(tmp_path: Path) -> None:
    """Parties 0 and 2 run in this process (their mailboxes are visible), party 1 is
    a worker process that gets killed: the message party 2 queued at party 0 for the
    abandoned execution is dropped, and nothing else is left behind."""
    dev = support.dev_cluster(tmp_path, support.make_spec(support.free_ports(3)))
    survivors = {rank: support.ThreadWorker(dev, f"node_{rank}") for rank in (0, 2)}
    remote = LocalCluster(dev.spec_path)
    driver = None
    try:
        for worker in survivors.values():
            worker.start()
        remote.start_node("node_1")
        driver = mp.Driver(dev.spec_path)
        assert ring_values(driver, "launch") == [15, 1, 8]

        thread, outcome = evaluate_in_thread(driver, stuck_on_party_1, "launch")
        mailbox_0 = survivors[0].server.mailbox
        deadline = time.monotonic() + 20
        while mailbox_0.pending() == 0 and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        # party 0 waits for party 1 while party 2's message is queued behind it
        assert mailbox_0.pending() == 1, outcome
        time.sleep(0.3)
        killed_at = time.monotonic()
        remote.kill("node_1")
        thread.join(FAIL_WITHIN_S + 5)
        assert not thread.is_alive()
        assert outcome["finished"] - killed_at < FAIL_WITHIN_S
        assert_names_party_1_and_an_op(outcome["error"])

        for rank, worker in survivors.items():
            assert worker.server.mailbox.pending() == 0, f"party {rank} kept messages"
        # the survivors' next program runs normally and leaves nothing behind either
        out = mp.evaluate(driver, lambda: simp.shuffle_static(simp.constant((2,), 9), {0: 2}))
        assert [None if v is None else int(v) for v in mp.fetch(driver, out)] == [9, None, None]
        for worker in survivors.values():
            assert worker.server.mailbox.pending() == 0
    finally:
        if driver is not None:
            driver.close()
        remote.close()
        for worker in survivors.values():
            worker.stop()


# ---------------------------------------------------------------- concurrency


def _concurrent_program(i: int) -> tuple[Callable[[], Any], list[Any]]:
    """Evaluation ``i``: per-party data depending on i, a dynamic shuffle by (rank + i),
    a static rotation by i, and an array held by party i % 3 broadcast to everyone."""
    owner = i % 3
    vector = np.arange(4, dtype=np.int32) + 10 * i

    def prog() -> Any:
        r = simp.prank()
        x = r * 1000 + i
        y = simp.shuffle(x, (r + i) % 3)
        z = simp.shuffle_static(y, {d: (d + i) % 3 for d in range(3)})
        v = simp.shuffle_static(simp.constant((owner,), vector), {d: owner for d in range(3)})
        return z + i, v * (r + 1)

    x = [r * 1000 + i for r in range(3)]
    y = [x[(r + i) % 3] for r in range(3)]
    z = [y[(d + i) % 3] + i for d in range(3)]
    v = [(vector * (r + 1)).tolist() for r in range(3)]
    return prog, [z, v]


def test_concurrent_evaluations_from_four_threads(http_driver: mp.Driver) -> None:
    def one(i: int) -> tuple[int, Any, Any]:
        prog, expected = _concurrent_program(i)
        mode = "launch" if i % 2 == 0 else "standard"
        z, v = mp.evaluate(http_driver, prog, mode=mode)
        got = [[int(a) for a in mp.fetch(http_driver, z)],
               [np.asarray(b).tolist() for b in mp.fetch(http_driver, v)]]
        return i, got, expected

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, range(20)))
    assert sorted(i for i, _, _ in results) == list(range(20))
    for i, got, expected in results:
        assert got == expected, f"evaluation {i}"


# ---------------------------------------------------------------- a busy port


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_worker_refuses_a_port_in_use(busy_port: int, tmp_path: Path) -> None:
    (other,) = support.free_ports(1)
    dev = support.dev_cluster(tmp_path, support.make_spec([busy_port, other,
                                                          *support.free_ports(1)]))
    result = subprocess.run([*support.mplang_command(), "worker", "--cluster",
                             str(dev.spec_path), "--node", "node_0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert str(busy_port) in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    # the other nodes' ports are untouched and the busy one is still held by its owner
    assert support.port_is_free(other)
