"""`mp.analyze` on compiled programs: levels, parallelism, critical path, rounds, the report."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import func, simp
from mplang.analysis import CostModel
from mplang.analysis.cost_model import predicate_check
from mplang.edsl.graph import Graph


def pairs_program() -> mp.Program:
    """16 parties: party 2k sends a scalar to party 2k+1, for k = 0..7 (disjoint pairs)."""
    def pairs() -> Any:
        outs = []
        for k in range(8):
            x = simp.constant((2 * k,), np.float32(k))
            outs.append(simp.shuffle_static(x, {2 * k + 1: 2 * k}))
        return outs

    return mp.compile(pairs, world_size=16)


def chain_program(hops: int = 4) -> mp.Program:
    """Ten floats bounced between parties 0 and 1 ``hops`` times."""
    def chain() -> Any:
        x = simp.constant((0,), np.zeros(10, np.float32))
        for k in range(hops):
            x = simp.shuffle_static(x, {(k + 1) % 2: k % 2})
        return x

    return mp.compile(chain, world_size=2)


def millionaire_program(world_size: int = 2) -> mp.Program:
    def millionaire() -> Any:
        x = mp.device("P0")(lambda: jnp.int32(1_000_000))()
        y = mp.device("P1")(lambda: jnp.int32(2_000_000))()
        return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(x, y))

    return mp.compile(millionaire, cluster=mp.ClusterSpec.simple(world_size))


def shuffle_program() -> mp.Program:
    def plain() -> Any:
        return simp.shuffle_static(simp.constant((0,), 1_000_000), {1: 0})

    return mp.compile(plain, world_size=2)


def scalar_const(model: CostModel) -> float:
    return model.op_s + model.element_s


def message(model: CostModel, nbytes: float) -> float:
    return model.latency_s + nbytes / model.bandwidth_bytes_per_s


# ---------------------------------------------------------------- parallel and chained


def test_independent_shuffles_on_disjoint_pairs(model: CostModel) -> None:
    report = mp.analyze(pairs_program(), model)
    assert report.num_ops == report.num_top_level_ops == 16
    assert report.depth == 2
    assert report.max_parallelism == 8
    assert report.levels == [list(range(0, 16, 2)), list(range(1, 16, 2))]
    assert report.independent_sets == report.levels
    assert report.rounds == 1
    # one constant, then one 4-byte message; the eight pairs overlap
    assert report.critical_path == pytest.approx(0.01 + 0.001 + 0.5 + 4 / 1000)
    assert report.critical_path == pytest.approx(scalar_const(model) + message(model, 4))
    assert report.critical_ops == (0, 1)


def test_independent_shuffles_under_the_default_model() -> None:
    report = mp.analyze(pairs_program())
    assert report.critical_path == pytest.approx(1e-6 + 1e-9 + 1e-3 + 4 / 125e6)
    assert report.cost_model == CostModel()


def test_a_chain_has_no_parallelism(model: CostModel) -> None:
    report = mp.analyze(chain_program(4), model)
    assert report.max_parallelism == 1
    assert report.depth == 5
    assert report.levels == [[0], [1], [2], [3], [4]]
    assert report.independent_sets == []
    assert report.rounds == 4
    const = model.op_s + 10 * model.element_s
    assert report.critical_path == pytest.approx(const + 4 * message(model, 40))
    assert report.critical_ops == (0, 1, 2, 3, 4)


@pytest.mark.parametrize("param", ["latency_s", "bandwidth", "op_s"])
def test_cost_parameters_change_the_critical_path_linearly(param: str) -> None:
    def cp(x: float, program: mp.Program) -> float:
        kwargs: dict[str, Any] = {
            "latency_s": {"latency_s": x},
            "bandwidth": {"bandwidth_bytes_per_s": 1 / x},  # linear in seconds per byte
            "op_s": {"op_s": x},
        }[param]
        return mp.analyze(program, CostModel(**kwargs)).critical_path

    chain = chain_program(4)
    xs = [1e-3, 2e-3, 3e-3, 7e-3]
    values = [cp(x, chain) for x in xs]
    slope = (values[1] - values[0]) / (xs[1] - xs[0])
    for x, value in zip(xs, values, strict=True):
        assert value == pytest.approx(values[0] + slope * (x - xs[0]))
    # the slope is what the path holds: 4 messages, 4 x 40 bytes, 1 local op
    assert slope == pytest.approx({"latency_s": 4, "bandwidth": 160, "op_s": 1}[param])


def test_spu_program_critical_path_scales_with_its_rounds() -> None:
    program = millionaire_program()
    low, high = (mp.analyze(program, CostModel(latency_s=x)) for x in (1e-3, 2e-3))
    assert low.rounds == high.rounds == 9
    assert high.critical_path - low.critical_path == pytest.approx(9 * 1e-3)


# ---------------------------------------------------------------- SPU


def test_spu_millionaire_rounds(model: CostModel) -> None:
    report = mp.analyze(millionaire_program(), model)
    opcodes = [s.opcode for s in report.ops]
    assert opcodes == ["simp.pcall", "simp.pcall", "spu.seal", "spu.seal", "spu.run",
                       "spu.reveal"]
    assert [s.rounds for s in report.ops] == [0, 0, 1, 1, 7, 1]
    assert report.rounds == 1 + 7 + 1  # seal, compare (log2(64) + 1), reveal
    assert report.depth == 4
    assert report.max_parallelism == 2
    assert report.num_ops == 8  # two run_jax ops inside the pcalls
    share, bit_share = 2 * 4, 2 * 1  # shares of an i32 and of a bool: 2 x plaintext bytes
    run_jax = model.op_s + model.element_s  # no inputs, one element out
    assert report.ops[0].cost_s == pytest.approx(run_jax)
    spu_run = (model.op_s + 3 * model.element_s) + 7 * message(model, share)
    assert report.ops[4].cost_s == pytest.approx(spu_run)
    expected = run_jax + message(model, share) + spu_run + message(model, bit_share)
    assert report.critical_path == pytest.approx(expected)


def test_spu_program_takes_more_rounds_than_a_plain_shuffle() -> None:
    spu_rounds = mp.analyze(millionaire_program()).rounds
    plain_rounds = mp.analyze(shuffle_program()).rounds
    assert plain_rounds == 1
    assert spu_rounds > plain_rounds


# ---------------------------------------------------------------- regions


def while_program() -> mp.Program:
    def counter() -> Any:
        return simp.while_loop(lambda k: k < 3, lambda k: k + 1, simp.constant((0, 1, 2), 0))

    return mp.compile(counter, world_size=3)


@pytest.mark.parametrize("iterations", [0, 1, 3])
def test_while_loop_costs_its_regions_times_the_iterations(model: CostModel,
                                                           iterations: int) -> None:
    m = dataclasses.replace(model, loop_iterations=iterations)
    report = mp.analyze(while_program(), m)
    assert report.num_top_level_ops == 2
    assert report.num_ops == 6  # while: cond (pcall + run_jax), body (pcall + run_jax)
    assert report.op_counts == {"simp.constant": 1, "simp.pcall": 2, "simp.while_loop": 1,
                                "tensor.run_jax": 2}
    assert report.depth == 2
    step = m.op_s + 2 * m.element_s  # one run_jax on a scalar: 1 element in, 1 out
    check = predicate_check(m).seconds
    loop = (iterations + 1) * (step + check) + iterations * step
    assert report.ops[1].cost_s == pytest.approx(loop)
    assert report.critical_path == pytest.approx(scalar_const(m) + loop)
    assert report.rounds == iterations + 1  # one predicate check per evaluation
    assert report.nested_depth == 1 + (iterations + 1) + iterations
    assert report.ops[1].nested_ops == 4
    assert report.ops[1].depth == (iterations + 1) + iterations


def cond_program(verify: bool = True) -> mp.Program:
    def choose() -> Any:
        pred = simp.constant((0, 1, 2), True)
        x = simp.constant((0,), np.float32(1.0))
        return simp.uniform_cond(
            pred,
            lambda v: simp.shuffle_static(v, {1: 0}),                               # 1 hop
            lambda v: simp.shuffle_static(simp.shuffle_static(v, {2: 0}), {1: 2}),  # 2 hops
            x, verify_uniform=verify)

    return mp.compile(choose, world_size=3)


@pytest.mark.parametrize("verify", [True, False])
def test_uniform_cond_costs_its_costlier_branch(model: CostModel, verify: bool) -> None:
    report = mp.analyze(cond_program(verify), model)
    check = predicate_check(model) if verify else None
    branch = 2 * message(model, 4)
    cond = branch + (check.seconds if check else 0.0)
    assert report.ops[2].cost_s == pytest.approx(cond)
    assert report.critical_path == pytest.approx(scalar_const(model) + cond)
    assert report.rounds == 2 + (1 if verify else 0)
    assert report.num_ops == 6
    assert report.nested_depth == 1 + 2
    then_branch, else_branch = report.region(2)
    assert (then_branch.rounds, else_branch.rounds) == (1, 2)
    assert else_branch.levels == [[0], [1]]


def test_func_call_costs_its_body(model: CostModel) -> None:
    @func.func
    def send(v: Any) -> Any:
        return simp.shuffle_static(v, {1: 0})

    def caller() -> Any:
        return send(send(simp.constant((0,), np.float32(1.0))))

    with pytest.raises(mp.MPTypeError):  # the second call reads from party 0, held by 1
        mp.compile(caller, world_size=2)

    def once() -> Any:
        return send(simp.constant((0,), np.float32(1.0)))

    report = mp.analyze(mp.compile(once, world_size=2), model)
    assert report.ops[1].label == "func.call[send]"
    assert report.ops[1].cost_s == pytest.approx(message(model, 4))
    assert report.rounds == 1
    assert report.num_ops == 3


def test_region_analysis_keeps_levels_and_use_def() -> None:
    def prog() -> Any:
        x = simp.constant((0,), 2)
        return simp.pcall((0,), lambda v: (v + 1, v * 2), x)

    report = mp.analyze(mp.compile(prog, world_size=2))
    (body,) = report.region(1)
    assert body.levels == [[0, 1]]  # the two local ops are independent
    assert body.max_parallelism == 2
    (v,) = body.graph.inputs
    assert body.use_def.users_of(v) == (0, 1)
    assert report.region(0) == ()


# ---------------------------------------------------------------- use-def through the report


def test_report_exposes_use_def_and_dependencies() -> None:
    program = chain_program(2)
    report = mp.analyze(program)
    ops = program.graph.operations
    assert report.use_def.def_of(ops[1].outputs[0]) == 1
    assert report.use_def.users_of(ops[0].outputs[0]) == (1,)
    assert report.dependencies(2) == (1,)
    assert report.users(0) == (1,)
    assert report.graph is program.graph


# ---------------------------------------------------------------- inputs


def test_a_bare_graph_is_accepted(model: CostModel) -> None:
    program = pairs_program()
    from_graph = mp.analyze(program.graph, model)
    from_program = mp.analyze(program, model)
    assert from_graph.name == "graph" and from_graph.world_size is None
    assert (from_program.name, from_program.world_size) == ("pairs", 16)
    for field in ("num_ops", "depth", "max_parallelism", "rounds", "levels", "critical_path"):
        assert getattr(from_graph, field) == getattr(from_program, field)


def test_an_empty_graph_has_an_empty_report() -> None:
    report = mp.analyze(Graph([], [], []))
    assert (report.num_ops, report.depth, report.max_parallelism, report.rounds) == (0, 0, 0, 0)
    assert report.critical_path == 0 and report.levels == []
    assert "(no ops)" in str(report)


def test_wrong_inputs_are_rejected() -> None:
    with pytest.raises(mp.MPLangError, match=r"mp.compile"):
        mp.analyze(lambda: 1)  # type: ignore[arg-type]
    with pytest.raises(mp.MPLangError, match="cost_model"):
        mp.analyze(pairs_program(), {"latency_s": 1})  # type: ignore[arg-type]


def test_analyze_is_public() -> None:
    import mplang.analysis

    assert "analyze" in mp.__all__
    assert mp.analyze is mplang.analysis.analyze


# ---------------------------------------------------------------- the table


def test_report_text_is_an_aligned_table(model: CostModel) -> None:
    text = str(mp.analyze(chain_program(2), model))
    assert text == "\n".join([
        "analysis of @chain (2 parties)",
        "  ops              3 (3 top level, 0 in regions)",
        "  depth            3 levels (nested depth 3)",
        "  max parallelism  1",
        "  critical path    1.1 s (3 ops, marked *)",
        "  rounds           2",
        "  cost model       latency 500 ms, bandwidth 1 kB/s, op 10 ms + 1 ms/element, "
        "share x2, loop iterations 1",
        "",
        "level  op  operation            outputs            cost   start  rounds",
        "-----  --  -------------------  ---------------  ------  ------  ------",
        "    1  #0  simp.constant        %0: f32[10]@{0}   20 ms     0 s       0  *",
        "    2  #1  simp.shuffle_static  %1: f32[10]@{1}  540 ms   20 ms       1  *",
        "    3  #2  simp.shuffle_static  %2: f32[10]@{0}  540 ms  560 ms       1  *",
    ])


def test_report_text_lists_every_op_by_level() -> None:
    report = mp.analyze(pairs_program())
    lines = str(report).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("level"))
    rows = lines[header + 2:]
    assert len(rows) == 16
    assert rows[0].split()[:3] == ["1", "#0", "simp.constant"]
    assert rows[8].split()[:3] == ["2", "#1", "simp.shuffle_static"]
    # columns line up: every row is as wide as the header (up to the critical-path mark)
    width = len(lines[header])
    assert all(len(row.rstrip(" *")) == width for row in rows)
    assert "max parallelism  8" in str(report)
