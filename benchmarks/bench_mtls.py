"""Mutual TLS against the HMAC-signed HTTP it replaced: the same figures from both trees.

- latency: ``mp.evaluate`` + ``mp.fetch`` of a trivial compiled ``pcall`` on party 0
  (median and p90 over ``--runs``, after 20 warm-up runs);
- throughput: a 64 MiB float32 array moved from worker 0 to worker 1 with
  ``simp.shuffle_static`` (median and best of ``--repeats``, in MiB/s);
- the wire's limit: 64 MiB copied over one loopback TCP connection between two
  processes, into a receive buffer reused from copy to copy (best of 3 per round).

"Old" is a git worktree of the main before mutual TLS (default ``/tmp/mplang-before``,
made with ``git worktree add /tmp/mplang-before 19cb34c``: HMAC-signed requests
under ``MPLANG_CLUSTER_SECRET``); "new" is this tree (per-party keys, TLS 1.3 with
pinned certificates). Each measurement is a child process with that tree first on
``PYTHONPATH`` and as working directory (its workers inherit both), same venv;
rounds alternate which tree goes first.

    .venv/bin/python benchmarks/bench_mtls.py [--rounds 5] [--old /tmp/mplang-before]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from timing import run_in_tree

NBYTES = 64 << 20
NEW = Path(__file__).resolve().parents[1]
SECRET = b"mplang-bench-mtls-" + b"0123456789abcdef"


# ---------------------------------------------------------------- child: one tree


def _measure(drv: Any, runs: int, repeats: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    import mplang as mp
    from mplang import simp

    x = mp.evaluate(drv, lambda: simp.constant((0,), np.float32(1)))
    program = mp.compile(lambda v: simp.pcall((0,), lambda a: a + 1, v), x, world_size=3)

    def round_trip() -> float:
        start = time.perf_counter()
        got = mp.fetch(drv, mp.evaluate(drv, program, x))
        elapsed = time.perf_counter() - start
        assert float(got[0]) == 2.0, got
        return elapsed

    for _ in range(20):
        round_trip()
    times = sorted(round_trip() for _ in range(runs))

    n = NBYTES // 4
    big = mp.evaluate(drv, lambda: simp.pcall((0,), lambda: jnp.arange(n, dtype=jnp.float32)))
    move = mp.compile(lambda v: simp.shuffle_static(v, {1: 0}), big, world_size=3)
    moved = mp.evaluate(drv, move, big)
    got = mp.fetch(drv, moved)[1]
    assert got.shape == (n,) and got[-1] == n - 1
    del moved, got
    shuffles = []
    for _ in range(repeats):
        start = time.perf_counter()
        moved = mp.evaluate(drv, move, big)
        shuffles.append(time.perf_counter() - start)
        del moved
    return {"latency_ms": {"median": statistics.median(times) * 1e3,
                           "p90": times[int(0.9 * (len(times) - 1))] * 1e3},
            "shuffle_s": {"median": statistics.median(shuffles), "best": min(shuffles)}}


def child(tree: str, runs: int, repeats: int) -> None:
    from bench_http import cluster_spec  # this script's folder (either tree's mplang)

    import mplang as mp
    from mplang.cluster.local import LocalCluster

    spec = cluster_spec()  # 3 nodes on free ports, PPUs, ABY3 SP0 (FM64)
    if tree == "old":
        old_cluster: Any = LocalCluster  # the old signature: (spec, secret)
        cluster = old_cluster(spec, SECRET)
        cluster.start()
        drv = mp.Driver(spec, secret=SECRET, timeout=30.0, run_timeout=120.0)
    else:
        cluster = LocalCluster(spec)
        cluster.start()
        drv = cluster.driver(timeout=30.0, run_timeout=120.0)
    try:
        result = _measure(drv, runs, repeats)
    finally:
        drv.close()
        cluster.close()
    print(json.dumps({"tree": tree, "mplang": mp.__file__, **result}), flush=True)


# ---------------------------------------------------------------- the wire's limit

_TCP_RECEIVER = r"""
import socket, sys
n, copies = int(sys.argv[1]), int(sys.argv[2])
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
view = memoryview(bytearray(n))  # one buffer, reused by every copy
for _ in range(copies):
    got = 0
    while got < n:
        got += conn.recv_into(view[got:], n - got)
    conn.sendall(b"k")
