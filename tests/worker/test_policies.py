"""Each party's policy, enforced by real worker processes: a program that would let a
party's data go where its policy does not allow is refused before anything runs (by
that party, naming the op, the source line and the rule), a fetch of a party's raw data
is refused, a write its ``writes`` does not allow is refused and writes nothing, and a
worker does not start with a malformed policy. Every refusal reaches the driver as an
`MPRefusedError` (never an `MPRuntimeError`) carrying the party's message."""

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
from mplang import simp, tensor
from mplang.cluster.local import LocalCluster
from mplang.dialects import table
from mplang.edsl.errors import MPRefusedError
from mplang.records.audit import read_events
from mplang.runtime.options import Mode
from tests.worker import support

NODES = ("node_0", "node_1", "node_2")
INPUT_CSV = "a\n1\n2\n3\n"


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    """Three workers with `mplang init`'s development policies, except that node_0 takes
    programs only from ``driver`` (the spec also lists ``driver2``) and node_2 lets the
    driver have its plaintext."""
    base = tmp_path_factory.mktemp("policies")
    dev = support.dev_cluster(base, mp.ClusterSpec.from_dict(
        support.spec_dict(support.free_ports(3))))
    node_0 = dev.spec_path.parent / "policies" / "node_0.yaml"
    node_0.write_text(node_0.read_text().replace("drivers: [driver, driver2]",
                                                 "drivers: [driver]"))
    node_2 = dev.spec_path.parent / "policies" / "node_2.yaml"
    node_2.write_text(node_2.read_text().replace("plaintext_to: []", "plaintext_to: [driver]"))
    for rank, node in enumerate(NODES):
        root = base / "data" / node
        root.mkdir(parents=True)
        np.save(root / "x.npy", np.arange(20, dtype=np.float32) + rank)
        np.save(root / "few.npy", np.arange(4, dtype=np.float32))
        (root / "x.csv").write_text(INPUT_CSV)
    cluster = LocalCluster(dev.spec_path, keys=dev.keys, audit_dir=base / "audit",
                           data_root=base / "data")
    try:
        cluster.start(timeout=120)
        yield cluster, base / "audit"
    finally:
        cluster.close()


def _load(device: str, path: str = "x.npy") -> Any:
    return mp.device(device)(lambda: tensor.load(path))()


def _refused(run: Any) -> MPRefusedError:
    """The `MPRefusedError` ``run()`` raises (not an `MPRuntimeError`)."""
    with pytest.raises(MPRefusedError) as caught:
        run()
    assert not isinstance(caught.value, mp.MPRuntimeError)
    return caught.value


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

    with support.connected_driver(cluster) as driver:
        refused = _refused(lambda: mp.evaluate(driver, steal))
    message = str(refused)
    assert refused.status == 403
    assert re.search(r"party 1 \(node_1 at \S+\) refused a program of \d+ ops: node_1 "
                     r"refuses the program: op spu\.reveal at test_policies\.py:\d+ sends the "
                     r"value revealed from SP0, row-wise \(raw\) values of x\.npy, to node_0; "
                     r"approve this program alone with approve: - \{program: [0-9a-f]{64}\}",
                     message), \
        message
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

    def small_sum() -> Any:  # 4 < min_rows 10 of the development policy
        return mp.put("P0", mp.device("SP0")(lambda a, b: jnp.sum(b))(
            _load("P0"), _load("P1", "few.npy")))

    with support.connected_driver(cluster) as driver:
        refused = _refused(lambda: mp.evaluate(driver, small_sum))
    assert re.search(r"node_1 refuses the program: op spu\.reveal at test_policies\.py:\d+ "
                     r".*few\.npy, to node_0; add a rule \{to: \[node_0\], when: aggregate, "
                     r"min_rows: 4\}", str(refused)), refused


FETCH = (r"party 1 \(node_1 at \S+\) refused a fetch: node_1 refuses to send object \S+ to "
         r"the driver: it is row-wise \(raw\) values of x\.npy; approve this program alone ")


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_the_driver_never_gets_a_party_s_raw_data(
        workers: tuple[LocalCluster, Path], mode: Mode) -> None:
    """node_1 keeps its output and refuses the driver's fetch of it: an `MPRefusedError`
    with node_1's message."""
    cluster, _ = workers
    with support.connected_driver(cluster) as driver:
        refused = _refused(lambda: mp.fetch(driver, mp.evaluate(driver, lambda: _load("P1"),
                                                                mode=mode)))
    assert refused.status == 403
    assert re.match(FETCH, str(refused)), refused
    assert "plaintext_to would give driver every row" in str(refused)


