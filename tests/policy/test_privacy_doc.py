"""docs/privacy.md runs as written: its policy file parses, its simulator example prints
what the page says, and its `mplang check` excerpt matches what the command prints."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest

from mplang.policy.policy import Policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "privacy.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_policy_example_parses() -> None:
    (text,) = _blocks("yaml")
    policy = Policy.parse(text, "docs/privacy.md")
    assert policy.drivers == ("driver",)
    assert policy.plaintext_to == ()
    assert dict(policy.max_uses) == {"salaries": 3}
    assert [(r.to, r.when, r.min_rows) for r in policy.declassify] == [
        (("node_0", "driver"), "aggregate", 10), (("*",), "compare", 1),
        (("node_0",), "intersection", 1)]


def test_the_simulator_example_prints_what_the_page_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    (code,) = _blocks("python")
    expected = [line.split("# ")[-1].strip() for line in code.splitlines()
                if line.lstrip().startswith("print(")]
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "privacy_example.py"
    script.write_text(code)
    runpy.run_path(str(script))
    assert capsys.readouterr().out.split() == expected == ["19.0", "refused"]


def test_the_check_excerpt_has_the_command_s_shape() -> None:
    (text,) = _blocks("text")
    lines = text.splitlines()
    assert lines[0].startswith("program prog: digest ")
    assert lines[1] == "node_1 (dev/policies/node_1.yaml): REFUSES"
    assert lines[2].startswith("  flow: row-wise (raw) values of x.npy -> node_0 (the value "
                               "revealed from SP0, op spu.reveal at prog.py:12): REFUSED")
    assert lines[3].startswith("  refused: op spu.reveal at prog.py:12 sends the value "
                               "revealed from SP0, row-wise (raw) values of x.npy, to node_0;")
