"""The same benchmarks on two trees of MPLang (old and new), alternately, in one run.

Both trees import as ``mplang``, so every measurement runs in a fresh
subprocess of the same interpreter with ``PYTHONPATH`` set to one tree (first
on ``sys.path``, ahead of the editable install) and that tree as working
directory. Each round runs, old then new for each item:

1. ``import mplang`` timed with ``time.perf_counter()`` inside the child, once
   in a fresh interpreter and once after ``jax`` and ``numpy`` are imported
   (MPLang's own share); the child also reports whether fastapi, uvicorn or
   starlette are in ``sys.modules`` afterwards and which file ``mplang`` is;
2. the tree's own ``benchmarks/bench_interpreter.py`` (default sizes);
3. the tree's own ``benchmarks/bench_parallel.py``.

Prints per-metric medians over the rounds, the ratio new / old and whether it
is within the tolerance (for times new / old <= tolerance, for speedups
new / old >= 1 / tolerance), then the SPU mention counts of
``count_dialect_mentions.py`` for both trees.

    git worktree add /tmp/mplang_old 16646e4
    .venv/bin/python benchmarks/bench_before_after.py --old /tmp/mplang_old [--rounds 5]
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from count_dialect_mentions import count, report

ROOT = Path(__file__).resolve().parent.parent
WEB = ("fastapi", "uvicorn", "starlette")

IMPORT_CHILD = """
import json, sys, time
if {pre!r}:
    import jax, numpy
before = len(sys.modules)
start = time.perf_counter()
import mplang
elapsed = time.perf_counter() - start
print(json.dumps({{"import_s": elapsed, "file": mplang.__file__,
                  "modules": len(sys.modules) - before,
                  "web": [m for m in {web!r} if m in sys.modules]}}))
"""

# metric name -> (unit, "lower" or "higher" is better); the order of the table
METRICS: dict[str, tuple[str, str]] = {}


def metric(name: str, unit: str, better: str) -> str:
    METRICS.setdefault(name, (unit, better))
    return name


# (tree, what) -> return codes of every child; non-zero ones printed output that parsed
# (an abort in native teardown at exit: see RESULTS.md)
EXITS: dict[tuple[str, str], list[int]] = {}


def run_child(tree: Path, args: list[str], python: str,
              parse: Callable[[str], dict[str, float]]) -> dict[str, float]:
    """Run ``python args`` with ``tree`` first on ``sys.path``; ``parse`` of its output.

    A non-zero exit is tolerated (and counted) when the output still parses."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([python, *args], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=600)
    try:
        values = parse(done.stdout)
    except (ValueError, KeyError) as e:
        raise RuntimeError(f"{args} in {tree} exited {done.returncode}, output unusable "
                           f"({e}):\n{done.stderr}") from None
    what = "import mplang" if args[0] == "-c" else Path(args[-1]).name
    EXITS.setdefault((str(tree), what), []).append(done.returncode)
    return values


def measure_import(tree: Path, python: str, pre: bool) -> dict[str, Any]:
    out: dict[str, Any] = run_child(tree, ["-c", IMPORT_CHILD.format(pre=pre, web=WEB)],
                                    python, json.loads)
    expected = (tree / "mplang" / "__init__.py").resolve()
    if Path(out["file"]).resolve() != expected:
        raise RuntimeError(f"imported {out['file']}, expected {expected}")
    return out


def _number(pattern: str, text: str) -> float:
    found = re.search(pattern, text, re.MULTILINE)
    if found is None:
        raise ValueError(f"no match for {pattern!r} in:\n{text}")
    return float(found.group(1))


def parse_interpreter(out: str) -> dict[str, float]:
    values = {}
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", out,
                      re.MULTILINE)
    if not rows:
        raise ValueError(f"no table rows in:\n{out}")
    for n, trace, exec_, direct, ratio in rows:
        values[metric(f"interp {n} ops: trace", "µs/op", "lower")] = float(trace)
        values[metric(f"interp {n} ops: exec", "µs/op", "lower")] = float(exec_)
        values[metric(f"interp {n} ops: direct JAX", "µs/op", "lower")] = float(direct)
        values[metric(f"interp {n} ops: exec / direct", "x", "lower")] = float(ratio)
    values[metric("interp eager", "ms/op", "lower")] = _number(
        r"median per op over \d+ ops: ([\d.]+) ms", out)
    return values


def parse_parallel(out: str) -> dict[str, float]:
    shuffles = r"^8 independent shuffles.*"
    pyfuncs = r"^8 independent 200 ms host calls.*"
    values = {
        metric("8 shuffles: parallel", "ms", "lower"):
            _number(shuffles + r"parallel ([\d.]+) ms", out),
        metric("8 shuffles: sequential", "ms", "lower"):
            _number(shuffles + r"sequential ([\d.]+) ms", out),
        metric("8 shuffles: speedup", "x", "higher"):
            _number(shuffles + r"speedup ([\d.]+)x", out),
        metric("8 shuffles: measured / estimate", "x", "lower"):
            _number(shuffles + r"measured / estimate ([\d.]+)", out),
        metric("8 host calls: parallel", "s", "lower"):
            _number(pyfuncs + r"parallel ([\d.]+) s", out),
        metric("8 host calls: sequential", "s", "lower"):
            _number(pyfuncs + r"sequential ([\d.]+) s", out),
        metric("8 host calls: speedup", "x", "higher"):
            _number(pyfuncs + r"speedup ([\d.]+)x", out),
    }
    for label in ("sequential, no passes", "scheduler, no passes", "scheduler + passes"):
        values[metric(f"logreg {label}", "s", "lower")] = _number(
            rf"^  {re.escape(label)}: ([\d.]+) s", out)
    values[metric("logreg accuracy", "", "same")] = _number(r"accuracy ([\d.]+)", out)
    values[metric("logreg rounds after passes", "", "same")] = _number(
        r"rounds \d+ -> (\d+)", out)
    return values


