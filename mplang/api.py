"""The user-facing verbs: compile, evaluate, fetch."""

from __future__ import annotations

import builtins
import contextlib
import os
from collections.abc import Callable
from typing import Any

from mplang.cli.progress import ProgressDisplay, in_notebook, is_terminal
from mplang.device.cluster import ClusterSpec
from mplang.device.fetch import fetch_device_object
from mplang.edsl.context import ExecutionContext
from mplang.edsl.errors import MPLangError, MPTraceError, MPTypeError
from mplang.edsl.function import run_function
from mplang.edsl.location import locate_error
from mplang.edsl.object import MPObject
from mplang.edsl.program import Program, trace_program
from mplang.edsl.pytree import tree_flatten, tree_map, tree_unflatten
from mplang.edsl.tracer import TraceObject
from mplang.records.trace_file import check_trace_path, write_trace
from mplang.runtime.console import whole_lines
from mplang.runtime.options import Mode, RunOptions, make_options
from mplang.runtime.timeline import RunMonitor


def compile(fn: Callable[..., Any], *args: Any, world_size: int | None = None,
            cluster: ClusterSpec | None = None, **kwargs: Any) -> Program:
    """Trace ``fn(*args, **kwargs)`` into a program for ``world_size`` parties, or for
    the parties and devices of ``cluster``.

    Plain values among the arguments are compile-time constants; MPLang objects
    (from an earlier evaluate) are runtime inputs, replaceable by objects of the
    same types when the program is evaluated.
    """
    if cluster is None:
        if world_size is None:
            error = MPLangError(
                "mp.compile needs the parties to compile for: pass world_size=N for a "
                "simp-level program (e.g. mp.compile(fn, *args, world_size=3)) or "
                "cluster=mp.ClusterSpec.simple(N) for one that uses devices")
            locate_error(error)
            raise error
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise MPLangError(f"world_size must be a positive int, got {world_size!r}")
        cluster = ClusterSpec.simple(world_size)
    elif world_size is not None and world_size != cluster.world_size:
        raise MPLangError(f"world_size={world_size} contradicts the cluster's "
                          f"{cluster.world_size} nodes")
    program, _ = trace_program(fn, args, kwargs, cluster.world_size, cluster)
    return program


def evaluate(ctx: ExecutionContext, fn_or_program: Callable[..., Any] | Program, *args: Any,
             mode: Mode | None = None, progress: bool | Callable[[str], None] | None = None,
             parallel: bool = True, timeout: float | None = None,
             trace: str | os.PathLike[str] | None = None, **kwargs: Any) -> Any:
    """Run a function (traced on ``args`` first) or a compiled program in ``ctx``.

    A program takes only its runtime inputs (MPLang objects). ``mode`` is
    ``"launch"`` (default: every party runs the whole graph) or ``"standard"``
    (the driver interprets and dispatches op by op).

    ``progress``: None (default) shows a live display (ops done of those expected,
    each party's current op, bytes moved) on standard error when it is a terminal,
    or as one output of the running cell in a Jupyter notebook, when the run takes
    over a second; True shows it too, or prints a line per
    completed op when standard error is not a terminal (each line written at once,
    while the program's own prints are held until their line ends, so neither splits
    the other's lines); False shows nothing; a callable receives a line per completed
    op.

    ``trace="run.json"`` writes the run's timeline as a Chrome / Perfetto trace: a
    track per party, a slice per op with its source line and the messages and bytes
    it sent and received (written even when the run fails; see `mplang trace
    summarize`). ``parallel=False`` runs one op at a time, in standard mode unless
    ``mode`` says otherwise; results are identical either way. ``timeout`` bounds
    every wait for a message (seconds; default: the context's). The keywords become
    one `RunOptions` that every interpreter of the run receives.
    """
    if not isinstance(ctx, ExecutionContext):
        raise MPLangError(f"evaluate needs an execution context (e.g. mp.Simulator), got {ctx!r}")
    name = fn_or_program.name if isinstance(fn_or_program, Program) \
        else getattr(fn_or_program, "__name__", "main")
    trace_path = None if trace is None else check_trace_path(trace)
    notebook = in_notebook()
    display = (progress is None or progress is True) and (is_terminal() or notebook)
    monitor = RunMonitor(name, record=trace_path is not None) \
        if trace_path is not None or display else None
    options = make_options(name, mode=mode, parallel=parallel, timeout=timeout,
                           progress=None if display else progress, monitor=monitor)
    lines = whole_lines() if progress is True and not display else contextlib.nullcontext()
    if monitor is None:
        with lines:  # progress lines and the program's prints never split each other
            return _evaluate(ctx, fn_or_program, args, kwargs, options)
    try:
        with ProgressDisplay(monitor, notebook=notebook) if display else lines:
            return _evaluate(ctx, fn_or_program, args, kwargs, options)
    finally:
        if trace_path is not None:
            write_trace(monitor, trace_path)


def _evaluate(ctx: ExecutionContext, fn_or_program: Callable[..., Any] | Program,
              args: tuple[Any, ...], kwargs: dict[str, Any], options: RunOptions) -> Any:
    if isinstance(fn_or_program, Program):
        if kwargs:
            raise MPLangError("a compiled program takes positional runtime inputs only")
        leaves, _ = tree_flatten(args)
        plain = [type(x).__name__ for x in leaves if not isinstance(x, MPObject)]
        if plain:
            raise MPLangError(
                f"a compiled program takes MPLang objects only; got plain values of types "
                f"{plain} (compile-time constants are already part of the program)")
        outputs = ctx.run_program(fn_or_program, leaves, options)
        return tree_unflatten(fn_or_program.out_tree, outputs)
    if not builtins.callable(fn_or_program):
        raise MPLangError(f"evaluate takes a function or a Program, got {fn_or_program!r}")
    return run_function(ctx, fn_or_program, args, kwargs, options)


def fetch(ctx: ExecutionContext, obj: Any) -> Any:
    """The values of ``obj`` (any pytree of MPLang objects), brought to the caller.

    A simp-level object becomes a list with one entry per party (None where the
    party holds nothing); an object on a device becomes its plain value (a secure device's
    object is revealed to the caller).
    """
    def one(x: Any) -> Any:
        if not isinstance(x, MPObject):
            return x
        if isinstance(x, TraceObject):
            error = MPTraceError(
                f"mp.fetch got {x!r}, a traced value of a program being traced, which has no "
                "data until the program runs; return it from the function and fetch the "
                "result: mp.fetch(sim, mp.evaluate(sim, fn))")
            locate_error(error)
            raise error
        if x.base_type.confined:
            raise MPTypeError(f"fetch: {x.mptype} is key material, which never leaves the "
                              "party holding it; fetch what it protects or produces instead")
        if x.device is None:
            return ctx.fetch_object(x)
        try:
            return fetch_device_object(ctx, x)
        except MPLangError as e:
            locate_error(e)
            raise

    return tree_map(one, obj)
