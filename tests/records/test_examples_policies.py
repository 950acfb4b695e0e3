"""The examples that load each party's data on its own side pass the policies `mplang init`
writes on real worker processes: every node accepts every program (its audit log says
so; PHE vertical LR, which weights each party's rows by the other's values, once both
approve its digest; a group-by, once its key holder approves `mplang.libs.groupby`; each
PSI partner listed in the other's `intersection` rule) and the results match numpy,
pandas or plaintext references. A program that aggregates two PSI joins of one table
is refused there too.

One four-node cluster (`examples/secure_mean_devices.py`'s: node_0..2 hold data, an
ABY3 SPU over them, a Paillier device HE0 of node_0 and node_3, a mock-attested TEE on
node_3) serves every example; each example's helper writes its demo data into the
workers' data roots.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import mplang as mp
from mplang import simp, table
from mplang.cluster.commitments import program_digest
from mplang.cluster.local import LocalCluster
from mplang.libs import psi
from mplang.records.audit import read_events
from tests.examples.test_examples import load, psi_by_band
from tests.records.test_examples_audit import run_logged
from tests.worker import support

pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")

KEY_BITS = 1024
MEAN_VALUES = 200
"""Values per party of the secure mean."""
CUSTOMERS = (300, 200)
"""joint_customers: rows of each table, and how many customers they share."""


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """Four workers with the init policies, audit logs and every example's data."""
    base = tmp_path_factory.mktemp("examples-policies")
    layout = load("secure_mean_devices").cluster(KEY_BITS).to_dict()
    for node, port in zip(layout["nodes"], support.free_ports(4), strict=True):
        node["endpoint"] = f"127.0.0.1:{port}"
    roots = {node["name"]: base / "data" / node["name"] for node in layout["nodes"]}
    for root in roots.values():
        root.mkdir(parents=True)
    load("tee_two_party").save_salaries(roots, *load("tee_two_party").make_salaries())
    load("secure_mean_devices").save_values(
        roots, load("secure_mean_devices").make_values(MEAN_VALUES))
    load("phe_secure_aggregation").save_sales(roots, load("phe_secure_aggregation").make_sales())
    load("phe_vertical_lr").save_party_data(roots, load("phe_vertical_lr").data())
    load("psi").save_tables(roots, *load("psi").make_tables())
    load("joint_customers").save_tables(roots, *load("joint_customers").make_data(*CUSTOMERS))
    _two_joins_data(roots)
    with support.audited_cluster(mp.ClusterSpec.from_dict(layout), base) as workers:
        support.edit_policies(workers[0], [n["name"] for n in layout["nodes"]], lambda t: t.replace(
            "{to: [], when: intersection}", '{to: ["*"], when: intersection}'))  # PSI partners
        yield workers


@contextlib.contextmanager
def approving(workers: tuple[LocalCluster, Path], entry: str,
              nodes: Sequence[str] = ("node_0", "node_1")) -> Iterator[None]:
    """``nodes``' policies with the ``approve`` entry ``entry`` (as its docs show), put
    back after."""
    cluster, approve = workers[0], f"approve:\n  - {entry}\n"
    support.edit_policies(cluster, nodes, lambda t: t.replace("approve: []\n", approve))
    try:
        yield
    finally:
        support.edit_policies(cluster, nodes, lambda t: t.replace(approve, "approve: []\n"))


