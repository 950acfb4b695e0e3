"""docs/api.md: generated from the docstrings, current, and complete."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from mplang.cli import apidoc
from mplang.cli.main import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
API_MD = ROOT / "docs" / "api.md"

SAMPLE = '''
"""A sample module."""

from dataclasses import dataclass

LIMIT = 3
"""The limit."""
FLAGS = frozenset({"zeta", "alpha", "mid"})
"""Flags, printed sorted."""
BARE = 1


def documented(x: int, *, scale: float = 2.0) -> float:
    """Scale ``x``.

    Longer text.
    """
    return x * scale


def undocumented(y, cb=print):
    return y


class Base:
    """A base class."""

    def shared(self) -> None:
        """Shared by subclasses."""


class Thing(Base):
    """A thing."""

    def run(self, n: int) -> int:
        """Run ``n`` times."""
        return n

    def stop(self) -> None:
        pass

    @property
    def size(self) -> int:
        return 0

    def _private(self) -> None:
        pass


@dataclass
class Record:
    value: int
'''


@pytest.fixture
def sample(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[apidoc.ModuleDoc]:
    (tmp_path / "apidoc_sample.py").write_text(textwrap.dedent(SAMPLE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "apidoc_sample", raising=False)
    return apidoc.collect([apidoc.PublicModule("sample", "apidoc_sample", "Samples")])


def test_api_md_is_current() -> None:
    committed = API_MD.read_text(encoding="utf-8")
    generated = apidoc.generate()
    if generated != committed:
        old, new = committed.splitlines(), generated.splitlines()
        line = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b),
                    min(len(old), len(new)))
        pytest.fail("docs/api.md is stale: run mplang apidoc -o docs/api.md "
                    f"(first difference at line {line + 1})")


def test_every_public_name_has_a_docstring() -> None:
    missing = apidoc.missing_docstrings(apidoc.collect())
    assert not missing, "public names without a docstring:\n  " + "\n  ".join(missing)


def test_checker_reports_undocumented_names(sample: list[apidoc.ModuleDoc]) -> None:
    assert apidoc.missing_docstrings(sample) == [
        "apidoc_sample.BARE",
        "apidoc_sample.Record",
        "apidoc_sample.Thing.size",
        "apidoc_sample.Thing.stop",
        "apidoc_sample.undocumented",
    ]


def test_checker_reports_a_module_without_docstring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "apidoc_bare.py").write_text('def f():\n    """F."""\n', encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    docs = apidoc.collect([apidoc.PublicModule("bare", "apidoc_bare", "Samples")])
    assert apidoc.missing_docstrings(docs) == ["apidoc_bare"]


def test_render_shows_kinds_signatures_and_docstrings(sample: list[apidoc.ModuleDoc]) -> None:
    text = apidoc.render(sample)
    assert "- [`sample`](#sample): A sample module." in text
    assert "- [`Thing`](#samplething) (class)" in text
    assert "documented(x: int, *, scale: float = 2.0) -> float" in text
    assert "Scale ``x``.\n\nLonger text." in text
    assert "undocumented(y, cb=print)" in text
    assert "FLAGS = frozenset({'alpha', 'mid', 'zeta'})" in text
    assert "LIMIT = 3\n```\n\nThe limit." in text
    assert "#### sample.Thing.run\n\n*method*\n\n```python\nrun(n: int) -> int" in text
    assert "#### sample.Thing.size\n\n*property*\n\n```python\nsize: int" in text
    assert "#### sample.Thing.stop\n\n*method*\n\n```python\nstop() -> None\n```\n\n" \
        "*(no docstring)*" in text
    assert "_private" not in text
    assert "Inherited from [`sample.Base`](#samplebase): `shared`." in text


def test_main_writes_the_file_or_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "api.md"
    assert apidoc.main(["-o", str(out)]) == 0
    assert apidoc.main([]) == 0
    assert out.read_text(encoding="utf-8") == capsys.readouterr().out == apidoc.generate()


def test_the_mplang_command_writes_the_same_file(tmp_path: Path) -> None:
    out = tmp_path / "api.md"
    assert cli_main(["apidoc", "-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == apidoc.generate()


def _github_anchors(markdown: str) -> set[str]:
    anchors: set[str] = set()
    counts: dict[str, int] = {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        anchors.add(f"{slug}-{n}" if n else slug)
    return anchors


def test_every_link_in_api_md_has_a_heading() -> None:
    text = API_MD.read_text(encoding="utf-8")
    anchors = _github_anchors(text)
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert {"mplangdevice", "mplangdevice-1"} <= links  # mplang.Device, mplang.device
    assert links - anchors == set()
