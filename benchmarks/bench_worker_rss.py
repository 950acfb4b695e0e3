"""Worker memory over a long run: RSS of 3 worker processes across 1,000 evaluations.

The mix (``tests/worker/memory_workload.py``): a trivial pcall fetched, a shuffle
from party 0 to party 1 fetched, an SPU op on ``SP0`` revealed to ``P2``
fetched, and objects the driver drops unfetched (their finalizers ``/delete``
them), each evaluation with new data. Each worker's VmRSS (/proc/PID/status) is
sampled after the warm-up (the first ``--warmup`` evaluations) and every
``--every`` evaluations after it; growth is end against after-warm-up.

``--held`` runs the same mix on in-process workers (one process, so no RSS per
worker) and prints what each worker holds at the same points: objects in its
store, queued messages, runs going on, prepared runs, remembered executions,
cached programs.

    .venv/bin/python benchmarks/bench_worker_rss.py [--evaluations 1000] [--held]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mplang as mp  # noqa: E402
from tests.worker import memory_workload, support  # noqa: E402


def processes(args: argparse.Namespace) -> dict[str, Any]:
    """The mix on worker processes; RSS samples per worker (KiB)."""
    samples: list[dict[str, Any]] = []
    with support.running_cluster(support.make_spec(support.free_ports(3))) as cluster, \
            support.connected_driver(cluster) as driver:
        pids = {name: proc.pid for name, proc in cluster.processes.items()}

        def sample(done: int) -> None:
            memory_workload.settle()
            row = {"evaluations": done, "seconds": round(time.monotonic() - start, 1),
                   "driver": memory_workload.rss_kib(os.getpid()),
                   **{name: memory_workload.rss_kib(pid) for name, pid in pids.items()}}
            samples.append(row)
            print(json.dumps(row), flush=True)

        start = time.monotonic()
        memory_workload.run(driver, args.warmup)
        sample(args.warmup)
        done = args.warmup
        while done < args.evaluations:
            count = min(args.every, args.evaluations - done)
            memory_workload.run(driver, count, start=done)
            done += count
            sample(done)
        alive = {name: proc.poll() is None for name, proc in cluster.processes.items()}
    first, last = samples[0], samples[-1]
    growth = {name: round(100.0 * (last[name] - first[name]) / first[name], 2)
              for name in [*pids, "driver"]}
    return {"samples": samples, "growth_percent": growth, "alive": alive,
            "after_warmup_kib": {k: first[k] for k in growth},
            "end_kib": {k: last[k] for k in growth}}


def in_process(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The mix on in-process workers; what each holds at the same points."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mplang-rss-") as tmp:
        dev = support.dev_cluster(Path(tmp), support.make_spec(support.free_ports(3)))
        workers = [support.ThreadWorker(dev, f"node_{r}") for r in range(3)]
        for worker in workers:
            worker.start()
        driver = mp.Driver(dev.spec_path, key=dev.keys / "driver.key")
        try:
            done = 0
            for target in [args.warmup, *range(args.warmup + args.every, args.evaluations + 1,
                                                args.every)]:
                memory_workload.run(driver, target - done, start=done)
                done = target
                memory_workload.settle()
                row = {"evaluations": done, **{
                    f"node_{r}": memory_workload.held(w.server) for r, w in enumerate(workers)}}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            driver.close()
            for worker in workers:
                worker.stop()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluations", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--held", action="store_true",
                        help="in-process workers: print what each holds instead of RSS")
    parser.add_argument("--json", help="write the result here too")
    args = parser.parse_args()
    if args.held:
        result: Any = in_process(args)
    else:
        result = processes(args)
        print("growth after warm-up (%):", json.dumps(result["growth_percent"]))
        print("after warm-up KiB:", json.dumps(result["after_warmup_kib"]))
        print("end KiB:", json.dumps(result["end_kib"]))
        print("workers alive:", json.dumps(result["alive"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
