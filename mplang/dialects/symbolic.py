"""Shape-polymorphic StableHLO (sizes known only at run time, ``jax.export``) and the
static modules JAX refines it to: for a run's sizes (the kernels compile those) and for
probe sizes (the analyses that read a module, data flows and round estimates, read
those: refined, a module has no dynamic-shape op left for them to treat as unknown).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import export as jax_export
from jax._src.interpreters.mlir import refine_polymorphic_shapes
from jax.interpreters.mlir import make_ir_context

from mplang.edsl.typing import Dim, TensorType, numpy_dtype

PROBE_SIZES = (1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049, 1051, 1061, 1063, 1069)
"""The sizes probes give symbols, in order of appearance: primes no program is likely to
use as a static size, so a probe's axes stay told apart."""


def avals(types: Sequence[TensorType], scope: Any = None) -> list[jax.ShapeDtypeStruct]:
    """JAX's abstract values of ``types``; their symbolic dimensions are JAX's symbolic
    shapes of one scope (``scope``, or a new one), so equal symbols are one size."""
    scope = scope if scope is not None else jax_export.SymbolicScope()
    return [jax.ShapeDtypeStruct(
        jax_export.symbolic_shape(",".join(map(str, t.shape)), scope=scope)
        if not t.is_static else t.shape, numpy_dtype(t.dtype)) for t in types]


def exported(bytecode: bytes, in_types: Sequence[TensorType], out_types: Sequence[TensorType],
             platform: str, calling_convention: int, kept: Sequence[int]) -> jax_export.Exported:
    """The ``jax.export.Exported`` of StableHLO portable artifact ``bytecode``: a function
    of a flat tuple of arrays of ``in_types`` (of which it uses ``kept``) returning a flat
    tuple of ``out_types``, for ``platform``. Its StableHLO is parsed when it is first
    lowered: a received module must pass its payload check first."""
    scope = jax_export.SymbolicScope()
    ins, outs = avals(in_types, scope), avals(out_types, scope)
    return jax_export.Exported(
        fun_name="run", in_tree=jax.tree_util.tree_structure((tuple(ins), {})),
        in_avals=tuple(jax.core.ShapedArray(a.shape, a.dtype) for a in ins),
        out_tree=jax.tree_util.tree_structure(tuple(outs)),
        out_avals=tuple(jax.core.ShapedArray(a.shape, a.dtype) for a in outs),
        in_shardings_hlo=(None,) * len(ins), out_shardings_hlo=(None,) * len(outs),
        nr_devices=1, platforms=(platform,), ordered_effects=(), unordered_effects=(),
        disabled_safety_checks=(), mlir_module_serialized=bytecode,
        calling_convention_version=calling_convention, module_kept_var_idx=tuple(kept),
        uses_global_constants=not all(t.is_static for t in in_types), _get_vjp=None)


def lowered(exp: jax_export.Exported, shapes: Sequence[tuple[int, ...]],
            lowering: Callable[[Callable[[], Any]], Any] = lambda f: f()) -> Any:
    """``exp`` lowered for inputs of static ``shapes`` (JAX's ``Lowered``), by
    ``lowering`` (which may set up the platform) around the call."""
    specs = [jax.ShapeDtypeStruct(shape, a.dtype)
             for shape, a in zip(shapes, exp.in_avals, strict=True)]
    return lowering(lambda: jax.jit(exp.call, keep_unused=True).trace(*specs).lower(
        lowering_platforms=exp.platforms))


def refined(low: Any) -> Any:
    """The static module JAX refines lowered ``low`` to (an MLIR module; call within
    ``make_ir_context``)."""
    return refine_polymorphic_shapes(low.compiler_ir("stablehlo"))


def probe_shapes(types: Sequence[TensorType]) -> list[tuple[int, ...]] | None:
    """Static shapes for ``types``: each symbol a size of `PROBE_SIZES`; None when an
    input size is an expression of symbols (``2*n0``) or symbols outnumber the sizes."""
    sizes: dict[str, int] = {}
    shapes = []
    for t in types:
        shape = []
        for d in t.shape:
            if isinstance(d, str):
                if not d.isidentifier():
                    return None
                if d not in sizes:
                    if len(sizes) == len(PROBE_SIZES):
                        return None
                    sizes[d] = PROBE_SIZES[len(sizes)]
                shape.append(sizes[d])
            else:
                shape.append(d)
        shapes.append(tuple(shape))
    return shapes


def probe_text(exp: jax_export.Exported, in_types: Sequence[TensorType],
               lowering: Callable[[Callable[[], Any]], Any] = lambda f: f()) -> str | None:
    """The StableHLO text ``exp`` refines to at probe sizes (`probe_shapes`), or None when
    there are none or it does not refine (the analyses then treat the module as
    unknown, which is conservative)."""
    shapes = probe_shapes(in_types)
    if shapes is None:
        return None
    try:
        low = lowered(exp, shapes, lowering)
        with make_ir_context():
            return str(refined(low))
    except Exception:  # a module that does not refine at these sizes
        return None


def scaled_size(t: TensorType, scale: int, offset: int = 0) -> Dim:
    """``scale`` times the elements of ``t``, plus ``offset``: an int when ``t``'s shape is
    static, else the expression of its symbols as JAX writes it (so one size is always
    spelled the same, ``4*n0+28``)."""
    if t.is_static:
        return scale * math.prod(d for d in t.shape if isinstance(d, int)) + offset
    total: Any = scale
    for d in jax_export.symbolic_shape(",".join(map(str, t.shape))):
        total = total * d
    return str(total + offset).replace(" ", "")


def shape_of_elements(t: TensorType, elements: int) -> tuple[int, ...] | None:
    """The shape of type ``t`` holding ``elements`` elements: its static shape, or with
    its one symbolic dimension (a bare symbol) solved; None if there is none."""
    known = math.prod(d for d in t.shape if isinstance(d, int))
    symbolic = [i for i, d in enumerate(t.shape) if isinstance(d, str)]
    if not symbolic:
        return tuple(int(d) for d in t.shape) if known == elements else None
    dim = t.shape[symbolic[0]]
    if len(symbolic) > 1 or not isinstance(dim, str) or not dim.isidentifier() or \
            known == 0 or elements % known or elements // known < 1:
        return None
    return tuple(elements // known if i == symbolic[0] else int(d)
                 for i, d in enumerate(t.shape))