def tree_state(tree: Path) -> str:
    """``tree``'s commit, and whether ``mplang/`` has uncommitted changes."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True,
                              text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--", "mplang")
    return git("rev-parse", "--short", "HEAD") + (" + uncommitted mplang/ changes" if dirty
                                                  else "")


def script_of(tree: Path, name: str) -> Path:
    own = tree / "benchmarks" / name
    return own if own.exists() else ROOT / "benchmarks" / name


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", type=Path, default=Path("/tmp/mplang_old"))
    parser.add_argument("--new", type=Path, default=ROOT)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tolerance", type=float, default=1.10)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument("--no-parallel", action="store_true",
                        help="skip bench_parallel.py (item 3)")
    args = parser.parse_args()
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    states = {side: tree_state(tree) for side, tree in trees.items()}
    for side, tree in trees.items():
        print(f"{side}: {tree} at {states[side]}")
    for name in ("bench_interpreter.py", "bench_parallel.py"):
        same = filecmp.cmp(script_of(trees["old"], name), script_of(trees["new"], name),
                           shallow=False)
        print(f"{name}: {'identical in both trees' if same else 'differs between trees'}")

    samples: dict[str, dict[str, list[float]]] = {side: {} for side in trees}
    info: dict[str, dict[str, Any]] = {side: {} for side in trees}
    benches: list[Callable[[str, Path], dict[str, float]]] = [
        lambda side, t: import_figures(t, args.python, info[side]),
        lambda side, t: run_child(t, [str(script_of(t, "bench_interpreter.py"))], args.python,
                                  parse_interpreter),
        lambda side, t: run_child(t, [str(script_of(t, "bench_parallel.py"))], args.python,
                                  parse_parallel),
    ][:2 if args.no_parallel else 3]
    for tree in trees.values():  # compile bytecode, warm the disk cache
        measure_import(tree, args.python, pre=False)
    for r in range(args.rounds):
        start = time.perf_counter()
        for bench in benches:
            for side, tree in trees.items():
                for key, value in bench(side, tree).items():
                    samples[side].setdefault(key, []).append(value)
        print(f"round {r + 1}/{args.rounds}: {time.perf_counter() - start:.0f} s", flush=True)

    print()
    for side, tree in trees.items():
        now = tree_state(tree)
        if now != states[side]:
            print(f"WARNING: {side} tree changed during the run: {states[side]} -> {now}")
        print(f"{side}: {tree} -> {info[side]['file']}; web framework after import mplang: "
              f"{', '.join(info[side]['web']) or 'none'}; modules loaded by import mplang: "
              f"{info[side]['modules']}")
    print(f"\nmedians over {args.rounds} rounds (old then new in each round); "
          f"tolerance {args.tolerance:.2f}\n")
    print("| metric | unit | old | new | new / old | verdict |")
    print("|---|---|---:|---:|---:|---|")
    misses = []
    for key, (unit, better) in METRICS.items():
        if key not in samples["old"]:
            continue
        old = statistics.median(samples["old"][key])
        new = statistics.median(samples["new"][key])
        ratio = new / old if old else float("nan")
        if better == "same":
            verdict = "same" if set(samples["old"][key]) == set(samples["new"][key]) else "DIFFERS"
        elif key.startswith("import") or "direct JAX" in key:
            verdict = ""  # not a target: import time, and JAX's own speed (noise control)
        elif better == "lower":
            verdict = "ok" if ratio <= args.tolerance else "MISS"
        else:
            verdict = "ok" if ratio >= 1 / args.tolerance else "MISS"
        if verdict in ("MISS", "DIFFERS"):
            misses.append(key)
        print(f"| {key} | {unit} | {old:.4g} | {new:.4g} | {ratio:.2f} | {verdict} |")
    print(f"\nmisses: {', '.join(misses) if misses else 'none'}")
    for (tree_name, what), codes in EXITS.items():
        bad = [c for c in codes if c != 0]
        if bad:
            print(f"non-zero exit after complete output: {tree_name} {what}: {len(bad)} of "
                  f"{len(codes)} runs (codes {sorted(set(bad))})")

    print("\nmodules naming SPU outside SPU's own modules:")
    for side, tree in trees.items():
        report(side, count(tree))
    if args.json:
        args.json.write_text(json.dumps({"trees": {k: str(v) for k, v in trees.items()},
                                         "info": info, "samples": samples}, indent=1))


def import_figures(tree: Path, python: str, info: dict[str, Any]) -> dict[str, float]:
    """Import times of one tree; its file, web modules and module count go to ``info``."""
    cold = measure_import(tree, python, pre=False)
    warm = measure_import(tree, python, pre=True)
    info.update(file=cold["file"], web=cold["web"], modules=cold["modules"])
    return {metric("import mplang (fresh interpreter)", "s", "lower"): cold["import_s"],
            metric("import mplang (jax, numpy already imported)", "s", "lower"): warm["import_s"]}


if __name__ == "__main__":
    main()
