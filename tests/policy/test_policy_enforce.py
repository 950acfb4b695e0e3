"""Policies enforced by simulated workers: refused programs and refused fetches."""

from __future__ import annotations

import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects import simp, tensor
from mplang.edsl.errors import MPLangError, MPRefusedError
from mplang.policy import PolicyRefusedError

RULES = "declassify:\n  - to: ['*']\n    when: aggregate\n    min_elements: 5\n"


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

    with pytest.raises(MPRefusedError, match=r"party 1 refuses the program: op spu\.reveal at "
                       r"test_policy_enforce\.py:\d+ .*raw of x\.npy, to node_0"):
        mp.evaluate(sim, prog)


def test_fetch_of_derived_unrevealed_object_refused(sim: mp.Simulator) -> None:
    out = mp.evaluate(sim, lambda: simp.pcall((0,), lambda a: a * 2, loaded(0)))
    with pytest.raises(PolicyRefusedError, match=r"node_0 refuses to send object .* to the "
                       r"driver: it is raw of x\.npy; add driver to plaintext_to"):
        mp.fetch(sim, out)
    total = mp.evaluate(sim, lambda: simp.pcall((0,), jnp.sum, loaded(0)))
    assert float(mp.fetch(sim, total)[0]) == 45.0  # an aggregate of 10 elements may go


def test_standard_mode_inputs_keep_their_labels(sim: mp.Simulator) -> None:
    x = mp.evaluate(sim, lambda: loaded(0))
    with pytest.raises(MPLangError, match=r"node_0 refuses the program: op "
                       r"simp\.shuffle_static .*raw of x\.npy, to node_1"):
        mp.evaluate(sim, lambda v: simp.shuffle_static(v, {1: 0}), x, mode="standard")


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
        assert [(r.when, r.min_elements) for r in policy.declassify] == [
            ("compare", 1), ("aggregate", 10)]


def test_labels_go_with_their_objects(sim: mp.Simulator) -> None:
    """A derived object's label is kept while the object lives and dropped with it: a
    worker that runs programs on its data for good does not grow a label per result."""
    worker = sim.mesh.workers[0]
    assert worker.guard is not None
    before = len(worker.guard.labels._labels)
    for _ in range(20):
        out = mp.evaluate(sim, lambda: simp.pcall((0,), lambda a: a * 2, loaded(0)))
        (uri, _) = out.var.uris
        assert worker.guard.labels.of(uri) is not None
        del out  # the driver's handle goes: the object and its label are deleted
    deadline = time.monotonic() + 10
    while len(worker.guard.labels._labels) > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(worker.guard.labels._labels) == before
