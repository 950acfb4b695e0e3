"""What vetting a received program costs on the simulator.

The program: an SPU sum of two parties' vectors, revealed to P0 and squared there by
JAX (one ``spu.run`` and one ``tensor.run_jax``). Timed per evaluate + fetch, median
of ``--runs``:

- traced: the program as this process's tracer made it (never vetted);
- first received: the very first received program (starts the checkers' helper
  processes, then vets);
- new payloads, traced: programs of this process's tracer with another constant in
  each (their first run compiles the new run_jax module and SPU executable here);
- new payloads: received programs whose payloads this process has not seen (another
  constant in each: the helpers parse and compile both payloads, then as above);
- same bytes again: a new `Program.from_bytes` of bytes already vetted (verdicts
  cached by digest);
- vetted program again: the same received `Program` object run again.

    .venv/bin/python benchmarks/bench_vetting.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import mplang as mp

CLUSTER = mp.ClusterSpec.simple(2)


def program(k: int) -> mp.Program:
    def add(a: Any, b: Any) -> Any:
        return a + b + k

    def prog() -> Any:
        x = mp.put("P0", np.arange(4, dtype=np.int32))
        y = mp.put("P1", np.ones(4, dtype=np.int32))
        z = mp.put("P0", mp.device("SP0")(add)(x, y))
        return mp.device("P0")(lambda v: v * v - k)(z)

    return mp.compile(prog, cluster=CLUSTER)


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    sim = mp.Simulator(CLUSTER)

    def run(p: mp.Program) -> Callable[[], Any]:
        return lambda: mp.fetch(sim, mp.evaluate(sim, p))

    traced = program(0)
    run(traced)()  # warm up JAX and libspu
    data = [program(k).to_bytes() for k in range(args.runs + 1)]
    rows = {"first received (helpers start)": [timed(run(mp.Program.from_bytes(data[0])))]}
    rows["traced"] = [timed(run(traced)) for _ in range(args.runs)]
    fresh = [program(k) for k in range(args.runs + 1, 2 * args.runs + 1)]
    rows["new payloads, traced"] = [timed(run(p)) for p in fresh]
    rows["new payloads"] = [timed(run(mp.Program.from_bytes(b))) for b in data[1:]]
    rows["same bytes again"] = [timed(run(mp.Program.from_bytes(b))) for b in data[1:]]
    again = mp.Program.from_bytes(data[0])
    run(again)()
    rows["vetted program again"] = [timed(run(again)) for _ in range(args.runs)]
    print("| program | median ms | min ms | runs |")
    print("|---|---:|---:|---:|")
    for name, ms in rows.items():
        print(f"| {name} | {statistics.median(ms):.1f} | {min(ms):.1f} | {len(ms)} |")


if __name__ == "__main__":
    main()
