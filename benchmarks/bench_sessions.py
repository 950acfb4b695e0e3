"""Secure sessions kept across evaluations: 2 parties on CHEETAH and 3 on ABY3, worker
processes over mutual TLS, this tree against an older main and against raw libspu with
one link and one runtime made once (its brpc links, `spu_raw_brpc`), in one run.

Per tree and party count, one child process starts the workers and measures:

- ``first``: the first evaluation of the compiled millionaire program on the new
  cluster (loads both wealths, compares them on the SPU, reveals to P0, fetches),
  so it includes the secure session's setup; ``compile`` is its compilation;
- ``millionaire``: the same, median after warm-up;
- ``trivial``: a compiled one-op ``pcall`` on every party, evaluated and fetched;
- ``spu``: one SPU op on inputs already secret-shared, result kept secret (the whole
  ``mp.evaluate``): 2 parties compare 1 and 10^4 and multiply 10^5, 3 parties compare
  10^4 and 10^5 and multiply 10^6.

The parent runs the trees' children alternately (``--rounds``) and, every round, raw
libspu on the same executables: over plaintext brpc links (the figures' baseline) and
over brpc's mutual TLS (the same protection as MPLang's links).

    git worktree add --detach /tmp/mplang-before-sessions OLD_COMMIT
    .venv/bin/python benchmarks/bench_sessions.py --old /tmp/mplang-before-sessions \\
        [--parties 2 3] [--rounds 2] [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_http import free_ports
from bench_wire import _inputs, _med, _spu_op, spu_case_ms
from timing import median_ms, run_in_tree

NEW = Path(__file__).resolve().parents[1]
PROTOCOL = {2: "CHEETAH", 3: "ABY3"}
CASES = {2: [("compare", 1), ("compare", 10_000), ("multiply", 100_000)],
         3: [("compare", 10_000), ("compare", 100_000), ("multiply", 1_000_000)]}
TARGETS = {2: "1.5x (goal 1.2x)", 3: "1.2x (goal 1.1x)"}


def cluster_spec(parties: int) -> Any:
    import mplang as mp

    names = [f"node_{i}" for i in range(parties)]
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": n, "endpoint": f"127.0.0.1:{p}"}
                  for n, p in zip(names, free_ports(parties), strict=True)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [n]} for i, n in enumerate(names)},
                    "SP0": {"kind": "SPU", "members": names,
                            "config": {"protocol": PROTOCOL[parties], "field": "FM64"}}},
    })


def _measure(drv: Any, spec: Any, parties: int, runs: int) -> dict[str, Any]:
    import numpy as np

    import mplang as mp
    from mplang import simp, tensor

    out: dict[str, Any] = {}

    @mp.function
    def millionaire() -> Any:
        alice = mp.device("P0")(lambda: tensor.load("wealth.npy"))()
        bob = mp.device("P1")(lambda: tensor.load("wealth.npy"))()
        return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(alice, bob))

    start = time.perf_counter()
    with drv:  # the parties tell the driver their files' types
        rich = mp.compile(millionaire, cluster=spec)
    out["compile_ms"] = (time.perf_counter() - start) * 1e3

    def compare_wealth() -> None:
        assert bool(mp.fetch(drv, mp.evaluate(drv, rich)))  # Alice (1e6) < Bob (2e6)

    start = time.perf_counter()
    compare_wealth()
    out["first_ms"] = (time.perf_counter() - start) * 1e3
    out["millionaire_ms"] = median_ms(compare_wealth, runs * 3, 3)

    ranks = tuple(range(parties))
    y = mp.evaluate(drv, lambda: simp.constant(ranks, np.float32(1)))
    every = mp.compile(lambda v: simp.pcall(ranks, lambda a: a + 1, v), y, cluster=spec)
    out["trivial_ms"] = median_ms(
        lambda: float(mp.fetch(drv, mp.evaluate(drv, every, y))[0]), runs * 3, 10)

    out["spu_ms"] = spu_case_ms(drv, spec, CASES[parties], runs)
    return out


def child(tree: str, parties: int, runs: int) -> None:
    import numpy as np

    import mplang as mp
    from mplang.cluster.local import LocalCluster

    spec = cluster_spec(parties)
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as data:
        for rank in range(parties):
            (Path(data) / f"node_{rank}").mkdir()
            np.save(Path(data) / f"node_{rank}" / "wealth.npy", np.int32((rank + 1) * 10**6))
        with LocalCluster(spec, data_root=data) as cluster:
            drv = cluster.driver(timeout=60.0, run_timeout=600.0)
            try:
                result = _measure(drv, spec, parties, runs)
            finally:
                drv.close()
    print(json.dumps({"tree": tree, "mplang": mp.__file__, **result}), flush=True)


def raw_spu_ms(parties: int, runs: int, tls: bool = False) -> dict[str, float]:
    """Raw libspu over brpc (one link and runtime, warmed up; with ``tls``, brpc's mutual
    TLS) on this tree's executables."""
    from spu_raw_brpc import raw_brpc_seconds

    import mplang as mp
    from mplang.dialects.spu import SpuConfig

    spec = cluster_spec(parties)
    out = {}
    for kind, n in CASES[parties]:
        x, y = _inputs(n)

        def prog(a: Any, b: Any, k: str = kind) -> Any:
            return mp.device("SP0")(_spu_op(k))(mp.put("P0", a), mp.put("P1", b))

        program = mp.compile(prog, x, y, cluster=spec)
        (run,) = [op for op in program.graph.walk() if op.opcode == "spu.run"]
        seconds = raw_brpc_seconds(bytes(run.attrs["executable"]),
                                   SpuConfig.from_attrs(run.attrs), [x, y], runs=runs,
                                   warmup=2, tls=tls)
        out[f"{kind} {n}"] = statistics.median(seconds) * 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="worktree of an older main (required but in a child)")
    parser.add_argument("--parties", type=int, nargs="+", default=[2, 3], choices=[2, 3])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=9, help="samples per figure per child")
    parser.add_argument("--child", choices=["old", "new"])
    args = parser.parse_args()
    if args.child:
        child(args.child, args.parties[0], args.runs)
        return 0
    if args.old is None:
        parser.error("--old is required")
    trees = {"old": Path(args.old), "new": NEW}
    for parties in args.parties:
        results: dict[str, list[dict[str, Any]]] = {"old": [], "new": [], "raw": [],
                                                     "raw_tls": []}
        for r in range(args.rounds):
            for tree in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
                results[tree].append(run_in_tree(
                    str(Path(__file__).resolve()), tree, trees[tree],
                    ["--child", tree, "--parties", str(parties), "--runs", str(args.runs)]))
            results["raw"].append(raw_spu_ms(parties, args.runs))
            results["raw_tls"].append(raw_spu_ms(parties, args.runs, tls=True))
            print(f"{parties} parties, round {r + 1}: "
                  + json.dumps({k: v[-1] for k, v in results.items()}), flush=True)
        report(parties, results)
    return 0


