"""The `tensor` dialect: party-local tensor computation.

`run_jax` traces any JAX function once per (function, static arguments, input
types), exports it as StableHLO (``jax.export``) and records it as data in the
op, so the program can cross the network without Python code. The module is
MPLang's own format (`ModuleInfo`): metadata checked field by field in Python,
then the StableHLO bytecode, which a worker hands to C++ only after its payload
check accepted it.
Python operators on local values are `run_jax` calls of the matching
``jax.numpy`` function (`LOCAL_OPERATORS`).
"""

from __future__ import annotations

import json
import operator
import re
import struct
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export
from jax._src.config import traceback_in_locations_limit
from jax._src.lib import xla_client

from mplang.analysis.cost_model import local_cost
from mplang.dialects.common import (
    as_array,
    canonical_type,
    remember_located,
    trace_failure,
)
from mplang.dialects.symbolic import avals, exported, probe_text
from mplang.edsl.attrs import Attr, NoneType
from mplang.edsl.errors import MPLangError, MPSerializationError, MPTypeError
from mplang.edsl.function import function
from mplang.edsl.graph import Operation
from mplang.edsl.object import MPObject, type_operator
from mplang.edsl.primitive import Operand, Primitive, Result, Signature, of_type
from mplang.edsl.private import Commitment, value_tensor_type
from mplang.edsl.pytree import TreeDef, tree_flatten, tree_unflatten
from mplang.edsl.sources import declared_type, looked_up_type
from mplang.edsl.text_printer import AttrCodec, PayloadError, register_attr_codec
from mplang.edsl.tracer import current_tracer
from mplang.edsl.traits import LOCAL_EFFECT, LOCAL_PURE
from mplang.edsl.typing import DTYPES, Mask, TensorType, ValueType, is_symbolic
from mplang.flows.dp_flows import enclave_release_flow
from mplang.flows.engine import Analysis, local_conservative
from mplang.flows.labels import FOREIGN, Label, approved, leading_rows, source, source_path
from mplang.flows.program_flows import through
from mplang.flows.stablehlo import hlo, ir, make_ir_context
from mplang.flows.vouched import Approvable, Releasing, library_attrs, vouched
from mplang.frontend.cache import CompileCache
from mplang.frontend.feop import feop
from mplang.frontend.pyfuncs import name_of, register_pyfunc
from mplang.util.lru import LRUCache

TENSOR = of_type(TensorType, name="a local tensor")
_OUT = [Result("out", TENSOR)]
constant_p = Primitive(
    "tensor.constant", kind="source", execution_model="single_rank", traits=LOCAL_PURE,
    attrs={"value": Attr((np.ndarray, Commitment), required=True,
                         doc="the value (compile-time; a commitment where it is private)")},
    results=_OUT, targets=("PPU",), cost=local_cost,
    doc="A compile-time constant tensor inside a party-local region.")
run_jax_p = Primitive(
    "tensor.run_jax", kind="compiler", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("args", TENSOR, variadic=True)],
    attrs={"fn": Attr(str, default="fn", doc="the JAX function's name, for readers"),
           "module": Attr(bytes, required=True,
                          doc="the function as an MPLang module: metadata and StableHLO"),
           "library": Attr(str, default="", optional=True,
                           doc="the registered library function run (policy.vouched), if any"),
           "library_args": Attr(tuple, default=(), optional=True,
                                doc="its static int and float arguments")},
    results=[Result("outs", TENSOR, variadic=True)], targets=("PPU",), cost=local_cost,
    doc="Run a JAX function, stored as serialized StableHLO, on local tensors.")
pyfunc_p = Primitive(
    "tensor.pyfunc", kind="compute", execution_model="single_rank", traits=LOCAL_EFFECT,
    operands=[Operand("args", TENSOR, variadic=True)],
    attrs={"fn": Attr(str, required=True, doc="the registered host function's name"),
           "out_types": Attr(tuple, required=True, doc="the result types")},
    results=[Result("outs", TENSOR, variadic=True)], targets=("PPU",), cost=local_cost,
    local_flow=local_conservative,
    doc="Call a named host function (I/O, a local service) on local tensors.")
