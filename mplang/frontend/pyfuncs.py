"""Named host functions for ``tensor.pyfunc``.

A program names a host function; it never carries its code. In one process
(the simulator) tracing registers the callable under its name; an HTTP worker
knows only the functions its operator registered (``mplang worker --register
module:function``), so nothing received over the network becomes code.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from mplang.edsl.errors import MPLangError

_FUNCS: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()


def name_of(fn: Callable[..., Any]) -> str:
    """``module:qualname`` for module-level functions; made unique for local ones."""
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    name = f"{module}:{qualname}"
    if "<" in qualname:  # lambdas and functions defined inside functions
        name += f"#{id(fn):x}"
    return name


def register_pyfunc(name: str, fn: Callable[..., Any]) -> None:
    """Make ``fn`` callable by ``tensor.pyfunc`` ops naming ``name`` in this process."""
    if not callable(fn):
        raise TypeError(f"{name}: {fn!r} is not callable")
    with _LOCK:
        _FUNCS[name] = fn


def lookup_pyfunc(name: str) -> Callable[..., Any] | None:
    with _LOCK:
        return _FUNCS.get(name)


def import_pyfunc(spec: str) -> str:
    """Import ``module:function`` (an operator's choice, not network input) and register it."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise MPLangError(f"--register takes module:function, got {spec!r}")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if not callable(obj):
        raise MPLangError(f"{spec} is not a function")
    register_pyfunc(spec, obj)
    return spec
