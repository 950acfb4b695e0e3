"""Kernels of the `tensor` dialect: run serialized StableHLO with JAX on the CPU.

Received run_jax modules pass a payload check first: a helper process parses,
vets and compiles each distinct module before this process parses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend.mlir import ir as _ir
from jax.interpreters.mlir import make_ir_context

from mplang.dialects import tensor as _tensor
from mplang.dialects.symbolic import lowered, refined
from mplang.dialects.tensor import exported_module, module_info
from mplang.edsl.errors import MPPublicError, MPSerializationError
from mplang.edsl.graph import Operation
from mplang.edsl.typing import TensorType, numpy_dtype
from mplang.frontend.pyfuncs import lookup_pyfunc
from mplang.kernels.symbolic_sizes import bind_sizes
from mplang.runtime.backend import payload_refusal, register_backend
from mplang.runtime.interpreter import Call
from mplang.runtime.sandbox import NativePayloadChecker
from mplang.util.lru import LRUCache

BACKEND = register_backend("tensor")
ir: Any = _ir  # the MLIR bindings ship no type stubs


SAFE_CUSTOM_CALLS = frozenset(["mhlo.topk", "ApproxTopK"])
"""Custom calls XLA rewrites into ordinary HLO. The others run native kernels that trust
the module's buffer shapes (a LAPACK result declared too small is a heap overflow) or
call host functions, so received modules may not use them."""
SHAPE_POLYMORPHISM = frozenset(
    ["custom call 'shape_assertion'", *(f"stablehlo.{name}" for name in [
        "dynamic_broadcast_in_dim", "dynamic_conv", "dynamic_gather", "dynamic_iota",
        "dynamic_pad", "dynamic_reshape", "real_dynamic_slice", "get_dimension_size"])])
"""What a module of sizes known at run time uses before JAX refines it to each run's
sizes; the refined module has none of it (`_refined` checks)."""
REFUSED_OPS = frozenset(f"stablehlo.{name}" for name in [
    "infeed", "outfeed", "send", "recv", "all_gather", "all_reduce", "all_to_all",
    "collective_broadcast", "collective_permute", "reduce_scatter", "dynamic_broadcast_in_dim",
    "dynamic_conv", "dynamic_gather", "dynamic_iota", "dynamic_pad", "dynamic_reshape",
    "real_dynamic_slice", "get_dimension_size", "set_dimension_size"])
"""Host transfers, collectives and dynamic shapes: never in a single-device export of
static shapes, and run by XLA runtime code that trusts its operands."""


def _fft_problem(op: Any) -> str | None:
    """Why ``op`` (a ``stablehlo.fft``) would fail an assertion when run (XLA does not
    check its lengths against its shapes), or None."""
    length = list(ir.DenseI64ArrayAttr(op.attributes["fft_length"]))
    kind = str(op.attributes["fft_type"]).rstrip(">").split()[-1]
    real, half = length, ([*length[:-1], length[-1] // 2 + 1] if length else [])
    expected = {"FFT": (length, length), "IFFT": (length, length), "RFFT": (real, half),
                "IRFFT": (half, real)}.get(kind)
    shapes = [ir.RankedTensorType(v.type).shape for v in (op.operands[0], op.results[0])]
    if (expected is None or not 1 <= len(length) <= min(len(s) for s in shapes)
            or shapes[0][:-len(length)] != shapes[1][:-len(length)]
            or [s[-len(length):] for s in shapes] != list(expected)):
        return f"stablehlo.fft {kind} of length {length} on shapes {shapes[0]} -> {shapes[1]}"
    return None


def refused_op(name: str, target: str | None) -> str | None:
    """Why a received module may not use op ``name`` (a custom call's ``target``), or None."""
    if name == "stablehlo.custom_call":
        return None if target in SAFE_CUSTOM_CALLS else f"custom call {target!r}"
    return name if name in REFUSED_OPS else None


def refuse_unsafe(unsafe: set[str]) -> None:
    """Raise `MPSerializationError` naming the ops in ``unsafe`` (when there are any)."""
    if unsafe:
        raise MPSerializationError(f"uses {', '.join(sorted(unsafe))}, which a received "
                                   "module may not")


def unsafe_ops(module: Any) -> set[str]:
    """Why each op of parsed ``module`` may not run in a received module (`refused_op`,
    FFTs whose lengths do not fit their shapes)."""
    unsafe: set[str] = set()

    def visit(op: Any) -> Any:
        target = ir.StringAttr(op.attributes["call_target_name"]).value \
            if op.name == "stablehlo.custom_call" else None
        problem = refused_op(op.name, target)
        if problem is None and op.name == "stablehlo.fft":
            problem = _fft_problem(op)
        if problem:
            unsafe.add(problem)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return unsafe


def vet_module(module: bytes) -> None:
    """Parse ``module``, refuse unsafe ops (custom calls outside `SAFE_CUSTOM_CALLS`,
    `REFUSED_OPS`, FFTs whose lengths do not fit their shapes), then lower and compile
    it for its declared input types as the kernel's first call does. A module of sizes
    known at run time is vetted again, refined, for each run's sizes (`_refined`). Runs
    in the payload checker's helper process."""
    exp = exported_module(module)
    with make_ir_context():
        unsafe = unsafe_ops(ir.Module.parse(exp.mlir_module()))
    info = module_info(module)
    if all(t.is_static for t in info.in_types):
        refuse_unsafe(unsafe)
        specs = [jax.ShapeDtypeStruct(t.shape, numpy_dtype(t.dtype)) for t in info.in_types]
        jax.jit(exp.call).lower(*specs).compile()
    else:
        refuse_unsafe(unsafe - SHAPE_POLYMORPHISM)


MODULE_CHECKER = NativePayloadChecker(vet_module, "run_jax module")
"""The helper process that vets this process's received run_jax modules."""


@BACKEND.payload_check(_tensor.run_jax_p)
def _check_run_jax(op: Operation) -> None:
    try:
        MODULE_CHECKER.check(op.attrs["module"], f"tensor.run_jax[{op.attrs['fn']}]")
    except MPSerializationError as e:
        raise payload_refusal(str(e), "module") from None


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


@BACKEND.kernel(_tensor.constant_p)
def _constant(call: Call, *, value: Any) -> list[Any]:
    return [value]


_REFINED = LRUCache(1024)
"""(module, input shapes) -> the module compiled for those shapes."""


def _refined(module: bytes, args: Sequence[Any]) -> Callable[..., Any]:
    """A symbolic module compiled for the shapes of ``args``: refined by JAX to static
    shapes, vetted as a static module would be, then compiled (cached per shapes)."""
    key = (module, tuple(np.shape(a) for a in args))
    fn = _REFINED.lookup(key)
    if fn is None:
        low = lowered(exported_module(module), [np.shape(a) for a in args])
        with make_ir_context():
            refuse_unsafe(unsafe_ops(refined(low)))
        fn = low.compile()
        _REFINED.store(key, fn)
    return fn


@BACKEND.kernel(_tensor.run_jax_p)
def _run_jax(call: Call, *args: Any, fn: str, module: bytes) -> list[Any]:
    info = module_info(module)
    if all(t.is_static for t in info.in_types):
        out = _compiled(module)(*args)
    else:
        bind_sizes(f"tensor.run_jax[{fn}]", info.in_types, [np.shape(a) for a in args])
        out = _refined(module, args)(*args)
    return list(jax.tree_util.tree_leaves(out))


@BACKEND.kernel(_tensor.pyfunc_p)
def _pyfunc(call: Call, *args: Any, fn: str, out_types: tuple[TensorType, ...]) -> list[Any]:
    host = lookup_pyfunc(fn)
    if host is None:  # texts of the program's own (names, declared types) reach the driver
        raise MPPublicError(f"host function {fn!r} is not registered on this party; start "
                            f"the worker with --register {fn}")
    result = host(*[np.asarray(a) for a in args])
    values = list(result) if isinstance(result, tuple | list) else [result]
    if len(values) != len(out_types):
        raise MPPublicError(f"{fn} returned {len(values)} values, declared {len(out_types)}")
    outs = []
    for i, (value, t) in enumerate(zip(values, out_types, strict=True)):
        arr = np.asarray(value)
        if arr.shape != t.shape:  # the shape it has may tell data: not said
            raise MPPublicError(f"{fn} result {i} does not have the declared type {t}")
        outs.append(arr.astype(numpy_dtype(t.dtype), copy=False))
    return outs