load_p = Primitive(
    "tensor.load", kind="source", execution_model="single_rank", traits=LOCAL_EFFECT,
    attrs={"path": Attr(str, required=True, doc="an .npy or .npz file in the data root"),
           "key": Attr((str, NoneType), default=None, doc="the member of an .npz archive"),
           "type": Attr(TensorType, required=True, doc="the declared type")},
    results=_OUT, targets=("PPU",), cost=local_cost,
    doc="Read a private input: an array from the party's own data root.")

_FRAMES = 16
"""Source frames a module lowered again with locations keeps (`remember_located`)."""
_EXPORTS: CompileCache[_Exported] = CompileCache(
    "tensor.run_jax", 4096, same=lambda a, b: a.module == b.module)
"""(fn, arg tree, static leaves, input types) -> `_Exported`."""


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

# ---------------------------------------------------------------- the module format

MODULE_MAGIC = b"MPJAXMOD"
MODULE_VERSION = 1
_MODULE_HEADER = struct.Struct("<8sI")
_MLIR_BYTECODE_MAGIC = b"ML\xefR"
MAX_METADATA_BYTES = 1 << 20
MAX_ARITY = 1 << 16
MAX_RANK = 64
MAX_DIM = (1 << 31) - 1
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
_FIELDS = frozenset(["version", "platform", "calling_convention", "in", "out", "kept"])


@dataclass(frozen=True)
class ModuleInfo:
    """A run_jax module, its metadata checked field by field (nothing parsed by C++ yet).

    The module format: `MODULE_MAGIC`, the metadata length (u32, little endian), the
    metadata (JSON: ``version``, ``platform``, ``calling_convention``, ``in`` and
    ``out`` as ``[dtype, shape]`` lists, ``kept``: the inputs the module uses), then
    the StableHLO portable artifact (MLIR bytecode) of a function of flat arrays.
    """

    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]
    kept: tuple[int, ...]
    platform: str
    calling_convention: int
    bytecode: bytes


def _malformed(field: str, what: str) -> MPSerializationError:
    return MPSerializationError(f"malformed run_jax module: {field}: {what}")


def _int_in(value: Any, low: int, high: int, field: str) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _malformed(field, f"expected an int in [{low}, {high}], got {value!r}")
    return value


def _list(value: Any, limit: int, field: str) -> list[Any]:
    if not isinstance(value, list) or len(value) > limit:
        raise _malformed(field, f"expected a list of at most {limit} items")
    return value


def _tensor_types(value: Any, field: str) -> tuple[TensorType, ...]:
    types = []
    for i, item in enumerate(_list(value, MAX_ARITY, field)):
        here = f"{field}[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            raise _malformed(here, "expected [dtype, shape]")
        dtype, shape = item
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise _malformed(f"{here}.dtype", f"unsupported dtype {dtype!r}")
        dims = tuple(d if is_symbolic(d) else _int_in(d, 0, MAX_DIM, f"{here}.shape[{j}]")
                     for j, d in enumerate(_list(shape, MAX_RANK, f"{here}.shape")))
        types.append(TensorType(dtype, dims))
    return tuple(types)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _malformed("metadata", "duplicate key")
    return dict(pairs)


def _parse_module(module: bytes) -> ModuleInfo:
    if len(module) < _MODULE_HEADER.size:
        raise _malformed("header", f"{len(module)} bytes is too short")
    magic, size = _MODULE_HEADER.unpack_from(module)
    if magic != MODULE_MAGIC:
        raise _malformed("header", "bad magic (not an MPLang run_jax module)")
    end = _MODULE_HEADER.size + size
    if size > MAX_METADATA_BYTES or end > len(module):
        raise _malformed("header", f"metadata length {size} exceeds the module or the "
                                   f"{MAX_METADATA_BYTES}-byte limit")
    try:
        meta = json.loads(module[_MODULE_HEADER.size:end], object_pairs_hook=_unique_keys)
    except (ValueError, RecursionError) as e:
        raise _malformed("metadata", f"invalid JSON: {e}") from None
    if not isinstance(meta, dict) or set(meta) != _FIELDS:
        raise _malformed("metadata", f"expected the fields {', '.join(sorted(_FIELDS))}")
    if meta["version"] != MODULE_VERSION or type(meta["version"]) is not int:
        raise _malformed("version", f"unsupported version {meta['version']!r}")
    if meta["platform"] not in PLATFORMS:
        raise _malformed("platform", f"expected one of {', '.join(PLATFORMS)}")
    convention = _int_in(meta["calling_convention"],
                         jax_export.minimum_supported_calling_convention_version,
                         jax_export.maximum_supported_calling_convention_version,
                         "calling_convention")
    in_types = _tensor_types(meta["in"], "in")
    kept = tuple(_int_in(k, 0, len(in_types) - 1, f"kept[{i}]")
                 for i, k in enumerate(_list(meta["kept"], len(in_types), "kept")))
    if list(kept) != sorted(set(kept)):
        raise _malformed("kept", "expected increasing input indices")
    bytecode = module[end:]
    if not bytecode.startswith(_MLIR_BYTECODE_MAGIC):
        raise _malformed("bytecode", "not MLIR bytecode")
    return ModuleInfo(in_types, _tensor_types(meta["out"], "out"), kept, meta["platform"],
                      convention, bytecode)


