"""Graph-to-graph optimization passes.

A pass is a pure function ``fn(graph) -> graph``: it returns a new graph and
never changes its input (unchanged ops and regions may be shared, since IR
nodes are immutable). `optimize` runs passes over a program's graph and checks
the result with `Graph.verify` after each one.

* `eliminate_common_subexpressions`: repeated pure computations done once;
* `eliminate_dead_code`: ops without effects whose results nobody uses removed;
* `batch_shuffles`: independent ``simp.shuffle_static``s with the same routes
  in the same communication round sent as one message per route;
* `fuse_pcalls`: adjacent ``simp.pcall``s on the same parties run as one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mplang.edsl.errors import MPVerifyError
from mplang.edsl.graph import Graph
from mplang.edsl.program import Program
from mplang.passes.batch_shuffles import batch_shuffles
from mplang.passes.cse import eliminate_common_subexpressions
from mplang.passes.dce import eliminate_dead_code
from mplang.passes.fuse_pcalls import fuse_pcalls

Pass = Callable[[Graph], Graph]
"""A graph-to-graph transformation that leaves its input unchanged."""

DEFAULT_PASSES: tuple[Pass, ...] = (
    eliminate_common_subexpressions,
    eliminate_dead_code,
    batch_shuffles,
    fuse_pcalls,
    eliminate_common_subexpressions,
    eliminate_dead_code,
)
"""CSE and DCE first (fewer ops, more adjacent pcalls), batching (which may bring
pcalls together), fusion, then CSE and DCE again inside the fused bodies."""


def optimize(program: Program, passes: Sequence[Pass] = DEFAULT_PASSES) -> Program:
    """A new program whose graph is ``program``'s after each of ``passes`` in turn.

    The result computes the same outputs, with the same types, devices and output
    tree; ``program`` is not changed. Raises `MPVerifyError` naming the pass if
    one produces an ill-formed graph.
    """
    if not isinstance(program, Program):
        raise TypeError(f"optimize takes a Program (from mp.compile), got {program!r}")
    graph = program.graph
    for fn in passes:
        result = fn(graph)
        name = getattr(fn, "__name__", repr(fn))
        try:
            result.verify()
        except MPVerifyError as e:
            raise MPVerifyError(f"pass {name} produced an invalid graph: {e}") from e
        _check_signature(graph, result, name)
        graph = result
    return Program(graph, program.out_tree, program.world_size, program.name,
                   program.out_devices, received=program.received)


def _check_signature(before: Graph, after: Graph, name: str) -> None:
    """A pass keeps the graph's inputs and the types of its outputs."""
    same_inputs = len(before.inputs) == len(after.inputs) and all(
        a is b for a, b in zip(before.inputs, after.inputs, strict=True))
    out_types = [v.type for v in before.outputs] == [v.type for v in after.outputs]
    if not (same_inputs and out_types):
        raise MPVerifyError(f"pass {name} changed the graph's inputs or output types")


__all__ = [
    "DEFAULT_PASSES",
    "Pass",
    "batch_shuffles",
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
    "fuse_pcalls",
    "optimize",
]
