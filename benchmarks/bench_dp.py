"""Differentially private releases on the secure device (ABY3 among three parties, FM64,
in-memory simulator): a noisy mean of 10^5 values against the exact mean on the same
device, and a noisy histogram of 10^5 keys into 100 groups against the exact counts.

P0 holds the values (uniform in [0, 100], float32) and P1 the keys (uniform in
[0, 100)). The exact histogram counts the same way as the noisy one (`groupby_count`
of the keys secret on the device: digit one-hots from their bits), without noise. Each
release draws its noise inside the device from the three members' random words
(`mplang.libs.dp`). Time is ``mp.evaluate`` plus ``mp.fetch`` of the result
revealed to P2; the first run (which compiles) is reported apart from the median of the
next ``--runs``. Error: the mean absolute difference from numpy's float64 answer over
those runs (for the histogram, over the groups too), next to the noise's expected
absolute value (``E|Z|`` of the discrete Laplace noise, rescaled).

    .venv/bin/python benchmarks/bench_dp.py [--rows 100000] [--groups 100] [--runs 5]
        [--epsilon 1.0]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang.libs import dp
from mplang.libs.groupby import groupby_count


def timed(sim: mp.Simulator, prog: Callable[[], Any], runs: int
          ) -> tuple[float, float, list[np.ndarray]]:
    """(first run's seconds, the median of ``runs`` more, their results)."""
    times, outs = [], []
    for _ in range(runs + 1):
        start = time.perf_counter()
        out = np.asarray(mp.fetch(sim, mp.evaluate(sim, prog)), np.float64)
        times.append(time.perf_counter() - start)
        outs.append(out)
    return times[0], statistics.median(times[1:]), outs[1:]


def abs_dlap(scale: float) -> float:
    """E|Z| of discrete Laplace noise of scale ``scale``: ``2q / (1 - q**2)``."""
    q = math.exp(-1 / scale)
    return 2 * q / (1 - q * q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    values = rng.uniform(0, 100, args.rows).astype(np.float32)
    keys = rng.integers(0, args.groups, args.rows).astype(np.int32)
    eps = args.epsilon
    sim = mp.Simulator(3)

    def load_values() -> Any:
        return mp.device("P0")(lambda: jnp.asarray(values))()

    def exact_mean() -> Any:
        return mp.put("P2", mp.device("SP0")(jnp.mean)(load_values()))

    def noisy_mean() -> Any:
        return dp.noisy_mean(load_values(), (0.0, 100.0), eps, to="P2")

    def exact_histogram() -> Any:  # the same counting on the device (key digits from
        k = mp.device("P1")(lambda: jnp.asarray(keys))()  # secret keys' bits), no noise
        return groupby_count(mp.device("SP0")(lambda x: x)(k), args.groups, min_rows=1,
                             to="P2")

    def noisy_histogram() -> Any:
        k = mp.device("P1")(lambda: jnp.asarray(keys))()
        return dp.noisy_histogram(k, args.groups, eps, to="P2")

    truth_mean = float(values.astype(np.float64).mean())
    truth_counts = np.bincount(keys, minlength=args.groups).astype(np.float64)
    levels = dp.quantization_levels("bench", args.rows, eps)
    expected = {"mean": abs_dlap((levels + 1) / eps) * 100 / levels / args.rows,
                "histogram": abs_dlap(2 / eps)}
    print(f"{args.rows} rows, epsilon {eps}, ABY3 on 3 simulated parties, {args.runs} runs")
    print(f"{'release':<22} {'first s':>8} {'median s':>9} {'mean |error|':>13} "
          f"{'E|noise|':>10}")
    for name, prog, truth, kind in (
            ("exact mean", exact_mean, truth_mean, None),
            ("noisy mean", noisy_mean, truth_mean, "mean"),
            ("exact histogram", exact_histogram, truth_counts, None),
            ("noisy histogram", noisy_histogram, truth_counts, "histogram")):
        first, median, outs = timed(sim, prog, args.runs)
        error = float(np.mean([np.abs(o - truth).mean() for o in outs]))
        noise = f"{expected[kind]:10.3g}" if kind else f"{'-':>10}"
        print(f"{name:<22} {first:8.2f} {median:9.2f} {error:13.3g} {noise}")
    sim.close()


if __name__ == "__main__":
    main()