def _accepted(workers: tuple[LocalCluster, Path], prog: Any, fetched: int) -> Any:
    """``prog``'s fetched results, after checking that every node accepted it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)  # the TEE's mock quote
        result, events = run_logged(workers, prog, fetched=fetched)
    verdicts = {(e["node"], e["verdict"]) for e in events if e["event"] == "execution"}
    assert {v for _, v in verdicts} == {"accepted"}, verdicts
    return result


def test_tee_two_party(workers: tuple[LocalCluster, Path]) -> None:
    """Salaries compared position by position are no comparison a rule lets out: both
    approve the program by its digest, as the example says."""
    example = load("tee_two_party")
    alice, bob = example.make_salaries()
    cluster = workers[0]
    with support.connected_driver(cluster) as driver, driver, warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
        digest = program_digest(mp.compile(example.compare, cluster=cluster.cluster).graph, 4)
        with pytest.raises(mp.MPRefusedError, match=rf"node_[01] refuses the program: .* "
                           rf"raw of salaries\.npy.* approve: - \{{program: {digest}\}}"):
            mp.evaluate(driver, example.compare)
    with approving(workers, f"{{program: {digest}}}"):
        total_a, total_b, more = _accepted(workers, example.compare, fetched=3)
    want = float(alice.astype(np.float64).sum() + bob.astype(np.float64).sum())
    assert float(total_a) == float(total_b) == pytest.approx(want, rel=1e-6)
    np.testing.assert_array_equal(more, alice > bob)


@pytest.mark.parametrize("device", ["SP0", "HE0", "T0"])
def test_secure_mean_on_each_device(workers: tuple[LocalCluster, Path], device: str) -> None:
    example = load("secure_mean_devices")
    mean = _accepted(workers, example.programs()[device], fetched=1)
    want = np.concatenate(example.make_values(MEAN_VALUES)).astype(np.float64).mean()
    assert float(mean) == pytest.approx(want, abs=2e-3 if device == "SP0" else 1e-5)


def test_phe_secure_aggregation(workers: tuple[LocalCluster, Path]) -> None:
    example = load("phe_secure_aggregation")
    total = _accepted(workers, example.aggregate, fetched=1)
    want = np.concatenate(example.make_sales()).astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(total, want, rtol=1e-6)


def test_phe_vertical_lr(workers: tuple[LocalCluster, Path]) -> None:
    """Each party's rows weighted by the other's real values (the residuals, the features)
    are no aggregate: both refuse the gradient step, naming the entry that approves it
    (the digest `mplang check` prints), and run it once their policies approve it."""
    example = load("phe_vertical_lr")
    d = example.data()
    program = example.gradient_step(d["w0"], d["w1"], KEY_BITS)
    cluster, _ = workers
    with support.connected_driver(cluster) as driver, driver:
        digest = program_digest(mp.compile(program, cluster=cluster.cluster).graph, 4)
    approve, edited = f"approve:\n  - program: {digest}\n", []
    try:
        while len(edited) < 2:  # whichever refuses first is reported
            with support.connected_driver(cluster) as driver, \
                    pytest.raises(mp.MPRefusedError) as refused:
                mp.evaluate(driver, program)
            node = re.search(r"(node_[01]) refuses the program: ", str(refused.value))
            assert node is not None and node[1] not in edited, refused.value
            assert re.search(rf"{node[1]} refuses the program: op (phe\.decrypt|simp\."
                             rf"shuffle_static) at phe_vertical_lr\.py:\d+ sends [^;]*, raw of "
                             rf"x{node[1][-1]}\.npy[^;]*; approve this program alone with "
                             rf"approve: - \{{program: {digest}\}} ", str(refused.value))
            support.edit_policies(cluster, [node[1]],
                                  lambda t: t.replace("approve: []\n", approve))
            edited.append(node[1])
        g0, g1 = _accepted(workers, program, fetched=2)
    finally:
        if edited:
            support.edit_policies(cluster, edited, lambda t: t.replace(approve, "approve: []\n"))
    want0, want1 = example.reference(d)
    np.testing.assert_allclose(g0[0], want0, atol=1e-5)
    np.testing.assert_allclose(g1[1], want1, atol=1e-5)


def test_psi(workers: tuple[LocalCluster, Path]) -> None:
    example = load("psi")
    customers, accounts = example.make_tables()
    merged = customers.to_pandas().merge(accounts.to_pandas(), on="id")
    sizes = _accepted(workers, example.count_shared, fetched=2)  # from P0 and P1
    assert [int(s) for s in sizes[:2]] == [len(merged)] * 2 and sizes[2:] == [None, None]
    with approving(workers, example.APPROVE, nodes=("node_0",)):  # the shop's age bands
        by_band = _accepted(workers, example.study(), fetched=1)
    np.testing.assert_allclose(by_band, psi_by_band(merged), rtol=1e-3, atol=1e-2)


def test_joint_customers(workers: tuple[LocalCluster, Path]) -> None:
    from sklearn.linear_model import LogisticRegression

    example = load("joint_customers")
    bank, shop = example.make_data(*CUSTOMERS)
    merged = bank.merge(shop, on="id")
    rows = int(_accepted(workers, example.count_shared, fetched=2)[0])
    assert rows == len(merged) == CUSTOMERS[1]
    with approving(workers, example.APPROVE[1], nodes=("node_0",)):  # the bank's labels
        means = _accepted(workers, example.spend_by_default, fetched=1)
    want = merged.groupby("defaulted")["spend"].mean()
    np.testing.assert_allclose(means, [want[0], want[1]], atol=2e-3)
    with pytest.raises(mp.MPRefusedError, match=r"add approve: - \{library: mplang\.libs\."
                       r"linear\.(train_vertical_lr|predict|accuracy), to: \[node_[01]\]\}"), \
            support.connected_driver(workers[0]) as driver:
        mp.evaluate(driver, example.joint_model())
    with approving(workers, "{library: mplang.libs.linear, to: [node_0, node_1, driver]}"):
        accuracy, w0, w1 = _accepted(workers, example.joint_model(), fetched=3)
    features = merged[["spend", "visits"]].to_numpy()
    x = np.hstack([merged[["income", "debt"]].to_numpy(),
                   (features - features.mean(0)) / (features.std(0) + 1e-6)])
    y = merged["defaulted"].to_numpy()
    assert float(accuracy) >= LogisticRegression().fit(x, y).score(x, y) - 0.05
    assert w0.shape == (3,) and w1.shape == (2,)


def test_run_me(workers: tuple[LocalCluster, Path], capsys: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch) -> None:
    """Driver constants are nobody's data: the policies have nothing to refuse."""
    monkeypatch.setattr("sys.argv", ["run_me.py", "5"])
    cluster, _ = workers
    with support.connected_driver(cluster) as driver:
        load("run_me").main(driver)
    assert capsys.readouterr().out == \
        f"sum on 4 parties, revealed to P0: {(11 * np.arange(5)).tolist()}\n"


