"""The live progress display: shown on a terminal for runs over a second (ops done of
those expected, each party's current op, bytes moved); silent otherwise."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from rich.console import Console

import mplang as mp
import mplang.api
from mplang import simp
from mplang.cli.progress import ProgressDisplay, startup_progress
from mplang.runtime.timeline import RunMonitor
from tests.simulators import simulated


def ring() -> Any:
    r = simp.prank()
    doubled = simp.pcall((0, 1, 2), lambda v: v * 2, r)
    return simp.shuffle_static(doubled, {0: 2, 1: 0, 2: 1})


sim = simulated(3, scope="function")


def test_display_shows_ops_parties_and_bytes() -> None:
    out = io.StringIO()
    monitor = RunMonitor("prog", total_ops=4, parties={0: "party 0 (node_0)"})
    console = Console(file=out, force_terminal=True, width=100)
    op = mp.compile(ring, world_size=3).graph.operations[2]
    with ProgressDisplay(monitor, delay_s=0.0, console=console) as display:
        start = monitor.op_started(0, op, "/2")
        monitor.count(0, "/2", "sent", 2048)
        time.sleep(0.3)
        first = display.render()
        monitor.op_finished(0, op, "/2", start)
    assert display.shown
    text = out.getvalue()
    assert "prog" in text and "1/4" in text and "2.0 KB moved" in text
    rendered = io.StringIO()
    Console(file=rendered, width=100).print(first)
    assert "party 0 (node_0)  simp.shuffle_static  0 ops  2.0 KB moved" in rendered.getvalue()


def test_display_waits_for_its_delay() -> None:
    out = io.StringIO()
    monitor = RunMonitor("quick")
    with ProgressDisplay(monitor, delay_s=5.0,
                         console=Console(file=out, force_terminal=True)) as display:
        pass
    assert not display.shown and out.getvalue() == ""


def _run(sim: Any, monkeypatch: pytest.MonkeyPatch, terminal: bool, **options: Any) -> str:
    monkeypatch.setattr(mplang.api, "is_terminal", lambda: terminal)
    seen: list[RunMonitor | None] = []
    original = sim.run_program

    def spy(program: Any, inputs: Any, opts: Any) -> Any:
        seen.append(opts.monitor)
        return original(program, inputs, opts)

    monkeypatch.setattr(sim, "run_program", spy)
    out = mp.evaluate(sim, ring, **options)
    assert [int(v) for v in mp.fetch(sim, out)] == [4, 0, 2]
    (monitor,) = seen
    return "none" if monitor is None else f"{monitor.done}/{monitor.total_ops}"


def test_on_by_default_in_a_terminal(sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    counted = _run(sim, monkeypatch, terminal=True)
    done, total = map(int, counted.split("/"))
    # launch mode: each of the 3 parties runs the 4 ops (pcall body included), the
    # driver runs the program's call
    assert done == 13 and total == 13


def test_off_without_a_terminal_or_when_asked(sim: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(sim, monkeypatch, terminal=False) == "none"
    assert _run(sim, monkeypatch, terminal=True, progress=False) == "none"


def test_progress_true_without_a_terminal_prints_lines(
        sim: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(sim, monkeypatch, terminal=False, progress=True) == "none"
    err = capsys.readouterr().err
    assert "[mplang ring +" in err and "simp.shuffle_static" in err


def test_display_is_drawn_while_a_run_works(sim: Any,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A real evaluation on a terminal, outlasting the display's delay: the display
    appears and ends with every op done."""
    out = io.StringIO()
    monkeypatch.setattr(mplang.api, "is_terminal", lambda: True)
    real_init, real_run = ProgressDisplay.__init__, sim.run_program

    def to_buffer(self: ProgressDisplay, monitor: RunMonitor, **_: Any) -> None:
        real_init(self, monitor, delay_s=0.1,
                  console=Console(file=out, force_terminal=True, width=100))

    def lasting(*args: Any) -> Any:
        outputs = real_run(*args)
        time.sleep(0.5)
        return outputs

    monkeypatch.setattr(ProgressDisplay, "__init__", to_buffer)
    monkeypatch.setattr(sim, "run_program", lasting)
    result = mp.evaluate(sim, ring)
    assert [int(v) for v in mp.fetch(sim, result)] == [4, 0, 2]
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "ring" in text and "13/13 ops" in text
    for rank in range(3):  # each sent its 4-byte value and received one
        assert f"party {rank} (node_{rank})  idle  4 ops  8 B moved" in text


def test_monitor_counts_are_thread_safe() -> None:
    monitor = RunMonitor("threads")
    threads = [threading.Thread(target=lambda: [monitor.count(1, "/3", "sent", 10)
                                                for _ in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert monitor.states[1].bytes_moved == 40_000


def test_startup_bar_counts_ready_workers() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    with startup_progress(["node_0", "node_1"], enabled=True, console=console) as ready:
        ready("node_1")
        ready("node_0")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "starting workers" in text and "2/2" in text
    assert "ready: node_1, node_0" in text


def test_startup_bar_draws_nothing_when_disabled() -> None:
    out = io.StringIO()
    with startup_progress(["node_0"], enabled=False,
                          console=Console(file=out, force_terminal=True)) as ready:
        ready("node_0")
    assert out.getvalue() == ""


def test_importing_mplang_does_not_load_rich() -> None:
    code = "import sys, mplang; print('rich' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
