"""The Markdown runner: which blocks run, how outputs are matched, and that it fails when a
block prints something else than its document shows."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.docs.markdown_blocks import MarkdownRunError, parse_blocks, run_markdown

FENCE = "```"


def doc(tmp_path: Path, text: str) -> Path:
    """``text`` (with ``'''`` standing for a fence) as ``tmp_path/doc.md``."""
    path = tmp_path / "doc.md"
    path.write_text(textwrap.dedent(text).replace("'''", FENCE))
    return path


def test_blocks_with_their_outputs_and_markers() -> None:
    blocks = parse_blocks(textwrap.dedent("""\
        intro
        '''python
        print(1)
        '''

        '''text
        1
        '''
        '''yaml file=spec.yaml
        a: 1
        '''
        '''bash background
        server
        '''
    """).replace("'''", FENCE))
    assert [(b.lang, b.tags, b.line, b.expected) for b in blocks] == [
        ("python", (), 3, "1\n"), ("yaml", ("file=spec.yaml",), 10, None),
        ("bash", ("background",), 13, None)]
    assert [b.runs for b in blocks] == [True, False, True]
    assert blocks[1].file == "spec.yaml" and blocks[2].background


def test_blocks_share_a_namespace_and_a_folder(tmp_path: Path) -> None:
    path = doc(tmp_path, """\
        '''python
        from pathlib import Path
        Path("note.txt").write_text("hi")
        x = 41
        '''
        '''python
        print(x + 1, Path("note.txt").read_text())
        '''
        '''text
        42 hi
        '''
        '''python file=helper.py
        VALUE = 7
        '''
        '''bash
        cat helper.py
        '''
        '''text
        VALUE = 7
        '''
    """)
    work = tmp_path / "work"
    work.mkdir()
    outcomes = run_markdown(path, work)
    assert [o.stdout for o in outcomes] == ["", "42 hi\n", "VALUE = 7\n"]
    assert (work / "note.txt").read_text() == "hi"


@pytest.mark.parametrize("shown, printed, problem", [
    ("'''text\n2\n'''\n", "print(1)", "printed something else than the text block"),
    ("", "print(1)", "shows no output"),
    ("'''text\n1\n'''\n", "pass", "printed something else than the text block"),
    ("'''text\n1\n\n'''\n", "print(1)", "printed something else than the text block"),
])
def test_an_output_other_than_shown_fails(tmp_path: Path, shown: str, printed: str,
                                          problem: str) -> None:
    path = doc(tmp_path, f"'''python\n{printed}\n'''\n\n{shown}")
    with pytest.raises(MarkdownRunError, match=problem) as info:
        run_markdown(path, tmp_path)
    assert "doc.md:2 (python block)" in str(info.value)


def test_a_text_block_after_prose_is_refused() -> None:
    with pytest.raises(MarkdownRunError, match="line 6: a text block shows output"):
        parse_blocks("```python\nprint(1)\n```\nprose\n```text\n1\n```\n")


def test_errors_name_the_markdown_line(tmp_path: Path) -> None:
    path = doc(tmp_path, """\
        '''python
        x = 1
        y = x / 0
        '''
    """)
    with pytest.raises(ZeroDivisionError) as info:
        run_markdown(path, tmp_path)
    assert any("doc.md:2 (python block)" in note for note in info.value.__notes__)
    assert info.traceback[-1].lineno + 1 == 3  # the file's own line numbers


def test_a_failing_bash_block_fails(tmp_path: Path) -> None:
    path = doc(tmp_path, "'''bash\necho partial\nfalse\necho never\n'''\n")
    with pytest.raises(MarkdownRunError, match="exited with code 1"):
        run_markdown(path, tmp_path)


def test_a_background_block_runs_until_the_end(tmp_path: Path) -> None:
    path = doc(tmp_path, """\
        '''python file=server.py
        import os, time
        open("pid", "w").write(str(os.getpid()))
        print("server ready", flush=True)
        time.sleep(60)
        '''
        '''bash background
        python server.py
        '''
        '''bash
        kill -0 "$(cat pid)" && echo alive
        '''
        '''text
        alive
        '''
    """)
    run_markdown(path, tmp_path)
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped
