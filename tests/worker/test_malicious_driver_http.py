"""The malicious driver of `tests/policy/test_malicious_driver.py` against two worker
processes over mutual TLS, each with the policy `mplang init` writes (aggregates over
at least 10 rows and comparisons to anyone, plaintext to nobody): every attack is
refused by node_1 before anything runs, as `mp.MPRefusedError` naming node_1, the op,
the user's line and the rule, and quoting no salary; the honest analytics run."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cluster.local import LocalCluster
from mplang.libs import dp
from mplang.libs.aggregation import secure_sum
from mplang.libs.groupby import groupby_sum
from tests.policy import test_malicious_driver as attacks
from tests.policy.hints import undigested
from tests.worker import support

NODES = ("node_0", "node_1")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """node_0 and node_1 (CHEETAH SPU SP0) with the salaries, tables and ids the simulator
    suite uses, each in its own data root."""
    base = tmp_path_factory.mktemp("malicious-http")
    spec = mp.ClusterSpec.simple(2).to_dict()
    for node, port in zip(spec["nodes"], support.free_ports(2), strict=True):
        node["endpoint"] = f"127.0.0.1:{port}"
    for i, node in enumerate(NODES):
        root = base / "data" / node
        root.mkdir(parents=True)
        np.save(root / "salaries.npy", attacks.SALARIES[i])
        np.save(root / "ids.npy", attacks.IDS + i)
        np.save(root / "bonus.npy", attacks.SALARIES[i] / 10)  # for the two-program attack
    with support.running_cluster(mp.ClusterSpec.from_dict(spec), timeout=120,
                                 data_root=base / "data") as local:
        yield local


@pytest.fixture(scope="module")
def driver(cluster: LocalCluster) -> Iterator[mp.Driver]:
    with support.connected_driver(cluster) as d:
        yield d


def _refused(driver: mp.Driver, program: Callable[[], Any]) -> str:
    """node_1's refusal of ``program``: its message, checked to quote no salary."""
    with pytest.raises(mp.MPRefusedError) as caught:
        mp.fetch(driver, mp.evaluate(driver, program))
    message = str(caught.value)
    for value in np.concatenate(attacks.SALARIES):  # a digest's hex digits may hold any number
        assert str(int(value)) not in undigested(message), (value, message)
    return message


def _policy(cluster: LocalCluster) -> str:
    return str(cluster.spec_path.parent / "policies" / "node_1.yaml")


@pytest.mark.parametrize("name", attacks.ATTACKS)
def test_a_reveal_from_the_secure_device_is_refused(cluster: LocalCluster, driver: mp.Driver,
                                                    name: str) -> None:
    fn, what = attacks.ATTACKS[name]
    message = _refused(driver, attacks.on_sp0(fn))
    assert message.startswith("party 1 (node_1 at https://127.0.0.1:"), message
    body = message.split(" ops: ", 1)[1]
    assert body.startswith(f"node_1 refuses the program: op spu.reveal at {attacks.SP0_AT} "
                           f"sends the value revealed from SP0, {what}, to node_0; "), body
    assert re.search(rf" in {re.escape(_policy(cluster))}( \(it became raw at stablehlo\.\w+ "
                     rf"at [\w.]+:\d+ in the function traced at {attacks.SP0_AT}\))?$",
                     body), body


@pytest.mark.parametrize("name", ["x @ eye", "sum of one row and zeros", "bits of every row",
                                  "order statistic"])
def test_an_output_of_node_1_itself_is_refused_when_fetched(
        cluster: LocalCluster, driver: mp.Driver, name: str) -> None:
    """node_1 runs the program and keeps its output; the driver's fetch is refused."""
    fn, what = attacks.ATTACKS[name]
    message = _refused(driver, attacks.on_p1(fn))
    assert re.match(r"party 1 \(node_1 at \S+\) refused a fetch: node_1 refuses to send "
                    rf"object \S+ to the driver: it is {re.escape(what)}; ", message), message
    assert f" in {_policy(cluster)} (or reveal it under a rule)" in message, message


def test_overlapping_aggregates_are_refused(driver: mp.Driver) -> None:
    message = _refused(driver, attacks.on_sp0(lambda x: (jnp.sum(x), jnp.sum(x[1:]))))
    assert attacks.OVERLAP in message, message


def test_a_loop_whose_trip_count_is_a_salary_is_refused(driver: mp.Driver) -> None:
    def count_up(x: Any) -> Any:
        return jax.lax.while_loop(lambda c: c < x[3], lambda c: c + 1.0, 0.0)

    message = _refused(driver, attacks.on_sp0(count_up))
    assert f"op spu.run at {attacks.SP0_AT} sends the run time of a loop or branch that " \
           "depends on it, row-wise (raw) values of salaries.npy, to driver; " in message


def test_psi_against_a_table_the_driver_planted_is_refused(driver: mp.Driver) -> None:
    from mplang.dialects import table
    from mplang.libs import psi

    planted = np.array([103, 106], np.int32)

    def program() -> Any:
        table_0 = mp.device("P0")(lambda: table.constant({"id": planted}))()
        return psi.join(table_0, attacks._ids(1), "id")[0]

    message = _refused(driver, program)
    assert "op psi.join at test_malicious_driver_http.py:" in message, message
    assert "sends which of the receiver's keys this party's table holds, row-wise (raw) " \
           "values of ids.npy, to node_0; " in message, message


