"""Progress lines (``progress=True`` off a terminal) and the program's own prints never
split each other's lines, even when a party's host function prints half a line and
waits."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import threading
from pathlib import Path

import mplang as mp
from mplang.runtime.console import LineWriter, write_line

PROGRAM = """\
import time
import numpy as np
import mplang as mp
from mplang import simp, tensor
from mplang.edsl.typing import TensorType

F = TensorType("float32", (3,))


def slow(v):
    print("computing", end="", flush=True)
    time.sleep(0.3)
    print(" done", flush=True)
    return v


@mp.function
def prog():
    x = simp.constant((0,), np.ones(3, np.float32))
    y = simp.pcall((0,), lambda v: tensor.pyfunc(slow, v, out=F), x)
    z = simp.constant((1,), np.ones(3, np.float32))
    for _ in range(5):
        z = simp.pcall((1,), lambda v: v + 1, z)
    return y, z


mp.evaluate(mp.Simulator(2), prog, progress=True)
print("after the run")
"""
PROGRESS = re.compile(r"^\[mplang prog \+\d+\.\d{3}s\] (party [01]|driver): [a-z_.]+ "
                      r"/[0-9/]+ done$")


def test_a_half_printed_line_is_not_split_by_progress_lines(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = subprocess.run([sys.executable, "-u", "prog.py"], cwd=tmp_path, timeout=120,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    progress = [line for line in lines if PROGRESS.match(line)]
    assert len(progress) >= 8
    assert [line for line in lines if line not in progress] == ["computing done",
                                                               "after the run"]


def test_threads_write_whole_lines() -> None:
    target = io.StringIO()
    writer = LineWriter(target)
    start = threading.Barrier(4)

    def speak(who: str) -> None:
        start.wait()
        for i in range(200):
            writer.write(f"{who} ")
            writer.write(f"says {i}")
            writer.write("\n")

    threads = [threading.Thread(target=speak, args=(w,)) for w in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    writer.write("no newline yet")
    write_line(target, "a progress line")
    writer.finish()
    lines = target.getvalue().splitlines()
    assert lines[-2:] == ["a progress line", "no newline yet"]
    assert sorted(lines[:-2]) == sorted(f"{w} says {i}" for w in "abcd" for i in range(200))


def test_an_unclosed_simulator_stops_its_collector_at_exit() -> None:
    """The program above never closes its simulator. At exit its collector thread (a
    daemon) used to release parties' arrays while the interpreter tore modules down,
    and the process aborted in JAX's array destructor about one run in seven; the
    exit hook now stops and joins every running collector first."""
    from mplang.driver import base

    sim = mp.Simulator(2)
    assert sim in base._COLLECTING and sim._collector.is_alive()
    base._stop_collectors()
    assert sim not in base._COLLECTING and not sim._collector.is_alive()
    sim.close()  # closing afterwards is fine
