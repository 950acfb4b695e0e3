"""No tracked text file keeps a merge's conflict markers."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(rb"^(<{7} |={7}$|>{7} )", re.MULTILINE)


def test_no_tracked_file_has_conflict_markers() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.split(b"\0")
    marked = [name.decode() for name in files if name and (ROOT / name.decode()).is_file()
              and MARKER.search((ROOT / name.decode()).read_bytes())]
    assert marked == []
