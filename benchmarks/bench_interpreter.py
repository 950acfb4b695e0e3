"""Interpreter overhead: a chain of small local ops on one party of a 3-party simulator.

Reports tracing time per op, execution time per op (launch mode, after a
warm-up run), the ratio of execution to calling the same jitted JAX function
directly in a loop, and the per-op cost of eager mode (``with sim:``).

    .venv/bin/python benchmarks/bench_interpreter.py [--sizes 1000 10000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from timing import best_of

import mplang as mp
from mplang import simp, tensor


def increment(v: Any) -> Any:
    return v + 1


def chain_program(n: int) -> Callable[[], Any]:
    def chain() -> Any:
        x = simp.constant((0,), np.float32(0))

        def body(v: Any) -> Any:
            for _ in range(n):
                v = tensor.run_jax(increment, v)
            return v

        return simp.pcall((0,), body, x)

    return chain


def bench_chain(sim: mp.Simulator, n: int) -> dict[str, float]:
    fn = chain_program(n)
    mp.compile(fn, world_size=3)  # warm the export cache of `increment`
    trace_s = best_of(3, lambda: mp.compile(fn, world_size=3))
    program = mp.compile(fn, world_size=3)

    def run() -> None:
        out = mp.evaluate(sim, program)
        assert mp.fetch(sim, out)[0] == np.float32(n)

    run()
    exec_s = best_of(3, run)
    jitted = jax.jit(increment)

    def direct() -> None:
        v = jax.numpy.float32(0)
        for _ in range(n):
            v = jitted(v)
        v.block_until_ready()

    direct()
    direct_s = best_of(3, direct)
    return {"trace_us": trace_s / n * 1e6, "exec_us": exec_s / n * 1e6,
            "direct_us": direct_s / n * 1e6, "ratio": exec_s / direct_s}


def bench_eager(sim: mp.Simulator, n: int) -> float:
    with sim:
        x = simp.constant((0,), np.float32(0))
        x = x + 1  # warm-up
        per_op = []
        for _ in range(n):
            start = time.perf_counter()
            x = x + 1
            per_op.append(time.perf_counter() - start)
        assert mp.fetch(sim, x)[0] == np.float32(n + 1)
    return statistics.median(per_op) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--eager-ops", type=int, default=200)
    args = parser.parse_args()
    with mp.Simulator(3) as sim:
        print("| ops | trace µs/op | exec µs/op | direct JAX µs/op | exec / direct |")
        print("|---:|---:|---:|---:|---:|")
        for n in args.sizes:
            r = bench_chain(sim, n)
            print(f"| {n} | {r['trace_us']:.1f} | {r['exec_us']:.1f} | {r['direct_us']:.1f} "
                  f"| {r['ratio']:.2f} |")
        print(f"\neager mode (`with sim:`), median per op over {args.eager_ops} ops: "
              f"{bench_eager(sim, args.eager_ops):.3f} ms")
        sim.close()


if __name__ == "__main__":
    main()
