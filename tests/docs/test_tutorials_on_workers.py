"""The tutorials on worker processes (slow: ``pytest -m slow``): each ``mp.Simulator`` of a
tutorial becomes one ``mplang worker`` per node under the policies the simulator judges by
(`tests.docs.on_workers`), and the tutorial prints exactly what it shows. Three do not run
so: `NOT_ON_WORKERS` says why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.test_tutorials import RUNNER, TUTORIALS

NOT_ON_WORKERS = {
    "07_analysis": "its simulator delays messages (latency_ms=200) to time the scheduler",
    "08_extending": "it defines an op in the driver's process; workers load it as a plugin",
    "13_dp": "the same refusal, worded by the party that answered first (node_1 on workers)",
}


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in TUTORIALS if p.stem not in NOT_ON_WORKERS],
                         ids=lambda path: path.stem)
def test_tutorial_prints_the_same_on_workers(path: Path, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(RUNNER), str(path), "--cwd", str(tmp_path),
                           "--workers"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    simulated = "mp.Simulator(" in path.read_text()  # 05 starts its workers itself
    assert ("none started" not in proc.stderr) == simulated, proc.stderr[-2000:]