"""

_TCP_SENDER = r"""
import socket, sys, time
port, n, copies = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
data = bytes(n)
sock = socket.create_connection(("127.0.0.1", port))
times = []
for _ in range(copies):
    start = time.perf_counter()
    sock.sendall(data)
    assert sock.recv(1) == b"k"
    times.append(time.perf_counter() - start)
print(min(times), flush=True)
"""


def tcp_copy_seconds(nbytes: int = NBYTES, copies: int = 3) -> float:
    """Best of ``copies`` copies of ``nbytes`` over one loopback TCP connection."""
    receiver = subprocess.Popen([sys.executable, "-c", _TCP_RECEIVER, str(nbytes), str(copies)],
                                stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    port = receiver.stdout.readline().strip()
    sender = subprocess.run([sys.executable, "-c", _TCP_SENDER, port, str(nbytes), str(copies)],
                            capture_output=True, text=True, check=True)
    receiver.wait(timeout=60)
    return float(sender.stdout.strip())


# ---------------------------------------------------------------- parent


def run_tree(tree: str, path: Path, runs: int, repeats: int) -> dict[str, Any]:
    return run_in_tree(str(Path(__file__).resolve()), tree, path,
                       ["--child", tree, "--runs", str(runs), "--repeats", str(repeats)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="/tmp/mplang-before",
                        help="worktree of the main before mutual TLS (19cb34c)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200, help="latency samples per child")
    parser.add_argument("--repeats", type=int, default=5, help="64 MiB shuffles per child")
    parser.add_argument("--child", choices=["old", "new"], help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write every round's figures here too")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.runs, args.repeats)
        return 0

    trees = {"old": Path(args.old), "new": NEW}
    if not (trees["old"] / "mplang" / "__init__.py").exists():
        sys.exit(f"no old tree at {args.old}: git worktree add {args.old} 19cb34c")
    rows: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    tcp: list[float] = []
    mib = NBYTES / (1 << 20)
    for r in range(args.rounds):
        order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
        for tree in order:
            row = run_tree(tree, trees[tree], args.runs, args.repeats)
            rows[tree].append(row)
            print(f"round {r + 1} {tree}: latency median {row['latency_ms']['median']:.2f} ms "
                  f"p90 {row['latency_ms']['p90']:.2f} ms; 64 MiB shuffle median "
                  f"{mib / row['shuffle_s']['median']:.0f} MiB/s, best "
                  f"{mib / row['shuffle_s']['best']:.0f} MiB/s", flush=True)
        tcp.append(tcp_copy_seconds())
        print(f"round {r + 1} loopback TCP copy: {mib / tcp[-1]:.0f} MiB/s", flush=True)

    def med(tree: str, *keys: str) -> float:
        values = []
        for row in rows[tree]:
            value: Any = row
            for key in keys:
                value = value[key]
            values.append(float(value))
        return statistics.median(values)

    summary = {
        tree: {"latency_median_ms": med(tree, "latency_ms", "median"),
               "latency_p90_ms": med(tree, "latency_ms", "p90"),
               "shuffle_median_mib_s": mib / med(tree, "shuffle_s", "median"),
               "shuffle_best_mib_s": mib / med(tree, "shuffle_s", "best")}
        for tree in ("old", "new")}
    wire = mib / statistics.median(tcp)
    print(f"\nmedians over {args.rounds} rounds (old = {args.old}, new = {NEW}):")
    print("| figure | old | new | new / old |\n|---|---:|---:|---:|")
    for key, label in [("latency_median_ms", "evaluate + fetch, trivial pcall: median ms"),
                       ("latency_p90_ms", "evaluate + fetch, trivial pcall: p90 ms"),
                       ("shuffle_median_mib_s", "64 MiB shuffle worker 0 -> 1: MiB/s (median)"),
                       ("shuffle_best_mib_s", "64 MiB shuffle worker 0 -> 1: MiB/s (best)")]:
        old, new = summary["old"][key], summary["new"][key]
        print(f"| {label} | {old:.2f} | {new:.2f} | {new / old:.2f} |")
    print(f"| loopback TCP copy of 64 MiB, reused buffer: MiB/s | {wire:.0f} | {wire:.0f} | |")
    for tree in ("old", "new"):
        print(f"{tree}: shuffle at {summary[tree]['shuffle_median_mib_s'] / wire:.2f} of the "
              "TCP copy (median)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rows, "tcp_s": tcp,
                                               "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
