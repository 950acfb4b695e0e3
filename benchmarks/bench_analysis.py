"""Cost of the declassification analysis, before and after the row-aware rules, in one run.

- ``check_10k``: `mplang.policy.check` of `bench_check.py`'s 10,026-op program, per
  party (each tree's own copy of that script builds the program);
- per evaluation: the check each party runs before it accepts an evaluation, on the
  millionaire (2 parties, a CHEETAH compare) and the vertical logistic regression
  example (3 parties, 30 iterations on an ABY3 SPU), per party, under the
  policies `mplang init` writes. ``cold`` is the first check in the process (module
  texts parsed), ``warm`` the median of later ones (a worker checking the program
  again for a new evaluation: module texts cached, the graph decoded anew). Before the
  checks the process does what the tree's worker does before it serves (a worker that
  freezes its start-up heap, `freeze_startup_heap`, or not).

"Old" is a git worktree of the main before these rules (made with ``git worktree add
/tmp/mplang-before-declassify 67a614f``), "new" this tree; each measurement is a
child process with that tree first on ``PYTHONPATH`` and as working directory, and
rounds alternate which tree goes first.

    .venv/bin/python benchmarks/bench_analysis.py [--rounds 3] [--old PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from timing import run_in_tree

NEW = Path(__file__).resolve().parents[1]


def _module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _timed(graph: Any, world: int, policies: list[Any], names: list[str], runs: int
           ) -> dict[str, Any]:
    from mplang.policy import check

    out: dict[str, Any] = {}
    for rank in range(world):
        start = time.perf_counter()
        verdict = check(graph, world, rank, policies[rank], names=names)
        cold = time.perf_counter() - start
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            check(graph, world, rank, policies[rank], names=names)
            times.append(time.perf_counter() - start)
        out[names[rank]] = {"cold_ms": cold * 1e3, "warm_ms": statistics.median(times) * 1e3,
                            "accepted": verdict.accepted}
    return out


def _example_program(name: str, world: int, build: Any, save: Any) -> tuple[Any, Any]:
    import mplang as mp
    from mplang.cluster.local import write_dev_policies
    from mplang.policy import Policy

    cluster = mp.ClusterSpec.simple(world)
    base = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    roots = {n.name: base / "data" / n.name for n in cluster.nodes}
    for root in roots.values():
        root.mkdir(parents=True)
    save(roots)
    write_dev_policies(cluster, base)
    policies = [Policy.load(base / "policies" / f"{n.name}.yaml") for n in cluster.nodes]
    with mp.Simulator(cluster, data_roots=roots) as sim:
        del sim
        graph = mp.compile(build, cluster=cluster).graph
    return graph, policies


def child(runs: int) -> None:
    import mplang as mp
    from mplang.policy import Policy

    tree = Path.cwd()
    result: dict[str, Any] = {"mplang": mp.__file__}
    bench_check = _module(tree / "benchmarks" / "bench_check.py")
    graph = mp.compile(bench_check.program, cluster=mp.ClusterSpec.simple(2)).graph
    rule = Policy.parse("declassify:\n  - to: ['*']\n    when: aggregate\n")
    from mplang.worker import http

    getattr(http, "freeze_startup_heap", lambda: None)()  # as this tree's worker does
    result["check_10k"] = _timed(graph, 2, [rule, rule], ["node_0", "node_1"], max(3, runs // 10))

    millionaire = _module(tree / "examples" / "millionaire.py")

    def wealth(roots: dict[str, Path]) -> None:
        millionaire.save_wealth(roots["node_0"], 2_500_000)
        millionaire.save_wealth(roots["node_1"], 1_999_999)

    graph, policies = _example_program("millionaire", 2, millionaire.millionaire, wealth)
    result["millionaire"] = _timed(graph, 2, policies, ["node_0", "node_1"], runs)

    regression = _module(tree / "examples" / "logistic_regression.py")
    graph, policies = _example_program(
        "lr", 3, lambda: regression.vertical_logistic_regression(30),
        lambda roots: regression.save_party_data(roots, regression.load_data()))
    result["logistic_regression"] = _timed(graph, 3, policies,
                                           ["node_0", "node_1", "node_2"], runs)
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--old", default="/tmp/mplang-before-declassify")
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.runs)
        return
    trees = {"old": Path(args.old), "new": NEW}
    results: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for tree in (["old", "new"] if r % 2 == 0 else ["new", "old"]):
            results[tree].append(run_in_tree(__file__, tree, trees[tree],
                                             ["--child", "--runs", str(args.runs)]))
    for case in ("check_10k", "millionaire", "logistic_regression"):
        for node in results["new"][0][case]:
            row = [case, node]
            for tree in ("old", "new"):
                for key in ("cold_ms", "warm_ms"):
                    ms = statistics.median(x[case][node][key] for x in results[tree])
                    row.append(f"{ms:.2f}")
                row.append(str(results[tree][0][case][node]["accepted"]))
            print(" | ".join(row))
    print("columns: case | node | old cold ms | old warm ms | old accepted | new cold ms | "
          "new warm ms | new accepted")


if __name__ == "__main__":
    main()
