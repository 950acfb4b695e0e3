"""Every tutorial in ``docs/tutorials/`` runs as written and prints exactly what it shows.

Each numbered tutorial runs in a fresh interpreter (``markdown_blocks.py`` as a
script), in its own empty folder: one process per tutorial keeps what a
tutorial registers (its own ops, a plugin) and warnings shown once per process
from leaking into other tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import parse_blocks

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS_DIR = ROOT / "docs" / "tutorials"
TUTORIALS = sorted(TUTORIALS_DIR.glob("[0-9][0-9]_*.md"))
RUNNER = Path(__file__).with_name("markdown_blocks.py")


def test_at_least_eight_tutorials_numbered_without_gaps() -> None:
    numbers = [int(path.name[:2]) for path in TUTORIALS]
    assert len(numbers) >= 8, [path.name for path in TUTORIALS]
    assert numbers == list(range(1, len(numbers) + 1))


def test_the_index_links_every_tutorial() -> None:
    index = (TUTORIALS_DIR / "README.md").read_text()
    missing = [path.name for path in TUTORIALS if f"]({path.name})" not in index]
    assert not missing, f"docs/tutorials/README.md does not link {missing}"


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda path: path.stem)
def test_tutorial_runs_and_prints_what_it_shows(path: Path, tmp_path: Path) -> None:
    blocks = parse_blocks(path.read_text())
    shown = [b for b in blocks if b.runs and b.expected is not None]
    assert len(shown) >= 2, f"{path.name} shows the output of fewer than 2 blocks"
    proc = subprocess.run([sys.executable, str(RUNNER), str(path), "--cwd", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
