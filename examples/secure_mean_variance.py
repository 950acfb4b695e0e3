"""Joint mean and variance of three parties' private data.

Three parties (devices ``P0``, ``P1``, ``P2``) each hold a private float32
vector; the vectors may have different lengths. They want the mean and the
(population) variance of all their values together, and nothing else:

1. each vector is secret-shared into the SPU ``SP0`` (ABY3 over the three
   parties) simply by passing it to a function run on ``SP0``;
2. on the SPU the vectors are concatenated and the two-pass formulas
   ``mean = sum(x) / n`` and ``var = sum((x - mean)**2) / n`` are evaluated on
   shares (in fixed point: see Precision below);
3. the two statistics are revealed to ``P0`` only.

Each party reads its vector from its own data root (``tensor.load``): no
value passes through the driver. In this demo one process plays every party,
so it writes the three files into temporary data roots first; on real workers
each organisation keeps its file on its own machine (``mplang worker
--data-root DIR``). Only the vector lengths are public (they are part of the
program's types).

Security: ABY3 protects against semi-honest parties only (each follows the
protocol but may try to learn from what it sees) and needs an honest majority:
any two of the three parties together could rebuild the third one's values.

Precision: the SPU computes in fixed point. Dividing by the public count ``n``
multiplies by ``1/n`` encoded with the field's fraction bits, so with the
default 64-bit field (18 fraction bits) the results can be off by up to
about ``n * 2**-19`` relative (2.4e-4 for the 125 values here). The 128-bit
field (``field="FM128"``, 26 fraction bits by default) is 256x more precise at
a modest cost; ``main(field="FM128")`` builds such a cluster.

Run: ``python examples/secure_mean_variance.py``
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import tensor

SIZES = (40, 25, 60)
"""Number of values held by P0, P1 and P2."""


def make_data(seed: int = 0, sizes: tuple[int, ...] = SIZES) -> list[np.ndarray]:
    """One private float32 vector per party (e.g. salaries, in thousands)."""
    rng = np.random.default_rng(seed)
    return [rng.normal(50.0 + 5 * i, 10.0, size=n).astype(np.float32)
            for i, n in enumerate(sizes)]


def mean_and_variance(*parts: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Mean and population variance of all values of ``parts`` (a plain JAX function)."""
    x = jnp.concatenate(parts)
    mean = jnp.sum(x) / x.size
    variance = jnp.sum((x - mean) ** 2) / x.size
    return mean, variance


VALUES_FILE = "values.npy"
"""The file each party keeps its vector in, in its own data root."""


@mp.function
def joint_stats() -> Any:
    """Each of P0, P1, P2 loads its own vector; the statistics end up on P0 only."""
    parts = [mp.device(f"P{i}")(lambda: tensor.load(VALUES_FILE))() for i in range(3)]
    mean, variance = mp.device("SP0")(mean_and_variance)(*parts)
    return mp.put("P0", mean), mp.put("P0", variance)


def save_values(data_root: Path, values: np.ndarray) -> None:
    """What a party does on its own machine: keep its vector in its data root."""
    data_root.mkdir(parents=True, exist_ok=True)
    np.save(data_root / VALUES_FILE, values)


def make_cluster(field: str = "FM64") -> mp.ClusterSpec:
    """Three parties with PPUs P0..P2 and an ABY3 SPU ``SP0`` over the ring ``field``
    (``ClusterSpec.simple(3)`` is this cluster with ``field="FM64"``)."""
    nodes = [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61920 + i}"} for i in range(3)]
    devices: dict[str, Any] = {f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]}
                               for i in range(3)}
    devices["SP0"] = {"kind": "SPU", "members": [n["name"] for n in nodes],
                      "config": {"protocol": "ABY3", "field": field}}
    return mp.ClusterSpec.from_dict({"nodes": nodes, "devices": devices})


def main(seed: int = 0, field: str = "FM64") -> dict[str, Any]:
    """Run the joint statistics on a 3-party simulator; returns inputs and results."""
    data = make_data(seed)
    cluster = make_cluster(field)
    with tempfile.TemporaryDirectory(prefix="mean-variance-") as folder:
        roots = {node.name: Path(folder) / node.name for node in cluster.nodes}
        for node, values in zip(cluster.nodes, data, strict=True):
            save_values(roots[node.name], values)  # on each party's own machine
        sim = mp.Simulator(cluster, data_roots=roots)
        try:
            mean, variance = mp.evaluate(sim, joint_stats)
            return {
                "data": data,
                "device": mp.get_dev_attr(mean),  # "P0"
                "mean": float(mp.fetch(sim, mean)),
                "variance": float(mp.fetch(sim, variance)),
            }
        finally:
            sim.close()


if __name__ == "__main__":
    for field in ("FM64", "FM128"):
        result = main(field=field)
        values = np.concatenate(result["data"]).astype(np.float64)
        print(f"{field}: party sizes {[len(v) for v in result['data']]}, "
              f"revealed to {result['device']} only")
        print(f"  SPU mean     = {result['mean']:.5f}   (numpy: {values.mean():.5f})")
        print(f"  SPU variance = {result['variance']:.5f}   (numpy: {values.var():.5f})")
