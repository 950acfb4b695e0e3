"""The FileCheck helper of the text-in/text-out tests (`tests.filecheck`)."""

from __future__ import annotations

import pytest

from tests.filecheck import CheckFailure, filecheck

OUTPUT = """\
%a = simp.constant() {parties = @{0}}
%b = simp.pcall(%a) {fn = "f"}
  region 0 (%x: i32[]) {
    return %x
  }
return %b"""


@pytest.mark.parametrize("checks", [
    "CHECK: simp.constant\nCHECK: return %b",
    "CHECK: %a = simp.constant()\nCHECK-NEXT: %b = simp.pcall(%a)\nCHECK-SAME: {fn = \"f\"}",
    "CHECK: simp.pcall\nCHECK-NOT: simp.constant\nCHECK: return %x",
    "CHECK: %[[V:[a-z]]] = simp.constant\nCHECK: simp.pcall(%[[V]])",
    "CHECK: region {{[0-9]+}} (%x:   i32[])",
    "// CHECK:    parties = @{0}\n// CHECK-NEXT: fn",
    "CHECK: return %b\nCHECK-NOT: region",
])
def test_satisfied_checks_pass(checks: str) -> None:
    filecheck(OUTPUT, checks)


@pytest.mark.parametrize("checks,message", [
    ("CHECK: simp.shuffle", "checks line 1: CHECK: simp.shuffle\nno match (output line 1):\n"
                            "   1| %a = simp.constant() {parties = @{0}}\n"
                            "   2| %b = simp.pcall(%a) {fn = \"f\"}\n"
                            "   3|   region 0 (%x: i32[]) {"),
    ("CHECK: %a\nCHECK-NEXT: region", "checks line 2: CHECK-NEXT: region\nnot on the next "
                                      "line (output line 1):"),
    ("CHECK: %b =\nCHECK-SAME: parties", "checks line 2: CHECK-SAME: parties\nnot on the same "
                                         "line (output line 2):"),
    ("CHECK: %a\nCHECK-NOT: pcall\nCHECK: region", "checks line 2: CHECK-NOT: pcall\na match "
                                                   "that should not be there (output line 2):"),
    ("CHECK: pcall\nCHECK-NOT: return", "checks line 2: CHECK-NOT: return\na match that should "
                                        "not be there (output line 4):"),
    ("CHECK: simp.constant\nCHECK: return %b\nCHECK: return",
     "checks line 3: CHECK: return\nno match (output line 6):"),
    ("CHECK-NEXT: %a", "checks line 1: CHECK-NEXT needs a previous match"),
    ("CHECK: [[X]]", "[[X]] is used before it is bound"),
    ("CHECK:   ", "checks line 1: CHECK has an empty pattern"),
    ("no directives", "no CHECK directives found"),
])
def test_failed_checks_say_which_and_where(checks: str, message: str) -> None:
    with pytest.raises(CheckFailure) as info:
        filecheck(OUTPUT, checks)
    assert str(info.value).startswith(message)


def test_a_match_continues_after_the_previous_one_on_the_same_line() -> None:
    filecheck("a b a", "CHECK: a\nCHECK: b\nCHECK: a")
    with pytest.raises(CheckFailure):
        filecheck("a b", "CHECK: b\nCHECK: a")
