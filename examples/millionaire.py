"""Yao's millionaire's problem: who is richer, without anyone telling their wealth.

Alice (party 0, device ``P0``) and Bob (party 1, device ``P1``) each hold their
wealth privately. The comparison ``alice < bob`` runs on the SPU ``SP0``, where
both values are secret-shared among the SPU's members, and only the one-bit
answer is revealed, to Alice alone (``mp.put("P0", ...)``). Bob learns nothing.

The same program runs on two clusters from ``mp.ClusterSpec.simple``:

* 2 parties: the SPU runs CHEETAH between Alice and Bob (no dealer: neither
  of them, nor anyone else, makes correlated randomness for the other);
* 3 parties: the SPU runs ABY3; party 2 only helps compute on shares, it holds
  no input and receives no output.

Security: both protocols protect against semi-honest parties only (each follows
the protocol but may try to learn from what it sees), not against a party that
deviates from it. ABY3 also needs an honest majority: Bob and party 2 together
could rebuild Alice's wealth, so they must not collude.

Each party reads its own wealth from its own data root (``tensor.load``): the
number never passes through the driver or reaches the other party. In this
demo one process plays every party, so it writes both files into temporary
data roots first; on real workers each organisation keeps its file on its own
machine (``mplang worker --data-root DIR``). The program is compiled once per
cluster (the types come from the parties' files) and evaluated again whenever
the files change.

Note: integers are 32-bit (JAX's default), so wealths must stay below 2**31.

Run: ``python examples/millionaire.py``
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import mplang as mp
from mplang import tensor

WEALTH_PAIRS = [(1_000_000, 2_000_000), (2_500_000, 1_999_999), (7_000_000, 7_000_000)]
"""(Alice's wealth, Bob's wealth) pairs to compare."""
WEALTH_FILE = "wealth.npy"
"""The file each party keeps its wealth in, in its own data root."""


@mp.function
def millionaire() -> Any:
    """Whether Alice (on P0) is poorer than Bob (on P1); the answer is held by P0 only.

    Each wealth is loaded by its owner; the SPU compares the secret shares."""
    alice_wealth = mp.device("P0")(lambda: tensor.load(WEALTH_FILE))()
    bob_wealth = mp.device("P1")(lambda: tensor.load(WEALTH_FILE))()
    alice_is_poorer = mp.device("SP0")(lambda a, b: a < b)(alice_wealth, bob_wealth)
    return mp.put("P0", alice_is_poorer)


def save_wealth(data_root: Path, wealth: int) -> None:
    """What a party does on its own machine: keep its wealth in its data root."""
    data_root.mkdir(parents=True, exist_ok=True)
    np.save(data_root / WEALTH_FILE, np.int32(wealth))


def run(world_size: int, pairs: list[tuple[int, int]] = WEALTH_PAIRS) -> list[dict[str, Any]]:
    """Compare every pair of wealths on a ``world_size``-party simulator."""
    cluster = mp.ClusterSpec.simple(world_size)
    protocol = cluster.device("SP0").config["protocol"]
    with tempfile.TemporaryDirectory(prefix="millionaire-") as data:
        roots = {node.name: Path(data) / node.name for node in cluster.nodes}
        sim = mp.Simulator(cluster, data_roots=roots)
        try:
            program = None
            results = []
            for alice, bob in pairs:
                save_wealth(roots["node_0"], alice)   # on Alice's machine
                save_wealth(roots["node_1"], bob)     # on Bob's machine
                if program is None:  # compile once, reuse for every pair
                    with sim:
                        program = mp.compile(millionaire, cluster=cluster)
                out = mp.evaluate(sim, program)
                results.append({
                    "parties": world_size,
                    "protocol": protocol,
                    "alice": alice,
                    "bob": bob,
                    "alice_is_poorer": bool(mp.fetch(sim, out)),
                    "device": mp.get_dev_attr(out),           # "P0"
                    "holders": tuple(out.mptype.pmask),        # (0,): nobody else holds it
                })
            return results
        finally:
            sim.close()


def main() -> list[dict[str, Any]]:
    """The millionaire's problem with 2 parties (CHEETAH) and 3 parties (ABY3)."""
    return run(2) + run(3)


if __name__ == "__main__":
    for r in main():
        answer = "Bob is richer" if r["alice_is_poorer"] else "Bob is not richer"
        print(f"{r['parties']} parties ({r['protocol']}): alice={r['alice']:>9,} "
              f"bob={r['bob']:>9,} -> {answer} (revealed to {r['device']} only)")
