"""Cost of the audit log on the HTTP runtime: the same workloads on 3 local worker
processes with the audit log on (every worker writes ``audit/<node>.jsonl``) and off
(workers started with ``WorkerServer.audit`` unset, which only this benchmark does).

- one event written, alone and from 4 threads at once (microseconds);
- latency: a trivial ``pcall`` on party 0 (median of many runs);
- throughput: a 64 MiB tensor moved between workers with ``shuffle_static``;
- SPU: the millionaire's comparison on ABY3.

For each workload: the times with the log off and on (best of 4 alternating rounds),
the events written per evaluation, and what writing them costs at the measured
cost of one event (the direct difference drowns in noise on a shared machine).

    .venv/bin/python benchmarks/bench_audit.py
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax.numpy as jnp
from bench_http import cluster_spec, latency, throughput

import mplang as mp
from mplang.cluster.local import LocalCluster
from mplang.records.audit import AuditLog, read_events

_NO_AUDIT = ("import sys, runpy; import mplang.worker.server as h; "
             "h.AuditLog = lambda *a, **k: None; sys.argv = ['mplang'] + sys.argv[3:]; "
             "runpy.run_module('mplang.cli', run_name='__main__')")


def event_microseconds(threads: int, events: int = 20_000) -> float:
    """Mean wall time per event with ``threads`` threads writing at once."""
    with tempfile.TemporaryDirectory() as tmp:
        log = AuditLog(Path(tmp) / "n.jsonl", "node_0", ["node_0", "node_1", "node_2"])

        def write() -> None:
            for i in range(events // threads):
                log.message("send", "e", 1, f"/3/link#{i}", "secret share", 1000)

        workers = [threading.Thread(target=write) for _ in range(threads)]
        start = time.perf_counter()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        elapsed = time.perf_counter() - start
        log.close()
        return elapsed / events * 1e6


@contextmanager
def cluster(audit: bool) -> Iterator[tuple[mp.Driver, Path]]:
    """3 workers with the audit log on or off, and a driver for them."""
    with tempfile.TemporaryDirectory() as tmp:
        real = sys.executable
        if not audit:  # workers start through a wrapper that unsets the audit log
            wrapper = Path(tmp) / "python-no-audit"
            wrapper.write_text(f'#!/bin/sh\nexec "{real}" -c "{_NO_AUDIT}" "$@"\n')
            wrapper.chmod(0o755)
            sys.executable = str(wrapper)
        try:
            local = LocalCluster(cluster_spec(), audit_dir=Path(tmp) / "audit")
            local.start()
        finally:
            sys.executable = real
        try:
            drv = local.driver()
            yield drv, Path(tmp) / "audit"
            drv.close()
        finally:
            local.close()


def millionaire_seconds(drv: mp.Driver, runs: int = 15) -> float:
    def prog() -> Any:
        x = mp.device("P0")(lambda: jnp.int32(5))()
        y = mp.device("P1")(lambda: jnp.int32(7))()
        return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(x, y))

    program = mp.compile(prog, world_size=3)
    mp.evaluate(drv, program)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        mp.evaluate(drv, program)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _lines(audit_dir: Path) -> int:
    return len(read_events(sorted(audit_dir.glob("*.jsonl"))))


def measure(audit: bool) -> dict[str, float]:
    """Each workload's time (ms) and, with the audit log on, the events its workers wrote
    per evaluation (``*_events``; over all workers, fetches included)."""
    with cluster(audit) as (drv, audit_dir):
        counts = [_lines(audit_dir) if audit else 0]
        median, _ = latency(drv, runs=200)  # 220 evaluations with the warm-up
        counts.append(_lines(audit_dir) if audit else 0)
        shuffle_s, _ = throughput(drv, repeats=3)  # 4 evaluations (and 4 fetches)
        counts.append(_lines(audit_dir) if audit else 0)
        spu_s = millionaire_seconds(drv)  # 16 evaluations
        counts.append(_lines(audit_dir) if audit else 0)
    per_eval = [(b - a) / n for a, b, n in zip(counts[:-1], counts[1:], (220, 4, 16), strict=True)]
    return {"latency_ms": median * 1e3, "shuffle_ms": shuffle_s * 1e3, "spu_ms": spu_s * 1e3,
            "latency_events": per_eval[0], "shuffle_events": per_eval[1],
            "spu_events": per_eval[2]}


def main() -> None:
    alone = event_microseconds(1)
    print(f"one audit event: {alone:.1f} us alone, "
          f"{event_microseconds(4):.1f} us each from 4 threads")
    rounds: list[tuple[dict[str, float], dict[str, float]]] = []
    for i in range(4):  # alternate which side goes first: drift hits both sides alike
        first = measure(i % 2 == 1)
        second = measure(i % 2 == 0)
        rounds.append((first, second) if i % 2 == 0 else (second, first))

    def best(side: int, key: str) -> float:
        return min(r[side][key] for r in rounds)

    for key, what in (("latency_ms", "trivial pcall round trip (median)"),
                      ("shuffle_ms", "64 MiB shuffle_static (best of 3)"),
                      ("spu_ms", "ABY3 millionaire (median)")):
        off, on = best(0, key), best(1, key)
        events = rounds[-1][1][key.replace("_ms", "_events")]
        cost = events * alone / 1e3
        print(f"{what}: audit off {off:.2f} ms, on {on:.2f} ms ({(on / off - 1) * 100:+.1f} "
              f"%); {events:.1f} events per evaluation, {cost:.3f} ms of writing "
              f"({cost / off * 100:.2f} % of the run)")
    print(f"(cpus: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
