"""The policy file format (`mplang.policy.policy`): parsing, errors naming the line,
the former keys' replacements, `Policy.rule_for` and `Policy.may_write`."""

from __future__ import annotations

import pytest
import yaml

from mplang.policy.policy import DeclassifyRule, Policy, PolicyError

EXAMPLE = """\
drivers: [driver]
plaintext_to: []
protocols: [CHEETAH, ABY3]
programs: []
max_uses: {salaries: 3}
writes: [out/*.csv, ./reports//summary.parquet]
declassify:
  - {to: ["*"], when: aggregate, min_rows: 10}
  - {to: ["*"], when: compare}
  - {to: [driver, node_1], when: dp, max_epsilon: 1.0, budget: 10}
  - to: [node_2]
    when: any
"""


def policy(text: str) -> Policy:
    return Policy.parse(text, "p.yaml")


def test_the_format_reference_parses() -> None:
    p = policy(EXAMPLE)
    assert p.drivers == ("driver",) and p.plaintext_to == ()
    assert p.protocols == ("CHEETAH", "ABY3") and p.programs == frozenset()
    assert dict(p.max_uses) == {"salaries": 3}
    assert p.writes == ("out/*.csv", "reports/summary.parquet")
    assert p.declassify == (
        DeclassifyRule(("*",), "aggregate", min_rows=10, line=8),
        DeclassifyRule(("*",), "compare", line=9),
        DeclassifyRule(("driver", "node_1"), "dp", max_epsilon=1.0, budget=10.0, line=10),
        DeclassifyRule(("node_2",), "any", line=11))
    assert p.source == "p.yaml"


def test_a_rule_prints_as_it_is_written_in_a_file() -> None:
    rules = policy(EXAMPLE).declassify
    assert [str(r) for r in rules] == [
        '{to: ["*"], when: aggregate, min_rows: 10}',
        '{to: ["*"], when: compare}',
        "{to: [driver, node_1], when: dp, max_epsilon: 1.0, budget: 10.0}",
        "{to: [node_2], when: any}"]
    for rule in rules:  # and reads back as the same rule
        assert policy(f"declassify:\n  - {rule}\n").declassify == (
            DeclassifyRule(rule.to, rule.when, rule.min_rows, rule.max_epsilon, rule.budget,
                           line=2),)
    odd = DeclassifyRule(("yes", 'a"b'), "aggregate", 3)
    assert yaml.safe_load(str(odd)) == {"to": ["yes", 'a"b'], "when": "aggregate",
                                        "min_rows": 3}


def test_the_default_policy_allows_nothing_to_leave_and_nothing_to_be_written() -> None:
    for p in (Policy.default(), policy(""), policy("drivers: [driver]\n")):
        assert p.plaintext_to == () and p.declassify == () and p.writes == ()
        assert p.rule_for("driver", "aggregate", 10**9) is None
        assert not p.may_write("out.csv")
    assert Policy.default().drivers is None and Policy.default().protocols is None


@pytest.mark.parametrize("text, line, words", [
    ("drivers: [driver]\nplaintext_to: node_1\n", 2, "expected a list"),
    ("declassify:\n  - to: [driver]\n    when: sometimes\n", 3,
     "when must be one of aggregate, compare, intersection, dp, any"),
    ("declassify:\n  - to: [driver]\n    when: aggregate\n    min_rows: 0\n", 4,
     "declassify.min_rows must be at least 1, got 0"),
    ("declassify:\n  - to: [driver]\n    when: aggregate\n    min_rows: 2.5\n", 4,
     "declassify.min_rows must be an integer"),
    ("declassify:\n  - {to: [driver], when: compare, min_rows: 3}\n", 2,
     "min_rows applies only to rules with when: aggregate, not when: compare"),
    ("declassify:\n  - to: [driver]\n    when: aggregate\n    max_epsilon: 1\n", 4,
     "max_epsilon applies only to rules with when: dp, not when: aggregate"),
    ("declassify:\n  - to: [driver]\n    when: any\n    budget: 1\n", 4,
     "budget applies only to rules with when: dp, not when: any"),
    ("declassify:\n  - to: [driver]\n    when: dp\n", 2,
     "a rule with when: dp needs max_epsilon"),
    ("declassify:\n  - {to: [driver], when: dp, max_epsilon: 0}\n", 2,
     "declassify.max_epsilon must be a number greater than 0, got '0'"),
    ("declassify:\n  - {to: [driver], when: dp, max_epsilon: 1, budget: -2.0}\n", 2,
     "declassify.budget must be a number greater than 0, got '-2.0'"),
    ("declassify:\n  - {to: [driver], when: dp, max_epsilon: '1.0'}\n", 2,
     "max_epsilon must be a number greater than 0"),
    ("declassify:\n  - {to: [driver], when: dp, max_epsilon: .inf}\n", 2,
     "max_epsilon must be a number greater than 0"),
    ("declassify:\n  - to: [driver]\n    when: aggregate\n    rows: 3\n", 4,
     "unknown key 'rows' \\(known: to, when, min_rows, max_releases, max_epsilon, budget\\)"),
    ("declassify:\n  - when: compare\n", 2, "a rule needs 'to'"),
    ("writes: [/etc/passwd.csv]\n", 1, "writes: '/etc/passwd.csv' must be a path relative"),
    ("writes:\n  - out/*.csv\n  - ../x.csv\n", 3, "writes: '../x.csv' must be a path"),
    ("writes: [./]\n", 1, "writes: './' must be a path relative"),
    ("writes: [[a]]\n", 1, "writes: every entry must be a name"),
    ("drivers: [driver]\nreveal: all\n", 2, "unknown key 'reveal'"),
    ("max_uses:\n  v: many\n", 2, "max_uses.v must be an integer"),
    ("programs: [abc]\n", 1, "not a sha256 digest"),
    ("drivers: [driver\n", 2, "not valid YAML"),
])
def test_a_malformed_policy_names_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(PolicyError, match=rf"^p\.yaml:{line}: .*{words}"):
        policy(text)


