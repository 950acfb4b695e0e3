"""The tensor corpus (`tests.dialects.corpus`): tensor.constant, run_jax, pyfunc and
func.call."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mplang import func, simp, tensor


def host_double(a: np.ndarray) -> np.ndarray:
    """A host function for ``tensor.pyfunc`` (module level: a stable name)."""
    return a * 2


@func.func
def triple(v: Any) -> Any:
    """A ``func.call`` whose body uses ``tensor.run_jax`` and ``tensor.constant``."""
    return simp.pcall(None, lambda t: tensor.run_jax(
        jnp.multiply, t, tensor.constant(np.full(3, 3, np.float32))), v)


def tensor_corpus() -> Any:
    """tensor.constant, tensor.run_jax, tensor.pyfunc and func.call."""
    x = simp.constant((0, 1), np.arange(3, dtype=np.float32))
    y = simp.pcall((0,), lambda v: tensor.pyfunc(
        host_double, v, out=jax.ShapeDtypeStruct((3,), jnp.float32)), x)
    return y, triple(x)


TENSOR_EXPECTED = ([[0.0, 2.0, 4.0], None, None], [[0.0, 3.0, 6.0], [0.0, 3.0, 6.0], None])


def check(result: Any) -> None:
    for got, expected in zip(result, TENSOR_EXPECTED, strict=True):
        assert [None if v is None else np.asarray(v).tolist() for v in got] == expected
