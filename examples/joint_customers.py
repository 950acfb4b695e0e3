"""Two organisations' customer tables: align them privately, then analyse and train jointly.

A bank (``P0``, node_0) holds ``bank.csv``: customer ``id``, ``income``, ``debt`` and
the label ``defaulted``. A retailer (``P1``, node_1) holds ``shop.csv``: ``id``,
``spend`` and ``visits``. They share some customers. Each reads its own file from
its own data root. Nobody knows how many customers they share when a program is
traced: the joined tables and their tensors have a symbolic row count (``?n0``, one
symbol for both sides), and each SPU member compiles the functions for the count of
the run. Three programs run:

1. **the number of shared customers** (``psi.intersection_size``, a comparison of
   the two parties' IDs), for both parties and the driver to report;
2. **a PSI inner join on ``id``** (libpsi, RR22; each keeps its own rows of the
   shared customers, both in the same order, and neither learns the other's other
   customers), then **a joint aggregate** on the SPU ``SP0``: the retailer's average
   spend of the bank's defaulters and non-defaulters (an oblivious group-by: the
   labels and the spend stay secret-shared; only the two means are revealed, to the
   bank; a group of fewer than 10 customers would be reported as 0);
3. **the same join, then a logistic regression** on the joined features (bank's and
   retailer's columns, bank's labels), trained on secret shares: each party
   receives its own part of the model (its weights), and the bank the model's
   accuracy on the joined customers, computed on the SPU.

The first two reveal only what the policies ``mplang init`` writes let out
(``docs/privacy.md``), once each lists the other in its ``intersection`` rule (the
join shows each which of its IDs the other holds): a comparison (the count), and
aggregates over at least 10 of the rows the join kept (each holder checks that
count at run time); the bank, whose labels group the retailer's spend, approves
group-bys (``approve: - {library: mplang.libs.groupby, to: [node_0, driver]}``). The
regression
weights each party's rows by the other's real values, which no rule lets out: each
party approves the library in its policy (``approve: - {library: mplang.libs.linear,
to: [node_0, node_1, driver]}``: the weights, the predictions kept on the SPU and the
accuracy), and each member checks that the SPU runs the library's own functions. The group means
and the model are two programs because one program releasing both is refused: the
groups and the whole set of joined rows are chosen by data, and subtracting the
releases could isolate fewer rows than ``min_rows``. (Across programs, the policies'
``max_uses`` and program digests are what bounds such differences.) The model trains
on the full batch: a mini-batch is a part of the joined rows whose count the
run-time check does not cover.

Security: PSI (RR22) and the SPU (ABY3 here, with node_2 as a helper that holds no
data) are secure against semi-honest parties; the SPU also needs an honest
majority (no two of the three nodes collude).

Run: ``python examples/joint_customers.py``
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import mplang as mp
from mplang import table
from mplang.cluster.local import init_policies
from mplang.libs import groupby, linear, psi
from mplang.libs.demo import simulated

APPROVE = ["{library: mplang.libs.linear, to: [node_0, node_1, driver]}",
           "{library: mplang.libs.groupby, to: [node_0, driver]}"]
"""The approvals each party's policy adds to those ``mplang init`` writes: the model, and
the bank's group-by over its labels of the retailer's spend."""
PARTNERS = ["node_0", "node_1"]
"""Who each party's ``intersection`` rule lets learn which of its IDs the join matched."""


def make_data(n: int = 400, shared: int = 300, seed: int = 3) -> tuple[pd.DataFrame,
                                                                        pd.DataFrame]:
    """The bank's and the retailer's tables: ``shared`` customers in both."""
    rng = np.random.default_rng(seed)
    ids = rng.permutation(10 * n)[: 2 * n - shared]
    bank_ids, shop_ids = ids[:n], ids[n - shared:]
    income = rng.normal(size=n)
    debt = rng.normal(size=n)
    spend_by_id = dict(zip(shop_ids, rng.normal(size=n), strict=True))
    spend = np.array([spend_by_id.get(i, rng.normal()) for i in bank_ids])
    score = 1.5 * income - 2.0 * debt - 1.2 * spend
    defaulted = (score + rng.logistic(size=n) * 0.5 < 0).astype(np.int64)
    bank = pd.DataFrame({"id": bank_ids, "income": income, "debt": debt,
                         "defaulted": defaulted})
    shop = pd.DataFrame({"id": shop_ids, "spend": [spend_by_id[i] for i in shop_ids],
                         "visits": rng.integers(1, 30, size=n)})
    return bank.sample(frac=1, random_state=1), shop.sample(frac=1, random_state=2)


