"""The examples of docs/psi.md's n-party and unbalanced sections run as written and print
what the document shows."""

from __future__ import annotations

from pathlib import Path

from tests.docs.markdown_blocks import parse_blocks, run_blocks

DOC = Path(__file__).resolve().parents[3] / "docs" / "psi.md"


def test_the_n_party_and_unbalanced_examples_run(tmp_path: Path) -> None:
    text = DOC.read_text()
    start = text[: text.index("## `psi.join_n(")].count("\n") + 1
    blocks = [b for b in parse_blocks(text) if b.line > start]
    assert [b.lang for b in blocks if b.runs] == ["python", "python"]
    outcomes = run_blocks(DOC, blocks, tmp_path)
    assert [o.stdout.splitlines()[0] for o in outcomes] == ["[150, 150, 150]", "100000"]
