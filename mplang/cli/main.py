"""The ``mplang`` command: ``demo``, ``ir FILE.py:FUNC``, ``keygen``, ``init``, ``worker``,
``up``, ``put``, ``check``, ``status``, ``ops`` (`mplang.cli.ops`), ``audit``, ``run``
(`mplang.cli.run`), ``trace`` (`mplang.cli.trace`) and ``apidoc`` (`mplang.cli.apidoc`)."""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mplang as mp
from mplang.cli.apidoc import add_apidoc_parser, run_apidoc
from mplang.cli.ops import add_ops_parser, run_ops
from mplang.cli.run import add_run_parser, run_script
from mplang.cli.trace import add_trace_parser, run_trace
from mplang.edsl.dot import html_page
from mplang.edsl.location import raised_at
from mplang.frontend.pyfuncs import import_pyfunc


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


def _trace_error(error: Exception) -> str:
    """``Type: message``, plus the innermost line of user code on the error's traceback
    (`raised_at`) when the message names no ``(at file.py:LINE)`` itself."""
    text = f"{type(error).__name__}: {error}"
    loc = None if " (at " in text else raised_at(error)
    return f"{text} (at {loc})" if loc else text


def _ir_context(args: argparse.Namespace) -> Any:
    """The simulator (``--data-root``) or driver (``--cluster``) that tells the tracer the
    types of the files a program loads; None without either."""
    from mplang.cli.run import data_roots

    if args.cluster:
        key = args.key or Path(args.cluster).resolve().parent / "keys" / "driver.key"
        return mp.Driver(args.cluster, key=key)
    if args.data_root:
        cluster = mp.ClusterSpec.simple(args.world_size)
        return mp.Simulator(cluster, data_roots=data_roots(cluster, args.data_root))
    return None


