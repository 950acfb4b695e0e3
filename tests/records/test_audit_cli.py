"""``mplang up --audit-dir DIR`` gives each worker the log ``DIR/<node>.jsonl``; without it,
and ``mplang worker`` without ``--audit-log``, each worker logs to ``./audit/<node>.jsonl``
under the working directory."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.records.audit import read_events
from tests.worker import support


def _start(tmp_path: Path, args: list[str], ready: str) -> subprocess.Popen[str]:
    """``mplang ARGS`` in ``tmp_path``, once it printed ``ready``."""
    proc = subprocess.Popen([*support.mplang_command(), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if ready in line:
            return proc
        assert time.monotonic() < deadline, f"mplang {args[0]} was not ready within 60 s"
    proc.kill()
    raise AssertionError(f"mplang {args[0]} exited: {proc.communicate()[1]}")


@pytest.mark.parametrize("where", ["up --audit-dir", "up", "worker"])
def test_each_worker_writes_its_own_audit_log(tmp_path: Path, where: str) -> None:
    """``mplang up --audit-dir DIR``: DIR/<node>.jsonl; ``mplang up`` and ``mplang worker``
    without options: ./audit/<node>.jsonl."""
    init = subprocess.run([*support.mplang_command(), "init", "--nodes", "2", "--out",
                           str(tmp_path / "c")], capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    spec = str(tmp_path / "c" / "cluster.yaml")
    logs = tmp_path / ("logs" if where == "up --audit-dir" else "audit")
    if where == "worker":
        procs = [_start(tmp_path, ["worker", "--cluster", spec, "--node", f"node_{i}"],
                        "ready at") for i in range(2)]
    else:
        procs = [_start(tmp_path, ["up", "--cluster", spec, *(
            ["--audit-dir", str(logs)] if where == "up --audit-dir" else [])],
            "all workers are ready")]
    try:
        driver = mp.Driver(tmp_path / "c" / "cluster.yaml",
                           key=tmp_path / "c" / "keys" / "driver.key")
        try:
            out = mp.evaluate(driver, lambda: simp.pcall(
                (1,), lambda v: v + 1, simp.constant((1,), np.int32(41))))
            assert int(mp.fetch(driver, out)[1]) == 42
        finally:
            driver.close()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGINT)
        for proc in procs:
            proc.wait(timeout=30)
    assert sorted(p.name for p in logs.iterdir()) == ["node_0.jsonl", "node_1.jsonl"]
    events = read_events([logs / "node_1.jsonl"])
    assert [e["event"] for e in events] == ["execution", "end", "fetch"]
    assert events[0]["verdict"] == "accepted" and events[0]["driver"]["name"] == "driver"
    assert events[1]["status"] == "ok"
    assert (events[2]["kind"], events[2]["node"]) == ("plaintext", "node_1")
