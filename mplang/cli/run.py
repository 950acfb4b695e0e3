"""``mplang run SCRIPT``: run a script's programs on a simulator or a cluster.

The command creates the context (``--sim N``: an in-memory `Simulator`;
``--cluster F``: a `Driver` for the workers of spec ``F``), installs it as the
process-wide default that ``mp.current_context()`` returns, runs the script as
``__main__`` and, under the rule `DESCRIPTION` states, calls its ``main(ctx)``.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import traceback
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mplang as mp
from mplang.driver.base import SimpDriver
from mplang.edsl.context import set_default_context
from mplang.edsl.location import is_user_file

USAGE = ("mplang run SCRIPT [ARG ...] (--sim N [--data-root DIR] [--policies DIR | --open] "
         "| --cluster F [--key K] [--name DRIVER]) [--timeout S]")
DESCRIPTION = """\
Run SCRIPT as __main__ with sys.argv = [SCRIPT, ARG ...] and SCRIPT's folder on
sys.path, on an in-memory simulator of N parties (--sim N; node NODE reads its
files from DIR/NODE with --data-root DIR, else from ./data/NODE; each node
judges every program by the policy `mplang init` writes for it, or by
NODE.yaml in --policies DIR; --open judges nothing) or on the
workers of the cluster spec F (--cluster F; `mplang init --nodes 3 --out dev`
writes one; each worker reads its own data root).

The script gets the context with `ctx = mp.current_context()`, or defines
`def main(ctx)`: after the script ran, mplang run calls main(ctx) unless the
script already ran a program on the context (for instance because its
`if __name__ == "__main__":` block called main itself). A script that runs no
program on the context is an error.

Options of mplang run may come before or after SCRIPT and its arguments;
arguments after `--` all go to the script."""

_OWN_OPTIONS = ("--sim", "--cluster", "--key", "--name", "--timeout", "--data-root",
                "--policies")
"""The options taken out of the tokens after SCRIPT (each takes one value)."""
_OWN_FLAGS = ("--open",)
"""The flags taken out of the tokens after SCRIPT."""
_MAX_FRAMES = 8
"""The innermost frames of the user's files an error report shows."""


class _BadInput(Exception):
    """A command-line mistake: reported in one line, exit code 2."""


def _add_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--sim", type=int, metavar="N",
                       help="run on an in-memory simulator of N parties (mp.Simulator(N))")
    where.add_argument("--cluster", metavar="F",
                       help="run on the workers of cluster spec F (mp.Driver(F, key=K))")
    parser.add_argument("--key", metavar="K",
                        help="the driver's private key (default: keys/DRIVER.key next to "
                             "the spec)")
    parser.add_argument("--name", metavar="DRIVER",
                        help="the driver's name in the spec (default: driver)")
    parser.add_argument("--data-root", metavar="DIR",
                        help="with --sim: node NODE reads its files from DIR/NODE (default "
                             "./data/NODE)")
    judge = parser.add_mutually_exclusive_group()
    judge.add_argument("--policies", metavar="DIR",
                       help="with --sim: node NODE judges programs by DIR/NODE.yaml (default: "
                            "the policy `mplang init` writes for it)")
    judge.add_argument("--open", action="store_true",
                       help="with --sim: no node judges any program")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="seconds a wait for a message between parties (--sim) or a "
                             "worker's reply (--cluster) may take")


