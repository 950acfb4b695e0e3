"""``mplang ops``: the frontend ops, the primitives they emit, and one op's whole contract.

- ``mplang ops [--family F]``: frontend ops with their kinds, execution models and routes
  (with ``--json``, an op named like its primitive also carries the primitive's contract);
- ``mplang ops --primitives [--dialect D]``: every primitive with its operands,
  attributes, results, kernels per runtime, flow and cost rules;
- ``mplang ops NAME``: everything `mplang.describe` knows about one primitive or op.

``--json`` prints the same as data.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from mplang.edsl.errors import MPLangError


def add_ops_parser(commands: Any) -> None:
    """Add ``ops`` to the ``mplang`` command's subparsers."""
    ops = commands.add_parser("ops", help="list the frontend ops and primitives (built-in and "
                              "plugins'), or describe one")
    ops.add_argument("name", nargs="?", help="describe this primitive or frontend op")
    ops.add_argument("--family", help="only this family's ops (simp, tensor, a plugin's name)")
    ops.add_argument("--primitives", action="store_true",
                     help="list the primitives with their whole contract")
    ops.add_argument("--dialect", help="with --primitives: only this dialect's")
    ops.add_argument("--json", action="store_true", help="print JSON")
    ops.add_argument("--plugin", action="append", default=[], metavar="NAME",
                     help="load only these plugins (repeatable; default: every installed one)")


def _load_plugins(names: Sequence[str]) -> bool:
    from mplang.frontend.plugins import discover, load_plugin

    for name in names or sorted(discover()):
        try:
            load_plugin(name)
        except MPLangError as e:
            if names:  # named on the command line: a hard error
                print(f"mplang ops: {e}", file=sys.stderr)
                return False
            print(f"mplang ops: skipping installed plugin {name!r}: {e}", file=sys.stderr)
    return True


def _table(rows: list[list[str]], columns: Sequence[str]) -> None:
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    for row in [[c.upper() for c in columns], *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _decls(items: list[dict[str, Any]]) -> str:
    return ", ".join(d["name"] + ("..." if d.get("variadic") else "") for d in items) or "-"


def _rule(rule: dict[str, Any] | None) -> str:
    return "-" if rule is None else str(rule["name"])


def _kernels(kernels: dict[str, bool]) -> str:
    return ",".join(r for r, present in kernels.items() if present) or "-"


def _primitive_rows(prims: list[dict[str, Any]]) -> list[list[str]]:
    return [[p["name"], p["kind"], p["execution_model"], _decls(p["operands"]),
             _decls(p["attributes"]), _decls(p["results"]), _kernels(p["kernels"]),
             _rule(p["flow"]), _rule(p["cost"])] for p in prims]


def _show(d: dict[str, Any]) -> None:
    """One op's contract as readable text."""
    print(f"{d['name']}: {d['doc']}")
    for key in ("kind", "execution_model", "targets", "regions"):
        if d.get(key) not in (None, [], ""):
            print(f"  {key}: {d[key]}")
    for key in ("operands", "results"):
        for item in d.get(key) or []:
            many = " (variadic)" if item["variadic"] else ""
            print(f"  {key[:-1]} {item['name']}: {item['type']}{many}")
    for attr in d.get("attributes") or []:
        need = "required" if attr["required"] else f"default {attr['default']!r}"
        print(f"  attribute {attr['name']}: {' | '.join(attr['type'])}, {need}"
              + (f" - {attr['doc']}" if attr["doc"] else ""))
    if "kernels" in d:
        print(f"  kernels: {_kernels(d['kernels'])}")
    for key in ("type_rule", "flow", "local_flow", "cost", "private", "payload_check"):
        if d.get(key):
            print(f"  {key}: {d[key]['name']} ({d[key]['where']})")
    for kind, model in (d.get("security") or {}).items():
        print(f"  security on {kind}: {model}")


_CONTRACT = ("operands", "attributes", "results", "regions", "traits", "targets", "kernels",
             "flow", "cost", "security")
"""The keys of a primitive's contract that ``mplang ops --json`` adds to the row of the
frontend op of the same name."""


def run_ops(args: argparse.Namespace) -> int:
    """Run ``mplang ops``; exit code 1 when nothing matches, 2 for a bad plugin."""
    from mplang.frontend.introspect import describe, list_ops, list_primitives, routes

    if not _load_plugins(args.plugin):
        return 2
    if args.name:
        try:
            d = describe(args.name)
        except KeyError:
            print(f"mplang ops: no primitive or frontend op named {args.name!r}",
                  file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(d, indent=2, default=str))
        else:
            _show(d)
        return 0
    if args.primitives:
        prims = list_primitives(args.dialect)
        if args.json:
            print(json.dumps(prims, indent=2))
            return 0 if prims else 1
        if not prims:
            print(f"no primitives{f' in dialect {args.dialect!r}' if args.dialect else ''}",
                  file=sys.stderr)
            return 1
        _table(_primitive_rows(prims), ("name", "kind", "model", "operands", "attributes",
                                        "results", "kernels", "flow", "cost"))
        return 0
    rows = [{"name": i.name, "family": i.family, "op_kind": i.op_kind,
             "execution_model": i.execution_model, "routes": routes(i),
             "primitives": list(i.primitives), "doc": i.doc}
            for i in list_ops(args.family)]
    if args.json:
        contracts = {p["name"]: p for p in list_primitives()}
        for row in rows:  # an op named like its primitive carries that contract too
            contract = contracts.get(row["name"], {})
            row.update({k: contract[k] for k in _CONTRACT if k in contract})
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no frontend ops{f' in family {args.family!r}' if args.family else ''}",
              file=sys.stderr)
        return 1
    columns = ("name", "family", "op_kind", "execution_model", "routes", "doc")
    _table([[", ".join(r[c]) if c == "routes" else str(r[c]) for c in columns] for r in rows],
           columns)
    return 0