_MODULES = LRUCache(4096)
"""module bytes -> its `ModuleInfo`."""


def module_info(module: bytes) -> ModuleInfo:
    """The checked metadata of a run_jax module (cached per distinct bytes); raises
    `MPSerializationError` naming the malformed field."""
    if not isinstance(module, bytes):
        raise _malformed("module", f"expected bytes, got {type(module).__name__}")
    info: ModuleInfo | None = _MODULES.lookup(module)
    if info is None:
        info = _parse_module(module)
        _MODULES.store(module, info)
    return info


def _encode_module(name: str, exp: jax_export.Exported) -> bytes:
    symbolic = not all(TensorType.of(a.dtype, a.shape).is_static for a in exp.in_avals)
    fixed = {"nr_devices": (exp.nr_devices, 1),
             "ordered_effects": (exp.ordered_effects, ()),
             "unordered_effects": (exp.unordered_effects, ()),
             "disabled_safety_checks": (tuple(exp.disabled_safety_checks), ()),
             "uses_global_constants": (exp.uses_global_constants, symbolic),
             "shardings": ({*exp.in_shardings_hlo, *exp.out_shardings_hlo} - {None}, set())}
    for field, (found, expected) in fixed.items():
        if found != expected:
            raise MPTypeError(f"tensor.run_jax[{name}]: the exported module has {field} "
                              f"{found!r}; run_jax ships only {expected!r}")
    if len(exp.platforms) != 1:
        raise MPTypeError(f"tensor.run_jax[{name}]: exported for platforms {exp.platforms}; "
                          "run_jax ships modules for one platform")

    def types(avals: Sequence[Any]) -> list[Any]:
        return [[t.dtype, list(t.shape)] for t in (TensorType.of(a.dtype, a.shape)
                                                   for a in avals)]

    meta = {"version": MODULE_VERSION, "platform": exp.platforms[0],
            "calling_convention": exp.calling_convention_version, "in": types(exp.in_avals),
            "out": types(exp.out_avals), "kept": list(exp.module_kept_var_idx)}
    text = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    return _MODULE_HEADER.pack(MODULE_MAGIC, len(text)) + text + canonical_bytecode(
        exp.mlir_module_serialized)


def exported_module(module: bytes) -> jax_export.Exported:
    """The ``jax.export.Exported`` of ``module``, built from its checked metadata (a
    function of a flat tuple of arrays returning a flat tuple). Its StableHLO is parsed
    when it is first lowered: a received module must pass the worker's payload check
    (`mplang.kernels.tensor`) first."""
    info = module_info(module)
    return exported(info.bytecode, info.in_types, info.out_types, info.platform,
                    info.calling_convention, info.kept)


def _tensor_type(fn: str, t: ValueType, i: int) -> TensorType:
    if not isinstance(t, TensorType):
        raise MPTypeError(f"tensor.run_jax[{fn}]: input {i} must be a local tensor, got {t}")
    return t


@constant_p.def_type_rule
def _constant_rule(sig: Signature) -> list[ValueType]:
    return [value_tensor_type("tensor.constant", sig.value)]


@constant_p.def_private
def _constant_private(op: Operation) -> dict[str, Mask | None]:
    """A driver constant inside a party-local region: seen by the parties that run it.
    (Literals written inside a JAX function are code: every party reads them.)"""
    return {"value": None}


