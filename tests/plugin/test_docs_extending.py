"""``docs/extending.md`` stays true: its code blocks are checked against the code.

Every fenced block is preceded by a marker comment, or is not Python:

- ``<!-- excerpt: PATH -->``: the block's text appears verbatim in ``PATH`` (the
  example plugin's source, or MPLang's own), so the guide cannot drift from it;
- ``<!-- runnable -->``: the runnable blocks, concatenated in order, run in a
  fresh interpreter with the example plugin installed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "extending.md"
FENCE = re.compile(r"(?:<!-- (?P<mark>runnable|excerpt: (?P<path>\S+)) -->\n)?"
                   r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$", re.S | re.M)


def blocks() -> list[tuple[str | None, str | None, str, str]]:
    """(marker, excerpt path, language, text) of each fenced block, in order."""
    return [(m["mark"], m["path"], m["lang"], m["body"]) for m in FENCE.finditer(DOC.read_text())]


def test_every_python_block_is_an_excerpt_or_runnable() -> None:
    found = blocks()
    assert len(found) >= 15
    unmarked = [body[:60] for mark, _, lang, body in found if lang == "python" and mark is None]
    assert not unmarked, f"python blocks without an excerpt/runnable marker: {unmarked}"
    assert sum(1 for mark, *_ in found if mark == "runnable") >= 2


@pytest.mark.parametrize("index", [i for i, (mark, *_) in enumerate(blocks())
                                   if mark and mark.startswith("excerpt")])
def test_excerpts_appear_verbatim_in_their_files(index: int) -> None:
    _, path, _, body = blocks()[index]
    assert path is not None
    source = (ROOT / path).read_text()
    assert body.strip(), f"block {index} is empty"
    assert body in source, f"block {index} is no longer an excerpt of {path}:\n{body}"


def test_the_guide_covers_every_registration() -> None:
    text = DOC.read_text()
    for api in ("@register_type(", ".simple_op(", "Primitive(", ".def_type_rule", "OpTraits(",
                "@feop(", "register_backend(", "@backend.state", "@backend.kernel(",
                "register_value_codec(", "register_kind(", "register_move(",
                '[project.entry-points."mplang.plugins"]', "mplang worker", "--plugin cms",
                "mplang up", "mplang ops", "plugins=[\"cms\"]"):
        assert api in text, api


def test_runnable_blocks_run(cms: ModuleType, tmp_path: Path) -> None:
    code = "\n\n".join(body for mark, _, _, body in blocks() if mark == "runnable")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "cms.merge" in result.stdout and "'communicates': True" in result.stdout
