"""A small FileCheck: match an output against ``CHECK`` lines written in a test's text.

Directives (anywhere in ``checks``, typically in ``//`` comments of the input):

* ``CHECK: pat``: ``pat`` occurs after the previous match;
* ``CHECK-NEXT: pat``: ``pat`` occurs on the line after the previous match's line;
* ``CHECK-SAME: pat``: ``pat`` occurs on the previous match's line, after it;
* ``CHECK-NOT: pat``: ``pat`` does not occur between the previous match and the next
  one (or the end of the output).

A pattern is literal text, except ``{{regex}}`` (a regular expression),
``[[NAME:regex]]`` (binds NAME to what the regex matched) and ``[[NAME]]`` (what
NAME was bound to). Runs of spaces match any run of spaces and tabs; a pattern's
leading and trailing spaces are ignored. Lines match independently: a pattern never
spans a newline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DIRECTIVE = re.compile(r"\b(CHECK(?:-NEXT|-SAME|-NOT)?):(.*)$", re.MULTILINE)
_PIECE = re.compile(r"\{\{(.*?)\}\}|\[\[([A-Za-z_]\w*)(?::(.*?))?\]\](?!\])")


class CheckFailure(AssertionError):
    """The output does not satisfy a directive; the message shows which and where."""


@dataclass(frozen=True)
class _Check:
    kind: str
    pattern: str
    line: int
    """The directive's line in the checks text (1-based)."""


def _literal(text: str) -> str:
    """The regex of literal ``text`` whose runs of spaces match any run of blanks."""
    return r"[ \t]+".join(re.escape(part) for part in re.split(r"[ \t]+", text))


def _regex(pattern: str, bound: dict[str, str]) -> tuple[str, list[str]]:
    """The regex of ``pattern`` and the names it binds, in order of their groups."""
    out, names, pos = [], [], 0
    for piece in _PIECE.finditer(pattern):
        out.append(_literal(pattern[pos:piece.start()]))
        regex, name, definition = piece.groups()
        if regex is not None:
            out.append(f"(?:{regex})")
        elif definition is not None:
            out.append(f"({definition})")
            names.append(name)
        else:
            if name not in bound:
                raise CheckFailure(f"[[{name}]] is used before it is bound")
            out.append(re.escape(bound[name]))
        pos = piece.end()
    out.append(_literal(pattern[pos:]))
    return "".join(out), names


def parse_checks(checks: str) -> list[_Check]:
    """The directives of ``checks`` in order."""
    found = []
    for match in _DIRECTIVE.finditer(checks):
        line = checks.count("\n", 0, match.start()) + 1
        pattern = match.group(2).strip()
        if not pattern and match.group(1) != "CHECK-NEXT":
            raise CheckFailure(f"checks line {line}: {match.group(1)} has an empty pattern")
        found.append(_Check(match.group(1), pattern, line))
    if not found:
        raise CheckFailure("no CHECK directives found")
    return found


class _Matcher:
    def __init__(self, output: str):
        self.output = output
        self.lines = output.split("\n")
        self.bound: dict[str, str] = {}

    def search(self, check: _Check, line: int, column: int, last_line: int | None
               ) -> tuple[int, int, int] | None:
        """The first match of ``check`` from (``line``, ``column``) up to ``last_line``:
        its line, start and end column."""
        regex, names = _regex(check.pattern, self.bound)
        compiled = re.compile(regex)
        stop = len(self.lines) if last_line is None else min(last_line + 1, len(self.lines))
        for index in range(line, stop):
            match = compiled.search(self.lines[index], column if index == line else 0)
            if match is not None:
                self.bound.update(zip(names, match.groups(), strict=True))
                return index, match.start(), match.end()
        return None

    def fail(self, check: _Check, message: str, line: int) -> CheckFailure:
        start, end = max(0, line - 2), min(len(self.lines), line + 3)
        context = "\n".join(f"{i + 1:4}| {self.lines[i]}" for i in range(start, end))
        return CheckFailure(f"checks line {check.line}: {check.kind}: {check.pattern}\n"
                            f"{message} (output line {line + 1}):\n{context}")


def filecheck(output: str, checks: str) -> None:
    """Raise `CheckFailure` unless ``output`` satisfies the directives in ``checks``."""
    matcher = _Matcher(output)
    line, column = 0, 0
    pending_not: list[_Check] = []
    started = False
    for check in parse_checks(checks):
        if check.kind == "CHECK-NOT":
            pending_not.append(check)
            continue
        if check.kind in ("CHECK-NEXT", "CHECK-SAME") and not started:
            raise CheckFailure(f"checks line {check.line}: {check.kind} needs a previous match")
        if check.kind == "CHECK-NEXT":
            found = matcher.search(check, line + 1, 0, line + 1)
        elif check.kind == "CHECK-SAME":
            found = matcher.search(check, line, column, line)
        else:
            found = matcher.search(check, line, column, None)
        if found is None:
            where = {"CHECK-NEXT": "not on the next line", "CHECK-SAME": "not on the same line"}
            raise matcher.fail(check, where.get(check.kind, "no match"), line)
        _check_absent(matcher, pending_not, (line, column), found[:2])
        pending_not = []
        line, column = found[0], found[2]
        started = True
    _check_absent(matcher, pending_not, (line, column), (len(matcher.lines), 0))


def _check_absent(matcher: _Matcher, checks: list[_Check], start: tuple[int, int],
                  end: tuple[int, int]) -> None:
    """Each of ``checks`` has no match from ``start`` to ``end`` (line, column)."""
    for check in checks:
        found = matcher.search(check, start[0], start[1], end[0])
        if found is not None and (found[0], found[1]) < end:
            raise matcher.fail(check, "a match that should not be there", found[0])
