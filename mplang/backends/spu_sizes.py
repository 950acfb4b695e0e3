"""An ``spu.run`` whose sizes are known only at run time: its StableHLO is shape
polymorphic (exported once while tracing), and each member compiles it for each run's
sizes, the same way on every member (so they run one executable).

For the sizes of the shares it holds, a member checks that every symbol has one size
(`bind_sizes`), lets JAX refine the module to those static shapes, refuses the ops a
received module may not use (now that the module is static, the dynamic-shape ops too),
and compiles it with libspu as a traced ``spu.run`` is compiled: through XLA's HLO, then
StableHLO again. The executables are cached per module and sizes (`MAX_CACHED`). The
sizes never leave the device's members: they are the shapes of the shares they hold.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax import export as jax_export
from jax._src.config import jax_export_calling_convention_version
from jax._src.interpreters.mlir import refine_polymorphic_shapes
from jax._src.lib import _jax, xla_client
from jax.extend.mlir import hlo_to_stablehlo
from jax.interpreters.mlir import make_ir_context, module_to_bytecode

from mplang.analysis.stablehlo import hlo
from mplang.backends.symbolic_sizes import bind_sizes
from mplang.backends.tensor_impl import ir, refuse_unsafe, unsafe_ops
from mplang.dialects.spu import _patched_for_libspu, executable_of
from mplang.dialects.tensor import avals
from mplang.edsl.graph import Operation
from mplang.edsl.typing import TensorType, numpy_dtype
from mplang.util.lru import LRUCache

MAX_CACHED = 256
"""Executables kept per worker: one per symbolic ``spu.run`` and sizes."""
_EXECUTABLES = LRUCache(MAX_CACHED)


def _exported(text: bytes, in_types: Sequence[TensorType], out_types: Sequence[TensorType]
              ) -> jax_export.Exported:
    """The ``jax.export.Exported`` of shape-polymorphic StableHLO ``text`` exported for
    libspu (`mplang.dialects.spu.lower_symbolic`)."""
    scope = jax_export.SymbolicScope()
    ins, outs = avals(in_types, scope), avals(out_types, scope)
    bytecode = xla_client._xla.mlir.serialize_portable_artifact(
        text.decode(), hlo.get_current_version(), True)
    return jax_export.Exported(
        fun_name="spu_run", in_tree=jax.tree_util.tree_structure((tuple(ins), {})),
        in_avals=tuple(jax.core.ShapedArray(a.shape, a.dtype) for a in ins),
        out_tree=jax.tree_util.tree_structure(tuple(outs)),
        out_avals=tuple(jax.core.ShapedArray(a.shape, a.dtype) for a in outs),
        in_shardings_hlo=(None,) * len(ins), out_shardings_hlo=(None,) * len(outs),
        nr_devices=1, platforms=("interpreter",), ordered_effects=(), unordered_effects=(),
        disabled_safety_checks=(), mlir_module_serialized=bytecode,
        calling_convention_version=jax_export_calling_convention_version.value,
        module_kept_var_idx=tuple(range(len(ins))), uses_global_constants=True,
        _get_vjp=None)


def _compile(op: Operation, shapes: tuple[tuple[int, ...], ...]) -> bytes:
    in_types, out_types = op.attrs["in_types"], op.attrs["out_types"]
    exp = _exported(op.attrs["stablehlo"], in_types, out_types)
    specs = [jax.ShapeDtypeStruct(shape, numpy_dtype(t.dtype))
             for shape, t in zip(shapes, in_types, strict=True)]
    lowered = _patched_for_libspu(lambda: jax.jit(exp.call, keep_unused=True).trace(
        *specs).lower(lowering_platforms=("interpreter",)))
    with make_ir_context():
        refined = refine_polymorphic_shapes(lowered.compiler_ir("stablehlo"))
        refuse_unsafe(unsafe_ops(refined))
        hlo = _jax.mlir.mlir_module_to_xla_computation(
            module_to_bytecode(refined), use_tuple_args=False, return_tuple=False)
        text = str(ir.Module.parse(hlo_to_stablehlo(hlo.as_serialized_hlo_module_proto())))
    return executable_of(text, len(in_types), len(out_types), op.attrs["fn"])


def sized_executable(op: Operation, shapes: Sequence[tuple[int, ...]]) -> bytes:
    """The libspu executable of symbolic ``spu.run`` ``op`` for inputs of ``shapes``
    (cached); `MPPublicError` naming the op and the symbol when the shapes disagree."""
    bind_sizes(f"spu.run[{op.attrs['fn']}]", op.attrs["in_types"], shapes)
    key = (bytes(op.attrs["stablehlo"]), tuple(shapes))
    executable: bytes | None = _EXECUTABLES.lookup(key)
    if executable is None:
        executable = _compile(op, tuple(shapes))
        _EXECUTABLES.store(key, executable)
    return executable


