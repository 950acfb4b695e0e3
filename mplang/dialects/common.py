"""Helpers shared by dialect definitions."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from mplang.edsl.errors import MPTypeError
from mplang.edsl.graph import Graph
from mplang.edsl.location import raised_at
from mplang.edsl.typing import TensorType
from mplang.flows.stablehlo import traced_line
from mplang.util.lru import LRUCache


def as_array(op: str, value: Any) -> np.ndarray:
    """``value`` as a numpy array with JAX's canonical dtype (32-bit unless x64 is enabled)."""
    try:
        arr = np.asarray(value)
    except Exception as e:
        raise MPTypeError(f"{op}: cannot make an array of {type(value).__name__}: {e}") from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise MPTypeError(f"{op}: values of dtype {arr.dtype} are not supported; use numbers")
    dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
    if dtype != arr.dtype and arr.dtype.kind in "iu" and arr.size:
        info = np.iinfo(dtype)
        low, high = arr.min(), arr.max()
        if low < info.min or high > info.max:
            raise MPTypeError(f"{op}: integer values in [{low}, {high}] do not fit {dtype} "
                              "(JAX runs with 32-bit integers unless jax_enable_x64 is set)")
    arr = arr.astype(dtype, copy=False)
    return arr if arr.flags.c_contiguous else arr.copy()


def trace_failure(error: BaseException) -> str:
    """How a tracing compiler's (JAX's, a secure device's) refusal to trace a user's function
    reads in an error: the exception, the line of the function it was raised at, and what
    to fix."""
    loc = raised_at(error)
    where = f"raised at {loc}; " if loc else ""
    return (f"{type(error).__name__}: {str(error).rstrip()} ({where}fix the function or the "
            "shapes and dtypes of its arguments)")


def canonical_type(t: TensorType) -> TensorType:
    """``t`` with JAX's canonical dtype: the type `as_array` gives data of type ``t``."""
    return TensorType.of(jax.dtypes.canonicalize_dtype(np.dtype(t.dtype)), t.shape)


_LOCATED: LRUCache = LRUCache(1024)
"""A device function's StableHLO as a program carries it (no source locations: program
bytes must not depend on where the code lives) -> how to lower it again with them."""
_RAW_AT = re.compile(r"(stablehlo\.\w+) #(\d+)(?= in the function traced at (\S+?:\d+)\))")


def remember_located(payload: bytes, located: Callable[[], str]) -> None:
    """Note that this process traced a device function to ``payload`` (an op attribute),
    and that ``located()`` gives its StableHLO text again, with source locations."""
    _LOCATED.store(payload, located)


def with_traced_lines(message: str, graph: Graph) -> str:
    """A party's refusal ``message`` with each StableHLO op it names (``stablehlo.sort #2
    in the function traced at prog.py:9``) given the line inside that function that traced
    it (``stablehlo.sort at prog.py:6``), where this process traced the function."""
    def line(match: re.Match[str]) -> str:
        name, number, where = match[1], int(match[2]), match[3]
        for op in graph.walk():
            for payload in (v for v in op.attrs.values() if op.loc == where and
                            isinstance(v, bytes) and v in _LOCATED):
                try:
                    found = traced_line(_LOCATED.lookup(payload)(), name, number)
                except Exception:  # the lowering with locations failed: keep the number
                    found = None
                if found is not None:
                    return f"{name} at {found}"
        return match[0]

    return _RAW_AT.sub(line, message)

