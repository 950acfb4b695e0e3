"""Each party's policy, enforced by real worker processes: a program that would let a
party's data go where its policy does not allow is refused before anything runs (by
that party, naming the op, the source line and the rule), a fetch of a party's raw data
is refused, and a worker does not start with a malformed policy."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cluster.local import LocalCluster
from mplang.edsl.errors import MPRefusedError
from mplang.records.audit import read_events
from tests.http import support

NODES = ("node_0", "node_1", "node_2")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """Three workers with `mplang init`'s development policies, except that node_0 takes
    programs only from ``driver`` (the spec also lists ``driver2``)."""
    base = tmp_path_factory.mktemp("policies")
    dev = support.dev_cluster(base, mp.ClusterSpec.from_dict(
        support.spec_dict(support.free_ports(3))))
    node_0 = dev.spec_path.parent / "policies" / "node_0.yaml"
    node_0.write_text(node_0.read_text().replace("drivers: [driver, driver2]",
                                                 "drivers: [driver]"))
    for rank, node in enumerate(NODES):
        root = base / "data" / node
        root.mkdir(parents=True)
        np.save(root / "x.npy", np.arange(20, dtype=np.float32) + rank)
        np.save(root / "few.npy", np.arange(4, dtype=np.float32))
    cluster = LocalCluster(dev.spec_path, keys=dev.keys, audit_dir=base / "audit",
                           data_root=base / "data")
    try:
        cluster.start(timeout=120)
        yield cluster, base / "audit"
    finally:
        cluster.close()


def _load(device: str, path: str = "x.npy") -> Any:
    return mp.device(device)(lambda: tensor.load(path))()


def _verdicts(audit: Path, node: str) -> list[tuple[str, str | None]]:
    return [(e["verdict"], e["reason"]) for e in read_events([audit / f"{node}.jsonl"])
            if e["event"] == "execution"]


def test_an_allowed_aggregate_runs(workers: tuple[LocalCluster, Path]) -> None:
    cluster, _ = workers

    def total() -> Any:
        joint = mp.device("SP0")(lambda a, b: jnp.sum(a) + jnp.sum(b))
        return mp.put("P0", joint(_load("P0"), _load("P1")))

    with support.connected_driver(cluster) as driver:
        assert float(mp.fetch(driver, mp.evaluate(driver, total))) == pytest.approx(
            2 * 190 + 20, abs=0.05)


def test_revealing_the_other_party_s_input_is_refused_before_anything_runs(
        workers: tuple[LocalCluster, Path]) -> None:
    cluster, audit = workers
    before = len(_verdicts(audit, "node_0"))

    def steal() -> Any:  # the SPU returns node_1's input, revealed to node_0
        return mp.put("P0", mp.device("SP0")(lambda a, b: b)(_load("P0"), _load("P1")))

    with support.connected_driver(cluster) as driver, \
            pytest.raises(MPRefusedError) as refused:
        mp.evaluate(driver, steal)
    message = str(refused.value)
    assert refused.value.status == 403
    assert re.search(r"party 1 \(node_1 at \S+\) refused a program of \d+ ops: party 1 "
                     r"refuses the program: op spu\.reveal at test_policies\.py:\d+ sends the "
                     r"value revealed from SP0, raw of x\.npy, to node_0; add node_0 to "
                     r"plaintext_to, or the program digest to programs", message), message
    # node_0 accepted (its own data may come back to it), but ran nothing: no end event
    new = read_events([audit / "node_0.jsonl"])
    execs = {e["exec"] for e in new if e["event"] == "execution"}
    assert len(_verdicts(audit, "node_0")) == before + 1
    assert not any(e["event"] == "send" and e["exec"] in execs
                   for e in new[-20:] if e.get("op") == "spu.reveal")
    assert _verdicts(audit, "node_1")[-1][0] == "refused"


def test_an_aggregate_of_too_few_elements_is_refused(
        workers: tuple[LocalCluster, Path]) -> None:
    cluster, _ = workers

    def small_sum() -> Any:  # 4 < min_elements 10 of the development policy
        return mp.put("P0", mp.device("SP0")(lambda a, b: jnp.sum(b))(
            _load("P0"), _load("P1", "few.npy")))

    with support.connected_driver(cluster) as driver, \
            pytest.raises(mp.MPLangError, match=r"aggregate of 4 elements of few\.npy, to "
                          r"node_0; add a rule \{to: \[node_0\], when: aggregate, "
                          r"min_elements: 4\}"):
        mp.evaluate(driver, small_sum)


def test_the_driver_cannot_fetch_a_party_s_raw_data(
        workers: tuple[LocalCluster, Path]) -> None:
    cluster, _ = workers
    with support.connected_driver(cluster) as driver:
        x = mp.evaluate(driver, lambda: _load("P1"))
        with pytest.raises(mp.MPLangError, match=r"node_1 refuses to send object \S+ to the "
                           r"driver: it is raw of x\.npy"):
            mp.fetch(driver, x)


def test_a_driver_not_in_the_party_s_list_is_refused(
        workers: tuple[LocalCluster, Path]) -> None:
    cluster, _ = workers
    other = mp.Driver(cluster.spec_path, key=cluster.keys_dir / "driver2.key", timeout=30.0)
    try:
        with pytest.raises(mp.MPLangError, match="node_0's policy does not accept driver "
                           "'driver2'"):
            mp.evaluate(other, lambda: mp.put("P0", mp.device("SP0")(jnp.add)(
                _load("P0"), _load("P1"))))
    finally:
        other.close()


def test_a_worker_does_not_start_with_a_malformed_policy(tmp_path: Path) -> None:
    dev = support.dev_cluster(tmp_path, support.make_spec(support.free_ports(3)))
    bad = tmp_path / "bad.yaml"
    bad.write_text("drivers: [driver]\ndeclassify:\n  - to: [node_0]\n    when: sometimes\n")
    done = subprocess.run([*support.mplang_command(), "worker", "--cluster",
                           str(dev.spec_path), "--node", "node_0", "--key",
                           str(dev.keys / "node_0.key"), "--policy", str(bad)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode != 0
    assert done.stderr == (f"mplang worker: {bad}:4: declassify: when must be one of "
                           "aggregate, compare, count, any\n")
    assert "Traceback" not in done.stderr
