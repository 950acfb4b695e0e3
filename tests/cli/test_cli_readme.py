"""The `mplang` command and the README's example, run as a user would."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mplang.cli.main import main
from tests.docs.markdown_blocks import Block, parse_blocks, run_blocks

ROOT = Path(__file__).resolve().parents[2]


def test_demo_prints_each_step(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "3 parties" in out
    assert "ring shift" in out
    # party 0's vector [1,2,3] squared, and the gathered sum 6 + 12 + 18 = 36
    assert "party 0: [1. 4. 9.]" in out
    assert "party 0: 36.0" in out
    assert "millionaire's problem, revealed to P0 only: is P0 poorer than P1? True" in out
    assert "secure mean of the 3 private vectors, revealed to P0: 4.0000" in out


def test_demo_results_match_numpy() -> None:
    from mplang.libs.demo import run_demo

    results = run_demo(4, echo=lambda _: None)
    vectors = [np.arange(1, 4, dtype=np.float32) * (i + 1) for i in range(4)]
    for got, want in zip(results[0], vectors, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(results[1], vectors, strict=True):
        np.testing.assert_array_equal(got, want**2)
    assert results[3][0] == pytest.approx(sum(v.sum() for v in vectors))
    assert results[3][1:] == [None, None, None]
    assert list(results[4]) == [0, 2, 4, 6]
    assert list(results[5]) == [5, 5, 5, 5]
    assert bool(results[6]) is True
    assert results[7] == pytest.approx(np.mean(vectors), abs=1e-3)


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "user_prog.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_ir_prints_a_functions_ir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, """
        import jax.numpy as jnp
        from mplang import simp

        def prog(a):
            x = simp.constant((0,), a)
            return simp.shuffle_static(simp.pcall((0,), jnp.square, x), {1: 0})
    """)
    assert main(["ir", f"{path}:prog", "--arg", "3", "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("func @prog() -> (i32[]@{1}) {")
    assert "simp.constant() {parties={0}, value=3:int32}" in out
    assert "tensor.run_jax(" in out and "{fn='square'}" in out
    assert "simp.shuffle_static(" in out and "{routes={1: 0}}" in out


def test_ir_reports_type_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, """
        from mplang import simp

        def bad():
            return simp.converge(simp.constant((0, 1), 1), simp.constant((1,), 2))
    """)
    assert main(["ir", f"{path}:bad"]) == 1
    err = capsys.readouterr().err
    assert "MPTypeError" in err and "simp.converge" in err and "overlap on {1}" in err


@pytest.mark.parametrize("target", ["nofile.py:f", "justtext", "{path}:missing"])
def test_ir_rejects_bad_targets(tmp_path: Path, target: str) -> None:
    path = _write(tmp_path, "x = 1\n")
    with pytest.raises(SystemExit, match="mplang ir"):
        main(["ir", target.format(path=path)])


def test_console_script_runs_demo() -> None:
    proc = subprocess.run([sys.executable, "-m", "mplang.cli", "demo", "--world-size", "2"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "2 parties" in proc.stdout


README = ROOT / "README.md"


def _readme_python_blocks() -> list[Block]:
    return [b for b in parse_blocks(README.read_text()) if b.lang == "python"]


def test_readme_examples_run(tmp_path: Path) -> None:
    blocks = _readme_python_blocks()
    assert len(blocks) == 3, "README's python examples changed: update this test"
    assert all(b.expected for b in blocks), "every README example shows what it prints"
    # the device example continues the first one; the third needs worker processes (below)
    first, device = (o.stdout for o in run_blocks(README, blocks[:2], tmp_path))
    assert first.startswith("[None, np.int32(9), None]\n")
    assert "simp.shuffle_static" in first
    assert device == "True\n"
    assert (tmp_path / "prog.mpl").exists()


def test_readme_driver_example_runs_on_worker_processes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mplang.cluster.local import LocalCluster

    monkeypatch.chdir(tmp_path)  # the workers read their files from ./data/NODE
    commands = [b.body for b in parse_blocks(README.read_text()) if b.lang == "bash"][2]
    init = commands.splitlines()[0].split("#")[0].split()
    assert init[:2] == [".venv/bin/mplang", "init"], init
    subprocess.run([sys.executable, "-m", "mplang.cli", *init[1:]], check=True, timeout=120)
    namespace: dict[str, Any] = {}
    with LocalCluster(tmp_path / "dev" / "cluster.yaml"):
        try:
            outcomes = run_blocks(README, _readme_python_blocks(), tmp_path, namespace)
        finally:
            if "drv" in namespace:
                namespace["drv"].close()
    assert outcomes[-1].stdout == "True\n"
