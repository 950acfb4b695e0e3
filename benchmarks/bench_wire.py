"""Wire speed across 3 worker processes: this tree against an older main, and against
the honest baselines (raw libspu over brpc, a loopback TCP copy into a reused buffer).

Per tree, one child process starts 3 workers (mutual TLS, ABY3 ``SP0`` on FM64) and measures:

- ``trivial``: ``mp.fetch(mp.evaluate(...))`` of a compiled one-op ``pcall`` on party 0,
  and the same ``pcall`` on all 3 parties (two-phase accept: prepare, then run);
- ``millionaire``: the millionaire program end to end (each wealth loaded from its
  party's data root, compared on the SPU, revealed to P0, fetched);
- ``spu``: one SPU op on inputs already secret-shared, result kept secret: compare at
  10^4 and 10^5, multiply at 10^6 (the whole ``mp.evaluate``);
- ``overlap``: 4 independent compares of 10^5 in one program, ``parallel=True`` against
  ``parallel=False``;
- ``move`` and ``fetch``: 64 MiB float32 from worker 0 to worker 1
  (``simp.shuffle_static``), and to the driver (``mp.fetch``), in MiB/s.

The parent runs the trees' children alternately (``--rounds``), and in every round also
raw libspu over its own brpc links on the same SPU executables (`spu_raw_brpc`) and a
TCP copy of 64 MiB into a reused buffer (`bench_mtls.tcp_copy_seconds`).
The old tree is a git worktree (``git worktree add /tmp/mplang-before-wire e9839e2``).

    .venv/bin/python benchmarks/bench_wire.py [--rounds 3] [--old /tmp/mplang-before-wire]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from timing import median_ms, run_in_tree

NEW = Path(__file__).resolve().parents[1]
NBYTES = 64 << 20
SPU_CASES = [("compare", 10_000), ("compare", 100_000), ("multiply", 1_000_000)]



def _spu_op(kind: str) -> Any:
    import jax.numpy as jnp
    return jnp.less if kind == "compare" else jnp.multiply


def _inputs(n: int) -> list[Any]:
    import numpy as np
    rng = np.random.default_rng(n)
    return [rng.normal(size=n).astype(np.float32) for _ in range(2)]


# ---------------------------------------------------------------- child: one tree


def spu_case_ms(drv: Any, spec: Any, cases: list[tuple[str, int]], runs: int
                ) -> dict[str, float]:
    """Per ``(kind, n)`` case, the median ms of one SPU op on inputs already secret-shared
    (from P0 and P1), its result kept secret: the whole ``mp.evaluate``."""
    import mplang as mp

    spu: dict[str, float] = {}
    for kind, n in cases:
        a, b = (mp.evaluate(drv, lambda v, p=p: mp.put("SP0", mp.put(p, v)), value)
                for p, value in zip(("P0", "P1"), _inputs(n), strict=True))
        program = mp.compile(lambda u, v, k=kind: mp.device("SP0")(_spu_op(k))(u, v), a, b,
                             cluster=spec)
        spu[f"{kind} {n}"] = median_ms(lambda p=program, u=a, v=b: mp.evaluate(drv, p, u, v),
                                        runs, 2)
    return spu


def _measure(drv: Any, spec: Any, runs: int) -> dict[str, Any]:
    import jax.numpy as jnp
    import numpy as np

    import mplang as mp
    from mplang import simp, tensor

    out: dict[str, Any] = {}
    x = mp.evaluate(drv, lambda: simp.constant((0,), np.float32(1)))
    one = mp.compile(lambda v: simp.pcall((0,), lambda a: a + 1, v), x, cluster=spec)
    y = mp.evaluate(drv, lambda: simp.constant((0, 1, 2), np.float32(1)))
    three = mp.compile(lambda v: simp.pcall((0, 1, 2), lambda a: a + 1, v), y, cluster=spec)

    def trivial(program: Any, arg: Any) -> None:
        got = mp.fetch(drv, mp.evaluate(drv, program, arg))
        assert float(got[0]) == 2.0, got

    out["trivial_1_ms"] = median_ms(lambda: trivial(one, x), runs * 4, 20)
    out["trivial_3_ms"] = median_ms(lambda: trivial(three, y), runs * 4, 20)

    @mp.function
    def millionaire() -> Any:
        alice = mp.device("P0")(lambda: tensor.load("wealth.npy"))()
        bob = mp.device("P1")(lambda: tensor.load("wealth.npy"))()
        return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(alice, bob))

    with drv:  # the parties tell the driver their files' types
        rich = mp.compile(millionaire, cluster=spec)

    def compare_wealth() -> None:
        assert bool(mp.fetch(drv, mp.evaluate(drv, rich)))  # Alice (1e6) < Bob (2e6)

    out["millionaire_ms"] = median_ms(compare_wealth, runs * 4, 5)

    out["spu_ms"] = spu_case_ms(drv, spec, SPU_CASES, runs)

    pairs = [[mp.evaluate(drv, lambda v, p=p: mp.put("SP0", mp.put(p, v)), value)
              for p, value in zip(("P0", "P1"), _inputs(100_000 + i), strict=True)]
             for i in range(4)]
    flat = [v for pair in pairs for v in pair]
    four = mp.compile(lambda *v: [mp.device("SP0")(jnp.less)(v[2 * i], v[2 * i + 1])
                                  for i in range(4)], *flat, cluster=spec)
    out["overlap_ms"] = {
        mode: median_ms(lambda p=parallel: mp.evaluate(drv, four, *flat, parallel=p), runs, 1)
        for mode, parallel in (("parallel", True), ("sequential", False))}

    n = NBYTES // 4
    big = mp.evaluate(drv, lambda: simp.pcall((0,), lambda: jnp.arange(n, dtype=jnp.float32)))
    move = mp.compile(lambda v: simp.shuffle_static(v, {1: 0}), big, cluster=spec)
    moved = mp.evaluate(drv, move, big)
    got = mp.fetch(drv, moved)[1]
    assert got.shape == (n,) and got[-1] == n - 1
    del got
    out["move_mib_s"] = 64 / (median_ms(lambda: mp.evaluate(drv, move, big), runs, 1) / 1e3)
    out["fetch_mib_s"] = 64 / (median_ms(lambda: mp.fetch(drv, big), runs, 1) / 1e3)
    return out


def child(tree: str, runs: int) -> None:
    import numpy as np
    from bench_http import cluster_spec

    import mplang as mp
    from mplang.cluster.local import LocalCluster

    spec = cluster_spec()
    with tempfile.TemporaryDirectory(prefix="bench-wire-") as data:
        for node, wealth in (("node_0", 1_000_000), ("node_1", 2_000_000)):
            (Path(data) / node).mkdir()
            np.save(Path(data) / node / "wealth.npy", np.int32(wealth))
        (Path(data) / "node_2").mkdir()
        with LocalCluster(spec, data_root=data) as cluster:
            drv = cluster.driver(timeout=60.0, run_timeout=600.0)
            try:
                result = _measure(drv, spec, runs)
            finally:
                drv.close()
    print(json.dumps({"tree": tree, "mplang": mp.__file__, **result}), flush=True)


# ---------------------------------------------------------------- parent: baselines


def raw_spu_ms(runs: int) -> dict[str, float]:
    """Raw libspu over brpc on the executables this tree compiles for `SPU_CASES`."""
    from bench_http import cluster_spec
    from spu_raw_brpc import raw_brpc_seconds

    import mplang as mp
    from mplang.dialects.spu import SpuConfig

    spec = cluster_spec()
    out = {}
    for kind, n in SPU_CASES:
        x, y = _inputs(n)

        def prog(a: Any, b: Any, k: str = kind) -> Any:
            return mp.device("SP0")(_spu_op(k))(mp.put("P0", a), mp.put("P1", b))

        program = mp.compile(prog, x, y, cluster=spec)
        (run,) = [op for op in program.graph.walk() if op.opcode == "spu.run"]
        seconds = raw_brpc_seconds(bytes(run.attrs["executable"]), SpuConfig.from_attrs(run.attrs),
                                   [x, y], runs=runs, warmup=2)
        out[f"{kind} {n}"] = statistics.median(seconds) * 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default="/tmp/mplang-before-wire",
                        help="worktree of an older main (e9839e2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=15, help="samples per figure per child")
    parser.add_argument("--child", choices=["old", "new"])
    args = parser.parse_args()
    if args.child:
        child(args.child, args.runs)
        return 0
    from bench_mtls import tcp_copy_seconds

    trees = {"old": Path(args.old), "new": NEW}
    results: dict[str, list[dict[str, Any]]] = {"old": [], "new": [], "raw": [], "tcp": []}
    for r in range(args.rounds):
        for tree in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            results[tree].append(run_in_tree(str(Path(__file__).resolve()), tree, trees[tree],
                                             ["--child", tree, "--runs", str(args.runs)]))
        results["raw"].append(raw_spu_ms(args.runs))
        results["tcp"].append({"mib_s": 64 / tcp_copy_seconds(NBYTES)})
        print(f"round {r + 1}: " + json.dumps({k: v[-1] for k, v in results.items()}),
              flush=True)
    print(json.dumps(results), file=sys.stderr)
    report(results)
    return 0


def _med(rows: list[dict[str, Any]], *path: str) -> float:
    values = []
    for row in rows:
        for key in path:
            row = row[key]
        values.append(float(row))  # type: ignore[arg-type]
    return statistics.median(values)


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    old, new, raw = results["old"], results["new"], results["raw"]
    tcp = _med(results["tcp"], "mib_s")
    print(f"\nMedians over {len(new)} rounds (each a median of its samples):\n")
    print("| figure | old | new | baseline | new vs baseline | target |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind, n in SPU_CASES:
        key = f"{kind} {n}"
        b = _med(raw, key)
        print(f"| SPU {kind} {n:,} (ms) | {_med(old, 'spu_ms', key):.1f} | "
              f"{_med(new, 'spu_ms', key):.1f} | {b:.1f} (raw libspu, brpc) | "
              f"{_med(new, 'spu_ms', key) / b:.2f}x | 1.1x |")
    print(f"| millionaire end to end (ms) | {_med(old, 'millionaire_ms'):.1f} | "
          f"{_med(new, 'millionaire_ms'):.1f} | | | 10 ms |")
    for what in ("move", "fetch"):
        o, w = _med(old, f"{what}_mib_s"), _med(new, f"{what}_mib_s")
        print(f"| 64 MiB {what} (MiB/s) | {o:.0f} ({o / tcp:.2f}x) | {w:.0f} | "
              f"{tcp:.0f} (TCP copy, reused buffer) | {w / tcp:.2f}x | 0.5x |")
    for parties in ("1", "3"):
        print(f"| trivial evaluate + fetch, pcall on {parties} of 3 (ms) | "
              f"{_med(old, f'trivial_{parties}_ms'):.2f} | "
              f"{_med(new, f'trivial_{parties}_ms'):.2f} | | | 2 ms |")
    for tree, rows in (("old", old), ("new", new)):
        par, seq = _med(rows, "overlap_ms", "parallel"), _med(rows, "overlap_ms", "sequential")
        print(f"| 4 compares of 10^5, {tree}: parallel / sequential (ms) | | {par:.0f} / "
              f"{seq:.0f} | | speedup {seq / par:.2f}x | |")


if __name__ == "__main__":
    sys.exit(main())
