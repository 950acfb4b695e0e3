"""Modules under ``mplang/`` that name the SPU dialect outside SPU's own modules.

For each tree given (default: this checkout) lists the modules whose text
contains "spu" (case-insensitive), excluding SPU's own modules
(``dialects/spu.py``, ``kernels/spu/`` (``backends/spu_*.py`` before), ``device/spu.py``,
``analysis/spu_rounds.py``, ``analysis/pphlo.py``), in three tiers:

- text: "spu" anywhere in the file (comments and docstrings included);
- code: "spu" in the code once comments and docstrings (bare string
  statements, attribute docstrings included) are dropped: names, imports,
  string literals such as opcodes, module lists and messages;
- imports: the module imports an SPU module (``import``/``from`` naming one).

    .venv/bin/python benchmarks/count_dialect_mentions.py [TREE ...]
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SPU_OWN = ("mplang/dialects/spu.py", "mplang/kernels/spu/*.py", "mplang/backends/spu_*.py",
           "mplang/device/spu.py",
           "mplang/analysis/spu_rounds.py", "mplang/analysis/pphlo.py")


def is_spu_own(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, pattern) for pattern in SPU_OWN)


def _is_bare_string(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _drop_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` without bare string statements (docstrings of modules, classes,
    functions and attributes); they do nothing at run time."""
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                kept = [stmt for stmt in body if not _is_bare_string(stmt)]
                setattr(node, name, kept or [ast.Pass()])
    return tree


def _imports_spu(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module or ''}.{a.name}" for a in node.names]
        else:
            continue
        if any("spu" in name.lower() for name in names):
            return True
    return False


def count(tree_root: Path) -> dict[str, list[str]]:
    """Tier name -> sorted module paths (relative to ``tree_root``)."""
    tiers: dict[str, list[str]] = {"text": [], "code": [], "imports": []}
    for path in sorted((tree_root / "mplang").rglob("*.py")):
        rel = path.relative_to(tree_root).as_posix()
        if is_spu_own(rel):
            continue
        text = path.read_text(encoding="utf-8")
        if "spu" not in text.lower():
            continue
        tiers["text"].append(rel)
        tree = ast.parse(text)
        if _imports_spu(tree):
            tiers["imports"].append(rel)
        if "spu" in ast.unparse(_drop_docstrings(tree)).lower():
            tiers["code"].append(rel)
    return tiers


def report(label: str, tiers: dict[str, list[str]]) -> None:
    print(f"{label}: text {len(tiers['text'])}, code {len(tiers['code'])}, "
          f"imports {len(tiers['imports'])}")
    for rel in tiers["text"]:
        marks = [t for t in ("code", "imports") if rel in tiers[t]]
        print(f"  {rel}" + (f"  ({', '.join(marks)})" if marks else "  (comments/docstrings only)"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trees", type=Path, nargs="*", default=[ROOT])
    args = parser.parse_args()
    for tree_root in args.trees:
        report(str(tree_root), count(tree_root))


if __name__ == "__main__":
    main()
