"""Every pass and `mp.optimize` on every shared program (``programs.py``).

For each (program, transformation) pair: the result verifies, the input graph
is unchanged, the expected structural change happened (op counts), the
transformed program survives a save/load round trip, and running it on a
3-party simulator gives exactly the results of the original, in both modes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import mplang as mp
from mplang import passes
from mplang.edsl.graph import Graph
from mplang.edsl.printer import format_graph
from tests.passes import programs
from tests.simulators import simulated

TRANSFORMS: dict[str, Callable[[mp.Program], mp.Program]] = {
    **{fn.__name__: (lambda p, fn=fn: mp.Program(fn(p.graph), p.out_tree, p.world_size, p.name,
                                                 p.out_devices))
       for fn in (passes.eliminate_dead_code, passes.eliminate_common_subexpressions,
                  passes.fuse_pcalls, passes.batch_shuffles)},
    "optimize": mp.optimize,
}
MODES = ("launch", "standard")


sim3 = simulated(programs.WORLD)


_BUILT: dict[str, tuple[mp.Program, list[Any]]] = {}
_REFERENCE: dict[tuple[str, str], Any] = {}


def _built(sim: mp.Simulator, case: Any) -> tuple[mp.Program, list[Any]]:
    if case.name not in _BUILT:
        _BUILT[case.name] = case.build(sim)
    return _BUILT[case.name]


def _reference(sim: mp.Simulator, case: Any, mode: str) -> Any:
    """The original program's results (computed once per case and mode)."""
    if (case.name, mode) not in _REFERENCE:
        program, inputs = _built(sim, case)
        _REFERENCE[(case.name, mode)] = programs.run(sim, program, inputs, mode)
    return _REFERENCE[(case.name, mode)]


def _fingerprint(graph: Graph) -> tuple[Any, ...]:
    """Everything a pass could mutate: the text, and the identity of every op and list."""
    ops = list(graph.walk())
    return (format_graph(graph), tuple(id(op) for op in ops), id(graph.operations),
            tuple(id(op.attrs) for op in ops), tuple(tuple(id(v) for v in op.inputs) for op in ops))


CASE_IDS = [c.name for c in programs.CASES]


@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("case", programs.CASES, ids=CASE_IDS)
def test_structure(sim3: mp.Simulator, case: Any, transform: str) -> None:
    program, _ = _built(sim3, case)
    before = _fingerprint(program.graph)
    out = TRANSFORMS[transform](program)
    out.graph.verify()
    assert _fingerprint(program.graph) == before, "the pass changed its input graph"
    assert [v.type for v in out.graph.outputs] == [v.type for v in program.graph.outputs]
    assert out.graph.inputs == program.graph.inputs
    counts = programs.op_counts(out.graph)
    for opcode, expected in case.expect.get(transform, {}).items():
        assert counts[opcode] == expected, (
            f"{transform} on {case.name}: {counts[opcode]} {opcode} ops, expected {expected}\n"
            f"{out}")
    loaded = mp.Program.from_bytes(out.to_bytes())
    assert str(loaded) == str(out)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("case", programs.CASES, ids=CASE_IDS)
def test_same_results(sim3: mp.Simulator, case: Any, transform: str, mode: str) -> None:
    program, inputs = _built(sim3, case)
    expected = _reference(sim3, case, mode)
    out = TRANSFORMS[transform](program)
    assert programs.run(sim3, out, inputs, mode) == expected


@pytest.mark.parametrize("case", programs.CASES, ids=CASE_IDS)
def test_optimize_changes_something(sim3: mp.Simulator, case: Any) -> None:
    """Every shared program gives the optimizer something to do (or says what stays)."""
    program, _ = _built(sim3, case)
    out = mp.optimize(program)
    assert str(out) != str(program)
    assert sum(programs.op_counts(out.graph).values()) < \
        sum(programs.op_counts(program.graph).values())