# ---------------------------------------------------------------- two joins of one table

SCHEMA = {"id": "int64", "v": "float64"}


def _two_joins_data(roots: dict[str, Path]) -> None:
    """node_0's ``ids.csv`` (ids 0..39) and node_1's ``ids.csv`` (ids 20..59) and
    ``ids_but_one.csv`` (the same but its first row): the two joins keep node_0's rows
    20..39 and 21..39."""
    for node, ids in (("node_0", np.arange(40)), ("node_1", np.arange(20, 60))):
        frame = pd.DataFrame({"id": ids, "v": ids * 2.0})
        frame.to_csv(roots[node] / "ids.csv", index=False)
        frame[1:].to_csv(roots[node] / "ids_but_one.csv", index=False)


def _joined_sum(other: str, rows: int) -> Any:
    """The sum of node_0's ``v`` over the rows its join with node_1's ``other`` kept."""
    mine = simp.pcall((0,), lambda: table.read_csv("ids.csv", SCHEMA))
    theirs = simp.pcall((1,), lambda: table.read_csv(other, SCHEMA))
    joined, _ = psi.join(mine, theirs, "id")
    column = simp.pcall((0,), lambda t: table.to_tensor(t, ["v"], rows=rows), joined)
    return simp.pcall((0,), jnp.sum, column)


