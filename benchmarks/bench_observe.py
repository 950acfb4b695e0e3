"""What observing a run costs: timelines (``trace=``) and the progress display, per op.

The workload is `bench_interpreter.py`'s chain of N small local ops on one party
of a 3-party simulator (launch mode). Each round runs, in fresh subprocesses
and alternately, the old tree (a git worktree of the previous main: tracing and
the display do not exist there) and this tree, each executing the compiled chain
``--runs`` times per setting and keeping the best time:

- old tree, observation off (its only setting);
- new tree, off (``progress=False``, no trace);
- new tree, ``trace=FILE`` (every op recorded and the file written);
- new tree, the ops recorded as for a trace but no file written (the share of
  recording in the trace's cost);
- new tree, the progress display (standard error taken for a terminal, display
  drawn into a buffer from the start, no delay).

Each setting runs two chain lengths; the slope between them is the cost per op
and what remains the cost per run (the display's start, the file's header).
Prints per-setting medians over the rounds, the off/off ratio (target: within
3 %) and the on - off cost per op (target: at most 2 µs).

    git worktree add /tmp/mplang_old HEAD~1
    .venv/bin/python benchmarks/bench_observe.py --old /tmp/mplang_old [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ["old", "off", "trace", "record", "progress"]

CHILD = """
import io, json, os, sys, tempfile, time
import numpy as np
import mplang as mp
from mplang import simp, tensor

N, RUNS, SETTING = {n}, {runs}, {setting!r}

def increment(v):
    return v + 1

def chain():
    x = simp.constant((0,), np.float32(0))
    def body(v):
        for _ in range(N):
            v = tensor.run_jax(increment, v)
        return v
    return simp.pcall((0,), body, x)

options = {{}}
if SETTING != "old":
    options["progress"] = False
if SETTING == "trace":
    options["trace"] = os.path.join(tempfile.mkdtemp(), "run.json")
if SETTING == "record":  # the ops recorded, no file written
    import mplang.api
    from mplang.runtime.timeline import RunMonitor
    original = mplang.api.make_options
    mplang.api.make_options = lambda *a, **k: original(
        *a, **{{**k, "monitor": RunMonitor("chain", record=True)}})
if SETTING == "progress":
    import mplang.api
    from rich.console import Console
    from mplang.cli.progress import ProgressDisplay
    mplang.api.is_terminal = lambda: True
    init = ProgressDisplay.__init__
    def drawn(self, monitor, **_):
        init(self, monitor, delay_s=0.0, console=Console(file=io.StringIO(),
                                                         force_terminal=True))
    ProgressDisplay.__init__ = drawn
    del options["progress"]
sim = mp.Simulator(3)
program = mp.compile(chain, world_size=3)
best = float("inf")
for i in range(RUNS + 1):
    start = time.perf_counter()
    out = mp.evaluate(sim, program, **options)
    elapsed = time.perf_counter() - start
    assert mp.fetch(sim, out)[0] == np.float32(N)
    if i:
        best = min(best, elapsed)
print(json.dumps({{"run_us": best * 1e6, "file": mp.__file__}}))
sim.close()
"""


def measure(tree: Path, setting: str, n: int, runs: int) -> float:
    """Microseconds of the best of ``runs`` runs of the ``n``-op chain."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run([sys.executable, "-c", CHILD.format(n=n, runs=runs, setting=setting)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{setting} in {tree} exited {done.returncode}:\n{done.stderr}")
    out = json.loads(lines[-1])
    if Path(out["file"]).resolve() != (tree / "mplang" / "__init__.py").resolve():
        raise RuntimeError(f"imported {out['file']}, expected the tree {tree}")
    return float(out["run_us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="worktree of the old main")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", type=int, nargs=2, default=[2000, 10000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--settings", nargs="+", default=SETTINGS, choices=SETTINGS,
                        help="which settings to run (old and off always run)")
    args = parser.parse_args()
    small, large = args.sizes
    plan = [(args.old if s == "old" else ROOT, s) for s in SETTINGS
            if s in ("old", "off") or s in args.settings]
    per_op: dict[str, list[float]] = {setting: [] for _, setting in plan}
    fixed: dict[str, list[float]] = {setting: [] for _, setting in plan}
    for r in range(args.rounds):
        for tree, setting in plan:
            a = measure(tree, setting, small, args.runs)
            b = measure(tree, setting, large, args.runs)
            per_op[setting].append((b - a) / (large - small))
            fixed[setting].append(a - small * per_op[setting][-1])
        print(f"round {r + 1}: " + ", ".join(f"{s} {t[-1]:.2f}" for s, t in per_op.items()),
              flush=True)
    med = {s: statistics.median(t) for s, t in per_op.items()}
    fix = {s: statistics.median(t) / 1000 for s, t in fixed.items()}
    print(f"\nchains of {small} and {large} ops, 3-party simulator, launch mode; medians of "
          f"{args.rounds} rounds (best of {args.runs} runs each). Per op: the slope between "
          "the two sizes; per run: what remains (start-up, and for trace the file's header)")
    print("| setting | µs/op | range | per run ms | vs target |")
    print("| --- | ---: | --- | ---: | --- |")
    ratio = med["off"] / med["old"]
    print(f"| old main | {med['old']:.2f} | {min(per_op['old']):.2f}–{max(per_op['old']):.2f} "
          f"| {fix['old']:.1f} | |")
    print(f"| new, off | {med['off']:.2f} | {min(per_op['off']):.2f}–{max(per_op['off']):.2f} "
          f"| {fix['off']:.1f} | new/old {ratio:.3f} "
          f"({'met' if ratio <= 1.03 else 'MISSED'}: <= 1.03) |")
    for setting in [s for s in ("trace", "record", "progress") if s in med]:
        cost = med[setting] - med["off"]
        print(f"| new, {setting} | {med[setting]:.2f} | {min(per_op[setting]):.2f}–"
              f"{max(per_op[setting]):.2f} | {fix[setting]:.1f} | +{cost:.2f} µs/op "
              f"({'met' if cost <= 2.0 else 'MISSED'}: <= 2) |")


if __name__ == "__main__":
    main()
