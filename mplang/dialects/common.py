"""Helpers shared by dialect definitions."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from mplang.edsl.errors import MPTypeError
from mplang.edsl.location import raised_at
from mplang.edsl.typing import TensorType


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
