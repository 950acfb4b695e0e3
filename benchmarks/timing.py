"""Timing helpers shared by the benchmark scripts (run them as scripts: this
directory is then on ``sys.path``)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def best_of(repeats: int, fn: Callable[[], Any]) -> float:
    """The shortest of ``repeats`` timed calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def median_ms(fn: Callable[[], Any], runs: int, warmup: int = 3) -> float:
    """Median milliseconds of ``runs`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_in_tree(script: str, tree: str, path: Path, args: list[str],
                timeout: float = 1200) -> dict[str, Any]:
    """Run benchmark ``script`` (its ``--child`` mode, with ``args``) as a child process
    with the source tree ``path`` first on ``PYTHONPATH`` and as working directory (its
    workers inherit both); the JSON object it printed last. Checks that the child
    imported that tree's ``mplang``."""
    env = {**os.environ, "PYTHONPATH": str(path)}
    done = subprocess.run([sys.executable, script, *args], cwd=path, env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{tree} tree failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    expected = path / "mplang" / "__init__.py"
    if Path(result["mplang"]).resolve() != expected.resolve():
        raise RuntimeError(f"{tree} child imported {result['mplang']}, not {expected}")
    return result
