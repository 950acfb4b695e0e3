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

from jax._src.lib import _jax
from jax.extend.mlir import hlo_to_stablehlo
from jax.interpreters.mlir import make_ir_context, module_to_bytecode

from mplang.dialects.spu import executable_of, exported_run, patched_for_libspu
from mplang.dialects.symbolic import lowered, refined
from mplang.edsl.graph import Operation
from mplang.kernels.symbolic_sizes import bind_sizes
from mplang.kernels.tensor import ir, refuse_unsafe, unsafe_ops
from mplang.util.lru import LRUCache

MAX_CACHED = 256
"""Executables kept per worker: one per symbolic ``spu.run`` and sizes."""
_EXECUTABLES = LRUCache(MAX_CACHED)


def _compile(op: Operation, shapes: tuple[tuple[int, ...], ...]) -> bytes:
    in_types, out_types = tuple(op.attrs["in_types"]), tuple(op.attrs["out_types"])
    exp = exported_run(bytes(op.attrs["stablehlo"]), in_types, out_types)
    low = lowered(exp, shapes, patched_for_libspu)
    with make_ir_context():
        module = refined(low)
        refuse_unsafe(unsafe_ops(module))
        hlo = _jax.mlir.mlir_module_to_xla_computation(
            module_to_bytecode(module), use_tuple_args=False, return_tuple=False)
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