def _ir(args: argparse.Namespace) -> int:
    """``mplang ir``: the function's IR as text, DOT, SVG or an HTML page."""
    from mplang.edsl.program import trace_program

    fn = _load_function(args.target)
    try:
        ctx = _ir_context(args)
    except (mp.MPLangError, OSError) as e:
        print(f"mplang ir: {e}", file=sys.stderr)
        return 2
    constants = [_literal(a) for a in args.arg]
    try:
        if ctx is None:
            program = mp.compile(fn, *constants, world_size=args.world_size)
        else:  # ctx tells the tracer the types of the files the program loads
            program, _ = trace_program(fn, constants, {}, ctx.world_size, ctx.cluster, ctx)
    except Exception as e:  # the user's code may raise anything while it is traced
        print(f"mplang ir: {args.target} failed to trace: {_trace_error(e)}",
              file=sys.stderr)
        return 1
    finally:
        if ctx is not None:
            ctx.close()
    output, fmt = args.output, args.format
    has_dot = shutil.which("dot") is not None
    if fmt == "svg" and not has_dot:
        fmt, output = "dot", output and str(Path(output).with_suffix(".dot"))
        print(f"mplang ir: SVG needs graphviz's `dot` program, which is not installed (apt "
              f"install graphviz); wrote the DOT source to {output or 'stdout'} instead",
              file=sys.stderr)
    try:
        if fmt == "html":
            text = html_page(program.name, str(program), program.to_svg() if has_dot else None)
        else:
            text = program.to_svg() if fmt == "svg" else (
                program.to_dot() if fmt == "dot" else f"{program}\n")
    except mp.MPLangError as e:  # dot is installed but failed
        print(f"mplang ir: {e}", file=sys.stderr)
        return 1
    if output:
        Path(output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _exit_with_parent() -> None:
    """Exit when the process that started this one dies (``mplang up`` was killed)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="mplang-parent-watch").start()


LIMIT_OPTIONS = {
    "max_body_bytes": "largest request body",
    "max_value_bytes": "largest value a program may declare",
    "mailbox_bytes": "bytes of peer messages held at once",
    "max_inflight_bytes": "bytes of bodies being received at once (default 4 GiB)",
    "max_streams": "streams open at once on one mplang/1 connection (default 1024)",
    "stall_seconds": "a body receiving nothing this long closes its connection (default 30)",
    "handshake_seconds": "longest TLS handshake (default 10)",
    "vote_seconds": "longest wait for the other parties' votes on a run (default 30)",
    "max_connections_per_peer": "connections one certificate may hold (default 64)",
    "max_connections_per_address": "connections from one source address (default 256)",
    "max_connections": "connections at once (default: the descriptor limit less 256)"}
"""The `WorkerLimits` that ``mplang worker`` takes as options (``--max-body-bytes`` ...)."""


def _worker(args: argparse.Namespace, cluster: mp.ClusterSpec) -> int:
    from mplang.cluster.identity import format_fingerprint, load_identity
    from mplang.records.audit import default_path as default_audit_path
    from mplang.runtime import native_logs
    from mplang.transport.limits import WorkerLimits
    from mplang.worker.http import serve
    from mplang.worker.server import WorkerServer

    native_logs.level()  # refuse a wrong MPLANG_LOG before serving
    native_logs.keep_descriptors()  # this worker's output is the party's log
    for spec in args.register:
        import_pyfunc(spec)
    key = args.key or Path(args.cluster).resolve().parent / "keys" / f"{args.node}.key"
    identity = load_identity(key)
    if args.exit_with_parent:
        _exit_with_parent()
    limits = WorkerLimits(**{name: getattr(args, name) for name in LIMIT_OPTIONS
                             if getattr(args, name) is not None})

    def ready(server: WorkerServer) -> None:
        url = server.cluster.base_urls()[server.rank]
        print(f"mplang worker {server.node} ready at {url} (certificate sha256 "
              f"{format_fingerprint(identity.fingerprint)})", flush=True)

    serve(cluster, args.node, identity, timeout=args.timeout, limits=limits,
          spec_path=args.cluster, on_ready=ready,
          audit_log=args.audit_log or default_audit_path(args.node), data_root=args.data_root,
          policy=args.policy, listen=args.listen, state_dir=args.state_dir)
    return 0


def _up(args: argparse.Namespace) -> int:
    from mplang.cli.progress import is_terminal, startup_progress
    from mplang.cluster.local import LocalCluster

    local = LocalCluster(args.cluster, keys=args.keys, register=args.register,
                         plugins=args.plugin, audit_dir=args.audit_dir or "audit",
                         state_dir=args.state_dir or "state",
                         data_root=args.data_root)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)  # also when started where SIGINT is ignored (`&`)
    try:
        names = [node.name for node in local.cluster.nodes]
        with startup_progress(names, enabled=is_terminal()) as ready:
            local.start(on_ready=ready)
        for node, url in zip(local.cluster.nodes, local.cluster.base_urls(), strict=True):
            print(f"{node.name}: {url}", flush=True)
        print("all workers are ready; Ctrl-C stops them", flush=True)
        while all(p.poll() is None for p in local.processes.values()):
            time.sleep(0.5)
        print("a worker exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        local.close()


def _serve(args: argparse.Namespace) -> int:
    from mplang.frontend.plugins import load_plugin

    for name in args.plugin:  # first: a plugin may define the device kinds the spec uses
        load_plugin(name)
    if args.command == "worker":
        return _worker(args, mp.ClusterSpec.from_yaml(args.cluster))
    return _up(args)


def _keygen(args: argparse.Namespace) -> int:
    from mplang.cluster.identity import format_fingerprint, keygen

    cert = keygen(args.name, args.out, days=args.days)
    out = Path(args.out)
    print(f"wrote {out / (args.name + '.key')} (private: keep it here) and "
          f"{out / (args.name + '.crt')} (share it)")
    print(f"certificate sha256 fingerprint: {format_fingerprint(cert.fingerprint)}")
    return 0


def _init(args: argparse.Namespace) -> int:
    from mplang.cluster.local import init_cluster

    path = init_cluster(args.nodes, args.out)
    print(f"wrote {path} and {path.parent / 'keys'}/ (every party's key: for development on "
          "this machine only)")
    print(f"start the workers: mplang up --cluster {path}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from mplang.records.audit import format_summary, summarize

    summary = summarize(args.logs)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def _budget(args: argparse.Namespace) -> int:
    from mplang.driver.upload_client import budget
    from mplang.policy.ledger import format_report

    report = budget(args.cluster, args.node, key=args.key)
    print(json.dumps(report, indent=2) if args.json else format_report(args.node, report))
    return 0


def _put(args: argparse.Namespace) -> int:
    from mplang.driver.upload_client import put, read_npy

    answer = put(args.cluster, args.node, args.name, read_npy(args.file), key=args.key)
    shape = "x".join(map(str, answer["shape"])) or "scalar"
    print(f"uploaded {answer['name']!r} ({answer['dtype']}, shape {shape}) to "
          f"{answer['node']}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from mplang.cluster.identity import load_identity
    from mplang.cluster.status import cluster_status, format_status

    spec_path = Path(args.cluster)
    key = args.key or spec_path.resolve().parent / "keys" / f"{args.name}.key"
    spec = mp.ClusterSpec.from_yaml(spec_path)
    statuses = cluster_status(spec, load_identity(key), timeout=args.timeout)
    print(format_status(statuses, spec.digest()))
    return 0 if all(s.problem is None for s in statuses) else 1


def _check(args: argparse.Namespace) -> int:
    from mplang.policy.report import check_program

    if args.cluster and (args.policies or args.data_root):
        print("mplang check: --policies and --data-root go with --sim (with --cluster, each "
              "node's policy is policies/NODE.yaml next to the spec)", file=sys.stderr)
        return 2
    return 0 if check_program(args.cluster, args.program, args.policy, args.node,
                              policies=args.policies, data_root=args.data_root) else 1


_LOCAL = {"worker": _serve, "up": _serve, "keygen": _keygen, "init": _init, "audit": _audit,
          "budget": _budget, "put": _put, "check": _check, "status": _status}


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
    ir.add_argument("--format", choices=("text", "dot", "svg", "html"), default="text",
                    help="text IR (default), graphviz DOT, SVG (needs graphviz's dot program) "
                         "or an HTML page")
    ir.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    files = ir.add_mutually_exclusive_group()
    files.add_argument("--data-root", metavar="DIR",
                       help="a program that loads files: node NODE's are in DIR/NODE (a "
                            "simulator of --world-size parties looks up their types)")
    files.add_argument("--cluster", metavar="F",
                       help="a program that loads files: ask the workers of cluster spec F "
                            "for their types (the program is traced for F's parties)")
    ir.add_argument("--key", metavar="K", help="with --cluster: the driver's key (default: "
                                                "keys/driver.key next to the spec)")
    keygen = commands.add_parser("keygen", help="make a key pair and certificate for a party")
    keygen.add_argument("--name", required=True, help="the node or driver name")
    keygen.add_argument("--out", required=True, help="folder for NAME.key and NAME.crt")
    keygen.add_argument("--days", type=int, default=365, help="validity (default 365)")
    init = commands.add_parser("init", help="write a development cluster: spec and keys")
    init.add_argument("--nodes", type=int, required=True, help="number of parties")
    init.add_argument("--out", required=True, help="folder for cluster.yaml and keys/")
    worker = commands.add_parser("worker", help="serve one node of a cluster spec (mutual TLS)")
    worker.add_argument("--cluster", required=True, help="cluster spec YAML")
    worker.add_argument("--node", required=True, help="the node to serve, e.g. node_0")
    worker.add_argument("--key", help="this node's private key (default: keys/NODE.key next "
                                      "to the spec; its certificate is NODE.crt beside it)")
    worker.add_argument("--listen", metavar="HOST:PORT",
                        help="listen here, not at the spec's endpoint (a proxy there forwards)")
    worker.add_argument("--timeout", type=float, default=60.0,
                        help="seconds any wait for a peer may take (default 60)")
    for name, text in LIMIT_OPTIONS.items():
        worker.add_argument("--" + name.replace("_", "-"), help=text,
                            type=float if name.endswith("_seconds") else int)
    worker.add_argument("--audit-log", metavar="PATH",
                        help="append this node's audit events (JSON lines) to PATH "
                             "(default ./audit/NODE.jsonl)")
    worker.add_argument("--state-dir", metavar="DIR",
                        help="keep this node's privacy budget ledger in DIR (default "
                             "./state/NODE)")
    worker.add_argument("--data-root", metavar="DIR",
                        help="where tensor.load reads this node's files (default ./data/NODE)")
    worker.add_argument("--policy", metavar="P",
                        help="this node's policy file, reloaded when it changes (default "
                             "policies/NODE.yaml next to the spec if it exists, else: no "
                             "plaintext leaves, no reveals of its data)")
    worker.add_argument("--exit-with-parent", action="store_true",
                        help="exit when the parent process dies (mplang up uses this)")
    worker.add_argument("--register", action="append", default=[], metavar="MODULE:FUNCTION",
                        help="a host function tensor.pyfunc may call here (repeatable)")
    worker.add_argument("--plugin", action="append", default=[], metavar="NAME",
                        help="load this plugin (entry point or module) before serving "
                             "(repeatable)")
    up = commands.add_parser("up", help="start every node of a cluster spec on this machine")
    up.add_argument("--cluster", required=True, help="cluster spec YAML")
    up.add_argument("--keys", help="folder with NODE.key of every node (default: keys/ next "
                                   "to the spec)")
    up.add_argument("--register", action="append", default=[], metavar="MODULE:FUNCTION",
                    help="a host function every worker may call (repeatable)")
    up.add_argument("--plugin", action="append", default=[], metavar="NAME",
                    help="a plugin every worker loads (repeatable)")
    up.add_argument("--audit-dir", metavar="DIR",
                    help="write each node's audit log to DIR/NODE.jsonl (default ./audit)")
    up.add_argument("--state-dir", metavar="DIR",
                    help="keep each node's privacy budget ledger in DIR/NODE (default ./state)")
    up.add_argument("--data-root", metavar="DIR",
                    help="each node reads its files from DIR/NODE (default ./data/NODE)")
    put = commands.add_parser("put", help="upload a tensor to a node's own worker, with "
                                          "the node's key (programs read it with simp.load)")
    put.add_argument("--cluster", required=True, help="cluster spec YAML")
    put.add_argument("--node", required=True, help="the node to upload to (your own)")
    put.add_argument("--key", help="the node's private key (default: keys/NODE.key next to "
                                   "the spec)")
    put.add_argument("name", help="the object's name (1-128 letters, digits or '_.-')")
    put.add_argument("file", help="a .npy file")
    budget = commands.add_parser("budget", help="a node's privacy budget: the epsilon spent "
                                 "and left per source of its data (asks its own worker)")
    budget.add_argument("--cluster", required=True, help="cluster spec YAML")
    budget.add_argument("--node", required=True, help="the node (your own)")
    budget.add_argument("--key", help="the node's private key (default: keys/NODE.key next to "
                        "the spec)")
    budget.add_argument("--json", action="store_true", help="print the ledger as JSON")
    audit = commands.add_parser("audit", help="summarise workers' audit logs")
    audit.add_argument("logs", nargs="+", metavar="LOG", help="audit log (JSON lines)")
    audit.add_argument("--json", action="store_true", help="print the summary as JSON")
    status = commands.add_parser("status", help="ask every node of a cluster spec whether its "
                                 "worker is up, with which certificate, spec, version and "
                                 "devices (exit code 1 unless all are up and agree, and "
                                 "their policy files loaded)")
    status.add_argument("--cluster", required=True, help="cluster spec YAML")
    status.add_argument("--key", help="the private key to ask with (default: keys/NAME.key "
                                      "next to the spec)")
    status.add_argument("--name", default="driver",
                        help="whose key to use by default: a driver or node name (default "
                             "driver)")
    status.add_argument("--timeout", type=float, default=5.0,
                        help="seconds to wait for each node (default 5)")
    check = commands.add_parser("check", help="print a saved program's data flows and each "
                                               "node's policy verdict, without running it")
    nodes = check.add_mutually_exclusive_group(required=True)
    nodes.add_argument("--cluster", help="cluster spec YAML")
    nodes.add_argument("--sim", action="store_true",
                       help="the simulator's nodes for the program's parties (mplang run --sim)")
    check.add_argument("--policy", help="the policy file to apply (default: each node's own, "
                       "policies/NODE.yaml next to the spec, else the default policy; with "
                       "--sim: the policy `mplang init` writes for it)")
    check.add_argument("--policies", metavar="DIR",
                       help="with --sim: node NODE's policy is DIR/NODE.yaml if it exists")
    check.add_argument("--data-root", metavar="DIR",
                       help="with --sim: node NODE's files are in DIR/NODE (the files the "
                            "program loads are looked up there)")
    check.add_argument("--node", help="check only this node (default: every node)")
    check.add_argument("program", help="a program written by Program.save (.mpl)")
    add_ops_parser(commands)
    add_run_parser(commands)
    add_trace_parser(commands)
    add_apidoc_parser(commands)
    args = parser.parse_args(argv)

    if args.command == "demo":
        from mplang.libs.demo import run_demo

        run_demo(args.world_size)
        return 0
    if args.command in _LOCAL:  # these print an error as "mplang COMMAND: ..." and exit 2
        try:
            return _LOCAL[args.command](args)
        except (mp.MPLangError, OSError) as e:
            print(f"mplang {args.command}: {e}", file=sys.stderr)
            return 2
    if args.command == "ops":
        return run_ops(args)
    if args.command == "run":
        return run_script(args)
    if args.command == "trace":
        return run_trace(args)
    if args.command == "apidoc":
        return run_apidoc(args)
    return _ir(args)
