"""Secure aggregation of three parties' tables with Paillier encryption under P0's key.

Three shops (``P0``, ``P1``, ``P2``) each keep a table of sales, one row per sale
and one column per product (``sales.npy``, in their own data roots). The head
office, P0, wants the total sales of each product over the three shops, and
nobody should see another shop's sales:

1. each shop sums its own rows, on its own machine, and encrypts the column totals
   under the public key of the PHE device ``HE0`` (``mp.put("HE0", x)``); the key
   pair is made by HE0's key owner, node_0, and only the public key travels;
2. the ciphertexts go to HE0's evaluator, node_1, which adds them without seeing
   any value;
3. the encrypted sum goes to node_0, which decrypts it (``mp.put("P0", s)``).

What node_0 learns is an aggregate over each shop's rows, which the policies
``mplang init`` writes allow for tables of at least ``min_rows`` (10) rows. Each
shop reads its table on its own side (``tensor.load``); this demo writes the
three files into temporary data roots first.

Security (PHE device): semi-honest parties, and node_0 (who can decrypt) must not
collude with node_1 (who holds every party's ciphertext). node_0 learns the sum
and nothing else; node_1 learns nothing. Fixed point: floats are encrypted as
``round(v * 2**24)``, so each value carries an error below 2**-25.

Run: ``python examples/phe_secure_aggregation.py``
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import tensor
from mplang.libs.demo import simulated

KEY_BITS = 2048
SALES = "sales.npy"
"""The file each shop keeps its sales in, in its own data root."""


def cluster(key_bits: int = KEY_BITS) -> mp.ClusterSpec:
    """Three nodes with PPUs P0..P2 and the PHE device HE0 (owner node_0, evaluator node_1)."""
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61920 + i}"} for i in range(3)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]} for i in range(3)},
                    "HE0": {"kind": "PHE", "members": ["node_0", "node_1"],
                            "config": {"scheme": "paillier", "key_bits": key_bits}}}})


def make_sales(rows: tuple[int, ...] = (40, 25, 60), products: int = 4, seed: int = 2024
               ) -> list[np.ndarray]:
    """Each shop's sales: ``rows[i]`` sales of ``products`` products (float32)."""
    rng = np.random.default_rng(seed)
    return [np.round(rng.gamma(2.0, 10.0, size=(n, products)), 2).astype(np.float32)
            for n in rows]


def save_sales(roots: dict[str, Path], sales: list[np.ndarray]) -> None:
    """What each shop does on its own machine: shop i keeps ``sales[i]`` in its data root
    (``roots`` maps node_i to it)."""
    for i, table in enumerate(sales):
        roots[f"node_{i}"].mkdir(parents=True, exist_ok=True)
        np.save(roots[f"node_{i}"] / SALES, table)


@mp.function
def aggregate() -> Any:
    """The total of each product over every shop's sales, revealed to P0 only."""
    shops = [f"P{i}" for i in range(3)]
    sales = [mp.device(shop)(lambda: tensor.load(SALES))() for shop in shops]
    totals = [mp.device(shop)(lambda x: jnp.sum(x, axis=0))(x)  # on the shop's own machine
              for shop, x in zip(shops, sales, strict=True)]
    encrypted = [mp.put("HE0", x) for x in totals]
    total = mp.device("HE0")(lambda a, b, c: a + b + c)(*encrypted)
    return mp.put("P0", total)


def main(key_bits: int = KEY_BITS, rows: tuple[int, ...] = (40, 25, 60)) -> dict[str, Any]:
    sales = make_sales(rows)
    with simulated(cluster(key_bits), lambda roots: save_sales(roots, sales)) as sim:
        total = mp.fetch(sim, mp.evaluate(sim, aggregate))
    print("total sales per product over the three shops, decrypted by P0:",
          np.round(total, 2))
    return {"sales": sales, "sum": total}


if __name__ == "__main__":
    main()
