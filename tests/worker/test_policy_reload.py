"""An edited policy file takes effect on worker processes without a restart.

Two worker processes with `mplang init`'s development policies; each test edits
node_0's policy file and waits for node_0's log to say it reloaded (or kept) it: the
watcher looks once a second, so that is within 2 s of the edit. Each test puts the
file back afterwards. `PolicyFile` alone: what an edit that does not load leaves.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.cli.main import main
from mplang.cluster.local import LocalCluster
from mplang.dialects import table
from mplang.policy import Policy, PolicyError
from mplang.policy.enforce import PolicyFile
from tests.worker import support

RELOADED, KEPT = "reloaded policy", "keeping the policy in force"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = support.spec_dict(support.free_ports(2))
    del spec["devices"]["SP0"]
    base = tmp_path_factory.mktemp("policy_reload")
    for node in ("node_0", "node_1"):
        (base / "data" / node).mkdir(parents=True)
    with support.running_cluster(mp.ClusterSpec.from_dict(spec), data_root=base / "data") \
            as local:
        yield local


@pytest.fixture
def policy(cluster: LocalCluster) -> Iterator[Path]:
    """node_0's policy file, put back (and reloaded) after the test."""
    path = cluster.spec_path.parent / "policies" / "node_0.yaml"
    original = path.read_text()
    yield path
    if path.read_text() != original:
        edit(cluster, path, lambda _: original, RELOADED)


def edit(cluster: LocalCluster, path: Path, change: Callable[[str], str], logged: str) -> None:
    """Rewrite ``path`` with ``change`` and wait until node_0 logs ``logged`` once more,
    within 2 s."""
    before = cluster.log_tail("node_0", 1 << 20).count(logged)
    path.write_text(change(path.read_text()))
    deadline = time.monotonic() + 2.0
    while cluster.log_tail("node_0", 1 << 20).count(logged) == before:
        assert time.monotonic() < deadline, f"node_0 did not log {logged!r} within 2 s"
        time.sleep(0.05)


def write_report() -> Any:
    """node_0 writes ``out.csv`` into its data root (the development policy allows no
    writes)."""
    t = simp.pcall((0,), lambda: table.constant({"a": np.array([1, 2], np.int64)}))
    return simp.pcall((0,), lambda u: table.write_csv(u, "out.csv"), t)


def add_one() -> Any:
    return simp.pcall((0,), lambda v: v + 1, simp.constant((0,), np.int64(5)))


def test_an_edit_refuses_what_was_accepted_and_accepts_what_was_refused(
        cluster: LocalCluster, policy: Path) -> None:
    out = cluster.data_root / "node_0" / "out.csv"  # type: ignore[operator]
    with support.connected_driver(cluster) as driver:
        with pytest.raises(mp.MPRefusedError) as refused:
            mp.evaluate(driver, write_report)
        assert f"'out.csv' into this party's data root: writes: [] in {policy} does not " \
            "allow it" in str(refused.value)
        assert not out.exists()
        edit(cluster, policy, lambda t: t.replace("writes: []", "writes: [out.csv]"), RELOADED)
        mp.evaluate(driver, write_report)
        assert out.read_text().split() == ['"a"', "1", "2"]
        assert mp.fetch(driver, mp.evaluate(driver, add_one))[0] == 6
        edit(cluster, policy, lambda t: t.replace("drivers: [driver]", "drivers: [driver2]"),
             RELOADED)
        with pytest.raises(mp.MPRefusedError) as refused:
            mp.evaluate(driver, add_one)
        assert f"driver 'driver' is not in drivers [driver2] of {policy}" in str(refused.value)


def test_a_malformed_edit_keeps_the_policy_and_status_shows_it(
        cluster: LocalCluster, policy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = policy.read_text().count("\n")
    bad = (f"{policy}:{lines + 2}: declassify: when must be one of aggregate, compare, "
           "intersection, dp, any")
    edit(cluster, policy, lambda t: t + "  - to: [driver]\n    when: sometimes\n", KEPT)
    assert bad in cluster.log_tail("node_0", 1 << 20)
    with support.connected_driver(cluster) as driver:
        assert mp.fetch(driver, mp.evaluate(driver, add_one))[0] == 6
        with pytest.raises(mp.MPRefusedError, match=r"writes: \[\] in "):
            mp.evaluate(driver, write_report)  # the old policy still judges
    assert main(["status", "--cluster", str(cluster.spec_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "2 of 2 nodes up"
    assert out[-1].startswith(f"- node_0 keeps the policy in force, {policy} (sha256 ")
    assert out[-1].endswith(f"...): {bad} (fix the file: the worker loads it within 2 s)")
    edit(cluster, policy, lambda t: t[:t.index("  - to: [driver]\n    when: sometimes")],
         RELOADED)
    assert main(["status", "--cluster", str(cluster.spec_path)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "2 of 2 nodes up, with the pinned certificates and this spec")


def test_an_edit_that_does_not_load_keeps_the_policy_and_says_why(tmp_path: Path) -> None:
    """An optional file stands for the default policy until it appears; an edit is taken
    once it is the same at two calls in a row (a file caught half-written is not); each
    edit that does not load (not UTF-8, not YAML, removed) keeps the policy in force, is
    raised once and stays in `state` until the file loads."""
    path = tmp_path / "node_0.yaml"
    file = PolicyFile(path, required=False)
    assert file.policy == Policy.default()
    assert file.state() == {"policy": f"the default policy ({path} does not exist)"}
    path.write_text("drivers: [")  # caught half-written: not taken
    assert file.reload() is None and file.policy == Policy.default()
    path.write_text("drivers: [driver]\n")
    assert file.reload() is None  # changed since the last call: one more to be sure
    assert file.reload() == file.policy == Policy(drivers=("driver",), source=str(path))
    assert file.reload() is None
    good = file.state()["policy"]
    edits: list[tuple[Callable[[], object], str]] = [
        (lambda: path.write_bytes(b"drivers: [\xff]\n"),
         f"cannot read policy {path}: 'utf-8' codec can't decode byte 0xff"),
        (lambda: path.write_text("drivers: [driver\n"), f"{path}:2: not valid YAML"),
        (path.unlink, f"cannot read policy {path}: No such file or directory")]
    for edit_, error in edits:
        edit_()
        assert file.reload() is None
        with pytest.raises(PolicyError, match=f"^{re.escape(error)}"):
            file.reload()
        assert file.reload() is None  # raised once per edit
        assert file.policy.drivers == ("driver",)
        assert file.state()["policy"] == good
        assert file.state()["policy_reload_failed"].startswith(error)
    path.write_text("drivers: [driver, driver2]\n")
    assert file.reload() is None
    assert file.reload() is not None and file.policy.drivers == ("driver", "driver2")
    assert "policy_reload_failed" not in file.state()