@run_jax_p.def_type_rule
def _run_jax_rule(sig: Signature) -> list[ValueType]:
    try:
        info = module_info(sig.module)
    except MPSerializationError as e:
        raise MPSerializationError(f"tensor.run_jax[{sig.fn}]: {e}") from None
    ins: list[TensorType] = sig.args
    if tuple(ins) != info.in_types:
        raise MPTypeError(f"tensor.run_jax[{sig.fn}]: inputs are ({', '.join(map(str, ins))}) "
                          f"but the module expects ({', '.join(map(str, info.in_types))})")
    return list(info.out_types)


@feop(constant_p, example="c = tensor.constant(np.ones(3))")
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
            in_types: tuple[TensorType, ...], frames: int = 0) -> _Exported:
    def flat(*arrays: Any) -> Any:
        it = iter(arrays)
        leaves = [next(it) if s is _DYNAMIC else _restore_static(s) for s in spec]
        args, kwargs = tree_unflatten(tree, leaves)
        return fn(*args, **kwargs)

    try:
        # no source locations in the module (``frames`` 0): program bytes must not depend
        # on (or reveal) where the code lives
        with traceback_in_locations_limit(frames):
            exp = jax_export.export(jax.jit(flat))(*avals(in_types))
    except Exception as e:
        types = ", ".join(map(str, in_types))
        raise MPTypeError(f"tensor.run_jax[{name}]: JAX could not trace the function on "
                          f"({types}): {trace_failure(e)}") from None
    return _Exported(_encode_module(name, exp), exp.out_tree)