def test_two_joins_of_one_table_aggregated_are_refused_together(
        workers: tuple[LocalCluster, Path]) -> None:
    """Either join alone passes; both in one program could be subtracted to isolate
    node_0's row 20, so node_0 refuses the program before it runs."""
    total = _accepted(workers, lambda: _joined_sum("ids.csv", 20), fetched=1)
    assert float(total[0]) == 2.0 * sum(range(20, 40))
    cluster, _ = workers
    release = (r"op simp\.pcall at test_examples_policies\.py:\d+ sends program output {}, "
               r"held by node_0, aggregate over the rows a join kept \(at least min_rows, "
               r"checked at run time\) of ids\.csv, which overlaps another release of this "
               r"party's data: subtracting them {}, fewer than min_rows 10 of \{{to: "
               r"\[\"\*\"\], when: aggregate, min_rows: 10\}} in \S+/policies/node_0\.yaml")
    with support.connected_driver(cluster) as driver, pytest.raises(
            mp.MPRefusedError, match=(
                r"^party 0 \(node_0 at https://127\.0\.0\.1:\d+\) refused a program of 10 "
                r"ops: node_0 refuses the program: "
                + release.format(0, r"isolates rows 19\.\.19 of ids\.csv") + "; "
                + release.format(1, r"may isolate as few as one row of ids\.csv \(the releases "
                                    r"combine rows that data chose differently\)") + "$")):
        mp.evaluate(driver, lambda: (_joined_sum("ids.csv", 20),
                                     _joined_sum("ids_but_one.csv", 19)))


def test_one_shared_customer_singled_out_of_the_join_is_refused(
        workers: tuple[LocalCluster, Path]) -> None:
    """The driver picks one shared customer by the shop's age column and asks for that
    customer's balance: a sum over rows a comparison chose, whose count the join's
    run-time check does not cover, so the bank refuses (the shop keeps its copy of the
    sum, to judge when it is fetched)."""
    example = load("psi")
    customers, accounts = example.make_tables()
    merged = customers.to_pandas().merge(accounts.to_pandas(), on="id")
    age = int(merged["age"].value_counts().idxmin())

    def program() -> Any:
        shop, bank = psi.join(example.customers(), example.accounts(), "id")
        ages = mp.device("P0")(lambda t: table.to_tensor(t, ["age"], rows=len(merged)))(shop)
        balances = mp.device("P1")(lambda t: table.to_tensor(t, ["balance"],
                                                             rows=len(merged)))(bank)
        return mp.put("P0", mp.device("SP0")(lambda a, b: jnp.sum((a == age) * b))(
            ages, balances))

    def sends(node: str, source: str, *what: str) -> str:
        return "; ".join(
            rf"op spu\.reveal at test_examples_policies\.py:\d+ sends {w}, aggregate over a "
            rf"data-dependent number of rows of {source}\.csv, to {to}; aggregate it in the "
            r"secure device with groups of at least min_rows rows enforced at run time "
            r"\(mplang\.libs\.groupby\), or add approve: - \{program: [0-9a-f]{64}\} in "
            rf"\S+/policies/{node}\.yaml" for w, to in (x.split("|") for x in what))

    bank = r"^party 1 \(node_1 at https://127\.0\.0\.1:\d+\) refused a program of \d+ " \
        r"ops: node_1 refuses the program: " + sends(
            "node_1", "accounts", "the value revealed from SP0|node_0",
            "program output 0, held by node_0|driver") + "$"
    cluster, audit = workers
    with support.connected_driver(cluster) as driver, \
            pytest.raises(mp.MPRefusedError, match=bank):
        mp.evaluate(driver, program)
    last = {node: [e for e in read_events([audit / f"{node}.jsonl"])
                   if e["event"] == "execution"][-1] for node in ("node_0", "node_1")}
    assert last["node_0"]["verdict"] == "accepted", last["node_0"]
    assert last["node_1"]["verdict"] == "refused", last["node_1"]
    assert "aggregate over a data-dependent number of rows of accounts.csv" in \
        last["node_1"]["reason"], last["node_1"]