@pytest.mark.parametrize("text, line, message", [
    ("declassify:\n  - to: [driver]\n    when: aggregate\n    min_elements: 10\n", 4,
     "declassify: min_elements is no longer a key; use min_rows (the number of distinct "
     "rows of this party's data an aggregate combines)"),
    ("declassify:\n  - to: [driver]\n    when: count\n", 3,
     "declassify: when: count is no longer a form; use when: aggregate (a count is an "
     "aggregate; min_rows bounds the rows it counts)"),
])
def test_the_former_keys_name_what_replaces_them(text: str, line: int, message: str) -> None:
    with pytest.raises(PolicyError) as refused:
        policy(text)
    assert str(refused.value) == f"p.yaml:{line}: {message}"


def test_rule_for_matches_receiver_form_and_rows() -> None:
    p = policy("declassify:\n"
               "  - {to: [node_1], when: aggregate, min_rows: 10}\n"
               "  - {to: [driver], when: compare}\n"
               "  - {to: [driver], when: dp, max_epsilon: 0.5}\n"
               "  - {to: [node_2], when: any}\n")
    aggregate, compare, dp, anything = p.declassify
    assert p.rule_for("node_1", "aggregate", 10) is aggregate
    assert p.rule_for("node_1", "aggregate", 9) is None
    assert p.rule_for("node_1", "aggregate", None) is None  # rows not known: not enough
    assert p.rule_for("node_1", "compare", None) is None
    assert p.rule_for("driver", "compare", None) is compare
    assert p.rule_for("driver", "aggregate", 100) is None
    assert p.rule_for("driver", "dp", None) is dp
    assert p.rule_for("node_1", "dp", None) is None
    for form in ("aggregate", "compare", "dp"):
        assert p.rule_for("node_2", form, None) is anything
    assert p.rule_for("node_3", "compare", None) is None
    everyone = policy("declassify:\n  - {to: ['*'], when: aggregate}\n")
    assert everyone.rule_for("anyone", "aggregate", 1) is everyone.declassify[0]
    assert everyone.rule_for("anyone", "aggregate", 0) is None


@pytest.mark.parametrize("path, allowed", [
    ("out/a.csv", True),
    ("./out//a.csv", True),
    ("out\\a.csv", True),
    ("out/sub/a.csv", False),  # a pattern's * stays within one folder
    ("a.csv", False),
    ("out/a.parquet", False),
    ("reports/summary.parquet", True),
    ("reports/summary.parquet.bak", False),
    ("/out/a.csv", False),
    ("out/../out/a.csv", False),
    ("../main/out/a.csv", False),
    ("C:/out/a.csv", False),
    ("", False),
    (".", False),
])
def test_may_write_matches_relative_paths_only(path: str, allowed: bool) -> None:
    assert policy(EXAMPLE).may_write(path) is allowed


def test_a_pattern_may_allow_every_file_of_the_root_s_top_folder() -> None:
    p = policy("writes: ['*']\n")
    assert p.may_write("x.csv") and p.may_write("salaries.parquet")
    assert not p.may_write("in/x.csv")