@feop(run_jax_p, dialects=["stablehlo"],
      capabilities={"caching": {"scope": "process", "key_strategy": "signature"}},
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
    in_types = tuple([_tensor_type(name, tracer.lift(x).type, i)
                      for i, x in enumerate(inputs)])
    key = (fn, tree, tuple(spec), tuple(spec_types), in_types)
    entry = _EXPORTS.get_or_compile(key, lambda: _export(fn, name, tree, tuple(spec), in_types),
                                    f"tensor.run_jax[{name}]")
    remember_located(entry.module, lambda: _mlir_text(module_info(_export(
        fn, name, tree, tuple(spec), in_types, frames=_FRAMES).module).bytecode))
    outs = run_jax_p.bind(inputs, {"fn": name, "module": entry.module, **library_attrs(fn)})
    return entry.out_tree.unflatten(outs)


def _derive(fn: Callable[..., Any], in_types: tuple[TensorType, ...]) -> str:
    """The StableHLO text `run_jax` records for ``fn`` on inputs of ``in_types``."""
    _, tree = tree_flatten((tuple(range(len(in_types))), {}))
    name = getattr(fn, "__name__", type(fn).__name__)
    return _stablehlo(_export(fn, name, tree, (_DYNAMIC,) * len(in_types), in_types).module)


@pyfunc_p.def_type_rule
def _pyfunc_rule(sig: Signature) -> list[ValueType]:
    if not all(isinstance(t, TensorType) for t in sig.out_types):
        raise MPTypeError(f"tensor.pyfunc[{sig.fn}]: out_types must be tensor types, got "
                          f"{sig.out_types!r}")
    return list(sig.out_types)


def _out_type(spec: Any) -> TensorType:
    if isinstance(spec, TensorType):
        return spec
    if hasattr(spec, "shape") and hasattr(spec, "dtype"):
        return TensorType.of(jax.dtypes.canonicalize_dtype(spec.dtype), spec.shape)
    raise MPTypeError(f"tensor.pyfunc: out= takes TensorType or ShapeDtypeStruct leaves, "
                      f"got {spec!r}")


@feop(pyfunc_p,
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


@load_p.def_type_rule
def _load_rule(sig: Signature) -> list[ValueType]:
    if not sig.path:
        raise MPTypeError("tensor.load: the path must be a non-empty string, got ''")
    return [sig.type]


@feop(load_p, example='x = simp.pcall((0,), lambda: tensor.load("x.npy"))')
@function
def load(path: str, key: str | None = None, *, dtype: Any = None, shape: Any = None
         ) -> MPObject:
    """A private input: an array read from the data root of the party running this body.

    ``path`` names an ``.npy`` file, or an ``.npz`` archive and its member ``key``,
    relative to the root. Each party reads its own file; the data never passes
    through the driver. Its type is ``dtype``/``shape`` when given, else looked up
    while tracing: the simulator or driver asks each party for the file's header,
    and all must agree.
    """
    tracer = current_tracer("tensor.load")
    if not tracer.local:
        raise MPTypeError("tensor.load is a party-local op; at the simp level run it inside "
                          "simp.pcall(parties, fn, ...)")
    what = f"{path!r}" if key is None else f"{path!r}[{key!r}]"
    vtype = canonical_type(declared_type("tensor.load", dtype, shape) or looked_up_type(
        "tensor.load", what, tracer, tracer.parties,
        lambda ctx, rank: ctx.describe_data(rank, path, key)))
    return load_p.bind([], {"path": path, "key": key, "type": vtype})[0]


def _operator(name: str, jfn: Callable[..., Any]) -> Callable[..., Any]:
    def apply(*operands: Any) -> Any:
        typed = type_operator(name, operands)
        return typed(*operands) if typed is not None else run_jax(jfn, *operands)

    apply.__name__ = getattr(jfn, "__name__", "operator")
    return apply


_JAX_OPERATORS: dict[str, Callable[..., Any]] = {
    "add": jnp.add,
    "subtract": jnp.subtract,
    "multiply": jnp.multiply,
    "divide": jnp.true_divide,
    "floor_divide": jnp.floor_divide,
    "remainder": jnp.remainder,
    "power": jnp.power,
    "matmul": jnp.matmul,
    "less": jnp.less,
    "less_equal": jnp.less_equal,
    "greater": jnp.greater,
    "greater_equal": jnp.greater_equal,
    "equal": jnp.equal,
    "not_equal": jnp.not_equal,
    "negative": jnp.negative,
    "getitem": operator.getitem,
}
LOCAL_OPERATORS: dict[str, Callable[..., Any]] = {
    name: _operator(name, jfn) for name, jfn in _JAX_OPERATORS.items()}
"""Python operators on party-local values; the simp dialect lifts them to the simp level."""


# ---------------------------------------------------------------- flow rules


def _stablehlo(module: bytes) -> str:
    """A run_jax module's StableHLO as MLIR text; a module of sizes known only at run time
    refined to probe sizes first (`mplang.dialects.symbolic`)."""
    info = module_info(module)
    if all(t.is_static for t in info.in_types):
        return _mlir_text(info.bytecode)
    return probe_text(exported_module(module), info.in_types) or ""


@constant_p.def_local_flow
def _constant_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """A compile-time constant carries no party's data."""
    return [None]


@run_jax_p.def_local_flow
def _run_jax_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Labels follow the ops of the StableHLO module (of the inputs it keeps: an unused
    input reaches no output); a vouched release's outputs are noisy
    (`enclave_release_flow`); an approvable function's are ``approved``."""
    entry = vouched(op, _stablehlo(op.attrs["module"]), _derive,
                    module_info(op.attrs["module"]).in_types) if op.attrs.get("library") else None
    if isinstance(entry, Releasing):
        return enclave_release_flow(a, op, ins, entry)
    try:
        kept = module_info(op.attrs["module"]).kept
    except (MPLangError, ValueError):
        kept = tuple(range(len(ins)))
    result = through(_stablehlo, op.attrs["module"], [ins[i] for i in kept if i < len(ins)],
                     len(op.outputs), op.loc or "")
    a.observe(op, result.observed)
    if isinstance(entry, Approvable):
        return [approved(entry.release, ins)] * len(op.outputs)
    return result.outputs


@load_p.def_local_flow
def _load_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """A file of the party's data root is a source of the party's data."""
    if not own:
        return [FOREIGN]
    name = source_path(str(op.attrs["path"])) + \
        (f"[{op.attrs['key']}]" if op.attrs.get("key") else "")
    a.source(op, name)
    return [source(name, leading_rows(op.outputs[0].type))]


# ---------------------------------------------------------------- the text form of modules

_PRODUCER = re.compile(r"// StableHLO_v(\d+\.\d+\.\d+)")
_MLIR_ERROR = re.compile(r'loc\("-":(\d+):(\d+)\)')


def _producer(bytecode: bytes) -> str:
    """The StableHLO version a portable artifact was written for (``1.12.1``)."""
    at = len(_MLIR_BYTECODE_MAGIC)
    first = bytecode[at] if len(bytecode) > at else 1
    # the bytecode version, a prefix varint: its first byte's trailing zeros say its size
    start = at + ((first & -first).bit_length() if first else 9)
    end = bytecode.find(b"\0", start)
    producer = bytecode[start:end].decode("ascii", "replace") if end > 0 else ""
    if not producer.startswith("StableHLO_v"):
        raise ValueError(f"not a StableHLO portable artifact (producer {producer!r})")
    return producer.removeprefix("StableHLO_v")


def _mlir_text(bytecode: bytes) -> str:
    """A portable artifact's StableHLO as MLIR text, with its debug locations."""
    with make_ir_context() as context:
        module = hlo.deserialize_portable_artifact(context, bytecode)
        return str(module.operation.get_asm(enable_debug_info=True))


def _portable(text: str, version: str) -> bytes:
    """MLIR text as a portable artifact for StableHLO ``version`` (`PayloadError` names
    the line of the first error, counted in ``text``)."""
    with make_ir_context():
        try:
            ir.Module.parse(text)
        except ir.MLIRError as e:
            diag = e.error_diagnostics[0] if e.error_diagnostics else None
            where = _MLIR_ERROR.fullmatch(str(diag.location)) if diag is not None else None
            message = diag.message if diag is not None else e.message
            if where is None:
                raise PayloadError(f"StableHLO: {message}") from None
            raise PayloadError(f"StableHLO: {message}", int(where[1]), int(where[2])) from None
    try:
        bytecode: bytes = xla_client._xla.mlir.serialize_portable_artifact(text, version, True)
    except Exception as e:  # the serializer raises JaxRuntimeError
        raise PayloadError(f"StableHLO: {str(e).splitlines()[0]}") from None
    if _producer(bytecode) != version:
        raise PayloadError(f"StableHLO version {version} is not supported here (versions "
                           f"{hlo.get_minimum_version()} to {hlo.get_current_version()})")
    return bytecode


def canonical_bytecode(bytecode: bytes) -> bytes:
    """The portable artifact that printing ``bytecode`` as text and parsing it back gives:
    a fixed point of that round trip (the printed text drops some locations), so a
    program's text form reads back to the same bytes."""
    return _portable(_mlir_text(bytecode), _producer(bytecode))


def _print_module(module: bytes) -> str:
    """A run_jax module as text: its metadata JSON, ``// StableHLO_vX.Y.Z`` (the version
    its bytecode targets) and the StableHLO as MLIR text."""
    info = module_info(module)
    meta = module[_MODULE_HEADER.size:len(module) - len(info.bytecode)].decode()
    return "\n".join([meta, f"// StableHLO_v{_producer(info.bytecode)}",
                      _mlir_text(info.bytecode)])


def _parse_module_text(text: str) -> bytes:
    """The module of `_print_module`'s text: the metadata JSON (which may span lines),
    the line ``// StableHLO_vX.Y.Z``, then the MLIR text."""
    lines = text.split("\n")
    at = next((i for i, line in enumerate(lines) if _PRODUCER.fullmatch(line)), None)
    if at is None or at == 0:
        raise PayloadError("expected the metadata, then the line // StableHLO_vX.Y.Z")
    version = _PRODUCER.fullmatch(lines[at])
    assert version is not None
    try:
        bytecode = _portable("\n".join(lines[at + 1:]), version[1])
    except PayloadError as e:
        raise PayloadError(str(e), None if e.line is None else e.line + at + 1,
                           e.column) from None
    meta = "\n".join(lines[:at]).encode()
    module = _MODULE_HEADER.pack(MODULE_MAGIC, len(meta)) + meta + bytecode
    try:
        module_info(module)
    except MPSerializationError as e:
        raise PayloadError(str(e), 1, 1) from None
    return module


register_attr_codec(run_jax_p, "module", AttrCodec("stablehlo", _print_module,
                                                    _parse_module_text))

__all__ = ["constant", "load", "pyfunc", "run_jax"]
