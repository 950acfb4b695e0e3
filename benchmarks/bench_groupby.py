"""Secure group-by sum: 10^5 rows into 100 groups on SPU, against plaintext numpy.

P0 holds the group keys, P1 the values (float32); each reads its column from its
own data root. Two placements of the keys, both oblivious on the SPU (ABY3 among
three parties, or CHEETAH between two with ``--parties 2``; FM64):

* ``keys on P0``: P0 builds the one-hots of its keys' two digits (10 + 10
  columns for 100 groups) locally and secret-shares them; the SPU multiplies;
* ``keys secret``: the keys enter the SPU first (as if an earlier secure step had
  made them); the digit one-hots are built there from the keys' bits.

See `mplang.libs.groupby` for the method.

Time is ``mp.evaluate`` plus ``mp.fetch`` of the sums revealed to P0, the first
run (which compiles) reported apart from the best of the next ``--runs``. By
default on the in-memory simulator; ``--workers`` runs three worker processes
over mutual TLS instead (`LocalCluster`).

    .venv/bin/python benchmarks/bench_groupby.py [--rows 100000] [--groups 100] [--runs 2]
        [--workers] [--parties 3] [--only owner|secret]

To compare an older tree, run this script with ``PYTHONPATH=OLD_TREE`` (it uses the
public API only).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import mplang as mp
from mplang import tensor
from mplang.cluster.local import LocalCluster
from mplang.libs.groupby import groupby_sum

KEYS, VALUES = "keys.npy", "values.npy"


def program(groups: int, secret_keys: bool) -> Callable[[], Any]:
    def prog() -> Any:
        keys = mp.device("P0")(lambda: tensor.load(KEYS))()
        values = mp.device("P1")(lambda: tensor.load(VALUES))()
        if secret_keys:
            keys = mp.device("SP0")(lambda k: k)(keys)
        return groupby_sum(keys, values, groups, to="P0")

    return prog


def timed(ctx: Any, prog: Callable[[], Any], runs: int) -> tuple[float, float, np.ndarray]:
    """(first run's seconds, best of ``runs`` more, the result)."""
    times = []
    out = np.zeros(0)
    for _ in range(runs + 1):
        start = time.perf_counter()
        out = np.asarray(mp.fetch(ctx, mp.evaluate(ctx, prog)))
        times.append(time.perf_counter() - start)
    return times[0], min(times[1:]), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--runs", type=int, default=2, help="timed runs after the first")
    parser.add_argument("--workers", action="store_true",
                        help="worker processes over mutual TLS, not the simulator")
    parser.add_argument("--parties", type=int, default=3,
                        help="3: ABY3 among three parties; 2: CHEETAH between P0 and P1")
    parser.add_argument("--only", choices=["owner", "secret"], default=None)
    args = parser.parse_args()
    warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
    rng = np.random.default_rng(0)
    keys = rng.integers(0, args.groups, size=args.rows).astype(np.int32)
    values = rng.normal(size=args.rows).astype(np.float32)

    start = time.perf_counter()
    for _ in range(10):
        want = np.bincount(keys, weights=values, minlength=args.groups)
    numpy_s = (time.perf_counter() - start) / 10

    cluster = mp.ClusterSpec.simple(args.parties)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-groupby-") as folder:
        roots = {n.name: Path(folder) / n.name for n in cluster.nodes}
        for root in roots.values():
            root.mkdir()
        np.save(roots["node_0"] / KEYS, keys)
        np.save(roots["node_1"] / VALUES, values)
        if args.workers:
            local = LocalCluster(cluster, data_root=folder)
            local.start()
            ctx: Any = local.driver()
        else:
            ctx = mp.Simulator(cluster, data_roots=roots)
        try:
            cases = [("keys on P0", False), ("keys secret", True)]
            for name, secret in cases:
                if args.only and (args.only == "secret") != secret:
                    continue
                first, best, out = timed(ctx, program(args.groups, secret), args.runs)
                rows.append((name, first, best, float(np.max(np.abs(out - want)))))
                print(rows[-1], file=sys.stderr, flush=True)
        finally:
            ctx.close()
            if args.workers:
                local.close()
    where = f"{args.parties} worker processes (mutual TLS)" if args.workers \
        else "in-memory simulator"
    protocol = "ABY3" if args.parties == 3 else "CHEETAH"
    print(f"group-by sum of {args.rows} float32 rows into {args.groups} groups, {protocol} FM64, "
          f"{where}; keys on P0, values on P1, sums revealed to P0")
    print(f"{'case':<12} {'first s':>8} {'best s':>8} {'vs numpy':>9} {'max abs error':>14}")
    for name, first, best, error in rows:
        print(f"{name:<12} {first:8.2f} {best:8.2f} {best / numpy_s:8.0f}x {error:14.2e}")
    print(f"{'numpy':<12} {'':>8} {numpy_s:8.5f} {'1':>8}x  (np.bincount with weights)")


if __name__ == "__main__":
    main()
