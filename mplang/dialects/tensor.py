"""The `tensor` dialect: party-local tensor computation.

`run_jax` traces any JAX function once per (function, static arguments, input
types), exports it as serialized StableHLO (``jax.export``) and records it as
data in the op, so the program can cross the network without Python code.
Python operators on local values are `run_jax` calls of the matching
``jax.numpy`` function (`LOCAL_OPERATORS`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export
from jax._src.config import traceback_in_locations_limit

from mplang.dialects.common import LRUCache, as_array
from mplang.edsl.function import function
from mplang.edsl.graph import Graph
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Primitive
from mplang.edsl.pytree import TreeDef, tree_flatten, tree_unflatten
from mplang.edsl.tracer import current_tracer
from mplang.edsl.typing import TensorType, ValueType
from mplang.frontend.cache import CompileCache
from mplang.frontend.errors import MPTypeError
from mplang.frontend.feop import feop
from mplang.frontend.pyfuncs import name_of, register_pyfunc
from mplang.frontend.registry import LOCAL_PURE, OpTraits

constant_p = Primitive("tensor.constant", kind="source", execution_model="single_rank",
                       traits=LOCAL_PURE,
                       doc="A compile-time constant tensor inside a party-local region.")
run_jax_p = Primitive("tensor.run_jax", kind="compute", execution_model="single_rank",
                      traits=LOCAL_PURE,
                      doc="Run a JAX function, stored as serialized StableHLO, on local tensors.")
pyfunc_p = Primitive("tensor.pyfunc", kind="compute", execution_model="single_rank",
                     traits=OpTraits(pure=False, communicates=False),
                     doc="Call a named host function (I/O, a local service) on local tensors.")

_EXPORTS: CompileCache[_Exported] = CompileCache(
    "tensor.run_jax", 4096, same=lambda a, b: a.module == b.module)
"""(fn, arg tree, static leaves, input types) -> `_Exported`."""
_MODULES = LRUCache(4096)
"""serialized module bytes -> deserialized ``jax.export.Exported``."""


@dataclass(frozen=True)
class _Exported:
    module: bytes
    out_tree: Any  # jax PyTreeDef of the function's result


@dataclass(frozen=True)
class _StaticSlice:
    """A hashable stand-in for a `slice` (slices are unhashable before Python 3.12)."""

    start: Any
    stop: Any
    step: Any


_DYNAMIC = object()


def exported_module(module: bytes) -> jax_export.Exported:
    """The deserialized form of ``module`` (cached per distinct bytes)."""
    exp = _MODULES.lookup(module)
    if exp is None:
        exp = jax_export.deserialize(bytearray(module))
        _MODULES.store(module, exp)
    return exp


_SIGNATURES = LRUCache(4096)
"""serialized module bytes -> its (input types, output types)."""


def module_signature(module: bytes) -> tuple[list[TensorType], tuple[TensorType, ...]]:
    """The input and output tensor types of a serialized module (cached per bytes)."""
    signature = _SIGNATURES.lookup(module)
    if signature is None:
        exp = exported_module(module)
        signature = ([TensorType.of(a.dtype, a.shape) for a in exp.in_avals],
                     tuple(TensorType.of(a.dtype, a.shape) for a in exp.out_avals))
        _SIGNATURES.store(module, signature)
    return signature


def _tensor_type(op: str, t: ValueType, i: int) -> TensorType:
    if not isinstance(t, TensorType):
        raise MPTypeError(f"{op}: input {i} must be a local tensor, got {t}")
    return t


@constant_p.def_type_rule
def _constant_rule(in_types: list[ValueType], attrs: dict[str, Any], regions: Sequence[Graph],
                   world_size: int) -> list[ValueType]:
    value: np.ndarray = attrs["value"]
    return [TensorType.of(value.dtype, value.shape)]


@run_jax_p.def_type_rule
def _run_jax_rule(in_types: list[ValueType], attrs: dict[str, Any], regions: Sequence[Graph],
                  world_size: int) -> list[ValueType]:
    op = f"tensor.run_jax[{attrs['fn']}]"
    ins = [_tensor_type(op, t, i) for i, t in enumerate(in_types)]
    expected, outs = module_signature(attrs["module"])
    if ins != expected:
        raise MPTypeError(f"{op}: inputs are ({', '.join(map(str, ins))}) but the module expects "
                          f"({', '.join(map(str, expected))})")
    return list(outs)


@feop(name="tensor.constant", family="tensor", execution_model="single_rank",
      dialects=["tensor"], primitives=["tensor.constant"], targets=["PPU"],
      example="c = tensor.constant(np.ones(3))")
@function
def constant(value: Any) -> MPObject:
    """A local constant tensor (inside a pcall body)."""
    return constant_p.bind([], {"value": as_array("tensor.constant", value)})[0]


def _static_leaf(fn_name: str, leaf: Any) -> Hashable:
    if isinstance(leaf, slice):
        return _StaticSlice(leaf.start, leaf.stop, leaf.step)
    try:
        hash(leaf)
    except TypeError:
        raise MPTypeError(f"tensor.run_jax[{fn_name}]: static argument of type "
                          f"{type(leaf).__name__} is not hashable; pass arrays instead") from None
    return leaf


def _restore_static(leaf: Any) -> Any:
    return slice(leaf.start, leaf.stop, leaf.step) if isinstance(leaf, _StaticSlice) else leaf


def _export(fn: Callable[..., Any], name: str, tree: TreeDef, spec: tuple[Any, ...],
            in_types: tuple[TensorType, ...]) -> _Exported:
    def flat(*arrays: Any) -> Any:
        it = iter(arrays)
        leaves = [next(it) if s is _DYNAMIC else _restore_static(s) for s in spec]
        args, kwargs = tree_unflatten(tree, leaves)
        return fn(*args, **kwargs)

    avals = [jax.ShapeDtypeStruct(t.shape, np.dtype(t.dtype)) for t in in_types]
    try:
        # no source locations in the module: program bytes must not depend on (or reveal)
        # where the code lives
        with traceback_in_locations_limit(0):
            exp = jax_export.export(jax.jit(flat))(*avals)
    except Exception as e:
        types = ", ".join(map(str, in_types))
        raise MPTypeError(f"tensor.run_jax[{name}]: JAX could not trace the function on "
                          f"({types}): {type(e).__name__}: {e}") from None
    return _Exported(bytes(exp.serialize()), exp.out_tree)


@feop(name="tensor.run_jax", family="tensor", op_kind="compiler",
      execution_model="single_rank", dialects=["stablehlo"], primitives=["tensor.run_jax"],
      targets=["PPU"], capabilities={"caching": {"scope": "process", "key_strategy": "signature"}},
      example="y = tensor.run_jax(jnp.square, x)")
@function
def run_jax(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run JAX-traceable ``fn`` on local tensors; returns ``fn``'s output pytree.

    MPLang values and arrays among the arguments are inputs; other leaves
    (Python scalars, slices, strings) are static and part of the cache key.
    """
    name = getattr(fn, "__name__", type(fn).__name__)
    tracer = current_tracer(f"tensor.run_jax[{name}]")
    leaves, tree = tree_flatten((args, kwargs))
    inputs: list[MPObject] = []
    spec: list[Any] = []
    spec_types: list[type] = []
    for leaf in leaves:
        if isinstance(leaf, (np.ndarray, np.generic, jax.Array)):
            leaf = constant(np.asarray(leaf))
        if isinstance(leaf, MPObject):
            inputs.append(leaf)
            spec.append(_DYNAMIC)
        else:
            spec.append(_static_leaf(name, leaf))
            spec_types.append(type(leaf))
    in_types = tuple(_tensor_type(f"tensor.run_jax[{name}]", tracer.lift(x).type, i)
                     for i, x in enumerate(inputs))
    key = (fn, tree, tuple(spec), tuple(spec_types), in_types)
    entry = _EXPORTS.get_or_compile(key, lambda: _export(fn, name, tree, tuple(spec), in_types),
                                    f"tensor.run_jax[{name}]")
    outs = run_jax_p.bind(inputs, {"fn": name, "module": entry.module})
    return entry.out_tree.unflatten(outs)


