"""A trivial evaluation's round trip and the CPU it costs each process, an older main
against this tree, alternating, in one run.

Per tree and round, one child starts ``--parties`` workers (mutual TLS), then for
``--seconds`` evaluates and fetches a compiled one-op ``pcall`` on every party (its
output deleted after each fetch, as a driver does), after 50 warm-up evaluations.
It reports the median wall time and the CPU milliseconds (user + system, from
``/proc``) each worker and the driver spent per evaluation. Thousands of samples per
child make this steadier than the other benches' few dozen.

    git worktree add --detach /work/wt-s40 f25f649
    .venv/bin/python benchmarks/bench_round_trip.py --old /work/wt-s40 [--parties 3]
        [--rounds 4] [--seconds 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timing import run_in_tree

NEW = Path(__file__).resolve().parents[1]


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(tree: str, parties: int, seconds: float) -> None:
    import numpy as np
    from bench_sessions import cluster_spec

    import mplang as mp
    from mplang import simp
    from mplang.cluster.local import LocalCluster

    spec = cluster_spec(parties)
    ranks = tuple(range(parties))
    with tempfile.TemporaryDirectory(prefix="bench-rt-") as data, \
            LocalCluster(spec, data_root=data) as cluster:
        drv = cluster.driver(timeout=60.0, run_timeout=600.0)
        try:
            y = mp.evaluate(drv, lambda: simp.constant(ranks, np.float32(1)))
            program = mp.compile(lambda v: simp.pcall(ranks, lambda a: a + 1, v), y,
                                 cluster=spec)
            for _ in range(50):
                mp.fetch(drv, mp.evaluate(drv, program, y))
            pids = [p.pid for p in cluster.processes.values()] + [os.getpid()]
            before = [_cpu_seconds(p) for p in pids]
            times = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                start = time.perf_counter()
                assert mp.fetch(drv, mp.evaluate(drv, program, y))[0] == 2.0
                times.append(time.perf_counter() - start)
            cpu = [(_cpu_seconds(p) - b) / len(times) * 1e3 for p, b in zip(pids, before,
                                                                            strict=True)]
        finally:
            drv.close()
    print(json.dumps({"tree": tree, "mplang": mp.__file__, "n": len(times),
                      "median_ms": statistics.median(times) * 1e3,
                      "worker_cpu_ms": cpu[:-1], "driver_cpu_ms": cpu[-1]}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="worktree of an older main (required but in a child)")
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--child", choices=["old", "new"])
    args = parser.parse_args()
    if args.child:
        child(args.child, args.parties, args.seconds)
        return 0
    if not args.old:
        parser.error("--old is required")
    trees = {"old": Path(args.old), "new": NEW}
    rows: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for tree in ("old", "new") if r % 2 == 0 else ("new", "old"):
            row = run_in_tree(__file__, tree, trees[tree],
                              ["--child", tree, "--parties", str(args.parties),
                               "--seconds", str(args.seconds)])
            rows[tree].append(row)
            print(f"round {r + 1} {tree}: {row['median_ms']:.2f} ms, CPU ms per evaluation: "
                  f"workers {sum(row['worker_cpu_ms']):.2f}, driver "
                  f"{row['driver_cpu_ms']:.2f} ({row['n']} evaluations)", flush=True)
    print(f"\n| {args.parties} parties, trivial evaluate + fetch | old main | new |")
    print("|---|---:|---:|")
    for label, pick in (("median ms", lambda r: r["median_ms"]),
                        ("workers' CPU ms per evaluation", lambda r: sum(r["worker_cpu_ms"])),
                        ("driver's CPU ms per evaluation", lambda r: r["driver_cpu_ms"])):
        old, new = (statistics.median(pick(r) for r in rows[t]) for t in ("old", "new"))
        print(f"| {label} | {old:.2f} | {new:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
