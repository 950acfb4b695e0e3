"""Secure aggregation of three parties' vectors with Paillier encryption under P0's key.

Three parties (``P0``, ``P1``, ``P2``) each hold a float32 vector of the same
length. P0 wants the elementwise sum, and nobody should see anyone else's
vector:

1. each party encrypts its vector under the public key of the PHE device
   ``HE0`` (``mp.put("HE0", x)``); the key pair is made by HE0's key owner,
   node_0, and only the public key travels;
2. the ciphertexts go to HE0's evaluator, node_1, which adds them without
   seeing any value;
3. the encrypted sum goes to node_0, which decrypts it (``mp.put("P0", s)``).

Security (PHE device): semi-honest parties, and node_0 (who can decrypt) must
not collude with node_1 (who holds every party's ciphertext). node_0 learns the
sum and nothing else; node_1 learns nothing. Fixed point: floats are encrypted
as ``round(v * 2**24)``, so each value carries an error below 2**-25.

Run: ``python examples/phe_secure_aggregation.py``
"""

from __future__ import annotations

from typing import Any

import numpy as np

import mplang as mp

KEY_BITS = 2048


def cluster(key_bits: int = KEY_BITS) -> mp.ClusterSpec:
    """Three nodes with PPUs P0..P2 and the PHE device HE0 (owner node_0, evaluator node_1)."""
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61920 + i}"} for i in range(3)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]} for i in range(3)},
                    "HE0": {"kind": "PHE", "members": ["node_0", "node_1"],
                            "config": {"scheme": "paillier", "key_bits": key_bits}}}})


def aggregate(vectors: list[np.ndarray]) -> Any:
    """A program: the sum of ``vectors[i]`` (held by P``i``), revealed to P0 only."""
    @mp.function
    def program() -> Any:
        held = [mp.device(f"P{i}")(lambda v=v: v)() for i, v in enumerate(vectors)]
        encrypted = [mp.put("HE0", x) for x in held]
        total = mp.device("HE0")(lambda a, b, c: a + b + c)(*encrypted)
        return mp.put("P0", total)

    return program


def main(key_bits: int = KEY_BITS, size: int = 8) -> dict[str, Any]:
    rng = np.random.default_rng(2024)
    vectors = [rng.normal(size=size).astype(np.float32) for _ in range(3)]
    sim = mp.Simulator(cluster(key_bits))
    try:
        total = mp.fetch(sim, mp.evaluate(sim, aggregate(vectors)))
    finally:
        sim.close()
    print("sum of the three vectors, decrypted by P0:", np.round(total, 4))
    return {"vectors": vectors, "sum": total}


if __name__ == "__main__":
    main()
