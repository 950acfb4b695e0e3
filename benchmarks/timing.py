"""Timing helpers shared by the benchmark scripts (run them as scripts: this
directory is then on ``sys.path``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def best_of(repeats: int, fn: Callable[[], Any]) -> float:
    """The shortest of ``repeats`` timed calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)
