"""A two-party computation inside a TEE, with MOCK attestation.

Alice (``P0``) and Bob (``P1``) each hold a salary vector. They want, without
showing each other their vectors: the total payroll (for both), and for each
position whether Alice pays more (for Alice only). The TEE ``T0`` (node_2)
computes it:

1. T0 makes a fresh X25519 key pair and a quote binding its public key to the
   measurement of its code and of this exact computation;
2. Alice and Bob each check the quote against the measurement and the vendor
   key they expect; a mismatch stops them before their data leaves;
3. each seals its vector to T0's key (X25519 + HKDF-SHA256 + AES-256-GCM);
4. T0 opens them, computes in plaintext JAX, and seals each result to a fresh
   key of its receiver.

THE ATTESTATION HERE IS A MOCK (``attestation: mock``): the quote is signed with
a published key and T0 reports its own measurement, so it shows the protocol,
not a hardware guarantee. With real hardware: T0's host cannot read the
enclave; here node_2 sees both vectors.

Run: ``python examples/tee_two_party.py``
"""

from __future__ import annotations

import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp


def cluster() -> mp.ClusterSpec:
    """Alice (node_0, P0), Bob (node_1, P1) and the TEE T0 on node_2."""
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61930 + i}"} for i in range(3)],
        "devices": {"P0": {"kind": "PPU", "members": ["node_0"]},
                    "P1": {"kind": "PPU", "members": ["node_1"]},
                    "T0": {"kind": "TEE", "members": ["node_2"],
                           "config": {"attestation": "mock"}}}})


def compare(alice: np.ndarray, bob: np.ndarray) -> Any:
    """A program: (payroll at P0, payroll at P1, Alice-pays-more mask at P0)."""
    @mp.function
    def program() -> Any:
        a = mp.device("P0")(lambda: alice)()
        b = mp.device("P1")(lambda: bob)()
        total, more = mp.device("T0")(lambda x, y: (jnp.sum(x) + jnp.sum(y), x > y))(a, b)
        return mp.put("P0", total), mp.put("P1", total), mp.put("P0", more)

    return program


def main() -> dict[str, Any]:
    alice = np.array([5200.0, 6100.0, 4800.0, 7000.0], dtype=np.float32)
    bob = np.array([5000.0, 6400.0, 4800.0, 6900.0], dtype=np.float32)
    sim = mp.Simulator(cluster())
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mp.InsecureDeviceWarning)  # said above: a mock
            total_a, total_b, more = mp.fetch(sim, mp.evaluate(sim, compare(alice, bob)))
    finally:
        sim.close()
    print("payroll (Alice's copy, Bob's copy):", float(total_a), float(total_b))
    print("Alice pays more at positions:", np.flatnonzero(more).tolist())
    return {"alice": alice, "bob": bob, "total": (total_a, total_b), "more": more}


if __name__ == "__main__":
    main()
