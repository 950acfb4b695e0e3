"""docs/deployment.md runs as written: four parties make their own keys, exchange only
certificates, start their workers with their own keys, and the analyst drives."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mplang.cluster.identity import load_certificate
from mplang.cluster.status import package_version
from tests.worker import support

DOC = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.S)


def _mplang(line: str) -> list[str]:
    words = shlex.split(line)
    assert words[0] == "mplang", line
    return [sys.executable, "-m", "mplang.cli", *words[1:]]


def check_status(folder: Path, ports: list[int]) -> None:
    """The ``mplang status`` of the doc prints what the doc shows, with this run's ports
    and fingerprints (compared cell by cell: the columns' widths follow them)."""
    (console,) = _blocks("console")
    command, *shown = console.strip().splitlines()
    expected = "\n".join(shown)
    for i, (old, new) in enumerate(zip(("7101", "7102", "7103"), ports, strict=True)):
        shown_fp = shown[i + 1].split()[3]
        real_fp = load_certificate(str(folder / "certs" / f"node_{i}.crt")).fingerprint[:16]
        expected = expected.replace(old, str(new)).replace(shown_fp, real_fp)
    done = subprocess.run(_mplang(command.removeprefix("$ ")), cwd=folder, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.split() for line in done.stdout.splitlines()] == [
        line.split() for line in expected.replace("0.1.0", package_version()).splitlines()]


def test_deployment_walkthrough_runs(tmp_path: Path) -> None:
    keygens, workers = _blocks("bash")
    for line in keygens.strip().splitlines():
        subprocess.run(_mplang(line), cwd=tmp_path, check=True, timeout=60,
                       capture_output=True)
    made = list(tmp_path.glob("*/*.crt"))
    certs = tmp_path / "certs"
    certs.mkdir()
    for crt in made:  # only certificates travel
        shutil.copy(crt, certs / crt.name)
    (spec_text,) = _blocks("yaml")
    ports = support.free_ports(3)
    for old, new in zip(("7101", "7102", "7103"), ports, strict=True):
        spec_text = spec_text.replace(old, str(new))
    (tmp_path / "cluster.yaml").write_text(spec_text)
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    procs = []
    try:
        for line, log in zip(workers.strip().splitlines(), logs, strict=True):
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(_mplang(line), cwd=tmp_path, stdout=out,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 60
        for i, log in enumerate(logs):
            while "ready at https://" not in log.read_text():
                assert procs[i].poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            assert f"node_{i} ready" in log.read_text()
        check_status(tmp_path, ports)
        (script,) = _blocks("python")
        result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        expected = script.split("# ")[-1].splitlines()[0].strip()
        assert result.stdout.strip() == expected
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
