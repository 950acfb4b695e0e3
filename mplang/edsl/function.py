"""`@function`: one Python function, traced inline or run, depending on the context."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from mplang.edsl.context import ExecutionContext, current_context
from mplang.edsl.errors import MPTraceError
from mplang.edsl.location import locate_error
from mplang.edsl.program import trace_program
from mplang.edsl.pytree import tree_unflatten
from mplang.edsl.tracer import Tracer

F = TypeVar("F", bound=Callable[..., Any])


def run_function(ctx: ExecutionContext, fn: Callable[..., Any], args: Any, kwargs: Any,
                 options: Any = None) -> Any:
    """Trace ``fn`` on ``args`` and run it in ``ctx`` with ``options`` (the context's
    `RunOptions`; None: defaults); outputs keep ``fn``'s pytree shape."""
    program, inputs = trace_program(fn, args, kwargs, ctx.world_size, ctx.cluster, ctx)
    outputs = ctx.run_program(program, inputs) if options is None \
        else ctx.run_program(program, inputs, options)
    return tree_unflatten(program.out_tree, outputs)


def _display_name(fn: Callable[..., Any]) -> str:
    """How errors name ``fn``: its ``__mplang_name__``, else ``dialect.name`` for a dialect's
    function, else its qualified name."""
    name = getattr(fn, "__mplang_name__", None)
    if name:
        return str(name)
    module = getattr(fn, "__module__", None) or ""
    qualname = getattr(fn, "__qualname__", repr(fn))
    if module.startswith("mplang.dialects."):
        return f"{module.rsplit('.', 1)[1]}.{qualname}"
    return str(qualname)


def function(fn: F) -> F:
    """Make ``fn`` an MPLang function.

    Called inside a trace, its body is inlined into the caller's graph. Called
    under an execution context (``with sim:``), it is traced and run at once.
    Called anywhere else, it raises `MPTraceError` naming ``fn`` and the caller's line.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = current_context()
        if isinstance(ctx, Tracer):
            return fn(*args, **kwargs)
        if isinstance(ctx, ExecutionContext):
            return run_function(ctx, fn, args, kwargs)
        error = MPTraceError(
            f"{_display_name(fn)} needs a context: it was called outside any MPLang program, "
            "so nothing traces or runs it; call it inside an @mp.function that you run with "
            "mp.evaluate(sim, fn, ...) or mp.compile(fn, ..., world_size=N), or inside "
            "`with sim:`")
        locate_error(error)
        raise error

    return cast(F, wrapper)
