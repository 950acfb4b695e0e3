"""Worker memory under connection churn: one worker process's RSS while a client opens
and closes ``mplang/1`` connections (mutual TLS, nothing sent), for two trees of
MPLang alternately in one run.

Each measurement runs in a fresh subprocess with ``PYTHONPATH`` set to one tree (ahead
of the editable install), so its workers run that tree's code. The child starts 3
workers, samples node_0's VmRSS (/proc/PID/status) after a warm-up of 500 connections
and every ``--every`` connections after it, and prints the samples as JSON.

    git worktree add --detach /tmp/mplang_old OLD_COMMIT
    .venv/bin/python benchmarks/bench_connection_churn.py --old /tmp/mplang_old \\
        [--connections 12000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import json, sys, time
from tests.worker import mux_wire, support
total, every = int(sys.argv[1]), int(sys.argv[2])
def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024
with support.running_cluster(support.make_spec(support.free_ports(3))) as cluster:
    pid = cluster.processes["node_0"].pid
    for _ in range(500):
        mux_wire.connect(cluster, "driver", 0).close()
    time.sleep(0.5)
    samples, start = [(0, rss(pid))], time.perf_counter()
    for done in range(every, total + 1, every):
        for _ in range(every):
            mux_wire.connect(cluster, "driver", 0).close()
        time.sleep(0.5)
        samples.append((done, rss(pid)))
    print(json.dumps({"samples": samples, "seconds": time.perf_counter() - start}))
"""


def measure(tree: Path, connections: int, every: int) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", _CHILD, str(connections), str(every)],
                         cwd=tree, env=env, check=True, capture_output=True, text=True)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True, help="the old tree (a worktree)")
    parser.add_argument("--new", type=Path, default=ROOT)
    parser.add_argument("--connections", type=int, default=12000)
    parser.add_argument("--every", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"{'round':>5} {'tree':>4} {'conns':>7} {'RSS start MiB':>14} {'RSS end MiB':>12} "
          f"{'growth KiB/conn':>16} {'s':>6}")
    for r in range(args.rounds):
        for name, tree in (("old", args.old), ("new", args.new)):
            result = measure(tree, args.connections, args.every)
            samples = result["samples"]
            assert isinstance(samples, list)
            start, end = samples[0][1], samples[-1][1]
            per_conn = (end - start) * 1024 / args.connections
            print(f"{r + 1:>5} {name:>4} {args.connections:>7} {start:>14.1f} {end:>12.1f} "
                  f"{per_conn:>16.2f} {result['seconds']:>6.1f}", flush=True)
            print("      samples (connections, MiB):",
                  ", ".join(f"{n}: {m:.1f}" for n, m in samples), flush=True)


if __name__ == "__main__":
    main()
