"""Progress reporting: ``mp.evaluate(ctx, fn, progress=callback)`` calls the callback
for completed work, as it completes: in standard mode once per op the driver
dispatches (at least), in launch mode for the parties' completed programs."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from jax import lax

import mplang as mp
from mplang import simp, tensor


def three_ops() -> Any:
    r = simp.prank()
    doubled = simp.pcall((0, 1, 2), lambda v: v * 2, r)
    return simp.shuffle_static(doubled, {0: 2, 1: 0, 2: 1})


class Recorder:
    """A progress callback recording (time, message) pairs, from any thread."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str]] = []
        self._lock = threading.Lock()

    def __call__(self, message: str) -> None:
        assert isinstance(message, str) and message
        with self._lock:
            self.calls.append((time.monotonic(), message))

    @property
    def messages(self) -> list[str]:
        return [m for _, m in self.calls]


def assert_in_order(messages: list[str], opcodes: list[str]) -> list[int]:
    """Each opcode is mentioned by a distinct message, in this order; their indices."""
    found, start = [], 0
    for opcode in opcodes:
        index = next((i for i in range(start, len(messages)) if opcode in messages[i]
                      and "driver" in messages[i]), None)
        assert index is not None, f"no driver report of {opcode} after #{start}: {messages}"
        found.append(index)
        start = index + 1
    return found


def test_standard_mode_reports_each_dispatched_op(ctx: Any) -> None:
    program = mp.compile(three_ops, cluster=ctx.cluster)
    dispatched = [op.opcode for op in program.graph.operations]
    assert dispatched == ["simp.prank", "simp.pcall", "simp.shuffle_static"]
    recorder = Recorder()
    out = mp.evaluate(ctx, program, mode="standard", progress=recorder)
    assert [int(v) for v in mp.fetch(ctx, out)] == [4, 0, 2]
    assert_in_order(recorder.messages, dispatched)
    driver_reports = [m for m in recorder.messages if "driver" in m and "simp." in m]
    assert len(driver_reports) == len(dispatched), recorder.messages


def test_launch_mode_reports_completed_work(ctx: Any) -> None:
    recorder = Recorder()
    out = mp.evaluate(ctx, three_ops, mode="launch", progress=recorder)
    assert [int(v) for v in mp.fetch(ctx, out)] == [4, 0, 2]
    assert recorder.messages
    for rank in range(3):  # every party's completed work shows up
        assert any(f"party {rank}" in m for m in recorder.messages), recorder.messages


def test_reports_arrive_while_the_program_runs(http_driver: mp.Driver) -> None:
    """The first op's report comes well before the end: reports are not batched."""

    def prog() -> Any:
        r = simp.prank()
        slow = simp.pcall((1,), lambda v: tensor.run_jax(
            lambda x: lax.fori_loop(0, 2**27, lambda i, c: c * 3 + i, x), v), r)
        return simp.shuffle_static(slow, {0: 1})

    recorder = Recorder()
    started = time.monotonic()
    mp.evaluate(http_driver, prog, mode="standard", progress=recorder)
    ended = time.monotonic()
    first, _, last = assert_in_order(recorder.messages,
                                     ["simp.prank", "simp.pcall", "simp.shuffle_static"])
    t_first, t_last = recorder.calls[first][0], recorder.calls[last][0]
    assert started <= t_first < t_last <= ended
    assert t_last - t_first > 0.05, recorder.calls


def test_progress_true_prints_to_stderr(http_driver: mp.Driver,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    mp.evaluate(http_driver, three_ops, mode="standard", progress=True)
    err = capfd.readouterr().err
    for opcode in ("simp.prank", "simp.pcall", "simp.shuffle_static"):
        assert opcode in err, err

