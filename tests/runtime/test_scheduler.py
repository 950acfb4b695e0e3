"""The dataflow scheduler, host callbacks (tensor.pyfunc) and the simulator's network model."""

from __future__ import annotations

import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.runtime.scheduler import plan

F32 = jax.ShapeDtypeStruct((), np.float32)


def _ring(n: int) -> Any:
    x = simp.pcall(None, lambda r: r * 10 + 1, simp.prank())
    return simp.shuffle_static(x, {i: (i - 1) % n for i in range(n)})


def _independent_shuffles(n: int) -> Any:
    return [simp.shuffle_static(simp.constant((2 * i,), np.float32(i)), {2 * i + 1: 2 * i})
            for i in range(n // 2)]


def _control_flow(n: int) -> Any:
    rank = simp.prank()
    total = simp.while_loop(lambda s: s[0] < 4, lambda s: (s[0] + 1, s[1] + s[0] * rank),
                            (rank * 0, rank))
    pred = simp.pcall(None, lambda r: r >= 0, rank)
    return simp.uniform_cond(pred, lambda t: t[1] * 2, lambda t: t[1], total)


def _device(n: int) -> Any:
    a = mp.put("P0", np.arange(4, dtype=np.float32))
    b = mp.put("P1", np.full(4, 2.0, np.float32))
    s = mp.device("SP0")(lambda x, y: (x * y, x < y))(a, b)
    return mp.put("P0", s[0]), mp.put("P1", s[1])


PROGRAMS = {"ring": _ring, "independent shuffles": _independent_shuffles,
            "control flow": _control_flow, "device": _device}


def _same(a: Any, b: Any) -> None:
    if isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif a is None:
        assert b is None
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_parallel_and_sequential_results_are_identical(name: str, mode: str) -> None:
    sim = mp.Simulator(4)
    try:
        program = mp.compile(PROGRAMS[name], 4, cluster=sim.cluster)
        parallel = mp.fetch(sim, mp.evaluate(sim, program, mode=mode))
        sequential = mp.fetch(sim, mp.evaluate(sim, program, mode=mode, parallel=False))
        _same(parallel, sequential)
    finally:
        sim.close()


def test_plan_tracks_dependencies_and_effect_order() -> None:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(1))
        y = simp.shuffle_static(x, {1: 0})
        z = simp.shuffle_static(x, {2: 0})
        return y, z

    graph = mp.compile(prog, world_size=3).graph
    p = plan(graph)
    assert p.deps == ((), (0,), (0,))
    assert p.users[0] == (1, 2)
    assert p.parallel

    def effects(v: Any) -> Any:
        a = tensor.pyfunc(lambda t: t, v, out=F32)
        b = tensor.pyfunc(lambda t: t, v, out=F32)  # no data dependency on `a`
        return a, b

    body = mp.compile(lambda: simp.pcall((0,), effects, simp.constant((0,), np.float32(1))),
                      world_size=1).graph.operations[1].regions[0]
    assert plan(body).deps == ((), (0,))  # the second call waits for the first

    def calls_in_regions() -> Any:  # effects inside pcall bodies order the pcalls too
        x = simp.constant((0,), np.float32(1))
        return (simp.pcall((0,), lambda v: tensor.pyfunc(lambda t: t, v, out=F32), x),
                simp.pcall((0,), lambda v: tensor.pyfunc(lambda t: t, v, out=F32), x))

    top = mp.compile(calls_in_regions, world_size=1).graph
    assert plan(top).deps == ((), (0,), (0, 1))


def test_independent_ops_really_overlap(caplog: pytest.LogCaptureFixture) -> None:
    """Four host calls on four parties meet at a barrier: only concurrent execution passes."""
    barrier = threading.Barrier(4, timeout=5)

    def meet(v: np.ndarray) -> np.ndarray:
        barrier.wait()
        return v + 1

    def prog() -> Any:
        return [simp.pcall((i,), lambda v: tensor.pyfunc(meet, v, out=F32),
                           simp.constant((i,), np.float32(i))) for i in range(4)]

    sim = mp.Simulator(4)
    try:
        out = mp.fetch(sim, mp.evaluate(sim, prog))
        assert [out[i][i] for i in range(4)] == [1, 2, 3, 4]
        barrier.reset()
        with pytest.raises(mp.MPRuntimeError, match=r"^op tensor\.pyfunc at "):
            mp.evaluate(sim, prog, parallel=False)
        assert "BrokenBarrierError" in caplog.text
    finally:
        sim.close()


def test_effects_keep_program_order_on_a_party() -> None:
    calls: list[str] = []

    def record(tag: str) -> Any:
        def fn(v: np.ndarray) -> np.ndarray:
            time.sleep(0.02 if tag == "first" else 0.0)
            calls.append(tag)
            return v

        return fn

    def body(v: Any) -> Any:
        return (tensor.pyfunc(record("first"), v, out=F32),
                tensor.pyfunc(record("second"), v, out=F32))

    sim = mp.Simulator(1)
    try:
        for _ in range(3):
            mp.evaluate(sim, lambda: simp.pcall((0,), body, simp.constant((0,), np.float32(1))))
        assert calls == ["first", "second"] * 3
    finally:
        sim.close()


def test_pyfunc_results_and_declared_types(caplog: pytest.LogCaptureFixture) -> None:
    def stats(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return v.sum(), v * 2

    out_types = (jax.ShapeDtypeStruct((), np.float32), mp.TensorType.of("float32", (3,)))
    sim = mp.Simulator(2)
    try:
        def prog() -> Any:
            x = simp.constant((1,), np.array([1.0, 2.0, 3.0], np.float32))
            return simp.pcall((1,), lambda v: tensor.pyfunc(stats, v, out=out_types), x)

        total, doubled = mp.fetch(sim, mp.evaluate(sim, prog))
        assert total == [None, 6.0]
        np.testing.assert_array_equal(doubled[1], [2.0, 4.0, 6.0])
        text = str(mp.compile(prog, world_size=2))
        assert "tensor.pyfunc" in text and "stats" in text

        def wrong_shape() -> Any:
            x = simp.constant((0,), np.float32(1))
            return simp.pcall((0,), lambda v: tensor.pyfunc(
                lambda t: np.ones(2, np.float32), v, out=F32), x)

        with pytest.raises(mp.MPRuntimeError, match=r"^\S+ result 0 does not have the declared "
                                                    r"type f32\[\] \(in op tensor\.pyfunc at "):
            mp.evaluate(sim, wrong_shape)  # the program's own text; not the shape it has
    finally:
        sim.close()


def test_failing_pyfunc_names_party_and_op_and_cancels_dependents(
        caplog: pytest.LogCaptureFixture) -> None:
    def boom(v: np.ndarray) -> np.ndarray:
        raise OSError("disk on fire")

    def prog() -> Any:
        x = simp.constant((1,), np.float32(1))
        y = simp.pcall((1,), lambda v: tensor.pyfunc(boom, v, out=F32), x)
        return simp.shuffle_static(y, {0: 1})  # party 0 waits for what party 1 never sends

    sim = mp.Simulator(2, timeout=30)
    try:
        start = time.monotonic()
        with pytest.raises(mp.MPRuntimeError) as info:
            mp.evaluate(sim, prog)
        assert time.monotonic() - start < 10
        message = str(info.value)
        assert "party 1" in message and "tensor.pyfunc" in message
        assert "disk on fire" not in message and "OSError: disk on fire" in caplog.text
        ok = mp.evaluate(sim, lambda: simp.shuffle_static(simp.constant((1,), 5), {0: 1}))
        assert mp.fetch(sim, ok) == [5, None]
    finally:
        sim.close()


def test_network_model_delays_messages_and_parallel_hides_latency() -> None:
    sim = mp.Simulator(8, latency_ms=50)
    try:
        program = mp.compile(_independent_shuffles, 8, world_size=8)
        mp.evaluate(sim, program)  # warm-up
        start = time.perf_counter()
        out = mp.fetch(sim, mp.evaluate(sim, program))
        parallel = time.perf_counter() - start
        start = time.perf_counter()
        mp.evaluate(sim, program, parallel=False)
        sequential = time.perf_counter() - start
        assert [out[i][2 * i + 1] for i in range(4)] == [0, 1, 2, 3]
        assert parallel >= 0.05  # every message pays the latency
        assert sequential >= 4 * 0.05  # one shuffle at a time
        assert parallel < sequential / 2
    finally:
        sim.close()


def test_network_model_bandwidth_and_per_link_overrides() -> None:
    megabyte = np.zeros(1 << 18, np.float32)  # 1 MiB
    sim = mp.Simulator(3, bandwidth_mbps=80, links={(0, 2): (200.0, None)})
    try:
        def send(dst: int) -> Any:
            return lambda: simp.shuffle_static(simp.pcall((0,), lambda: jnp.asarray(megabyte)),
                                               {dst: 0})

        start = time.perf_counter()
        mp.evaluate(sim, send(1))
        assert time.perf_counter() - start >= (1 << 20) / (80e6 / 8)  # 1 MiB at 10 MB/s
        start = time.perf_counter()
        out = mp.fetch(sim, mp.evaluate(sim, send(2)))
        assert time.perf_counter() - start >= 0.2  # the overridden link's latency
        assert out[2].shape == megabyte.shape
    finally:
        sim.close()


def test_network_model_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="latency"):
        mp.Simulator(2, latency_ms=-1)
    with pytest.raises(ValueError, match="bandwidth"):
        mp.Simulator(2, bandwidth_mbps=0)


def test_an_op_waiting_for_a_message_lends_its_slot() -> None:
    """With one slot, an op waiting in a mailbox does not keep the next op (which sends
    what it waits for) from the pool. Before, the second op found no slot, its caller
    ran it inline or, across parties, every slot waited on ops that had none."""
    from mplang.runtime.scheduler import Scheduler
    from mplang.worker.mailbox import Mailbox

    scheduler, mailbox = Scheduler(1, "test-lend"), Mailbox(0)
    try:
        waiting = scheduler.try_submit(mailbox.take, 1, ("e", "/0"), 10.0)
        assert waiting is not None
        deadline = time.monotonic() + 5
        sender = None
        while sender is None and time.monotonic() < deadline:  # the waiter lends its slot
            sender = scheduler.try_submit(mailbox.put, 1, ("e", "/0"), "share")
            time.sleep(0.01)
        assert sender is not None
        assert waiting.result(timeout=5) == "share"
        sender.result(timeout=5)
        held = [scheduler.try_submit(time.sleep, 0.2)]  # the slot is back, and only one
        assert held[0] is not None and scheduler.try_submit(time.sleep, 0) is None
        held[0].result(timeout=5)
    finally:
        scheduler.shutdown()


def _secure_sums_finish(count: int, timeout: float) -> None:
    """``count`` independent secure sums of three parties' values, checked."""
    from mplang.libs.aggregation import secure_sum

    def prog() -> Any:
        return [secure_sum([mp.device(f"P{p}")(lambda i=i, p=p: jnp.float32(i + p))()
                            for p in range(3)]) for i in range(count)]

    sim = mp.Simulator(3)
    try:
        got = [float(mp.fetch(sim, o)) for o in mp.evaluate(sim, prog, timeout=timeout)]
    finally:
        sim.close()
    assert got == [3.0 * i + 3 for i in range(count)]


def test_three_hundred_independent_secure_sums_finish() -> None:
    """More ops waiting for shares than a party has slots (64): all finish."""
    _secure_sums_finish(300, 120)


def test_ops_that_wait_on_peers_are_not_run_by_a_loop_with_no_free_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With one slot per party, ready ops often find no slot. A loop that ran such an op
    itself stopped starting the others while it waited, among them the ones its peers'
    waiting ops needed, and every party could stop so (a run timed out under load). It
    now keeps an op that may wait until a slot is free."""
    from mplang.runtime.scheduler import Scheduler
    from mplang.worker import state

    monkeypatch.setattr(state, "Scheduler", lambda workers, name: Scheduler(1, name))
    _secure_sums_finish(12, 30)
