"""Workers keep nothing of finished evaluations: after ~150 evaluations of the memory
mix (pcall, shuffle, SPU op revealed to a PPU, objects dropped by the driver) every
in-process worker's store is as empty as after the warm-up, no message or run
is left, and the per-execution memory stays within its bounds.

The long version, with the RSS of worker processes over 1,000 evaluations, is
``benchmarks/bench_worker_rss.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import mplang as mp
from mplang.transport.limits import WorkerLimits
from tests.worker import memory_workload, support

WARMUP, EVALUATIONS = 20, 150
REMEMBERED = 64
"""Finished runs each worker remembers here (small, so the bound is reached)."""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[list[support.ThreadWorker], mp.Driver]]:
    dev = support.dev_cluster(tmp_path, support.make_spec(support.free_ports(3)))
    limits = WorkerLimits(remembered_runs=REMEMBERED)
    workers = [support.ThreadWorker(dev, f"node_{r}", limits=limits) for r in range(3)]
    for worker in workers:
        worker.start()
    driver = mp.Driver(dev.spec_path, key=dev.keys / "driver.key", timeout=30.0,
                       run_timeout=120.0)
    try:
        yield workers, driver
    finally:
        driver.close()
        for worker in workers:
            worker.stop()


def test_workers_keep_nothing_of_finished_evaluations(
        cluster: tuple[list[support.ThreadWorker], mp.Driver]) -> None:
    workers, driver = cluster
    memory_workload.run(driver, WARMUP)
    memory_workload.settle()
    after_warmup = [memory_workload.held(w.server) for w in workers]
    memory_workload.run(driver, EVALUATIONS, start=WARMUP)
    memory_workload.settle()
    at_end = [memory_workload.held(w.server) for w in workers]
    for rank, (before, after) in enumerate(zip(after_warmup, at_end, strict=True)):
        where = f"node_{rank}: after warm-up {before}, at the end {after}"
        assert after["objects"] <= before["objects"] == 0, where
        assert after["messages"] == after["running"] == 0, where
        assert after["remembered_executions"] <= REMEMBERED, where
        assert after["programs_cached"] <= 64, where
    # every worker took part in enough executions to reach the bound
    assert all(h["remembered_executions"] == REMEMBERED for h in at_end), at_end
