"""Kernels of the `tensor` dialect: run serialized StableHLO with JAX on the CPU.

Received run_jax modules pass a payload check first: a helper process lowers and
compiles each distinct module before this process parses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from mplang.dialects.tensor import exported_module, module_info
from mplang.edsl.graph import Operation
from mplang.edsl.typing import TensorType, numpy_dtype
from mplang.frontend.pyfuncs import lookup_pyfunc
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Interpreter
from mplang.runtime.sandbox import NativePayloadChecker

BACKEND = register_backend("tensor")


def compile_module(module: bytes) -> None:
    """Parse, lower and compile ``module`` for its declared input types, as the kernel's
    first call does; raises if any step fails. Runs in the payload checker's helper."""
    exp = exported_module(module)
    specs = [jax.ShapeDtypeStruct(t.shape, numpy_dtype(t.dtype))
             for t in module_info(module).in_types]
    jax.jit(exp.call).lower(*specs).compile()


MODULE_CHECKER = NativePayloadChecker(compile_module, "run_jax module")
"""The helper process that vets this process's received run_jax modules."""


@BACKEND.payload_check("tensor.run_jax")
def _check_run_jax(op: Operation) -> None:
    MODULE_CHECKER.check(op.attrs["module"], f"tensor.run_jax[{op.attrs['fn']}]")

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


@BACKEND.kernel("tensor.constant")
def _constant(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    return [op.attrs["value"]]


@BACKEND.kernel("tensor.run_jax")
def _run_jax(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    out = _compiled(op.attrs["module"])(*args)
    return list(jax.tree_util.tree_leaves(out))


@BACKEND.kernel("tensor.pyfunc")
def _pyfunc(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    name: str = op.attrs["fn"]
    fn = lookup_pyfunc(name)
    if fn is None:
        raise RuntimeError(f"host function {name!r} is not registered on this party; start "
                           f"the worker with --register {name}")
    result = fn(*[np.asarray(a) for a in args])
    out_types: tuple[TensorType, ...] = op.attrs["out_types"]
    values = list(result) if isinstance(result, tuple | list) else [result]
    if len(values) != len(out_types):
        raise RuntimeError(f"{name} returned {len(values)} values, declared {len(out_types)}")
    outs = []
    for i, (value, t) in enumerate(zip(values, out_types, strict=True)):
        arr = np.asarray(value)
        if arr.shape != t.shape:
            raise RuntimeError(f"{name} result {i} has shape {arr.shape}, declared {t}")
        outs.append(arr.astype(numpy_dtype(t.dtype), copy=False))
    return outs
