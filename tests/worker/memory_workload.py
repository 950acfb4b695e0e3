"""A long run of evaluations for memory checks, and what a worker holds between them.

`step` runs evaluation number ``i`` of a fixed mix: a trivial ``pcall`` fetched to
the driver; a shuffle from party 0 to party 1, fetched; an SPU op on ``SP0``
revealed to ``P2``, fetched; and a few objects the driver makes and drops without
fetching (their finalizers ask the workers to ``/delete`` them). Every evaluation
carries new data (its constants change with ``i``), as a real driver's would.

`held` counts what one in-process worker (`tests.worker.support.ThreadWorker`)
keeps: objects in its store, queued messages, runs going on,
remembered executions and cached programs. Used by ``benchmarks/bench_worker_rss.py``
and ``tests/worker/test_worker_memory.py``.
"""

from __future__ import annotations

import gc
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import mplang as mp
from mplang import simp
from mplang.worker.server import WorkerServer

KINDS = ("pcall", "shuffle", "spu", "drop")


def _pcall(i: int) -> Any:
    return simp.pcall((0,), lambda v: v * 2 + 1, simp.constant((0,), np.int64(i)))


def _shuffle(i: int) -> Any:
    x = simp.constant((0,), np.arange(256, dtype=np.float32) + i)
    return simp.shuffle_static(simp.pcall((0,), lambda v: v * 0.5, x), {1: 0})


def _spu(i: int) -> Any:
    a = mp.put("P0", np.arange(8, dtype=np.int32) + i)
    b = mp.put("P1", np.full(8, 3, dtype=np.int32))
    product = mp.device("SP0")(lambda u, v: u * v + 1)(a, b)
    return mp.put("P2", product)


def _drop(i: int) -> Any:
    return (simp.constant((0,), np.int32(i)), simp.constant((1,), np.ones(64) * i),
            simp.pcall((2,), lambda v: v - 1, simp.constant((2,), np.int32(i))))


def step(driver: mp.Driver, i: int) -> str:
    """Evaluation ``i`` of the mix (checked); returns its kind."""
    kind = KINDS[i % len(KINDS)]
    if kind == "pcall":
        got = mp.fetch(driver, mp.evaluate(driver, _pcall, i))
        assert int(got[0]) == 2 * i + 1, got
    elif kind == "shuffle":
        got = mp.fetch(driver, mp.evaluate(driver, _shuffle, i))
        assert got[1] is not None and float(got[1][3]) == (3 + i) * 0.5, got
    elif kind == "spu":
        got = mp.fetch(driver, mp.evaluate(driver, _spu, i))
        assert np.asarray(got).tolist() == [(k + i) * 3 + 1 for k in range(8)], got
    else:
        objects = mp.evaluate(driver, _drop, i)
        del objects  # unfetched: the finalizers send /delete
    return kind


def run(driver: mp.Driver, count: int, start: int = 0,
        every: Callable[[int], None] | None = None) -> None:
    """Evaluations ``start`` .. ``start + count - 1``; ``every(i)`` after each."""
    for i in range(start, start + count):
        step(driver, i)
        if every is not None:
            every(i)


def settle(seconds: float = 0.3) -> None:
    """Let dropped objects' finalizers run and their ``/delete`` requests land."""
    gc.collect()
    time.sleep(seconds)


def rss_kib(pid: int) -> int:
    """VmRSS of process ``pid`` in KiB (Linux /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.M)
    assert match, status
    return int(match.group(1))


def held(server: WorkerServer) -> dict[str, int]:
    """What one worker keeps between evaluations."""
    executions = server.executions
    return {
        "objects": len(server.worker.store),
        "messages": server.mailbox.pending(),
        "running": executions.running(),
        "remembered_executions": len(executions._owners),
        "programs_cached": len(server.programs),
    }
