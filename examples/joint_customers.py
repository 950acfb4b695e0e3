"""Two organisations' customer tables: align them privately, then analyse and train jointly.

A bank (``P0``, node_0) holds ``bank.csv``: customer ``id``, ``income``, ``debt`` and
the label ``defaulted``. A retailer (``P1``, node_1) holds ``shop.csv``: ``id``,
``spend`` and ``visits``. They share some customers. Each reads its own file from
its own data root, and:

1. **PSI inner join on ``id``** (libpsi, RR22): each keeps its own rows of the
   shared customers, both in the same order; neither learns the other's other
   customers. The number of shared customers is public to both (and to the
   driver, which needs it to size the tensors of step 2);
2. **a joint aggregate** on the SPU ``SP0``: the retailer's average spend of the
   bank's defaulters and non-defaulters (an oblivious group-by: the labels and the
   spend stay secret-shared; only the two means are revealed, to the bank);
3. **a logistic regression** on the joined features (bank's and retailer's
   columns, bank's labels), trained on secret shares: each party receives its own
   part of the model (its weights), and the bank the model's accuracy on the joined
   customers.

Security: PSI (RR22) and the SPU (ABY3 here, with node_2 as a helper that holds no
data) are secure against semi-honest parties; the SPU also needs an honest
majority (no two of the three nodes collude).

Run: ``python examples/joint_customers.py``
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pandas as pd

import mplang as mp
from mplang import table
from mplang.libs import groupby, linear, psi


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


def align() -> Any:
    """Phase 1: each party reads its CSV; PSI inner join; the joined row count."""
    @mp.function
    def program() -> Any:
        bank = mp.device("P0")(lambda: table.read_csv("bank.csv"))()
        shop = mp.device("P1")(lambda: table.read_csv("shop.csv"))()
        jbank, jshop = psi.join(bank, shop, "id", how="inner", protocol="rr22")
        count = mp.device("P0")(lambda t: table.to_tensor(
            table.sql("SELECT CAST(COUNT(*) AS BIGINT) AS n FROM t", t=t), rows=1))(jbank)
        return jbank, jshop, count

    return program


def analyse(rows: int, epochs: int = 20) -> Any:
    """Phase 2 on the joined tables: group-by means and a vertical logistic regression."""
    @mp.function
    def program(jbank: Any, jshop: Any) -> Any:
        x0 = mp.device("P0")(lambda t: table.to_tensor(t, ["income", "debt"], rows=rows))(
            jbank)
        y = mp.device("P0")(lambda t: table.to_tensor(t, ["defaulted"], rows=rows)[:, 0])(
            jbank)
        x1 = mp.device("P1")(lambda t: table.to_tensor(t, ["spend", "visits"], rows=rows))(
            jshop)
        x1 = mp.device("P1")(lambda x: (x - x.mean(0)) / (x.std(0) + 1e-6))(x1)
        spend = mp.device("P1")(lambda x: x[:, 0])(
            mp.device("P1")(lambda t: table.to_tensor(t, ["spend"], rows=rows))(jshop))
        means = groupby.groupby_mean(y, spend, 2, device="SP0", to="P0")
        w0, w1 = linear.train_vertical_lr([x0, x1], y, epochs=epochs, lr=0.5,
                                          device="SP0")
        predicted = linear.predict([x0, x1], [w0, w1], device="SP0", to="P0")
        accuracy = mp.device("P0")(lambda p, t: jnp.mean(p == t))(predicted, y)
        return means, accuracy, w0, w1

    return program


def main(n: int = 400, shared: int = 300) -> dict[str, Any]:
    bank, shop = make_data(n, shared)
    with tempfile.TemporaryDirectory() as tmp:
        roots = {f"node_{i}": Path(tmp, f"node_{i}") for i in range(3)}
        for root in roots.values():
            root.mkdir()
        bank.to_csv(roots["node_0"] / "bank.csv", index=False)  # on the bank's machine
        shop.to_csv(roots["node_1"] / "shop.csv", index=False)  # on the retailer's
        sim = mp.Simulator(mp.ClusterSpec.simple(3), data_roots=roots)
        try:
            jbank, jshop, count = mp.evaluate(sim, align())
            rows = int(mp.fetch(sim, count)[0, 0])
            means, accuracy, w0, w1 = mp.fetch(sim, mp.evaluate(sim, analyse(rows),
                                                                jbank, jshop))
        finally:
            sim.close()
    print(f"shared customers: {rows}")
    print(f"retailer's average spend, non-defaulters vs defaulters (bank only): "
          f"{means[0]:.3f} vs {means[1]:.3f}")
    print(f"joint model's accuracy on the shared customers (bank only): {float(accuracy):.3f}")
    return {"bank": bank, "shop": shop, "rows": rows, "means": means,
            "accuracy": float(accuracy), "weights": (w0, w1)}


if __name__ == "__main__":
    main()
