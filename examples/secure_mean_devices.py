"""The same secure mean on three kinds of secure device: SPU, PHE and TEE.

Three parties (``P0``, ``P1``, ``P2``) each hold ``n`` float32 values; P0 gets
the mean of all ``3n`` and nobody sees another party's values. The program is
written once per device, run on the simulator, timed, and printed with the
security model each device rests on:

- ``SP0``: ABY3 secret sharing among the three parties (libspu);
- ``HE0``: Paillier under node_0's key, summed by the evaluator node_3 (sf-heu);
- ``T0``: a TEE on node_3 with MOCK attestation (sealed with X25519 + AES-GCM).

Run: ``python examples/secure_mean_devices.py``
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import phe
from mplang.device.kinds import get_kind


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


def programs(vectors: list[np.ndarray]) -> dict[str, Callable[[], Any]]:
    """One program per device: the mean of every value, revealed to P0."""
    count = sum(v.size for v in vectors)

    def owned() -> list[Any]:
        return [mp.device(f"P{i}")(lambda v=v: v)() for i, v in enumerate(vectors)]

    @mp.function
    def on_spu() -> Any:
        total = mp.device("SP0")(lambda a, b, c: a.sum() + b.sum() + c.sum())(*owned())
        return mp.device("P0")(lambda s: s / count)(mp.put("P0", total))

    @mp.function
    def on_phe() -> Any:
        encrypted = [mp.put("HE0", x) for x in owned()]
        total = mp.device("HE0")(lambda a, b, c: phe.sum(a) + phe.sum(b) + phe.sum(c))(
            *encrypted)
        return mp.device("P0")(lambda s: s / count)(mp.put("P0", total))

    @mp.function
    def on_tee() -> Any:
        mean = mp.device("T0")(lambda a, b, c: jnp.concatenate([a, b, c]).mean())(*owned())
        return mp.put("P0", mean)

    return {"SP0": on_spu, "HE0": on_phe, "T0": on_tee}


def main(n: int = 1000, key_bits: int = 2048) -> list[dict[str, Any]]:
    rng = np.random.default_rng(11)
    vectors = [rng.normal(loc=i, size=n).astype(np.float32) for i in range(3)]
    spec = cluster(key_bits)
    sim = mp.Simulator(spec)
    rows = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mp.InsecureDeviceWarning)  # the models say it
            for name, program in programs(vectors).items():
                start = time.perf_counter()
                mean = float(mp.fetch(sim, mp.evaluate(sim, program)))
                seconds = time.perf_counter() - start
                device = spec.device(name)
                rows.append({"device": name, "kind": device.kind, "mean": mean,
                             "seconds": seconds,
                             "model": get_kind(device.kind).security_model_of(device)})
    finally:
        sim.close()
    print(f"mean of {3 * n} values held by three parties (plaintext "
          f"{float(np.concatenate(vectors).mean()):.5f}):")
    for row in rows:
        print(f"  {row['device']} ({row['kind']}): {row['mean']:.5f} in {row['seconds']:.2f} s"
              f"\n      who must be honest: {row['model']}")
    return rows


if __name__ == "__main__":
    main()
