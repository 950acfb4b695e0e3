"""The interpreter: runs a graph by dispatching each op to the kernel registered
for its name. Backends only register kernels; nothing overrides this loop.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from mplang.edsl.graph import Graph, Operation
from mplang.frontend.errors import MPLangError, MPRuntimeError

Kernel = Callable[["Interpreter", Operation, list[Any], str], list[Any]]
"""``kernel(interp, op, input values, key) -> output values``.

``key`` names this execution of ``op`` uniquely within a run (its path through
regions and loop iterations), so parties tag their messages with it.
"""


class KernelTable:
    """Op name -> kernel. Registering a name twice is an error unless ``override``."""

    def __init__(self, kernels: Mapping[str, Kernel] | None = None,
                 fallback: Callable[[str], Kernel | None] | None = None):
        self._kernels: dict[str, Kernel] = dict(kernels or {})
        self.fallback = fallback
        """Resolves names without a registered kernel (e.g. by op metadata)."""

    def register(self, name: str, *, override: bool = False) -> Callable[[Kernel], Kernel]:
        def deco(kernel: Kernel) -> Kernel:
            if name in self._kernels and not override:
                raise ValueError(f"a kernel for {name!r} is already registered")
            self._kernels[name] = kernel
            return kernel

        return deco

    def get(self, name: str) -> Kernel | None:
        kernel = self._kernels.get(name)
        if kernel is None and self.fallback is not None:
            kernel = self.fallback(name)
        return kernel

    def names(self) -> list[str]:
        return sorted(self._kernels)

    @staticmethod
    def merge(tables: Iterable[KernelTable]) -> KernelTable:
        merged = KernelTable()
        for table in tables:
            for name, kernel in table._kernels.items():
                merged.register(name)(kernel)
        return merged

    def with_overrides(self, overrides: KernelTable) -> KernelTable:
        table = KernelTable(self._kernels, self.fallback)
        table._kernels.update(overrides._kernels)
        return table


class Interpreter:
    """Runs graphs with one kernel table and per-dialect state (``states["simp"]`` …).

    ``party`` is the rank this interpreter runs for (None on the driver); it
    appears in error messages. ``exec_id`` identifies the run for message tags.
    """

    def __init__(self, kernels: KernelTable, states: Mapping[str, Any], *,
                 party: int | None, exec_id: str,
                 on_op: Callable[[Operation, str], None] | None = None):
        self.kernels = kernels
        self.states = states
        self.party = party
        self.exec_id = exec_id
        self.on_op = on_op
        """Called after each completed op with the op and its key (progress reporting)."""

    def run(self, graph: Graph, inputs: Sequence[Any], scope: str = "") -> list[Any]:
        """Evaluate ``graph`` on ``inputs``; ``scope`` prefixes the ops' message keys."""
        if len(inputs) != len(graph.inputs):
            raise MPRuntimeError(f"graph takes {len(graph.inputs)} inputs, got {len(inputs)}",
                                 party=self.party)
        env: dict[Any, Any] = dict(zip(graph.inputs, inputs, strict=True))
        where = "the driver" if self.party is None else f"party {self.party}"
        for index, op in enumerate(graph.operations):
            kernel = self.kernels.get(op.opcode)
            if kernel is None:
                raise MPRuntimeError(f"{where} has no kernel for op {op.opcode}",
                                     party=self.party, op=op.opcode)
            args = [env[v] for v in op.inputs]
            try:
                outs = kernel(self, op, args, f"{scope}/{index}")
            except MPRuntimeError as e:
                if e.op is None:  # name the op a communication wait belonged to
                    e.op = op.opcode
                    e.args = (f"{e.args[0]} (in op {op.opcode})", *e.args[1:])
                raise
            except MPLangError:
                raise
            except Exception as e:
                results = ", ".join(f"%{v.name}" for v in op.outputs) or "no results"
                raise MPRuntimeError(
                    f"{where}: op {op.opcode} (defining {results}) failed: "
                    f"{type(e).__name__}: {e}", party=self.party, op=op.opcode,
                ) from e
            if len(outs) != len(op.outputs):
                raise MPRuntimeError(f"{where}: kernel of {op.opcode} returned {len(outs)} values "
                                     f"for {len(op.outputs)} outputs", party=self.party,
                                     op=op.opcode)
            env.update(zip(op.outputs, outs, strict=True))
            if self.on_op is not None:
                self.on_op(op, f"{scope}/{index}")
        return [env[v] for v in graph.outputs]