def report(parties: int, results: dict[str, list[dict[str, Any]]]) -> None:
    old, new, raw, tls = results["old"], results["new"], results["raw"], results["raw_tls"]
    print(f"\n{parties} parties, {PROTOCOL[parties]}: medians over {len(new)} rounds\n")
    print("| figure | old main | new | raw libspu (kept link and runtime) | new vs raw "
          "| target | raw libspu, mutual TLS | new vs raw TLS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind, n in CASES[parties]:
        key = f"{kind} {n}"
        b, t, mine = _med(raw, key), _med(tls, key), _med(new, "spu_ms", key)
        print(f"| {kind} {n:,} (ms) | {_med(old, 'spu_ms', key):.1f} | {mine:.1f} | {b:.1f} | "
              f"{mine / b:.2f}x | {TARGETS[parties]} | {t:.1f} | {mine / t:.2f}x |")
    for name, label in (("millionaire_ms", "millionaire end to end"),
                        ("trivial_ms", f"trivial pcall on all {parties}, evaluate + fetch"),
                        ("first_ms", "first run of the millionaire (with setup)"),
                        ("compile_ms", "its compilation")):
        print(f"| {label} (ms) | {_med(old, name):.1f} | {_med(new, name):.1f} | | | | | |")


if __name__ == "__main__":
    sys.exit(main())
