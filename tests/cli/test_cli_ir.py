"""``mplang ir FILE.py:FUNC --format text|dot|svg|html [-o FILE]``."""

from __future__ import annotations

import shutil
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mplang.cli.main import main

needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="graphviz's dot program is not installed")
PROGRAM = """
    import jax.numpy as jnp
    from mplang import simp

    def prog(a):
        x = simp.constant((0,), a)
        return simp.shuffle_static(simp.pcall((0,), jnp.square, x), {1: 0})

    def bad():
        return simp.converge(simp.constant((0, 1), 1), simp.constant((1,), 2))

    def broken():
        simp.constant((0,), 1)
        return 1 // 0
"""
SHUFFLE_EDGE = 'label="simp.shuffle_static\\ni32[]@{0}"'


@pytest.fixture
def prog_file(tmp_path: Path) -> Path:
    path = tmp_path / "user_prog.py"
    path.write_text(textwrap.dedent(PROGRAM))
    return path


@pytest.fixture
def no_dot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH on which graphviz's `dot` program cannot be found."""
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["ir", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_text_is_the_default(prog_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, f"{prog_file}:prog", "--arg", "3")
    assert (code, err) == (0, "")
    assert out.startswith("func @prog() -> (i32[]@{1}) {\n") and out.endswith("}\n")
    assert run(capsys, f"{prog_file}:prog", "--arg", "3", "--format", "text")[1] == out


def test_dot_to_stdout_and_to_a_file(prog_file: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, f"{prog_file}:prog", "--arg", "3", "--format", "dot")
    assert (code, err) == (0, "")
    assert out.startswith("digraph prog {\n")
    assert 'label="party 0"' in out and 'label="party 1"' in out and SHUFFLE_EDGE in out
    assert "user_prog.py:7" in out  # the shuffle's source line
    target = tmp_path / "prog.dot"
    assert run(capsys, f"{prog_file}:prog", "--arg", "3", "--format", "dot", "-o",
               str(target)) == (0, "", "")
    assert target.read_text() == out


@needs_dot
def test_svg_to_a_file(prog_file: Path, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "prog.svg"
    assert run(capsys, f"{prog_file}:prog", "--arg", "3", "--format", "svg", "-o",
               str(target)) == (0, "", "")
    texts = [t.text for t in ET.parse(target).getroot().iter("{http://www.w3.org/2000/svg}text")]
    assert "party 0" in texts and "party 1" in texts


def test_svg_without_dot_writes_dot_and_says_so(prog_file: Path, tmp_path: Path, no_dot: None,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "prog.svg"
    code, out, err = run(capsys, f"{prog_file}:prog", "--arg", "3", "--format", "svg", "-o",
                         str(target))
    written = tmp_path / "prog.dot"
    assert (code, out) == (0, "")
    assert err == ("mplang ir: SVG needs graphviz's `dot` program, which is not installed (apt "
                   f"install graphviz); wrote the DOT source to {written} instead\n")
    assert not target.exists()
    assert written.read_text().startswith("digraph prog {") and SHUFFLE_EDGE in written.read_text()
    code, out, err = run(capsys, f"{prog_file}:prog", "--arg", "3", "--format", "svg")
    assert code == 0 and out == written.read_text() and "to stdout instead" in err


@needs_dot
def test_html_page_with_the_picture(prog_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, f"{prog_file}:prog", "--arg", "3", "--format", "html")
    assert (code, err) == (0, "")
    assert out.startswith("<!DOCTYPE html>") and "<title>prog</title>" in out
    assert "<svg" in out and "party 1" in out and "<?xml" not in out
    assert "<pre>func @prog() -&gt; (i32[]@{1}) {" in out


def test_html_page_without_dot_holds_the_text_ir(prog_file: Path, no_dot: None,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, f"{prog_file}:prog", "--arg", "3", "--format", "html")
    assert (code, err) == (0, "")
    assert "<svg" not in out and "<code>dot</code> program is not installed" in out
    assert "<pre>func @prog() -&gt; (i32[]@{1}) {" in out


def test_a_type_error_is_reported_without_a_traceback(
        prog_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, f"{prog_file}:bad", "--format", "dot")
    assert (code, out) == (1, "")
    assert err == (f"mplang ir: {prog_file}:bad failed to trace: MPTypeError: simp.converge: "
                   "inputs must be held by disjoint parties; input 0 (i32[]@{0,1}) and input 1 "
                   "(i32[]@{1}) overlap on {1} (at user_prog.py:10)\n")


def test_an_error_of_the_users_code_names_its_line(
        prog_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, f"{prog_file}:broken")
    assert (code, out) == (1, "")
    assert err == (f"mplang ir: {prog_file}:broken failed to trace: ZeroDivisionError: "
                   "integer division or modulo by zero (at user_prog.py:14)\n")
