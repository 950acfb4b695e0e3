"""Helpers shared by dialect definitions."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from mplang.frontend.errors import MPTypeError


def as_array(op: str, value: Any) -> np.ndarray:
    """``value`` as a numpy array with JAX's canonical dtype (32-bit unless x64 is enabled)."""
    try:
        arr = np.asarray(value)
    except Exception as e:
        raise MPTypeError(f"{op}: cannot make an array of {type(value).__name__}: {e}") from None
    if arr.dtype == object or arr.dtype.kind in "USV":
        raise MPTypeError(f"{op}: values of dtype {arr.dtype} are not supported; use numbers")
    dtype = jax.dtypes.canonicalize_dtype(arr.dtype)
    arr = arr.astype(dtype, copy=False)
    return arr if arr.flags.c_contiguous else arr.copy()