def customers() -> tuple[Any, Any]:
    """Each party's table, read on its own side."""
    return (mp.device("P0")(lambda: table.read_csv("bank.csv"))(),
            mp.device("P1")(lambda: table.read_csv("shop.csv"))())


@mp.function
def count_shared() -> Any:
    """Program 1: how many customers both hold (both parties learn it)."""
    return psi.intersection_size(*customers(), "id")


def joined() -> dict[str, Any]:
    """The PSI join of the two tables as tensors of the shared customers: the bank's
    features ``x0`` and labels ``y``, the retailer's standardized features ``x1`` and
    its ``spend``."""
    jbank, jshop = psi.join(*customers(), "id", how="inner", protocol="rr22")
    x0 = mp.device("P0")(lambda t: table.to_tensor(t, ["income", "debt"]))(jbank)
    y = mp.device("P0")(lambda t: table.to_tensor(t, ["defaulted"])[:, 0])(jbank)
    shop = mp.device("P1")(lambda t: table.to_tensor(t, ["spend", "visits"]))(jshop)
    x1 = mp.device("P1")(lambda x: (x - x.mean(0)) / (x.std(0) + 1e-6))(shop)
    spend = mp.device("P1")(lambda x: x[:, 0])(shop)
    return {"x0": x0, "y": y, "x1": x1, "spend": spend}


@mp.function
def spend_by_default() -> Any:
    """Program 2: the retailer's average spend of the bank's non-defaulters and
    defaulters, revealed to the bank."""
    t = joined()
    return groupby.groupby_mean(t["y"], t["spend"], 2, device="SP0", to="P0")


def joint_model(epochs: int = 100) -> Any:
    """Program 3: a logistic regression on both parties' columns (each gets its weights)
    and its accuracy on the shared customers (the bank gets it)."""
    @mp.function
    def program() -> Any:
        t = joined()
        features = [t["x0"], t["x1"]]
        w0, w1 = linear.train_vertical_lr(features, t["y"], epochs=epochs, lr=0.5,
                                          device="SP0", batch_size=None)
        predicted = linear.predict(features, [w0, w1], device="SP0", to=None)
        return linear.accuracy(predicted, t["y"], device="SP0", to="P0"), w0, w1

    return program


def save_tables(roots: dict[str, Path], bank: pd.DataFrame, shop: pd.DataFrame) -> None:
    """What each organisation does on its own machine: keep its table in its data root."""
    for node, name, frame in (("node_0", "bank.csv", bank), ("node_1", "shop.csv", shop)):
        roots[node].mkdir(parents=True, exist_ok=True)
        frame.to_csv(roots[node] / name, index=False)


def main(n: int = 400, shared: int = 300) -> dict[str, Any]:
    bank, shop = make_data(n, shared)
    cluster = mp.ClusterSpec.simple(3)
    with simulated(cluster, lambda roots: save_tables(roots, bank, shop),
                   policies=init_policies(cluster, approve=APPROVE, intersection=PARTNERS)
                   ) as sim:
        rows = int(mp.fetch(sim, mp.evaluate(sim, count_shared))[0])
        means = mp.fetch(sim, mp.evaluate(sim, spend_by_default))
        accuracy, w0, w1 = mp.fetch(sim, mp.evaluate(sim, joint_model()))
    print(f"shared customers: {rows}")
    print(f"retailer's average spend, non-defaulters vs defaulters (bank only): "
          f"{means[0]:.3f} vs {means[1]:.3f}")
    print(f"joint model's accuracy on the shared customers (bank only): {float(accuracy):.3f}")
    return {"bank": bank, "shop": shop, "rows": rows, "means": means,
            "accuracy": float(accuracy), "weights": (w0, w1)}


if __name__ == "__main__":
    main()