def add_run_parser(commands: Any) -> None:
    """Add the ``run`` subcommand to ``commands`` (the ``add_subparsers`` object)."""
    run = commands.add_parser("run", help="run a script's programs on a simulator or a cluster",
                              usage=USAGE, description=DESCRIPTION, allow_abbrev=False,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_options(run)
    run.add_argument("tokens", nargs=argparse.REMAINDER, metavar="SCRIPT [ARG ...]",
                     help="the script and its arguments")


def _split(tokens: Sequence[str]) -> tuple[list[str], list[str]]:
    """Tokens after SCRIPT as (mplang run's options, the script's arguments)."""
    own: list[str] = []
    script: list[str] = []
    rest = iter(tokens)
    for token in rest:
        if token == "--":
            script.extend(rest)
            break
        if token in _OWN_FLAGS:
            own.append(token)
            continue
        if token.split("=", 1)[0] not in _OWN_OPTIONS:
            script.append(token)
            continue
        own.append(token)
        if "=" not in token:
            value = next(rest, None)
            if value is None:
                raise _BadInput(f"{token} needs a value")
            own.append(value)
    return own, script


def _parse(args: argparse.Namespace) -> tuple[Path, list[str]]:
    """The script and its arguments; ``args`` gets the options given after SCRIPT."""
    tokens = list(args.tokens)
    if tokens[:1] == ["--"]:
        tokens = tokens[1:]
    if not tokens:
        raise _BadInput(f"give the script to run: {USAGE}")
    own, script_args = _split(tokens[1:])
    if own:
        late = argparse.ArgumentParser(prog="mplang run", usage=USAGE, add_help=False,
                                       allow_abbrev=False, exit_on_error=False)
        _add_options(late)
        try:
            late.parse_args(own, namespace=args)
        except argparse.ArgumentError as e:
            raise _BadInput(str(e)) from None
    if (args.sim is None) == (args.cluster is None):
        raise _BadInput("give exactly one of --sim N and --cluster F")
    if args.sim is not None and (args.key or args.name):
        raise _BadInput("--key and --name go with --cluster, not --sim")
    if args.cluster is not None and (args.policies or args.open):
        raise _BadInput("--policies and --open go with --sim: each worker of a cluster reads "
                        "its own policy (mplang worker --policy FILE)")
    if args.cluster is not None and args.data_root:
        raise _BadInput("--data-root goes with --sim: each worker of a cluster reads its own "
                        "data root (mplang worker --data-root DIR, mplang up --data-root DIR)")
    path = Path(tokens[0])
    if not path.is_file():
        raise _BadInput(f"no such script: {path}")
    return path, script_args


def _open(args: argparse.Namespace) -> SimpDriver:
    """The simulator or driver ``args`` ask for."""
    options: dict[str, Any] = {} if args.timeout is None else {"timeout": args.timeout}
    if args.sim is not None:
        if args.data_root:
            options["data_roots"] = data_roots(mp.ClusterSpec.simple(args.sim), args.data_root)
        if args.policies and not Path(args.policies).is_dir():
            raise _BadInput(f"--policies {args.policies}: no such folder (it holds NODE.yaml "
                            "per node, as `mplang init` writes in policies/)")
        policies = "open" if args.open else args.policies
        return mp.Simulator(args.sim, policies=policies, **options)
    spec = Path(args.cluster)
    if not spec.is_file():
        raise _BadInput(f"no such cluster spec: {spec} (write a development cluster with: "
                        "mplang init --nodes 3 --out dev)")
    key = args.key
    if key is None and args.name:
        key = spec.resolve().parent / "keys" / f"{args.name}.key"
    return mp.Driver(spec, key=key, **options)


def data_roots(cluster: mp.ClusterSpec, folder: str) -> dict[str, Path]:
    """``{NODE: folder/NODE}`` for every node of ``cluster``; refuses a missing folder."""
    base = Path(folder)
    if not base.is_dir():
        raise mp.MPLangError(f"--data-root {folder}: no such folder (it holds a folder per node: "
                        f"{base / cluster.nodes[0].name}, ...)")
    return {node.name: base / node.name for node in cluster.nodes}


def _takes_context(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` can be called as ``fn(ctx)``: exactly one required parameter, which
    may be passed by position."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL,
                                   inspect.Parameter.VAR_KEYWORD)]
    return len(required) == 1 and required[0].kind in positional


def _execute(path: Path, argv: list[str], ctx: SimpDriver) -> None:
    """Run the script as ``__main__`` (then ``main(ctx)`` if due); raise `_BadInput` if
    it ran no program on ``ctx``."""
    full = path.resolve()
    code = compile(full.read_bytes(), str(full), "exec")
    module = types.ModuleType("__main__")
    module.__file__ = str(full)
    saved_argv, saved_main, saved_path = sys.argv, sys.modules.get("__main__"), list(sys.path)
    sys.argv = [str(path), *argv]
    sys.modules["__main__"] = module
    sys.path.insert(0, str(full.parent))
    runs = ctx.runs
    try:
        try:
            exec(code, module.__dict__)
            main = module.__dict__.get("main")
            if ctx.runs == runs and callable(main) and _takes_context(main):
                main(ctx)
        except SystemExit as e:  # sys.exit(0) ends the script normally
            if e.code not in (None, 0):
                raise
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
    if ctx.runs == runs:
        raise _BadInput(
            f"{path.name} ran no MPLang program on the {ctx.kind} mplang run gave it: get "
            "that context with `ctx = mp.current_context()` and run programs with "
            "mp.evaluate(ctx, ...), or define `def main(ctx)`, which mplang run calls")


def _user_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The traceback of ``error`` restricted to the user's own files (the script and
    modules beside it), innermost last."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith("<") and is_user_file(f.filename)]
    return frames[-_MAX_FRAMES:]


def _report(error: BaseException) -> None:
    print(f"mplang run: {type(error).__name__}: {error}", file=sys.stderr)
    frames = _user_frames(error)
    if frames:
        print("in your script (most recent call last):", file=sys.stderr)
        print("".join(traceback.format_list(frames)), end="", file=sys.stderr)


def run_script(args: argparse.Namespace) -> int:
    """``mplang run``: 0 when the script ran, 1 when it raised, 2 on bad input (a missing
    script or cluster spec, a script that runs no program)."""
    try:
        path, script_args = _parse(args)
        ctx = _open(args)
    except (_BadInput, mp.MPLangError, OSError) as e:
        print(f"mplang run: {e}", file=sys.stderr)
        return 2
    previous = set_default_context(ctx)
    try:
        _execute(path, script_args, ctx)
    except _BadInput as e:
        print(f"mplang run: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except Exception as e:
        _report(e)
        return 1
    finally:
        set_default_context(previous)
        ctx.close()
    return 0
