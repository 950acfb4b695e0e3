"""``mplang trace summarize FILE [--by op|line]``: the ops of a timeline (``mp.evaluate(...,
trace=FILE)``) that took the most time, by op name or by source line, and each party's busy
time."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mplang.edsl.errors import MPLangError
from mplang.records.trace_file import summarize


def add_trace_parser(commands: Any) -> None:
    """Add ``trace summarize`` to the ``mplang`` command's subparsers."""
    trace = commands.add_parser("trace", help="read timelines written by "
                                "mp.evaluate(..., trace=FILE)")
    actions = trace.add_subparsers(dest="trace_command", required=True)
    summary = actions.add_parser("summarize", help="print the ops that took the most time "
                                 "(self time) and each track's busy time")
    summary.add_argument("file", help="a trace file (Chrome / Perfetto JSON)")
    summary.add_argument("--top", type=int, default=10, help="how many ops to list")
    summary.add_argument("--by", choices=("op", "line"), default="op",
                         help="group the ops by name (default) or by the source line that "
                              "made them")


def run_trace(args: argparse.Namespace) -> int:
    """Run ``mplang trace``; exit code 2 when the file is missing or not a trace."""
    try:
        summarize(args.file, max(1, args.top), by=args.by)
    except MPLangError as e:
        print(f"mplang trace: {e}", file=sys.stderr)
        return 2
    return 0