def test_honest_analytics_run(cluster: LocalCluster, driver: mp.Driver) -> None:
    """The same policies let through the sum of each party's salary total, and, in
    another program, node_1's salaries summed per node_0's groups (the group of 8 rows
    zeroed in the device; in one program the two would be refused together, as their
    difference is that group), once node_0 approves group-bys over its keys."""
    def totals() -> Any:
        return secure_sum([mp.device(f"P{i}")(jnp.sum)(attacks.salaries(i)) for i in range(2)])

    total = mp.fetch(driver, mp.evaluate(driver, totals))
    salaries = np.concatenate(attacks.SALARIES).astype(np.float64)
    assert float(total) == pytest.approx(salaries.sum(), rel=1e-5)
    approve = 'approve:\n  - {library: mplang.libs.groupby, to: ["*"]}\n'
    support.edit_policies(cluster, ["node_0"], lambda t: t.replace("approve: []\n", approve))
    try:
        sums = mp.fetch(driver, mp.evaluate(driver, lambda: groupby_sum(
            attacks.keys_of_node_0(), attacks.salaries(1), 2)))
    finally:
        support.edit_policies(cluster, ["node_0"], lambda t: t.replace(approve, "approve: []\n"))
    keys = (attacks.SALARIES[0] > attacks.HIGH).astype(np.int32)
    assert np.bincount(keys).tolist() == [8, 12]
    kept = attacks.SALARIES[1][keys == 1].astype(np.float64)
    np.testing.assert_allclose(sums, [0.0, kept.sum()], rtol=1e-5)


def test_a_group_by_that_would_spell_out_the_key_holder_s_keys_is_refused(
        driver: mp.Driver) -> None:
    """``2 ** i`` summed over node_0's groups would say which of node_0's rows hold each
    key: refused (node_1 refuses the row-varying values it would send; node_0, whose
    keys they are, the sums: it did not approve group-bys over its keys)."""
    spikes = mp.device("P1")(lambda s: 2.0 ** jnp.arange(20, dtype=jnp.float32) + s * 0)
    with pytest.raises(mp.MPRefusedError, match=r"node_[01] refuses .* the output of "
                       r"mplang\.libs\.groupby\.groupby_sum on salaries\.npy"):
        mp.fetch(driver, mp.evaluate(driver, lambda: groupby_sum(
            attacks.keys_of_node_0(), spikes(attacks.salaries(1)), 2)))


def test_this_month_s_red_team_is_refused_on_workers(driver: mp.Driver) -> None:
    """Weights laundered through node_0's aggregate, a reduction that keeps one row, a
    branch that selects the top row, a noisy release of one row repeated."""
    top = float(np.sort(attacks.SALARIES[1])[-1])

    def on_sp0(fn: Callable[..., Any], *more: Any) -> Callable[[], Any]:
        return lambda: mp.put("P0", mp.device("SP0")(fn)(attacks.salaries(1), *(
            m() for m in more)))

    def one_row_noised() -> Any:
        x = attacks.salaries(1)
        row_0 = mp.device("P1")(lambda x: x * 0 + (jnp.sum(x) - jnp.sum(x[1:])))(x)
        return dp.noisy_sum(row_0, bounds=(70000.0, 80000.0), epsilon=0.5)

    for program, what in [
            (on_sp0(lambda x, w: jnp.sum(x * w), attacks.laundered_weights),
             f"{attacks.RAW}, to node_0"),
            (on_sp0(lambda x: jax.lax.reduce(x.reshape(2, 10), np.float32(0), lambda a, b: b,
                                             (1,))), f"{attacks.RAW}, to node_0"),
            (on_sp0(lambda x: jnp.sum(jnp.where(x >= top, x, x * 0))),
             "aggregate over a data-dependent number of rows of salaries.npy, to node_0"),
            (one_row_noised, "mixes an aggregate of this party's rows into each row's "
             "contribution")]:
        message = _refused(driver, program)
        assert message.startswith("party 1 (node_1 at ") and what in message, message


def test_a_sum_and_then_the_sum_less_one_row_are_refused_across_programs(
        driver: mp.Driver) -> None:
    """node_1 remembers the rows of its releases: the second program would give row 0."""
    def total(lo: int) -> Callable[[], Any]:
        bonus = mp.device("P1")(lambda: tensor.load("bonus.npy"))
        return lambda: mp.put("P0", mp.device("SP0")(lambda x: jnp.sum(x[lo:]))(bonus()))

    got = mp.fetch(driver, mp.evaluate(driver, total(0)))
    assert float(got) == pytest.approx(float((attacks.SALARIES[1] / 10).sum()), rel=1e-5)
    message = _refused(driver, total(1))
    assert "subtracting them isolates rows 0..0 of bonus.npy, fewer than min_rows 10" \
        in message, message
