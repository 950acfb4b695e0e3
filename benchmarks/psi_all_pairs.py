"""All-pairs set intersection of two parties' ID sets on secret shares (the baseline
of ``benchmarks/bench_psi.py``; the PSI example is ``examples/psi.py``, on libpsi).

This is not a PSI protocol: it compares every ID of one party with every ID of the
other on the SPU, ``len(a) * len(b)`` secure comparisons (and as many elements of
memory), where hashing-based PSI protocols (RR22, KKRT, ECDH in ``mplang.libs.psi``)
take linear time.

Party 0 (device ``P0``) and party 1 (device ``P1``) each hold a set of
customer IDs (distinct int32 values). They want to know how many customers
they have in common, and party 0 also wants to know which of its own IDs are
shared, without either learning anything else about the other's set.

On the SPU ``SP0`` (CHEETAH between the two parties, ``ClusterSpec.simple(2)``)
both ID vectors are secret-shared and compared all against all:
``eq[i, j] = (a[i] == b[j])``.
Then

* the intersection size ``sum(eq)`` is revealed to both parties;
* the membership mask ``any(eq, axis=1)`` (which of P0's IDs are in P1's
  set) is revealed to P0 only, who reads the intersection off its own IDs.

Each party reads its IDs from its own data root (``tensor.load``): no ID passes
through the driver. In this demo one process plays both parties, so it writes
both files into temporary data roots first; on real workers each organisation
keeps its file on its own machine (``mplang worker --data-root DIR``).

The equality matrix costs ``len(a) * len(b)`` secure comparisons, which is fine
for sets of a few hundred IDs (CHEETAH spends a few seconds here on the default
200 x 150, mostly fixed setup of its oblivious transfers); hashing-based PSI
protocols scale further. Only the set sizes are public (they are part of the
program's types).

Security: CHEETAH protects against a semi-honest peer (one that follows the
protocol but may try to learn from what it sees), not against one that deviates
from it; no third party or dealer is involved.

Run: ``python benchmarks/psi_all_pairs.py``
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import tensor

SIZES = (200, 150)
"""Number of IDs held by P0 and P1."""
COMMON = 37
"""How many IDs the generated sets share."""


def make_ids(seed: int = 0, sizes: tuple[int, int] = SIZES,
             common: int = COMMON) -> tuple[np.ndarray, np.ndarray]:
    """Two sets of distinct int32 IDs with exactly ``common`` IDs in both, shuffled."""
    rng = np.random.default_rng(seed)
    pool = rng.choice(1_000_000, size=sizes[0] + sizes[1] - common, replace=False)
    a = pool[: sizes[0]]
    b = np.concatenate([pool[: common], pool[sizes[0]:]])
    return rng.permutation(a).astype(np.int32), rng.permutation(b).astype(np.int32)


def intersect(a: jnp.ndarray, b: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Intersection size and, for each element of ``a``, whether it is in ``b``
    (both vectors hold distinct values)."""
    eq = a[:, None] == b[None, :]
    return jnp.sum(eq, dtype=jnp.int32), jnp.any(eq, axis=1)


IDS_FILE = "ids.npy"
"""The file each party keeps its IDs in, in its own data root."""


@mp.function
def psi() -> dict[str, Any]:
    """P0 and P1 each load their own IDs; sizes go to both, the mask to P0 only."""
    ids0 = mp.device("P0")(lambda: tensor.load(IDS_FILE))()
    ids1 = mp.device("P1")(lambda: tensor.load(IDS_FILE))()
    size, in_ids1 = mp.device("SP0")(intersect)(ids0, ids1)
    return {"size_at_p0": mp.put("P0", size), "size_at_p1": mp.put("P1", size),
            "mask_at_p0": mp.put("P0", in_ids1)}


def save_ids(data_root: Path, ids: np.ndarray) -> None:
    """What a party does on its own machine: keep its IDs in its data root."""
    data_root.mkdir(parents=True, exist_ok=True)
    np.save(data_root / IDS_FILE, ids)


def main(seed: int = 0, sizes: tuple[int, int] = SIZES, common: int = COMMON,
         cluster: mp.ClusterSpec | None = None) -> dict[str, Any]:
    """Run the PSI on a simulator of ``cluster`` (default: ``ClusterSpec.simple(2)``, P0,
    P1 and the CHEETAH SPU "SP0"); returns the inputs and what each party learns."""
    ids0, ids1 = make_ids(seed, sizes, common)
    cluster = cluster or mp.ClusterSpec.simple(2)
    with tempfile.TemporaryDirectory(prefix="psi-") as folder:
        roots = {node.name: Path(folder) / node.name for node in cluster.nodes}
        save_ids(roots["node_0"], ids0)  # on P0's machine
        save_ids(roots["node_1"], ids1)  # on P1's machine
        sim = mp.Simulator(cluster, data_roots=roots)
        try:
            out = mp.evaluate(sim, psi)
            mask = np.asarray(mp.fetch(sim, out["mask_at_p0"]))
            return {
                "ids0": ids0,
                "ids1": ids1,
                "size_at_p0": int(mp.fetch(sim, out["size_at_p0"])),
                "size_at_p1": int(mp.fetch(sim, out["size_at_p1"])),
                "mask_at_p0": mask,
                "intersection": np.sort(ids0[mask]),  # P0 reads its own IDs under the mask
                "devices": {k: mp.get_dev_attr(v) for k, v in out.items()},
            }
        finally:
            sim.close()


if __name__ == "__main__":
    result = main()
    print(f"P0 holds {len(result['ids0'])} IDs, P1 holds {len(result['ids1'])} IDs")
    print(f"intersection size (learned by P0 and P1): {result['size_at_p0']}")
    print(f"shared IDs (learned by P0 only): {result['intersection'].tolist()}")
    expected = sorted(set(result["ids0"].tolist()) & set(result["ids1"].tolist()))
    print(f"matches Python's set intersection: {result['intersection'].tolist() == expected}")
