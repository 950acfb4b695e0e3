"""Private set intersection (PSI): two parties join their customer tables on an ID.

Party 0 (a shop, device ``P0``) holds ``customers.csv`` (``id``, ``age``) and party 1
(a bank, device ``P1``) holds ``accounts.csv`` (``id``, ``balance``). They want to
study their common customers without showing each other anyone else:

* ``psi.intersection_size`` tells both how many customers they share, and nothing
  else (ECDH PSI-cardinality over X25519);
* ``psi.join`` (libpsi's RR22 by default; KKRT and ECDH too) gives each party its
  own rows of the shared customers, in the same order on both sides, so row ``i``
  of the shop's result and row ``i`` of the bank's are the same customer. Neither
  sees the other's columns.

Each party reads its table from its own data root (``table.read_csv``): no row passes
through the driver. In this demo one process plays both parties, so it writes both
files into temporary data roots first; on real workers each organisation keeps its
file on its own machine (``mplang worker --data-root DIR``). To show the result, the
demo then fetches both parties' joined rows, which only works because the simulator
runs without policies; in a deployment each party reads its own result.

Security: the protocols are secure against semi-honest parties (each follows the
protocol but may try to learn from what it sees). What each party learns besides
its own result: the other's number of rows (or of distinct IDs, for the count), and
from the join which of its IDs the other holds (see ``mplang.libs.psi``).

Run: ``python examples/psi.py``
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

import mplang as mp
from mplang.dialects import table
from mplang.libs import psi

SIZES = (200, 150)
"""Number of customers of P0 and accounts of P1."""
COMMON = 37
"""How many IDs the generated tables share."""
FILES = {"node_0": "customers.csv", "node_1": "accounts.csv"}
"""The file each party keeps its table in, in its own data root."""
SCHEMAS = {"node_0": {"id": "int64", "age": "int32"},
           "node_1": {"id": "int64", "balance": "float64"}}


def make_tables(seed: int = 0, sizes: tuple[int, int] = SIZES,
                common: int = COMMON) -> tuple[pa.Table, pa.Table]:
    """Two tables of distinct IDs with exactly ``common`` IDs in both, shuffled."""
    rng = np.random.default_rng(seed)
    pool = rng.choice(1_000_000, size=sizes[0] + sizes[1] - common, replace=False)
    ids0 = rng.permutation(pool[: sizes[0]])
    ids1 = rng.permutation(np.concatenate([pool[: common], pool[sizes[0]:]]))
    customers = pa.table({"id": pa.array(ids0, pa.int64()),
                          "age": pa.array(rng.integers(18, 90, sizes[0]), pa.int32())})
    accounts = pa.table({"id": pa.array(ids1, pa.int64()),
                         "balance": pa.array(np.round(rng.gamma(2.0, 500.0, sizes[1]), 2))})
    return customers, accounts


@mp.function
def psi_program(protocol: str = "rr22") -> dict[str, Any]:
    """P0 and P1 read their own tables; both learn the count and their own joined rows."""
    customers = mp.device("P0")(lambda: table.read_csv(FILES["node_0"], SCHEMAS["node_0"]))()
    accounts = mp.device("P1")(lambda: table.read_csv(FILES["node_1"], SCHEMAS["node_1"]))()
    size = psi.intersection_size(customers, accounts, "id")
    mine, theirs = psi.join(customers, accounts, "id", how="inner", protocol=protocol)
    return {"size": size, "customers": mine, "accounts": theirs}


def save_table(data_root: Path, name: str, t: pa.Table) -> None:
    """What a party does on its own machine: keep its table in its data root."""
    data_root.mkdir(parents=True, exist_ok=True)
    pcsv.write_csv(t, data_root / name)


def main(seed: int = 0, sizes: tuple[int, int] = SIZES, common: int = COMMON,
         cluster: mp.ClusterSpec | None = None, protocol: str = "rr22") -> dict[str, Any]:
    """Run the PSI on a simulator of ``cluster`` (default: ``ClusterSpec.simple(2)``);
    returns the inputs and what each party learns."""
    customers, accounts = make_tables(seed, sizes, common)
    cluster = cluster or mp.ClusterSpec.simple(2)
    with tempfile.TemporaryDirectory(prefix="psi-") as folder:
        roots = {node.name: Path(folder) / node.name for node in cluster.nodes}
        save_table(roots["node_0"], FILES["node_0"], customers)  # on P0's machine
        save_table(roots["node_1"], FILES["node_1"], accounts)  # on P1's machine
        sim = mp.Simulator(cluster, data_roots=roots)
        try:
            out = mp.evaluate(sim, psi_program, protocol)
            sizes_seen = mp.fetch(sim, out["size"])
            return {
                "customers": customers,
                "accounts": accounts,
                "size_at_p0": int(sizes_seen[0]),
                "size_at_p1": int(sizes_seen[1]),
                "joined_at_p0": mp.fetch(sim, out["customers"]),
                "joined_at_p1": mp.fetch(sim, out["accounts"]),
                "devices": {k: mp.get_dev_attr(v) for k, v in out.items()},
            }
        finally:
            sim.close()


if __name__ == "__main__":
    result = main()
    print(f"P0 holds {result['customers'].num_rows} customers, P1 holds "
          f"{result['accounts'].num_rows} accounts")
    print(f"intersection size (learned by P0 and P1): {result['size_at_p0']}")
    shop, bank = result["joined_at_p0"], result["joined_at_p1"]
    print("the first shared customers, P0's row beside P1's row:")
    for i in range(min(5, shop.num_rows)):
        print(f"  id {shop['id'][i]}: age {shop['age'][i]} (P0) | "
              f"balance {bank['balance'][i]} (P1)")
    expected = sorted(set(result["customers"]["id"].to_pylist())
                      & set(result["accounts"]["id"].to_pylist()))
    print(f"matches Python's set intersection: {shop['id'].to_pylist() == expected}")
