"""Contexts: where a primitive call goes. A `Tracer` records it; an
`ExecutionContext` (simulator, driver) runs it. The current context is per thread;
``mplang run`` also installs a process-wide default execution context for scripts.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from mplang.edsl.errors import MPLangError

if TYPE_CHECKING:
    from mplang.edsl.object import MPObject
    from mplang.edsl.program import Program


class Context:
    """Base of tracing and execution contexts; ``with ctx:`` makes it current."""

    world_size: int
    cluster: Any
    """The `ClusterSpec` device names resolve against (None if the context has none)."""

    def __enter__(self) -> Any:
        _stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        popped = _stack().pop()
        assert popped is self, "contexts must be exited in reverse order of entry"


class ExecutionContext(Context, ABC):
    """A context that runs programs across ``world_size`` parties."""

    @abstractmethod
    def run_program(self, program: Program, inputs: list[MPObject],
                    options: Any = ...) -> list[MPObject]:
        """Run ``program`` on runtime objects ``inputs`` under ``options`` (`RunOptions`);
        return its outputs as runtime objects."""

    @abstractmethod
    def fetch_object(self, obj: MPObject) -> Any:
        """Bring one runtime object's per-party values to the caller."""


_local = threading.local()


def _stack() -> list[Context]:
    stack: list[Context] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def current_context() -> Context | None:
    """The innermost context entered on this thread (None: none)."""
    stack: list[Context] | None = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def execution_context() -> ExecutionContext | None:
    """The innermost execution context entered on this thread (``with sim:``), if any."""
    for ctx in reversed(_stack()):
        if isinstance(ctx, ExecutionContext):
            return ctx
    return None


_default: ExecutionContext | None = None
"""The execution context ``mplang run`` gave the script (None outside ``mplang run``)."""


def set_default_context(ctx: ExecutionContext | None) -> ExecutionContext | None:
    """Make ``ctx`` the process-wide fallback of `active_execution_context` (None: no
    fallback); return the previous one so the caller can restore it."""
    global _default
    previous, _default = _default, ctx
    return previous


def active_execution_context() -> ExecutionContext:
    """The execution context a script should run its programs on (``mp.current_context()``).

    It is the innermost ``with ctx:`` execution context on this thread, else the
    simulator or driver ``mplang run`` created for the script. Raises `MPLangError`
    when there is neither.
    """
    ctx = execution_context() or _default
    if ctx is None:
        raise MPLangError(
            "mp.current_context(): no MPLang context is active. Run the script with "
            "`mplang run SCRIPT --sim 3` (or `--cluster cluster.yaml`), or create a context "
            "yourself: `sim = mp.Simulator(3)` or `mp.Driver('cluster.yaml', "
            "key='keys/driver.key')`, and pass it to mp.evaluate")
    return ctx
