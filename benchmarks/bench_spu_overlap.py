"""Independent SPU ops in one program, across 3 worker processes: overlapped or one by one.

Four independent compares of 10^5-element vectors on the ABY3 SPU ``SP0`` (inputs
already secret-shared by an earlier evaluation, results kept secret), run as one
compiled program with ``parallel=True`` (each party's scheduler runs ready ops at
once; every op has its own link tags) and with ``parallel=False`` (one op at a time),
alternately, on the same workers. Also one compare alone, for scale.

    .venv/bin/python benchmarks/bench_spu_overlap.py [--rounds 5] [--n 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import jax.numpy as jnp
import numpy as np
from bench_http import cluster_spec

import mplang as mp
from mplang.cluster.local import LocalCluster


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used (Linux ``/proc``)."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _timed(fn: Any, pids: list[int], cpu: list[float]) -> float:
    before = _cpu_seconds(pids)
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    cpu.append(_cpu_seconds(pids) - before)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    spec = cluster_spec()
    with LocalCluster(spec) as cluster:
        drv = cluster.driver(timeout=60.0, run_timeout=600.0)
        try:
            pairs = [(mp.evaluate(drv, lambda v: mp.put("SP0", mp.put("P0", v)),
                                  rng.normal(size=args.n).astype(np.float32)),
                      mp.evaluate(drv, lambda v: mp.put("SP0", mp.put("P1", v)),
                                  rng.normal(size=args.n).astype(np.float32)))
                     for _ in range(4)]
            flat = [x for pair in pairs for x in pair]

            def four(*xs: Any) -> Any:
                return [mp.device("SP0")(jnp.less)(xs[2 * i], xs[2 * i + 1]) for i in range(4)]

            program = mp.compile(four, *flat, cluster=spec)
            one = mp.compile(lambda a, b: mp.device("SP0")(jnp.less)(a, b), *pairs[0],
                             cluster=spec)
            for parallel in (True, False):  # warm up both paths
                mp.evaluate(drv, program, *flat, parallel=parallel)
            rows: dict[str, list[float]] = {"overlapped": [], "one by one": [], "alone": []}
            cpu: dict[str, list[float]] = {k: [] for k in rows}
            pids = [p.pid for p in cluster.processes.values()]
            for r in range(args.rounds):
                order = [True, False] if r % 2 == 0 else [False, True]
                for parallel in order:
                    key = "overlapped" if parallel else "one by one"
                    rows[key].append(_timed(
                        lambda p=parallel: mp.evaluate(drv, program, *flat, parallel=p),
                        pids, cpu[key]))
                rows["alone"].append(_timed(lambda: mp.evaluate(drv, one, *pairs[0]), pids,
                                            cpu["alone"]))
                print(f"round {r + 1}: " + ", ".join(
                    f"{k} {v[-1] * 1e3:.0f} ms" for k, v in rows.items()), flush=True)
        finally:
            drv.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    busy = {k: statistics.median(v) for k, v in cpu.items()}
    print(f"\n4 independent compares of {args.n:,} on ABY3 across 3 worker processes "
          f"({os.cpu_count()} cores), medians over {args.rounds} rounds:")
    print("| run | ms | workers' CPU s | cores busy |\n|---|---:|---:|---:|")
    for key, value in med.items():
        print(f"| {key} | {value * 1e3:.0f} | {busy[key]:.2f} | {busy[key] / value:.2f} |")
    print(f"speedup of overlapping: {med['one by one'] / med['overlapped']:.2f}x")


if __name__ == "__main__":
    main()
