"""Fixed-point error of secure-device (SPU) arithmetic, measured against numpy (float64).

Three parties on the in-memory simulator, ABY3 over the parties (``ClusterSpec.simple(3)``
and the same cluster with another ring or fraction bits). For each ring and magnitude M,
P0, P1 and P2 hold ``n // 3`` values drawn uniformly from [M/2, M] (a second vector for
products); one program computes on the device, reveals to P0, and each result's relative
error is ``max |got - exact| / max |exact|``:

- ``share``: the values secret-shared and revealed (encoding alone);
- ``x + y``, ``x * y``: elementwise; ``x / 7``: a division by a public number;
- ``jnp.mean``, ``jnp.var``: numpy habits written in a device function;
- ``secure_mean``: `mplang.libs.aggregation.secure_mean`, the elementwise mean over parties;
- ``groupby_mean``: `mplang.libs.groupby.groupby_mean` over 4 groups of P0's keys;
- ``secure_mean_variance``: the pooled mean and variance (`mplang.libs.aggregation`).

    .venv/bin/python benchmarks/bench_precision.py [--n 999] [--seed 0]
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang.libs.aggregation import secure_mean, secure_mean_variance
from mplang.libs.groupby import groupby_mean

RINGS = (("FM64", None), ("FM64", 24), ("FM128", None))
"""(field, fxp_fraction_bits) pairs measured; None: libspu's default (18, 26)."""
MAGNITUDES = (1e2, 1e4, 1e6)


def cluster(field: str, bits: int | None) -> mp.ClusterSpec:
    data = mp.ClusterSpec.simple(3).to_dict()
    config = {"protocol": "ABY3", "field": field}
    if bits is not None:
        config["fxp_fraction_bits"] = bits
    data["devices"]["SP0"]["config"] = config
    return mp.ClusterSpec.from_dict(data)


def relative(got: Any, exact: Any) -> float:
    got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    return float(np.max(np.abs(got - exact)) / max(np.max(np.abs(exact)), 1e-30))


def measure(field: str, bits: int | None, magnitude: float, n: int, seed: int
            ) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    per = n // 3
    xs = [rng.uniform(magnitude / 2, magnitude, per).astype(np.float32) for _ in range(3)]
    ys = [rng.uniform(magnitude / 2, magnitude, per).astype(np.float32) for _ in range(3)]
    keys = rng.integers(0, 4, per).astype(np.int32)

    @mp.function
    def prog() -> Any:
        x = [mp.put(f"P{i}", v) for i, v in enumerate(xs)]
        y = mp.put("P1", ys[1])
        on = mp.device("SP0")
        out = {
            "share": on(lambda a: a)(x[0]),
            "x + y": on(lambda a, b: a + b)(x[0], y),
            "x * y": on(lambda a, b: a * b)(x[0], y),
            "x / 7": on(lambda a: a / 7.0)(x[0]),
            "jnp.mean": on(lambda a, b, c: jnp.mean(jnp.concatenate([a, b, c])))(*x),
            "jnp.var": on(lambda a, b, c: jnp.var(jnp.concatenate([a, b, c])))(*x),
        }
        out = {k: mp.put("P0", v) for k, v in out.items()}
        out["secure_mean"] = secure_mean(x)
        out["groupby_mean"] = groupby_mean(mp.put("P0", keys), x[0], 4, min_rows=1)
        out["secure_mean_variance: mean"], out["secure_mean_variance: variance"] = \
            secure_mean_variance(x, bound=magnitude)
        return out

    sim = mp.Simulator(cluster(field, bits))
    try:
        got = mp.fetch(sim, mp.evaluate(sim, prog))
    finally:
        sim.close()
    x64 = [v.astype(np.float64) for v in xs]
    pooled = np.concatenate(x64)
    exact = {
        "share": x64[0], "x + y": x64[0] + ys[1], "x * y": x64[0] * ys[1],
        "x / 7": x64[0] / 7, "jnp.mean": pooled.mean(), "jnp.var": pooled.var(),
        "secure_mean": np.mean(x64, axis=0),
        "groupby_mean": [x64[0][keys == g].mean() for g in range(4)],
        "secure_mean_variance: mean": pooled.mean(),
        "secure_mean_variance: variance": pooled.var(),
    }
    return {k: relative(got[k], exact[k]) for k in exact}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=999, help="values in all (a third per party)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    for field, bits in RINGS:
        rows = {m: measure(field, bits, m, args.n, args.seed) for m in MAGNITUDES}
        label = f"{field}, fxp_fraction_bits={bits or 'default'}"
        print(f"\n{label}, n={args.n}: max relative error")
        print("| op | " + " | ".join(f"M = {m:.0e}" for m in MAGNITUDES) + " |")
        print("| --- |" + " --- |" * len(MAGNITUDES))
        for op in rows[MAGNITUDES[0]]:
            print(f"| {op} | " + " | ".join(f"{rows[m][op]:.1e}" for m in MAGNITUDES) + " |")


if __name__ == "__main__":
    main()
