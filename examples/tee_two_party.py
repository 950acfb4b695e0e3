"""A two-party computation inside a TEE, with MOCK attestation.

Alice (``P0``) and Bob (``P1``) each hold the salaries of the same 12 positions
(``salaries.npy``, in their own data roots). They want, without showing each
other their salaries: the total payroll (for both), and for each position whether
Alice pays more (for Alice only). The TEE ``T0`` (node_2) computes it:

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

What leaves the enclave: the payroll is an aggregate over each party's 12 rows (at
least ``min_rows``, 10), which ``mplang init``'s policies let out; "Alice pays more"
compares Alice's salaries with Bob's position by position, which tells each position's
order, so no rule lets it out: on workers, Alice and Bob each review this program and
approve it by its digest (``approve: - {program: DIGEST}``; ``mplang check`` prints
the digest, and a refusal the entry).
Each party reads its salaries on its own side (``tensor.load``); this demo writes
both files into temporary data roots first (``mplang.libs.demo.simulated``).

Run: ``python examples/tee_two_party.py``
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import tensor
from mplang.libs.demo import simulated

SALARIES = "salaries.npy"
"""The file each of Alice and Bob keeps its salaries in, in its own data root."""


def cluster() -> mp.ClusterSpec:
    """Alice (node_0, P0), Bob (node_1, P1) and the TEE T0 on node_2."""
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61930 + i}"} for i in range(3)],
        "devices": {"P0": {"kind": "PPU", "members": ["node_0"]},
                    "P1": {"kind": "PPU", "members": ["node_1"]},
                    "T0": {"kind": "TEE", "members": ["node_2"],
                           "config": {"attestation": "mock"}}}})


def make_salaries(seed: int = 7, n: int = 12) -> tuple[np.ndarray, np.ndarray]:
    """Alice's and Bob's salaries of the same ``n`` positions (float32)."""
    rng = np.random.default_rng(seed)
    alice = np.round(rng.normal(5500.0, 800.0, size=n), -2).astype(np.float32)
    bob = np.round(alice + rng.normal(0.0, 400.0, size=n), -2).astype(np.float32)
    return alice, bob


def save_salaries(roots: dict[str, Path], alice: np.ndarray, bob: np.ndarray) -> None:
    """What Alice and Bob each do on their own machines: keep their salaries in their data
    roots (``roots`` maps node_0 and node_1 to them)."""
    for node, salaries in (("node_0", alice), ("node_1", bob)):
        roots[node].mkdir(parents=True, exist_ok=True)
        np.save(roots[node] / SALARIES, salaries)


@mp.function
def compare() -> Any:
    """(payroll at P0, payroll at P1, Alice-pays-more mask at P0)."""
    a = mp.device("P0")(lambda: tensor.load(SALARIES))()
    b = mp.device("P1")(lambda: tensor.load(SALARIES))()
    total, more = mp.device("T0")(lambda x, y: (jnp.sum(x) + jnp.sum(y), x > y))(a, b)
    return mp.put("P0", total), mp.put("P1", total), mp.put("P0", more)


def main() -> dict[str, Any]:
    alice, bob = make_salaries()
    # no policy judges here; on workers each party approves the program's digest (above)
    with simulated(cluster(), lambda roots: save_salaries(roots, alice, bob),
                   policies="open") as sim, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)  # said above: a mock
        total_a, total_b, more = mp.fetch(sim, mp.evaluate(sim, compare))
    print("payroll (Alice's copy, Bob's copy):", float(total_a), float(total_b))
    print("Alice pays more at positions:", np.flatnonzero(more).tolist())
    return {"alice": alice, "bob": bob, "total": (total_a, total_b), "more": more}


if __name__ == "__main__":
    main()
