"""The user-facing verbs: compile, evaluate, fetch."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from mplang.device.cluster import ClusterSpec
from mplang.device.fetch import fetch_device_object
from mplang.edsl.context import ExecutionContext
from mplang.edsl.function import run_function
from mplang.edsl.object import MPObject
from mplang.edsl.program import Program, trace_program
from mplang.edsl.pytree import tree_flatten, tree_map, tree_unflatten
from mplang.frontend.errors import MPLangError, MPTypeError
from mplang.runtime.options import Mode, make_options


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
            raise MPLangError("compile needs world_size=N or cluster=ClusterSpec")
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise MPLangError(f"world_size must be a positive int, got {world_size!r}")
        cluster = ClusterSpec.simple(world_size)
    elif world_size is not None and world_size != cluster.world_size:
        raise MPLangError(f"world_size={world_size} contradicts the cluster's "
                          f"{cluster.world_size} nodes")
    program, _ = trace_program(fn, args, kwargs, cluster.world_size, cluster)
    return program


def evaluate(ctx: ExecutionContext, fn_or_program: Callable[..., Any] | Program, *args: Any,
             mode: Mode | None = None, progress: bool | Callable[[str], None] = False,
             parallel: bool = True, timeout: float | None = None, **kwargs: Any) -> Any:
    """Run a function (traced on ``args`` first) or a compiled program in ``ctx``.

    A program takes only its runtime inputs (MPLang objects). ``mode`` is
    ``"launch"`` (default: every party runs the whole graph) or ``"standard"``
    (the driver interprets and dispatches op by op). ``progress=True`` prints a
    line per completed op (or pass a callable taking the message).
    ``parallel=False`` runs one op at a time, in standard mode unless ``mode``
    says otherwise; results are identical either way. ``timeout`` bounds every
    wait for a message (seconds; default: the context's). The keywords become
    one `RunOptions` that every interpreter of the run receives.
    """
    if not isinstance(ctx, ExecutionContext):
        raise MPLangError(f"evaluate needs an execution context (e.g. mp.Simulator), got {ctx!r}")
    name = fn_or_program.name if isinstance(fn_or_program, Program) \
        else getattr(fn_or_program, "__name__", "main")
    options = make_options(name, mode=mode, parallel=parallel, timeout=timeout,
                           progress=progress)
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
        if x.base_type.confined:
            raise MPTypeError(f"fetch: {x.mptype} is key material, which never leaves the "
                              "party holding it; fetch what it protects or produces instead")
        return ctx.fetch_object(x) if x.device is None else fetch_device_object(ctx, x)

    return tree_map(one, obj)
