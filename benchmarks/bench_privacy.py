"""Cost of the privacy machinery on the HTTP runtime: the same figures from the main
before it (commitments, signed two-phase accept, policy checks, labels, audit log) and
from this tree, run alternately in one run.

- latency: ``mp.evaluate`` + ``mp.fetch`` of a trivial compiled ``pcall`` on party 0
  (one party: its program is checked, no votes), and of a two-party program (a pcall
  on party 0 whose result party 1 receives: prepared on both, votes exchanged);
- SPU: a compiled ABY3 multiply of two 10^4 vectors (held by P0 and P1) revealed to P0;
- throughput: a 64 MiB float32 array moved from worker 0 to worker 1.

"Old" is a git worktree of the main before these changes (default
``/tmp/mplang-before-privacy``, made with ``git worktree add /tmp/mplang-before-privacy
8d4bcf9``); "new" is this tree. Each measurement is a child process with that tree first
on ``PYTHONPATH`` and as working directory (its 3 workers inherit both), same venv;
rounds alternate which tree goes first. Both trees run the same programs; the new
workers run with `mplang init`'s development policies and write their audit logs.

    .venv/bin/python benchmarks/bench_privacy.py [--rounds 5] [--old PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from timing import median_ms, run_in_tree

NBYTES = 64 << 20
NEW = Path(__file__).resolve().parents[1]



def _measure(drv: Any, runs: int, repeats: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    import mplang as mp
    from mplang import simp

    cluster = drv.cluster
    x = mp.evaluate(drv, lambda: simp.constant((0,), np.float32(1)))
    one = mp.compile(lambda v: simp.pcall((0,), lambda a: a + 1, v), x, world_size=3)
    two = mp.compile(lambda v: simp.shuffle_static(simp.pcall((0,), lambda a: a + 1, v),
                                                   {1: 0}), x, world_size=3)

    def one_party() -> None:
        assert float(mp.fetch(drv, mp.evaluate(drv, one, x))[0]) == 2.0

    def two_parties() -> None:
        assert float(mp.fetch(drv, mp.evaluate(drv, two, x))[1]) == 2.0

    n = 10_000
    a = mp.evaluate(drv, lambda: mp.put("P0", np.arange(n, dtype=np.float32)))
    b = mp.evaluate(drv, lambda: mp.put("P1", np.full(n, 0.5, dtype=np.float32)))
    multiply = mp.compile(lambda u, v: mp.put("P0", mp.device("SP0")(jnp.multiply)(u, v)),
                          a, b, cluster=cluster)

    def spu() -> None:
        got = mp.fetch(drv, mp.evaluate(drv, multiply, a, b))
        assert abs(float(got[-1]) - (n - 1) * 0.5) < 1e-2

    out = {"one_party_ms": median_ms(one_party, runs, 20),
           "two_parties_ms": median_ms(two_parties, runs, 20),
           "spu_multiply_ms": median_ms(spu, max(5, runs // 10), 3)}
    size = NBYTES // 4
    big = mp.evaluate(drv, lambda: simp.pcall((0,), lambda: jnp.arange(size, dtype=jnp.float32)))
    move = mp.compile(lambda v: simp.shuffle_static(v, {1: 0}), big, world_size=3)
    mp.evaluate(drv, move, big)  # warm up
    shuffles = []
    for _ in range(repeats):
        start = time.perf_counter()
        moved = mp.evaluate(drv, move, big)
        shuffles.append(time.perf_counter() - start)
        del moved
    out["shuffle_mib_s"] = (NBYTES / (1 << 20)) / statistics.median(shuffles)
    return out


def child(runs: int, repeats: int) -> None:
    from bench_http import cluster_spec  # this script's folder (either tree's mplang)

    import mplang as mp
    from mplang.cluster.local import LocalCluster

    spec = cluster_spec()  # 3 nodes on free ports, PPUs, ABY3 SP0 (FM64)
    with LocalCluster(spec) as cluster:  # started by entering
        drv = cluster.driver(timeout=30.0, run_timeout=120.0)
        try:
            result = _measure(drv, runs, repeats)
        finally:
            drv.close()
    print(json.dumps({"mplang": mp.__file__, **result}), flush=True)


def run_tree(tree: str, path: Path, runs: int, repeats: int) -> dict[str, Any]:
    return run_in_tree(str(Path(__file__).resolve()), tree, path,
                       ["--child", "--runs", str(runs), "--repeats", str(repeats)])


FIGURES = [("one_party_ms", "evaluate + fetch, trivial pcall on 1 party: median ms"),
           ("two_parties_ms", "evaluate + fetch, pcall + shuffle on 2 parties: median ms"),
           ("spu_multiply_ms", "evaluate + fetch, ABY3 multiply of 10^4, revealed: median ms"),
           ("shuffle_mib_s", "64 MiB shuffle worker 0 -> 1: MiB/s (median)")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="/tmp/mplang-before-privacy",
                        help="worktree of the main before the privacy changes (8d4bcf9)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200, help="latency samples per child")
    parser.add_argument("--repeats", type=int, default=5, help="64 MiB shuffles per child")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.runs, args.repeats)
        return 0
    trees = {"old": Path(args.old), "new": NEW}
    if not (trees["old"] / "mplang" / "__init__.py").exists():
        sys.exit(f"no old tree at {args.old}: git worktree add {args.old} 8d4bcf9")
    rows: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for tree in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            row = run_tree(tree, trees[tree], args.runs, args.repeats)
            rows[tree].append(row)
            print(f"round {r + 1} {tree}: " + ", ".join(
                f"{key} {row[key]:.2f}" for key, _ in FIGURES), flush=True)
    print(f"\nmedians over {args.rounds} rounds (old = {args.old}, new = {NEW}):")
    print("| figure | old | new | new / old |\n|---|---:|---:|---:|")
    for key, label in FIGURES:
        old = statistics.median(row[key] for row in rows["old"])
        new = statistics.median(row[key] for row in rows["new"])
        print(f"| {label} | {old:.2f} | {new:.2f} | {new / old:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
