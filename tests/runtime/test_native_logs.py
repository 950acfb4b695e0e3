"""The native libraries' logs (libpsi, libspu, perfetto) stay out of a program's output:
a PSI program run as a script or with ``mplang run --sim`` prints only what it prints, and
the lines go to the party's log; ``MPLANG_LOG=info`` shows them on the terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import mplang as mp

PROGRAM = """\
import logging

import pyarrow as pa
import mplang as mp
from mplang import simp
from mplang.dialects import table
from mplang.libs import psi


@mp.function
def shared():
    a = simp.pcall((0,), lambda: table.constant(pa.table({"id": pa.array([1, 2, 3, 4])})))
    b = simp.pcall((1,), lambda: table.constant(pa.table({"id": pa.array([3, 4, 5])})))
    left, _ = psi.join(a, b, "id")
    return simp.pcall((0,), lambda t: table.to_tensor(t, ["id"]), left)


def main(ctx):
    print("before the join")
    print("shared ids:", mp.fetch(ctx, mp.evaluate(ctx, shared))[0].ravel().tolist())
    logging.warning("a warning after the join")
"""
"""A program that joins with libpsi: `main(ctx)` runs it (``mplang run`` calls it)."""
POLICY = "plaintext_to: ['*']\nwrites: ['*']\n"
"""Each node's ``policies/NODE.yaml``: it allows what the program does (its join keeps
fewer rows than the ``min_rows`` of the policy `mplang init` writes), and, unlike
``policies="open"``, prints no note of its own."""
SCRIPT = [sys.executable, "-c", "import logging, mplang as mp, prog; logging.basicConfig(); "
          "prog.main(mp.Simulator(2, policies='policies'))"]
OUTPUT = "before the join\nshared ids: [3, 4]\n"
CLI = Path(sys.executable).with_name("mplang")


def run(tmp_path: Path, command: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "policies").mkdir()
    for node in ("node_0", "node_1"):
        (tmp_path / "policies" / f"{node}.yaml").write_text(POLICY)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MPLANG_LOG")}
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**environ, **env})


@pytest.mark.parametrize(("command", "warning"), [
    (SCRIPT, "WARNING:root:a warning after the join\n"),  # a handler made before the join
    ([str(CLI), "run", "--sim", "2", "--policies", "policies", "prog.py"],
     "WARNING:root:a warning after the join\n")],
    ids=["script", "mplang run"])
def test_a_psi_run_prints_only_the_programs_output(tmp_path: Path, command: list[str],
                                                   warning: str) -> None:
    log = tmp_path / "native.log"
    done = run(tmp_path, command, MPLANG_LOG_FILE=str(log))
    assert (done.returncode, done.stdout, done.stderr) == (0, OUTPUT, warning)
    text = log.read_text()
    assert "[info] [launch.cc:" in text  # libpsi's
    assert "perfetto.cc" in text


def test_the_default_log_is_a_file_named_by_the_process(tmp_path: Path) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = run(tmp_path, SCRIPT, TMPDIR=str(tmp))
    assert (done.returncode, done.stdout) == (0, OUTPUT)
    [log] = (tmp / "mplang-logs").iterdir()
    assert log.name.startswith("native-") and "[info] [launch.cc:" in log.read_text()
    assert log.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("level", ["info", "DEBUG"])
def test_mplang_log_shows_them_on_the_terminal(tmp_path: Path, level: str) -> None:
    log = tmp_path / "native.log"
    done = run(tmp_path, SCRIPT, MPLANG_LOG=level, MPLANG_LOG_FILE=str(log))
    assert done.returncode == 0
    assert "[info] [launch.cc:" in done.stdout
    assert "before the join\n" in done.stdout and "shared ids: [3, 4]\n" in done.stdout
    assert not log.exists()


def test_a_wrong_mplang_log_is_refused_when_the_simulator_starts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPLANG_LOG", "loud")
    with pytest.raises(mp.MPLangError) as info:
        mp.Simulator(2)
    assert str(info.value) == (
        "MPLANG_LOG='loud' is not a log setting: use MPLANG_LOG=info or MPLANG_LOG=debug to "
        "see the native libraries' logs on the terminal, or leave it unset to keep them in the "
        "party's log")
