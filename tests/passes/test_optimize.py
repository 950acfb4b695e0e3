"""`mp.optimize`: the API, the checks it runs after each pass, and proof that the
result comparison used by the pass tests catches a pass that changes results."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import passes, simp
from mplang.edsl.graph import Graph, Operation, Value
from tests.passes import programs
from tests.simulators import simulated

W = programs.WORLD


sim3 = simulated(W)


def test_public_api() -> None:
    assert mp.optimize is passes.optimize
    assert "optimize" in mp.__all__
    assert passes.DEFAULT_PASSES[0] is passes.eliminate_common_subexpressions
    for fn in (passes.eliminate_dead_code, passes.eliminate_common_subexpressions,
               passes.fuse_pcalls, passes.batch_shuffles):
        assert fn in passes.DEFAULT_PASSES


def test_optimize_keeps_the_program_metadata(sim3: mp.Simulator) -> None:
    program, _ = next(c for c in programs.CASES if c.name == "device_level").build(sim3)
    out = mp.optimize(program)
    assert isinstance(out, mp.Program) and out is not program
    assert (out.name, out.world_size, out.out_tree, out.out_devices) == \
        (program.name, program.world_size, program.out_tree, program.out_devices)
    assert out.input_types == program.input_types
    assert out.output_types == program.output_types


def test_optimize_is_idempotent(sim3: mp.Simulator) -> None:
    for case in programs.CASES:
        program, _ = case.build(sim3)
        once = mp.optimize(program)
        assert str(mp.optimize(once)) == str(once), case.name


def test_custom_pass_lists() -> None:
    program = mp.compile(programs.pcall_chains, world_size=W)
    assert str(mp.optimize(program, passes=[])) == str(program)
    fused = mp.optimize(program, passes=[passes.fuse_pcalls])
    assert programs.op_counts(fused.graph)["simp.pcall"] == 2


def test_a_pass_producing_an_invalid_graph_is_named() -> None:
    def drop_first_op(graph: Graph) -> Graph:
        return Graph(list(graph.inputs), graph.operations[1:], list(graph.outputs))

    program = mp.compile(programs.pcall_chains, world_size=W)
    with pytest.raises(mp.MPVerifyError, match="pass drop_first_op produced an invalid graph"):
        mp.optimize(program, passes=[drop_first_op])


def test_a_pass_changing_the_signature_is_refused() -> None:
    def new_inputs(graph: Graph) -> Graph:
        extra = Value("extra", graph.outputs[0].type)
        return Graph([*graph.inputs, extra], list(graph.operations), list(graph.outputs))

    program = mp.compile(programs.pcall_chains, world_size=W)
    with pytest.raises(mp.MPVerifyError, match="new_inputs changed the graph's inputs"):
        mp.optimize(program, passes=[new_inputs])


def test_optimize_takes_programs_only() -> None:
    with pytest.raises(TypeError, match="takes a Program"):
        mp.optimize(programs.pcall_chains)  # type: ignore[arg-type]


def test_optimized_programs_run_with_new_runtime_inputs(sim3: mp.Simulator) -> None:
    program, _ = next(c for c in programs.CASES if c.name == "millionaire").build(sim3)
    optimized = mp.optimize(program)
    for alice, bob in [(5, 7), (9, 2), (4, 4)]:
        with sim3:
            x = mp.put("P0", np.int32(alice))
            y = mp.put("P1", np.int32(bob))
        for mode in ("launch", "standard"):
            want = programs.run(sim3, program, [x, y], mode)
            assert programs.run(sim3, optimized, [x, y], mode) == want
            assert want == (("bool", (), [alice < bob]),) * 2


# ---------------------------------------------------------------- the comparison catches bugs


def careless_cse(graph: Graph) -> Graph:
    """A wrong CSE: merges ops with the same opcode, inputs and output types, ignoring
    attributes (so ``0.0`` and ``-0.0`` become one constant)."""
    replaced: dict[Value, Value] = {}
    seen: dict[tuple[Any, ...], Operation] = {}
    kept = []
    for op in graph.operations:
        op = op.replace(inputs=tuple(replaced.get(v, v) for v in op.inputs))
        key = (op.opcode, op.inputs, tuple(str(v.type) for v in op.outputs))
        if key in seen and not op.regions:
            replaced.update(zip(op.outputs, seen[key].outputs, strict=True))
            continue
        seen.setdefault(key, op)
        kept.append(op)
    return Graph(list(graph.inputs), kept, [replaced.get(v, v) for v in graph.outputs])


def swapped_fusion(graph: Graph) -> Graph:
    """A wrong fusion: fuses correctly, then swaps the first two results of the region."""
    out = passes.fuse_pcalls(graph)
    ops = []
    for op in out.operations:
        if op.opcode == "simp.pcall" and "+" in op.attrs["fn"]:
            body = op.regions[0]
            outs = [body.outputs[1], body.outputs[0], *body.outputs[2:]]
            op = op.replace(regions=(Graph(body.inputs, body.operations, outs),))
        ops.append(op)
    return Graph(list(out.inputs), ops, list(out.outputs))


@pytest.mark.parametrize("mode", ["launch", "standard"])
@pytest.mark.parametrize(("wrong", "case_name"), [
    (careless_cse, "numeric_edges"),
    (swapped_fusion, "dead_code"),
])
def test_the_result_comparison_catches_a_wrong_pass(sim3: mp.Simulator, wrong: Any,
                                                    case_name: str, mode: str) -> None:
    case = next(c for c in programs.CASES if c.name == case_name)
    program, inputs = case.build(sim3)
    broken = mp.optimize(program, passes=[wrong])    # well formed, wrong results
    assert programs.run(sim3, broken, inputs, mode) != programs.run(sim3, program, inputs, mode)


def test_the_comparison_tells_signed_zeros_and_dtypes_apart() -> None:
    assert programs.plain(np.float32(0.0)) != programs.plain(np.float32(-0.0))
    assert programs.plain(np.int32(1)) != programs.plain(np.int64(1))
    assert programs.plain(np.float32(np.nan)) == programs.plain(np.float32(np.nan))


def test_simp_ops_the_comparison_sees_per_party(sim3: mp.Simulator) -> None:
    def prog() -> Any:
        return simp.shuffle_static(simp.constant((0,), np.int32(1)), {2: 0})

    program = mp.compile(prog, world_size=W)
    assert programs.run(sim3, program, [], "launch") == [None, None, ("int32", (), [1])]
