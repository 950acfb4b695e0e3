"""The ``mplang`` command: ``demo``, ``ir FILE.py:FUNC``, ``worker``, ``up`` and ``ops``."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mplang as mp
from mplang.frontend.pyfuncs import import_pyfunc
from mplang.runtime.auth import SECRET_ENV, load_secret


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


def _serve(args: argparse.Namespace) -> int:
    from mplang.backends.simp_worker.http import serve
    from mplang.frontend.plugins import load_plugin
    from mplang.runtime.local_cluster import LocalCluster

    try:
        for name in args.plugin:  # first: a plugin may define the device kinds the spec uses
            load_plugin(name)
        cluster = mp.ClusterSpec.from_yaml(args.cluster)
        secret = load_secret(args.secret_file)
        if args.command == "worker":
            for spec in args.register:
                import_pyfunc(spec)
            serve(cluster, args.node, secret)
            return 0
        local = LocalCluster(cluster, secret, register=args.register, plugins=args.plugin)
        try:
            local.start()
            for node, url in zip(cluster.nodes, cluster.base_urls(), strict=True):
                print(f"{node.name}: {url}", flush=True)
            print("all workers are healthy; Ctrl-C stops them", flush=True)
            while all(p.poll() is None for p in local.processes.values()):
                time.sleep(0.5)
            print("a worker exited; stopping the others", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0
        finally:
            local.close()
    except (mp.MPLangError, OSError) as e:
        print(f"mplang {args.command}: {e}", file=sys.stderr)
        return 2


def _ops(args: argparse.Namespace) -> int:
    from mplang.frontend.introspect import list_ops, routes
    from mplang.frontend.plugins import discover, load_plugin

    names = args.plugin or sorted(discover())
    for name in names:
        try:
            load_plugin(name)
        except mp.MPLangError as e:
            if args.plugin:  # named on the command line: a hard error
                print(f"mplang ops: {e}", file=sys.stderr)
                return 2
            print(f"mplang ops: skipping installed plugin {name!r}: {e}", file=sys.stderr)
    rows = [{"name": i.name, "family": i.family, "op_kind": i.op_kind,
             "execution_model": i.execution_model, "routes": routes(i),
             "primitives": list(i.primitives), "doc": i.doc}
            for i in list_ops(args.family)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no frontend ops{f' in family {args.family!r}' if args.family else ''}",
              file=sys.stderr)
        return 1
    columns = ("name", "family", "op_kind", "execution_model", "routes", "doc")
    cells = [[", ".join(r[c]) if c == "routes" else str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    for row in [[c.upper() for c in columns], *cells]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


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
    worker = commands.add_parser("worker", help="serve one node of a cluster spec over HTTP")
    worker.add_argument("--cluster", required=True, help="cluster spec YAML")
    worker.add_argument("--node", required=True, help="the node to serve, e.g. node_0")
    worker.add_argument("--secret-file", help=f"cluster secret (default: ${SECRET_ENV})")
    worker.add_argument("--register", action="append", default=[], metavar="MODULE:FUNCTION",
                        help="a host function tensor.pyfunc may call here (repeatable)")
    worker.add_argument("--plugin", action="append", default=[], metavar="NAME",
                        help="load this plugin (entry point or module) before serving "
                             "(repeatable)")
    up = commands.add_parser("up", help="start every node of a cluster spec on this machine")
    up.add_argument("--cluster", required=True, help="cluster spec YAML")
    up.add_argument("--secret-file", help=f"cluster secret (default: ${SECRET_ENV})")
    up.add_argument("--register", action="append", default=[], metavar="MODULE:FUNCTION",
                    help="a host function every worker may call (repeatable)")
    up.add_argument("--plugin", action="append", default=[], metavar="NAME",
                    help="a plugin every worker loads (repeatable)")
    ops = commands.add_parser("ops", help="list the frontend ops (built-in and plugins')")
    ops.add_argument("--family", help="only this family's ops (simp, tensor, a plugin's name)")
    ops.add_argument("--json", action="store_true", help="print a JSON list")
    ops.add_argument("--plugin", action="append", default=[], metavar="NAME",
                     help="load only these plugins (repeatable; default: every installed one)")
    args = parser.parse_args(argv)

    if args.command == "demo":
        from mplang.libs.demo import run_demo

        run_demo(args.world_size)
        return 0
    if args.command in ("worker", "up"):
        return _serve(args)
    if args.command == "ops":
        return _ops(args)
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
