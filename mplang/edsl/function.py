"""`@function`: one Python function, traced inline or run, depending on the context."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from mplang.edsl.context import ExecutionContext, current_context
from mplang.edsl.program import trace_program
from mplang.edsl.pytree import tree_unflatten
from mplang.edsl.tracer import Tracer
from mplang.frontend.errors import MPTraceError

F = TypeVar("F", bound=Callable[..., Any])


def run_function(ctx: ExecutionContext, fn: Callable[..., Any], args: Any, kwargs: Any,
                 options: Any = None) -> Any:
    """Trace ``fn`` on ``args`` and run it in ``ctx`` with ``options`` (the context's
    `RunOptions`; None: defaults); outputs keep ``fn``'s pytree shape."""
    program, inputs = trace_program(fn, args, kwargs, ctx.world_size, ctx.cluster, ctx)
    outputs = ctx.run_program(program, inputs) if options is None \
        else ctx.run_program(program, inputs, options)
    return tree_unflatten(program.out_tree, outputs)


def function(fn: F) -> F:
    """Make ``fn`` an MPLang function.

    Called inside a trace, its body is inlined into the caller's graph. Called
    under an execution context (``with sim:``), it is traced and run at once.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = current_context()
        if isinstance(ctx, Tracer):
            return fn(*args, **kwargs)
        if isinstance(ctx, ExecutionContext):
            return run_function(ctx, fn, args, kwargs)
        raise MPTraceError(
            f"{getattr(fn, '__qualname__', fn)} needs a context: call it through "
            "mp.evaluate(sim, fn, ...) or mp.compile, or inside `with sim:`"
        )

    return cast(F, wrapper)
