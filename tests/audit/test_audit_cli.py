"""``mplang up --audit-dir DIR`` gives each worker the log ``DIR/<node>.jsonl``; without it
each worker logs to ``./audit/<node>.jsonl`` under the working directory."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.runtime.audit import read_events
from tests.http import support


def _up(tmp_path: Path, extra: list[str]) -> subprocess.Popen[str]:
    init = subprocess.run([*support.mplang_command(), "init", "--nodes", "2", "--out",
                           str(tmp_path / "c")], capture_output=True, text=True, timeout=60)
    assert init.returncode == 0, init.stderr
    proc = subprocess.Popen([*support.mplang_command(), "up", "--cluster",
                             str(tmp_path / "c" / "cluster.yaml"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if "all workers are ready" in line:
            return proc
        assert time.monotonic() < deadline, "mplang up was not ready within 60 s"
    proc.kill()
    raise AssertionError(f"mplang up exited: {proc.communicate()[1]}")


@pytest.mark.parametrize("where", ["--audit-dir", "default"])
def test_mplang_up_writes_one_audit_log_per_node(tmp_path: Path, where: str) -> None:
    logs = tmp_path / ("logs" if where == "--audit-dir" else "audit")
    proc = _up(tmp_path, ["--audit-dir", str(logs)] if where == "--audit-dir" else [])
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
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    assert sorted(p.name for p in logs.iterdir()) == ["node_0.jsonl", "node_1.jsonl"]
    events = read_events([logs / "node_1.jsonl"])
    assert [e["event"] for e in events] == ["execution", "end", "fetch"]
    assert events[0]["verdict"] == "accepted" and events[0]["driver"]["name"] == "driver"
    assert events[1]["status"] == "ok"
    assert (events[2]["kind"], events[2]["node"]) == ("plaintext", "node_1")
