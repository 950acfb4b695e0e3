"""Lines of code of the mplang package: per module, the lines that are neither blank nor
comments (docstrings count: they are part of the code a reader reads). Prints the total
and the largest modules; ``tests/test_layering.py`` holds the package to a budget.

    .venv/bin/python benchmarks/linecount.py [--top N] [PACKAGE]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "mplang"


def code_lines(text: str) -> int:
    """The lines of ``text`` that are neither blank nor a comment."""
    return sum(1 for line in text.splitlines()
               if line.strip() and not line.lstrip().startswith("#"))


def count(package: Path = PACKAGE) -> dict[str, int]:
    """Lines of code of every ``.py`` file under ``package``, by path relative to it."""
    return {path.relative_to(package).as_posix(): code_lines(path.read_text(encoding="utf-8"))
            for path in sorted(package.rglob("*.py"))}


def largest(counts: dict[str, int], n: int) -> list[tuple[str, int]]:
    """The ``n`` modules with the most lines of code, largest first."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:n]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", type=Path, default=PACKAGE)
    parser.add_argument("--top", type=int, default=15, help="how many modules to list")
    args = parser.parse_args(argv)
    counts = count(args.package)
    print(f"{sum(counts.values())} lines of code in {len(counts)} modules")
    for module, lines in largest(counts, args.top):
        print(f"{lines:7d}  {module}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
