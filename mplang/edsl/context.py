"""Contexts: where a primitive call goes. A `Tracer` records it; an
`ExecutionContext` (simulator, driver) runs it. The current context is per thread.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

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
    stack = _stack()
    return stack[-1] if stack else None


def execution_context() -> ExecutionContext | None:
    """The innermost execution context entered on this thread (``with sim:``), if any."""
    for ctx in reversed(_stack()):
        if isinstance(ctx, ExecutionContext):
            return ctx
    return None