@pyfunc_p.def_type_rule
def _pyfunc_rule(in_types: list[ValueType], attrs: dict[str, Any], regions: Sequence[Graph],
                 world_size: int) -> list[ValueType]:
    for i, t in enumerate(in_types):
        _tensor_type(f"tensor.pyfunc[{attrs['fn']}]", t, i)
    return list(attrs["out_types"])


def _out_type(spec: Any) -> TensorType:
    if isinstance(spec, TensorType):
        return spec
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):
        return TensorType.of(jax.dtypes.canonicalize_dtype(spec.dtype), spec.shape)
    raise MPTypeError(f"tensor.pyfunc: out= takes TensorType or ShapeDtypeStruct leaves, "
                      f"got {spec!r}")


@feop(name="tensor.pyfunc", family="tensor", execution_model="single_rank",
      dialects=["tensor"], primitives=["tensor.pyfunc"], side_effects=True, targets=["PPU"],
      example="y = tensor.pyfunc(load_rows, x, out=jax.ShapeDtypeStruct((3,), jnp.float32))")
@function
def pyfunc(fn: Callable[..., Any] | str, *args: MPObject, out: Any) -> Any:
    """Call host function ``fn`` on local tensors (as numpy arrays) on the party.

    ``out`` gives the result types (a pytree of `TensorType` or
    ``jax.ShapeDtypeStruct``). ``fn`` may be a callable (registered in this
    process under its name) or the name of a function an HTTP worker was
    started with (``--register module:function``). Calls keep their program
    order on each party.
    """
    name = fn if isinstance(fn, str) else name_of(fn)
    if not isinstance(fn, str):
        register_pyfunc(name, fn)
    for i, x in enumerate(args):
        if not isinstance(x, MPObject):
            raise MPTypeError(f"tensor.pyfunc[{name}]: argument {i} must be an MPLang value, "
                              f"got {type(x).__name__}")
    leaves, out_tree = tree_flatten(out)
    out_types = tuple(_out_type(s) for s in leaves)
    outs = pyfunc_p.bind(list(args), {"fn": name, "out_types": out_types})
    return tree_unflatten(out_tree, outs)


def _operator(jfn: Callable[..., Any]) -> Callable[..., Any]:
    def apply(*operands: Any) -> Any:
        return run_jax(jfn, *operands)

    apply.__name__ = getattr(jfn, "__name__", "operator")
    return apply


LOCAL_OPERATORS: dict[str, Callable[..., Any]] = {
    "add": _operator(jnp.add),
    "subtract": _operator(jnp.subtract),
    "multiply": _operator(jnp.multiply),
    "divide": _operator(jnp.true_divide),
    "floor_divide": _operator(jnp.floor_divide),
    "remainder": _operator(jnp.remainder),
    "power": _operator(jnp.power),
    "matmul": _operator(jnp.matmul),
    "less": _operator(jnp.less),
    "less_equal": _operator(jnp.less_equal),
    "greater": _operator(jnp.greater),
    "greater_equal": _operator(jnp.greater_equal),
    "equal": _operator(jnp.equal),
    "not_equal": _operator(jnp.not_equal),
    "negative": _operator(jnp.negative),
    "getitem": _operator(operator.getitem),
}
"""Python operators on party-local values; the simp dialect lifts them to the simp level."""

__all__ = ["constant", "pyfunc", "run_jax"]
