"""Kernels of the `tensor` dialect: run serialized StableHLO with JAX on the CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from mplang.dialects.tensor import exported_module
from mplang.edsl.graph import Operation
from mplang.runtime.interpreter import Interpreter, KernelTable

KERNELS = KernelTable()

_COMPILED: dict[bytes, Callable[..., Any]] = {}
_COMPILED_LIMIT = 4096


def _compiled(module: bytes) -> Callable[..., Any]:
    fn = _COMPILED.get(module)
    if fn is None:
        fn = jax.jit(exported_module(module).call)
        if len(_COMPILED) >= _COMPILED_LIMIT:
            _COMPILED.pop(next(iter(_COMPILED)))
        _COMPILED[module] = fn
    return fn


@KERNELS.register("tensor.constant")
def _constant(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    return [op.attrs["value"]]


@KERNELS.register("tensor.run_jax")
def _run_jax(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    out = _compiled(op.attrs["module"])(*args)
    return list(jax.tree_util.tree_leaves(out))