def test_a_value_kept_on_its_owner_feeds_a_later_aggregate(
        workers: tuple[LocalCluster, Path]) -> None:
    """node_1's raw x kept by one program: a second program releasing its mean runs, a
    fetch of it is refused, and a copy held by node_0 is refused when accepted."""
    cluster, _ = workers
    with support.connected_driver(cluster) as driver:
        x = mp.evaluate(driver, lambda: _load("P1"))
        mean = mp.evaluate(driver, lambda v: mp.put("P0", mp.device("SP0")(jnp.mean)(v)), x)
        assert float(mp.fetch(driver, mean)) == pytest.approx(np.mean(np.arange(20) + 1.0),
                                                               abs=0.01)
        refused = _refused(lambda: mp.fetch(driver, x))
        moved = _refused(lambda: mp.evaluate(driver, lambda: mp.put("P0", _load("P1"))))
    assert refused.status == 403 and re.match(FETCH, str(refused)), refused
    assert re.search(r"^party 1 \(node_1 at \S+\) refused a program of \d+ ops: node_1 "
                     r"refuses the program: .*op simp\.shuffle_static at test_policies\.py:\d+ "
                     r"sends program output 0, held by node_0, row-wise \(raw\) values of "
                     r"x\.npy, to driver; ", str(moved)), moved


def test_a_secret_share_is_refused_at_fetch(workers: tuple[LocalCluster, Path]) -> None:
    cluster, _ = workers
    with support.connected_driver(cluster) as driver:
        shared = mp.evaluate(driver, lambda: mp.put("SP0", mp.put("P0", np.float32(2.5))))
        refused = _refused(lambda: driver.fetch_object(shared))
    assert refused.status == 403
    assert re.match(r"party (\d) \(node_\1 at \S+\) refused a fetch: party \1: object \S+ is a "
                    r"secret share, which leaves this party only inside its protocol",
                    str(refused)), refused


def test_stored_raw_data_sent_on_is_refused_when_it_would_run(
        workers: tuple[LocalCluster, Path]) -> None:
    """node_2 lets the driver have its data, not node_0. Standard mode runs the shuffle
    as a program of its own: node_2 accepts it, then refuses to run it once it sees that
    the stored input is its raw data (`Guard.admit`)."""
    cluster, _ = workers
    with support.connected_driver(cluster) as driver:
        x = mp.evaluate(driver, lambda: _load("P2"))
        np.testing.assert_array_equal(mp.fetch(driver, x), np.arange(20) + 2)
        refused = _refused(lambda: mp.evaluate(
            driver, lambda v: simp.shuffle_static(v, {0: 2}), x, mode="standard"))
    assert refused.status == 403
    assert re.match(r"party 2 \(node_2 at \S+\) refused op simp\.shuffle_static: node_2 "
                    r"refuses the program: op simp\.shuffle_static at test_policies\.py:\d+ "
                    r".*x\.npy, to node_0; approve this program alone with approve: ",
                    str(refused)), refused


def test_a_driver_program_cannot_overwrite_a_party_s_input(
        workers: tuple[LocalCluster, Path]) -> None:
    """The development policy has ``writes: []``: a program writing node_1's own input
    file is refused by node_1 (when it accepts the program, or when the write would
    run), and the file stays as it was."""
    cluster, _ = workers
    target = cluster.data_root / "node_1" / "x.csv"  # type: ignore[operator]

    def overwrite() -> Any:
        t = simp.pcall((1,), lambda: table.constant({"a": np.array([0], np.int64)}))
        return simp.pcall((1,), lambda u: table.write_csv(u, "x.csv"), t)

    with support.connected_driver(cluster) as driver:
        refused = _refused(lambda: mp.evaluate(driver, overwrite))
    policy = cluster.spec_path.parent / "policies" / "node_1.yaml"
    message = str(refused)
    assert re.match(r"party 1 \(node_1 at \S+\) refused a program of \d+ ops: node_1 ",
                    message), message
    assert re.search(r"op table\.write(_csv)? at test_policies\.py:\d+ writ(es|ing) 'x\.csv' "
                     r"into ", message), message
    assert f"writes: [] in {policy} does not allow" in message
    assert target.read_text() == INPUT_CSV


def test_a_driver_not_in_the_party_s_list_is_refused(
        workers: tuple[LocalCluster, Path]) -> None:
    cluster, _ = workers
    other = mp.Driver(cluster.spec_path, key=cluster.keys_dir / "driver2.key", timeout=30.0)
    try:
        refused = _refused(lambda: mp.evaluate(other, lambda: mp.put("P0", mp.device("SP0")(
            jnp.add)(_load("P0"), _load("P1")))))
    finally:
        other.close()
    assert re.fullmatch(r"party 0 \(node_0 at \S+\): node_0's policy does not accept driver "
                        r"'driver2' \(drivers: \[driver\] in \S+node_0\.yaml\) \(at "
                        r"test_policies\.py:\d+\)", str(refused)), refused


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
                           "aggregate, compare, intersection, dp, any\n")
    assert "Traceback" not in done.stderr
