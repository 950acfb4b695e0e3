"""The same secure mean on three kinds of secure device: SPU, PHE and TEE.

Three parties (``P0``, ``P1``, ``P2``) each hold ``n`` float32 values
(``values.npy``, read on its own side from its data root); P0 gets the mean of all
``3n`` and nobody sees another party's values. The mean is an aggregate over each
party's ``n`` rows, which ``mplang init``'s policies let out (``n`` >= 10). The
program is written once per device, run on the simulator, timed, and printed with
the security model each device rests on:

- ``SP0``: ABY3 secret sharing among the three parties (libspu);
- ``HE0``: Paillier under node_0's key, summed by the evaluator node_3 (sf-heu);
- ``T0``: a TEE on node_3 with MOCK attestation (sealed with X25519 + AES-GCM).

Run: ``python examples/secure_mean_devices.py``
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import phe, tensor
from mplang.device.kinds import get_kind
from mplang.libs.demo import simulated

VALUES = "values.npy"
"""The file each data owner keeps its values in, in its own data root."""


def cluster(key_bits: int = 2048) -> mp.ClusterSpec:
    """Data owners node_0..2 (P0..P2); node_3 evaluates for HE0 and hosts T0."""
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61940 + i}"} for i in range(4)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]} for i in range(3)},
                    "SP0": {"kind": "SPU", "members": ["node_0", "node_1", "node_2"],
                            "config": {"protocol": "ABY3"}},
                    "HE0": {"kind": "PHE", "members": ["node_0", "node_3"],
                            "config": {"scheme": "paillier", "key_bits": key_bits}},
                    "T0": {"kind": "TEE", "members": ["node_3"],
                           "config": {"attestation": "mock"}}}})


def make_values(n: int = 1000, seed: int = 11) -> list[np.ndarray]:
    """Party i's ``n`` float32 values (mean i)."""
    rng = np.random.default_rng(seed)
    return [rng.normal(loc=i, size=n).astype(np.float32) for i in range(3)]


def save_values(roots: dict[str, Path], vectors: list[np.ndarray]) -> None:
    """What each data owner does on its own machine: party i keeps ``vectors[i]`` in its
    data root (``roots`` maps node_i to it)."""
    for i, values in enumerate(vectors):
        roots[f"node_{i}"].mkdir(parents=True, exist_ok=True)
        np.save(roots[f"node_{i}"] / VALUES, values)


def programs() -> dict[str, Callable[[], Any]]:
    """One program per device: the mean of every value, revealed to P0."""
    def owned() -> list[Any]:
        return [mp.device(f"P{i}")(lambda: tensor.load(VALUES))() for i in range(3)]

    @mp.function
    def on_spu() -> Any:
        values = owned()
        count = sum(x.shape[0] for x in values)  # the lengths are public (shapes)
        total = mp.device("SP0")(lambda a, b, c: a.sum() + b.sum() + c.sum())(*values)
        return mp.device("P0")(lambda s: s / count)(mp.put("P0", total))

    @mp.function
    def on_phe() -> Any:
        values = owned()
        count = sum(x.shape[0] for x in values)
        encrypted = [mp.put("HE0", x) for x in values]
        total = mp.device("HE0")(lambda a, b, c: phe.sum(a) + phe.sum(b) + phe.sum(c))(
            *encrypted)
        return mp.device("P0")(lambda s: s / count)(mp.put("P0", total))

    @mp.function
    def on_tee() -> Any:
        mean = mp.device("T0")(lambda a, b, c: jnp.concatenate([a, b, c]).mean())(*owned())
        return mp.put("P0", mean)

    return {"SP0": on_spu, "HE0": on_phe, "T0": on_tee}


def main(n: int = 1000, key_bits: int = 2048) -> list[dict[str, Any]]:
    vectors = make_values(n)
    spec = cluster(key_bits)
    rows = []
    with simulated(spec, lambda roots: save_values(roots, vectors)) as sim, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)  # the models say it
        for name, program in programs().items():
            start = time.perf_counter()
            mean = float(mp.fetch(sim, mp.evaluate(sim, program)))
            seconds = time.perf_counter() - start
            device = spec.device(name)
            rows.append({"device": name, "kind": device.kind, "mean": mean,
                         "seconds": seconds,
                         "model": get_kind(device.kind).security_model_of(device)})
    print(f"mean of {3 * n} values held by three parties (plaintext "
          f"{float(np.concatenate(vectors).mean()):.5f}):")
    for row in rows:
        print(f"  {row['device']} ({row['kind']}): {row['mean']:.5f} in {row['seconds']:.2f} s"
              f"\n      who must be honest: {row['model']}")
    return rows


if __name__ == "__main__":
    main()
