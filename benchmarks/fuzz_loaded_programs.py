"""One-byte mutants of the native payloads of a saved program, run on the simulator.

Each batch of mutants of one payload kind (run_jax ``module``, SPU ``executable``,
SPU ``stablehlo``) runs in its own child process (`tests.security.loaded_mutants`):
the mutated bytes are read with `mp.Program.from_bytes` and evaluated on
`mp.Simulator`. A batch whose child dies (a crash) or is silent for ``--timeout``
seconds (a hang) is counted once, at the mutant under way; the batch's other mutants
are not run again.

    .venv/bin/python benchmarks/fuzz_loaded_programs.py [--batches 16] [--size 25] [--seed 1]
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path.cwd()
KINDS = ("module", "executable", "stablehlo")


def batch(kind: str, seed: int, start: int, size: int, timeout: float) -> collections.Counter[str]:
    cmd = [sys.executable, "-m", "tests.security.loaded_mutants", kind, str(seed), str(start),
           str(size)]
    counts: collections.Counter[str] = collections.Counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, errors="replace",
                              timeout=timeout, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        out, code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, code = str(e.stdout or ""), None
    lines = out.splitlines()
    counts.update(line.split()[2] for line in lines if line.startswith("R "))
    if not lines or lines[-1] != "DONE":
        counts["hang" if code is None else "crash"] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=16)
    parser.add_argument("--size", type=int, default=25)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    print("| payload | mutants | ran | differs | refused | other | crashed batches | hangs "
          "| seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind in KINDS:
        started = time.perf_counter()
        total: collections.Counter[str] = collections.Counter()
        for b in range(args.batches):
            total += batch(kind, args.seed, b * args.size, args.size, args.timeout)
        print(f"| {kind} | {args.batches * args.size} | {total['ran']} | {total['differs']} "
              f"| {total['refused']} | {total['other']} | {total['crash']} of {args.batches} "
              f"| {total['hang']} | {time.perf_counter() - started:.0f} |", flush=True)


if __name__ == "__main__":
    main()
