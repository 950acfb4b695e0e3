"""Private set intersection (PSI): two parties join their customer tables on an ID.

Party 0 (a shop, device ``P0``) holds ``customers.csv`` (``id``, ``age``) and party 1
(a bank, device ``P1``) holds ``accounts.csv`` (``id``, ``balance``). They want to
study their common customers without showing each other anyone else:

* ``psi.intersection_size`` tells both how many customers they share, and nothing
  else (ECDH PSI-cardinality over X25519);
* ``psi.join`` (libpsi's RR22 by default; KKRT and ECDH too) gives each party its
  own rows of the shared customers, in the same order on both sides, so row ``i``
  of the shop's result and row ``i`` of the bank's are the same customer. Neither
  sees the other's columns, and the rows never leave their holders.

Each party lists the other in its policy's ``intersection`` rule (the policies
``mplang init`` writes list nobody there): the join shows each which of its IDs the
other holds. On those aligned rows the program computes only what the policies
``mplang init`` writes let out (``docs/privacy.md``): the shared customers' average age (the
shop's column) and balance (the bank's) per age band, under 50 and over, revealed
to the shop. It is a group-by on the SPU: for the bank, aggregates over the rows the
join kept (at least ``min_rows`` of them, which each holder checks at run time),
whose groups of fewer than ``min_rows`` rows are suppressed inside the SPU (reported
as 0). For the shop, whose age bands group the bank's balances, the sums weight its
rows by another owner's values, which would show its bands: the shop approves
group-bys by name (``approve: - {library: mplang.libs.groupby, to: [node_0,
driver]}``). Each
program releases one aggregate of those rows: two (say, the average age of every
shared customer beside the per-band one) could be subtracted from each other, so
the policies refuse them together.

Nobody knows the number of shared customers when the program is traced: it is a
symbol in the types of the joined tables and of their tensors (``?n0``, one symbol for
both sides), and each SPU member compiles the group-by for the count of the run. So one
program joins and aggregates; the count is a program of its own, for the parties that
want just it.

Each party reads its table from its own data root (``table.read_csv``): no row passes
through the driver. In this demo one process plays both parties, so it writes both
files into temporary data roots first; on real workers each organisation keeps its
file on its own machine (``mplang worker --data-root DIR``).

Security: the protocols are secure against semi-honest parties (each follows the
protocol but may try to learn from what it sees); the SPU's ABY3 also needs an
honest majority (node_2 helps and holds no data). What each party learns besides
the results: the other's number of rows (or of distinct IDs, for the count), and
from the join which of its IDs the other holds (see ``mplang.libs.psi``).

Run: ``python examples/psi.py``
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv

import mplang as mp
from mplang.cluster.local import init_policies
from mplang.dialects import table
from mplang.libs import groupby, psi
from mplang.libs.demo import simulated

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


BANDS = ("under 50", "50 and over")
"""The age bands of the group-by (key 0 and 1)."""


def customers() -> Any:
    """P0's table, read from its own data root."""
    return mp.device("P0")(lambda: table.read_csv(FILES["node_0"], SCHEMAS["node_0"]))()


def accounts() -> Any:
    """P1's table, read from its own data root."""
    return mp.device("P1")(lambda: table.read_csv(FILES["node_1"], SCHEMAS["node_1"]))()


@mp.function
def count_shared() -> Any:
    """P0 and P1 read their own tables; both learn how many IDs they share."""
    return psi.intersection_size(customers(), accounts(), "id")


def study(protocol: str = "rr22") -> Any:
    """A program: the PSI join of the two tables, then the shared customers' average age
    and balance per age band, revealed to P0: ``[band, (age, balance)]``."""
    @mp.function
    def program() -> Any:
        shop, bank = psi.join(customers(), accounts(), "id", how="inner", protocol=protocol)
        ages = mp.device("P0")(lambda t: table.to_tensor(t, ["age"])[:, 0])(shop)
        balances = mp.device("P1")(lambda t: table.to_tensor(t, ["balance"])[:, 0])(bank)
        bands = mp.device("P0")(lambda a: (a >= 50).astype(jnp.int32))(ages)
        means = [groupby.groupby_mean(bands, v, len(BANDS), device="SP0", to="P0")
                 for v in (ages, balances)]  # one grouping: the same bands, one release
        return mp.device("P0")(lambda a, b: jnp.stack([a, b], axis=1))(*means)

    return program


APPROVE = "{library: mplang.libs.groupby, to: [node_0, driver]}"
"""The shop's approval of group-bys over its age bands, which weight its rows by the
bank's balances."""


def save_tables(roots: dict[str, Path], shop: pa.Table, bank: pa.Table) -> None:
    """What each party does on its own machine: keep its table in its data root."""
    for node, t in (("node_0", shop), ("node_1", bank)):
        roots[node].mkdir(parents=True, exist_ok=True)
        pcsv.write_csv(t, roots[node] / FILES[node])


def main(seed: int = 0, sizes: tuple[int, int] = SIZES, common: int = COMMON,
         cluster: mp.ClusterSpec | None = None, protocol: str = "rr22") -> dict[str, Any]:
    """Run the PSI on a simulator of ``cluster`` (default: ``ClusterSpec.simple(3)``: the
    SPU needs the helper node_2); returns the inputs and what P0 and P1 learn
    (``by_band``: ``[band, (average age, average balance)]``, at P0)."""
    tables = make_tables(seed, sizes, common)
    cluster = cluster or mp.ClusterSpec.simple(3)
    with simulated(cluster, lambda roots: save_tables(roots, *tables),  # P0, P1: partners
                   policies=init_policies(cluster, intersection=["node_0", "node_1"],
                                          approve=[APPROVE])) as sim:
        size = mp.evaluate(sim, count_shared)
        seen = mp.fetch(sim, size)
        means = mp.evaluate(sim, study(protocol))
        return {"customers": tables[0], "accounts": tables[1],
                "size_at_p0": int(seen[0]), "size_at_p1": int(seen[1]),
                "by_band": mp.fetch(sim, means), "device": mp.get_dev_attr(means)}


if __name__ == "__main__":
    result = main()
    print(f"P0 holds {result['customers'].num_rows} customers, P1 holds "
          f"{result['accounts'].num_rows} accounts")
    print(f"intersection size (learned by P0 and P1): {result['size_at_p0']}")
    for band, (age, balance) in zip(BANDS, result["by_band"], strict=True):
        print(f"shared customers {band}: average age {age:.2f}, balance {balance:.2f} "
              "(revealed to P0)")
