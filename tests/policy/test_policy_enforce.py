"""Policies enforced by simulated workers: refused programs, labels kept with stored
objects (and judged again when a later program uses them), refused fetches."""

from __future__ import annotations

import re
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects import simp, tensor
from mplang.edsl.errors import MPLangError, MPRefusedError
from tests.policy.hints import raw_hint, undigested

RULES = "declassify:\n  - to: ['*']\n    when: aggregate\n    min_rows: 5\n"


@pytest.fixture
def sim(tmp_path: Path):
    roots = {}
    for i, node in enumerate(("node_0", "node_1")):
        (tmp_path / node).mkdir()
        np.save(tmp_path / node / "x.npy", np.arange(10, dtype=np.float32) + i)
        roots[node] = str(tmp_path / node)
    (tmp_path / "p.yaml").write_text(RULES)
    s = mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots,
                     policies={n: str(tmp_path / "p.yaml") for n in roots})
    yield s
    s.close()


def loaded(party: int) -> mp.MPObject:
    return simp.pcall((party,), lambda: tensor.load("x.npy"))


def test_allowed_aggregate_runs(sim: mp.Simulator) -> None:
    def prog():
        return mp.put("P0", mp.device("SP0")(lambda a, b: jnp.sum(a) + jnp.sum(b))(
            loaded(0), loaded(1)))

    assert float(mp.fetch(sim, mp.evaluate(sim, prog))) == pytest.approx(45 + 55)


def test_reveal_of_other_party_input_refused(sim: mp.Simulator) -> None:
    def prog():
        return mp.put("P0", mp.device("SP0")(lambda a, b: b)(loaded(0), loaded(1)))

    with pytest.raises(MPRefusedError, match=r"^node_1 refuses the program: op spu\.reveal at "
                       r"test_policy_enforce\.py:\d+ sends the value revealed from SP0, row-wise "
                       r"\(raw\) values of x\.npy, to node_0; approve this program alone "
                       r"with approve: - \{program: "):
        mp.evaluate(sim, prog)


def test_derived_raw_data_is_kept_its_fetch_refused_and_an_aggregate_is_fetched(
        sim: mp.Simulator, tmp_path: Path) -> None:
    doubled = mp.evaluate(sim, lambda: simp.pcall((0,), lambda a: a * 2, loaded(0)))
    with pytest.raises(MPRefusedError) as refused:
        mp.fetch(sim, doubled)
    assert re.match(
        r"node_0 refuses to send object \S+ to the driver: it is row-wise \(raw\) values of "
        + re.escape(f"x.npy; {raw_hint('driver')} in {tmp_path / 'p.yaml'} (or reveal it "
                    "under a rule)"), undigested(str(refused.value))), str(refused.value)
    total = mp.evaluate(sim, lambda t: simp.pcall((0,), jnp.sum, t), doubled)
    assert float(mp.fetch(sim, total)[0]) == 90.0  # an aggregate over 10 rows may go
    total = mp.evaluate(sim, lambda: simp.pcall((0,), jnp.sum, loaded(0)))
    assert float(mp.fetch(sim, total)[0]) == 45.0


def test_a_stored_aggregate_keeps_its_rows_into_the_next_program(sim: mp.Simulator) -> None:
    """sum(x) fetched in one program and sum(x[1:]) subtracted from it in the next would
    give x[0]: the stored object's label (rows 0..9) is judged with the new release."""
    total = mp.evaluate(sim, lambda: simp.pcall((0,), jnp.sum, loaded(0)))
    assert float(mp.fetch(sim, total)[0]) == 45.0
    with pytest.raises(MPRefusedError, match=(
            r"^node_0 refuses the program: op simp\.pcall at test_policy_enforce\.py:\d+ sends "
            r"program output 0, held by node_0, aggregate over 9 rows of x\.npy, which "
            r"overlaps another release of this party's data: subtracting them isolates rows "
            r"0\.\.0 of x\.npy, fewer than min_rows 5 of")):
        mp.evaluate(sim, lambda t: simp.pcall((0,), lambda a, b: a - jnp.sum(b[1:]), t,
                                              loaded(0)), total)
    moved = mp.evaluate(sim, lambda t: simp.shuffle_static(t, {1: 0}), total, mode="standard")
    assert mp.fetch(sim, moved) == [None, 45.0]  # the aggregate itself may go anywhere


def test_an_honest_aggregate_runs_in_standard_mode(sim: mp.Simulator) -> None:
    """One op at a time, the loaded data stays on its party and only the aggregate is
    fetched; fetching the loaded data itself is refused."""
    loads = mp.evaluate(sim, lambda: loaded(0), mode="standard")
    with pytest.raises(mp.MPRefusedError, match="node_0 refuses to send object"):
        mp.fetch(sim, loads)
    total = mp.evaluate(sim, lambda: simp.pcall((0,), jnp.sum, loaded(0)), mode="standard")
    assert float(mp.fetch(sim, total)[0]) == 45.0


def test_unknown_node_in_policies() -> None:
    with pytest.raises(MPLangError, match="policies names nodes \\['node_9'\\]"):
        mp.Simulator(mp.ClusterSpec.simple(2), policies={"node_9": "p.yaml"})


def test_init_writes_a_policy_per_node_that_workers_load(tmp_path: Path) -> None:
    from mplang.cluster.local import init_cluster
    from mplang.policy.policy import Policy

    init_cluster(3, tmp_path)
    for i in range(3):
        text = (tmp_path / "policies" / f"node_{i}.yaml").read_text()
        assert f"What node_{i} accepts" in text and "#" in text  # commented
        policy = Policy.load(tmp_path / "policies" / f"node_{i}.yaml")
        assert policy.drivers == ("driver",)
        assert policy.plaintext_to == ()
        assert policy.protocols == ("CHEETAH", "ABY3")
        assert policy.writes == () and not policy.may_write("out/r.csv")
        assert [str(r) for r in policy.declassify] == [
            '{to: ["*"], when: aggregate, min_rows: 10}', '{to: ["*"], when: compare}',
            '{to: [], when: intersection}']


def test_labels_go_with_their_objects(sim: mp.Simulator) -> None:
    """A derived object's label is kept while the object lives and dropped with it: a
    worker that runs programs on its data for good does not grow a label per result."""
    worker = sim.mesh.workers[0]
    assert worker.guard is not None
    before = len(worker.guard.labels._labels)
    for _ in range(20):
        out = mp.evaluate(sim, lambda: simp.pcall((0,), jnp.sum, loaded(0)))
        (uri, _) = out.var.uris
        label = worker.guard.labels.of(uri)
        assert label is not None and label.form == "aggregate" and label.rows == 10
        del out  # the driver's handle goes: the object and its label are deleted
    deadline = time.monotonic() + 10
    while len(worker.guard.labels._labels) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(worker.guard.labels._labels) == before
