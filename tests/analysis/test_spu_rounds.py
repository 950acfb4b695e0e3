"""Round estimates of SPU executables: the pphlo parser, the table, real executables."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest

import mplang as mp
from mplang.analysis.spu_rounds import estimate_rounds_from_code, estimate_spu_rounds, parse_module

HEAD = 'module @jit_f attributes {mhlo.is_dynamic = false, pphlo.version = "0.10"} {'
S, P = "tensor<8x!pphlo.secret<i32>>", "tensor<8xi32>"
SF, PF = "tensor<8x!pphlo.secret<f32>>", "tensor<8xf32>"


def module(*body: str, args: str = f"%arg0: {S}, %arg1: {S}") -> str:
    lines = [HEAD, f"  func.func @main({args}) -> {S} {{", *(f"    {b}" for b in body),
             "    return %0 : " + S, "  }", "}"]
    return "\n".join(lines)


@pytest.mark.parametrize(("field", "rounds"), [("FM32", 6), ("FM64", 7), ("FM128", 8)])
def test_secret_comparison_grows_with_log_of_the_field(field: str, rounds: int) -> None:
    code = module(f"%0 = pphlo.less %arg0, %arg1 : ({S}, {S}) -> tensor<8x!pphlo.secret<i1>>")
    assert estimate_rounds_from_code(code, field) == rounds


def test_public_ops_are_free() -> None:
    code = module(f"%0 = pphlo.less %arg0, %arg1 : ({P}, {P}) -> tensor<8xi1>",
                  f"%1 = pphlo.exponential %arg0 : {PF}", args=f"%arg0: {P}, %arg1: {P}")
    assert estimate_rounds_from_code(code) == 0


@pytest.mark.parametrize(("line", "rounds"), [
    (f"%0 = pphlo.multiply %arg0, %arg1 : {S}", 1),                  # secret x secret
    (f"%0 = pphlo.multiply %arg0, %arg1 : {SF}", 2),                 # + fixed-point truncation
    (f"%0 = pphlo.multiply %arg0, %c : ({SF}, {PF}) -> {SF}", 1),    # truncation only
    (f"%0 = pphlo.multiply %arg0, %c : ({S}, {P}) -> {S}", 0),       # local
    (f"%0 = pphlo.dot %arg0, %arg1 : ({SF}, {SF}) -> {SF}", 2),
    (f"%0 = pphlo.select %p, %arg0, %arg1 : (tensor<8xi1>, {S}, {S}) -> {S}", 0),
    (f"%0 = pphlo.select %p, %arg0, %arg1 : (tensor<8x!pphlo.secret<i1>>, {S}, {S}) -> {S}",
     1),
    (f"%0 = pphlo.add %arg0, %arg1 : {S}", 0),
    (f"%0 = pphlo.reshape %arg0 : ({S}) -> tensor<2x4x!pphlo.secret<i32>>", 0),
    (f"%0 = pphlo.exponential %arg0 : {SF}", 17),
    (f"%0 = pphlo.divide %arg0, %arg1 : {SF}", 38),
    (f"%0 = pphlo.logistic %arg0 : {SF}", 53),
    (f"%0 = pphlo.maximum %arg0, %arg1 : {S}", 8),
    (f"%0 = pphlo.simple_sort %arg0  ASC, dim = 0, num_keys = 1 : ({SF}) -> {SF}", 496),
    (f"%0 = pphlo.custom_call @mhlo.erf(%arg0) {{mhlo.attributes = {{}}}} : ({SF}) -> {SF}",
     60),
    (f"%0 = pphlo.custom_call @mhlo.unheard_of(%arg0) : ({SF}) -> {SF}", 1),
    (f"%0 = pphlo.some_future_op %arg0 : {S}", 1),                   # unknown: one round
])
def test_rounds_of_single_ops(line: str, rounds: int) -> None:
    assert estimate_rounds_from_code(module(line)) == rounds


def test_rounds_of_sequential_ops_add_up() -> None:
    code = module(f"%2 = pphlo.less %arg0, %arg1 : ({S}, {S}) -> tensor<8x!pphlo.secret<i1>>",
                  f"%3 = pphlo.multiply %arg0, %arg1 : {S}",
                  f"%0 = pphlo.less %arg1, %arg0 : ({S}, {S}) -> tensor<8x!pphlo.secret<i1>>")
    assert estimate_rounds_from_code(code) == 7 + 1 + 7


WHILE = [
    f"%0:2 = pphlo.while(%a = %c0, %b = %arg0) : tensor<i32>, {S}",
    " cond {",
    "  %1 = pphlo.less %a, %c3 : (tensor<i32>, tensor<i32>) -> tensor<i1>",
    "  pphlo.return %1 : tensor<i1>",
    "} do {",
    f"  %1 = pphlo.multiply %b, %b : {S}",
    f"  %2 = pphlo.less %b, %b : ({S}, {S}) -> tensor<8x!pphlo.secret<i1>>",
    f"  pphlo.return %a, %1 : tensor<i32>, {S}",
    "}",
]


@pytest.mark.parametrize(("iterations", "rounds"), [(0, 0), (1, 8), (5, 40)])
def test_while_loops_run_the_assumed_iterations(iterations: int, rounds: int) -> None:
    assert estimate_rounds_from_code(module(*WHILE), loop_iterations=iterations) == rounds


def counted_loop(init: str, bound: str, step: str, test: str = "less") -> list[str]:
    """``for (i = init; i <test> bound; i += step) b = b * b`` as jax.lax.fori_loop compiles it."""
    return [
        f"%c0 = pphlo.constant dense<{init}> : tensor<i32>",
        f"%c1 = pphlo.constant dense<{bound}> : tensor<i32>",
        f"%c2 = pphlo.constant dense<{step}> : tensor<i32>",
        f"%0:2 = pphlo.while(%a = %c0, %b = %arg0) : tensor<i32>, {S}",
        " cond {",
        "  %1 = pphlo.broadcast_as %c1, %a : tensor<i32>",
        f"  %2 = pphlo.{test} %a, %1 : (tensor<i32>, tensor<i32>) -> tensor<i1>",
        "  pphlo.return %2 : tensor<i1>",
        "} do {",
        "  %1 = pphlo.broadcast_as %c2, %a : tensor<i32>",
        "  %2 = pphlo.add %a, %1 : tensor<i32>",
        f"  %3 = pphlo.multiply %b, %b : {S}",
        f"  pphlo.return %2, %3 : tensor<i32>, {S}",
        "}",
    ]


@pytest.mark.parametrize(("init", "bound", "step", "test", "trips"), [
    (0, 5, 1, "less", 5), (2, 9, 3, "less", 3), (0, 5, 1, "less_equal", 6),
    (10, 0, -2, "greater", 5), (10, 0, -2, "greater_equal", 6), (5, 5, 1, "less", 0),
    (7, 3, 1, "less", 0),
])
def test_counted_loops_use_their_trip_count(init: int, bound: int, step: int, test: str,
                                            trips: int) -> None:
    code = module(*counted_loop(str(init), str(bound), str(step), test))
    # one secret multiply per iteration; the public counter costs nothing
    assert estimate_rounds_from_code(code, loop_iterations=100) == trips


def test_loops_with_a_data_dependent_bound_use_the_assumed_iterations() -> None:
    lines = counted_loop("0", "5", "1")
    lines[5] = "  %1 = pphlo.broadcast_as %n, %a : tensor<i32>"  # a bound that is no constant
    code = module(*lines)
    assert estimate_rounds_from_code(code, loop_iterations=1) == 1
    assert estimate_rounds_from_code(code, loop_iterations=7) == 7


def test_if_costs_its_costlier_branch() -> None:
    code = module('%0 = "pphlo.if"(%p) ({',
                  f"  %4 = pphlo.sqrt %arg0 : {SF}",
                  f"  pphlo.return %4 : {SF}",
                  "}, {",
                  f"  %4 = pphlo.exponential %arg0 : {SF}",
                  f"  pphlo.return %4 : {SF}",
                  f"}}) : (tensor<i1>) -> {SF}")
    assert estimate_rounds_from_code(code) == 35


def test_reduce_applies_its_reducer_once_per_tree_level() -> None:
    scalar = "tensor<!pphlo.secret<f32>>"
    code = module(f"%0 = pphlo.reduce(%arg0 init: %i) across dimensions = [0] : "
                  f"({SF}, {scalar}) -> {scalar}",
                  f" reducer(%a: {scalar}, %b: {scalar})  {{",
                  f"  %5 = pphlo.less %b, %a : ({scalar}, {scalar}) -> "
                  "tensor<!pphlo.secret<i1>>",
                  f"  %6 = pphlo.select %5, %a, %b : (tensor<!pphlo.secret<i1>>, {scalar}, "
                  f"{scalar}) -> {scalar}",
                  f"  pphlo.return %6 : {scalar}",
                  "}")
    assert estimate_rounds_from_code(code) == (7 + 1) * (3 + 1)  # 8 elements: 3 levels (+1)
    summed = module(f"%0 = pphlo.reduce(%arg0 init: %i) applies pphlo.add across dimensions "
                    f"= [0] : ({SF}, {scalar}) -> {scalar}")
    assert estimate_rounds_from_code(summed) == 0


def test_calls_to_private_functions_are_followed() -> None:
    code = "\n".join([
        HEAD,
        f"  func.func @main(%arg0: {S}, %arg1: {S}) -> {S} {{",
        f"    %0 = func.call @helper(%arg0, %arg1) : ({S}, {S}) -> {S}",
        f"    %1 = func.call @helper(%0, %arg1) : ({S}, {S}) -> {S}",
        f"    return %1 : {S}",
        "  }",
        f"  func.func private @helper(%arg0: {S}, %arg1: {S}) -> {S} {{",
        f"    %0 = pphlo.maximum %arg0, %arg1 : {S}",
        f"    return %0 : {S}",
        "  }",
        "}",
    ])
    assert estimate_rounds_from_code(code) == 2 * 8


def test_parse_module_nests_regions() -> None:
    (mod,) = parse_module(module(*WHILE))
    (func,) = mod.regions[0]
    body = func.regions[0]
    assert [op.name for op in body] == ["while", "return"]
    cond, loop = body[0].regions
    assert [op.name for op in cond] == ["less", "return"]
    assert [op.name for op in loop] == ["multiply", "less", "return"]


# ---------------------------------------------------------------- real executables


def semi2k_pair() -> mp.ClusterSpec:
    """``ClusterSpec.simple(2)`` with SEMI2K, the protocol the round table was measured on
    (the default for 2 parties is CHEETAH)."""
    spec = mp.ClusterSpec.simple(2).to_dict()
    spec["devices"]["SP0"]["config"] = {"protocol": "SEMI2K", "field": "FM64"}
    return mp.ClusterSpec.from_dict(spec)


def spu_run_executable(fn: Any, *args: Any) -> bytes:
    """The executable of the one ``spu.run`` of ``fn`` on the 2-party SEMI2K SPU SP0."""
    def prog() -> Any:
        ins = [mp.device(f"P{i}")(lambda a=a: a)() for i, a in enumerate(args)]
        return mp.device("SP0")(fn)(*ins)

    program = mp.compile(prog, cluster=semi2k_pair())
    (run,) = [op for op in program.graph.walk() if op.opcode == "spu.run"]
    assert (run.attrs["protocol"], run.attrs["field"]) == ("SEMI2K", "FM64")
    return bytes(run.attrs["executable"])


I8 = jnp.arange(8, dtype=jnp.int32)
F8 = jnp.arange(1, 9, dtype=jnp.float32)


@pytest.mark.parametrize(("name", "fn", "x", "rounds"), [
    # measured by libspu (SEMI2K, 2 parties, FM64, send actions): 7, 2, 17, 38, 53, 36
    ("less", lambda a, b: a < b, I8, 7),
    ("fmul", lambda a, b: a * b, F8, 2),
    ("exp", lambda a, b: jnp.exp(a), F8, 17),
    ("div", lambda a, b: a / b, F8, 38),
    ("sigmoid", lambda a, b: jax.nn.sigmoid(a), F8, 53),
    ("reciprocal", lambda a, b: 1 / a, F8, 36),
])
def test_rounds_of_compiled_functions_match_libspu(name: str, fn: Any, x: Any,
                                                   rounds: int) -> None:
    assert estimate_spu_rounds(spu_run_executable(fn, x, x[::-1])) == rounds


def descend(x: Any, w: Any) -> Any:
    return jax.lax.fori_loop(0, 4, lambda i, w: w - 0.1 * (x.T @ jax.nn.sigmoid(x @ w)), w)


def clipped_squares(x: Any, w: Any) -> Any:
    return jax.lax.fori_loop(2, 9, lambda i, w: jnp.maximum(w, x[0]) * w, w)


@pytest.mark.parametrize(("fn", "rounds"), [(descend, 232), (clipped_squares, 70)])
def test_rounds_of_compiled_loops_match_libspu(fn: Any, rounds: int) -> None:
    # measured by libspu (SEMI2K, 2 parties, FM64): 232 and 70 send actions
    executable = spu_run_executable(fn, jnp.ones((6, 3), jnp.float32),
                                    jnp.full(3, 0.5, jnp.float32))
    assert estimate_spu_rounds(executable) == rounds
    assert estimate_spu_rounds(executable, loop_iterations=50) == rounds  # counted: no guess


def test_malformed_executable_is_rejected() -> None:
    with pytest.raises(ValueError, match="malformed SPU executable"):
        estimate_spu_rounds(b"\xff\xfe not a protobuf")
