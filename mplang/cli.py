"""The ``mplang`` command: ``mplang demo`` and ``mplang ir FILE.py:FUNC``."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mplang as mp


def _load_function(target: str) -> Any:
    path_text, sep, func_name = target.rpartition(":")
    if not sep or not path_text or not func_name:
        raise SystemExit(f"mplang ir: expected FILE.py:FUNC, got {target!r}")
    path = Path(path_text)
    if not path.is_file():
        raise SystemExit(f"mplang ir: no such file {path}")
    spec = importlib.util.spec_from_file_location(f"_mplang_ir_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"mplang ir: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise SystemExit(f"mplang ir: {path} has no function {func_name!r}")
    return fn


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise SystemExit(f"mplang ir: --arg takes Python literals, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mplang", description="MPLang command line")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a short multi-party demo on the simulator")
    demo.add_argument("--world-size", type=int, default=3)
    ir = commands.add_parser("ir", help="print a function's IR")
    ir.add_argument("target", help="FILE.py:FUNC")
    ir.add_argument("--world-size", type=int, default=3)
    ir.add_argument("--arg", action="append", default=[],
                    help="a compile-time argument as a Python literal (repeatable)")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from mplang.libs.demo import run_demo

        run_demo(args.world_size)
        return 0
    fn = _load_function(args.target)
    try:
        program = mp.compile(fn, *[_literal(a) for a in args.arg], world_size=args.world_size)
    except mp.MPLangError as e:
        print(f"mplang ir: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(program)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
