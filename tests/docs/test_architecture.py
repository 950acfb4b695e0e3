"""docs/architecture.md stays true: every module and file it names exists and imports."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"


def named_paths() -> list[str]:
    """The files the page names in backticks (``mplang/api.py``; a bare name after one of
    the package's files, ``run_route.py``, is in that file's folder)."""
    found, folder = [], ""
    for path in re.findall(r"`([\w/.*<>]+\.py)`", PAGE.read_text()):
        if path.startswith("mplang/"):
            folder = path.rsplit("/", 1)[0]
        elif "/" not in path and folder:
            path = f"{folder}/{path}"
        found.append(path)
    return found


def test_every_module_the_page_names_imports() -> None:
    paths = named_paths()
    assert len(paths) >= 25, paths
    for path in paths:
        if "<" in path:  # a pattern: `mplang/dialects/<name>.py`
            assert (ROOT / path.split("<", 1)[0]).is_dir(), path
            continue
        for file in sorted(ROOT.glob(path)) or [ROOT / path]:
            assert file.is_file(), path
            if file.parts[len(ROOT.parts)] == "mplang":
                module = ".".join(file.relative_to(ROOT).with_suffix("").parts)
                importlib.import_module(module.removesuffix(".__init__"))


def test_every_folder_of_the_package_is_on_the_page() -> None:
    text = PAGE.read_text()
    folders = sorted(p.name for p in (ROOT / "mplang").iterdir()
                     if p.is_dir() and (p / "__init__.py").exists())
    assert [f for f in folders if f"`mplang/{f}`" not in text] == []
