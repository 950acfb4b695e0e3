"""Round estimates of ``spu.run``: the StableHLO reader, visibility, the table, real programs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest

import mplang as mp
from mplang.analysis.spu_rounds import estimate_spu_rounds
from mplang.flows.stablehlo import Tensor, parse

S, SF = "tensor<8xi32>", "tensor<8xf32>"
B = "tensor<8xi1>"


def module(*body: str, args: str = f"%arg0: {S}, %arg1: {S}", out: str = S) -> str:
    """A module whose ``main`` (inputs secret, as in an ``spu.run``) returns ``%0``."""
    return "\n".join(["module @jit_f {", f"  func.func @main({args}) -> {out} {{",
                      *(f"    {b}" for b in body), f"    return %0 : {out}", "  }", "}"])


def rounds(*body: str, field: str = "FM64", loops: int = 1, args: str = f"%arg0: {S}, %arg1: {S}",
           out: str = S) -> int:
    return estimate_spu_rounds(module(*body, args=args, out=out), field, loops)


@pytest.mark.parametrize(("field", "expected"), [("FM32", 6), ("FM64", 7), ("FM128", 8)])
def test_secret_comparison_grows_with_log_of_the_field(field: str, expected: int) -> None:
    assert rounds(f"%0 = stablehlo.compare LT, %arg0, %arg1 : ({S}, {S}) -> {B}",
                  field=field, out=B) == expected


def test_ops_on_constants_only_are_public_and_free() -> None:
    assert rounds("%c = stablehlo.constant dense<3> : tensor<8xi32>",
                  "%cf = stablehlo.constant dense<2.5> : tensor<8xf32>",
                  f"%1 = stablehlo.add %c, %c : {S}",
                  f"%2 = stablehlo.exponential %cf : {SF}",
                  f"%0 = stablehlo.compare LT, %1, %c : ({S}, {S}) -> {B}", out=B) == 0


def test_an_op_on_a_secret_is_secret() -> None:
    # %1 mixes a secret input with a constant: the comparison after it is secret
    assert rounds("%c = stablehlo.constant dense<3> : tensor<8xi32>",
                  f"%1 = stablehlo.add %arg0, %c : {S}",
                  f"%0 = stablehlo.compare GE, %1, %c : ({S}, {S}) -> {B}", out=B) == 7


CONST, CONST_F = ("%c = stablehlo.constant dense<2> : tensor<8xi32>",
                  "%c = stablehlo.constant dense<2.0> : tensor<8xf32>")
ONE = ["%c1 = stablehlo.constant dense<1.0> : tensor<f32>",
       f"%c = stablehlo.broadcast_in_dim %c1, dims = [] : (tensor<f32>) -> {SF}"]
SECRET_PRED = f"%p = stablehlo.compare LT, %arg0, %arg1 : ({SF}, {SF}) -> {B}"
PUBLIC_PRED = "%p = stablehlo.constant dense<true> : tensor<8xi1>"
F2 = f"%arg0: {SF}, %arg1: {SF}"


@pytest.mark.parametrize(("lines", "float_", "expected"), [
    ([f"%0 = stablehlo.multiply %arg0, %arg1 : {S}"], False, 1),  # secret x secret
    ([f"%0 = stablehlo.multiply %arg0, %arg1 : {SF}"], True, 2),  # + fixed-point truncation
    ([CONST_F, f"%0 = stablehlo.multiply %arg0, %c : {SF}"], True, 1),  # truncation only
    ([CONST, f"%0 = stablehlo.multiply %arg0, %c : {S}"], False, 0),  # local
    ([f"%0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], "
      f"contracting_dims = [] x [] : ({SF}, {SF}) -> {SF}"], True, 2),
    ([PUBLIC_PRED, f"%0 = stablehlo.select %p, %arg0, %arg1 : ({B}, {SF}, {SF}) -> {SF}"],
     True, 0),
    ([SECRET_PRED, f"%0 = stablehlo.select %p, %arg0, %arg1 : ({B}, {SF}, {SF}) -> {SF}"],
     True, 7 + 1),
    ([f"%0 = stablehlo.add %arg0, %arg1 : {S}"], False, 0),
    ([f"%1 = stablehlo.reshape %arg0 : ({S}) -> tensor<2x4xi32>",
      f"%0 = stablehlo.reshape %1 : (tensor<2x4xi32>) -> {S}"], False, 0),
    ([f"%0 = stablehlo.exponential %arg0 : {SF}"], True, 17),
    ([f"%0 = stablehlo.divide %arg0, %arg1 : {SF}"], True, 38),
    ([*ONE, f"%0 = stablehlo.divide %c, %arg0 : {SF}"], True, 36),  # libspu: reciprocal
    ([CONST_F, f"%0 = stablehlo.divide %arg0, %c : {SF}"], True, 1),  # x * (1/c): truncation
    ([f"%0 = stablehlo.logistic %arg0 : {SF}"], True, 53),
    ([f"%0 = stablehlo.maximum %arg0, %arg1 : {S}"], False, 8),
    (['%0 = "stablehlo.sort"(%arg0) <{dimension = 0 : i64, is_stable = true}> ({',
      "^bb0(%a: tensor<f32>, %b: tensor<f32>):",
      "  %1 = stablehlo.compare LT, %a, %b : (tensor<f32>, tensor<f32>) -> tensor<i1>",
      "  stablehlo.return %1 : tensor<i1>",
      f"}}) : ({SF}) -> {SF}"], True, 496),
    ([f"%0 = mhlo.erf %arg0 : {SF}"], True, 60),
    ([f"%0 = stablehlo.custom_call @mhlo.erf(%arg0) : ({SF}) -> {SF}"], True, 60),
    ([f"%0 = stablehlo.custom_call @unheard_of(%arg0) : ({SF}) -> {SF}"], True, 1),
    ([f"%0 = stablehlo.round_nearest_even %arg0 : {SF}"], True, 1),  # not in the table
])
def test_rounds_of_single_ops(lines: list[str], float_: bool, expected: int) -> None:
    assert (rounds(*lines, args=F2, out=SF) if float_ else rounds(*lines)) == expected


def test_rounds_of_sequential_ops_add_up() -> None:
    assert rounds(f"%2 = stablehlo.compare LT, %arg0, %arg1 : ({S}, {S}) -> {B}",
                  f"%3 = stablehlo.multiply %arg0, %arg1 : {S}",
                  f"%0 = stablehlo.compare GT, %arg1, %arg0 : ({S}, {S}) -> {B}",
                  out=B) == 7 + 1 + 7


def test_the_reader_gives_ops_values_types_and_regions() -> None:
    text = module("%c = stablehlo.constant dense<2> : tensor<i32>",
                  f"%0 = stablehlo.reduce(%arg0 init: %c) applies stablehlo.add across "
                  f"dimensions = [0] : ({S}, tensor<i32>) -> tensor<i32>", out="tensor<i32>")
    main = parse(text).functions["main"]
    const, reduce, ret = main.ops
    assert [op.name for op in main.ops] == ["stablehlo.constant", "stablehlo.reduce",
                                           "func.return"]
    assert const.attrs["value"] == 2 and reduce.attrs["dimensions"] == (0,)
    assert reduce.operands == (main.args[0], const.results[0])
    assert reduce.operand_types[0] == Tensor((8,), "i32")
    assert Tensor((8,), "i32").dtype == "int32" and Tensor((), "i1").dtype == "bool"
    (reducer,) = reduce.regions
    assert [op.kind for op in reducer.ops] == ["add", "return"]
    assert ret.operands == reduce.results == main.returned()
    with pytest.raises(ValueError, match="unparsable StableHLO"):
        parse("module { this is not mlir }")


def while_loop(bound: str, test: str = "LT", init: int = 0, step: int = 1,
               secret_bound: bool = False) -> list[str]:
    """``for (i = init; i <test> bound; i += step) b = b * b``, as fori_loop compiles it; the
    bound is a constant, or (``secret_bound``) the first element of a secret input."""
    bound_def = [f"%s = stablehlo.slice %arg1 [0:1] : ({S}) -> tensor<1xi32>",
                 "%n = stablehlo.reshape %s : (tensor<1xi32>) -> tensor<i32>"] \
        if secret_bound else [f"%n = stablehlo.constant dense<{bound}> : tensor<i32>"]
    return [
        f"%c0 = stablehlo.constant dense<{init}> : tensor<i32>",
        f"%c2 = stablehlo.constant dense<{step}> : tensor<i32>",
        *bound_def,
        f"%0, %w = stablehlo.while(%b = %arg0, %a = %c0) : {S}, tensor<i32>",
        " cond {",
        "  %1 = stablehlo.broadcast_in_dim %n, dims = [] : (tensor<i32>) -> tensor<i32>",
        f"  %2 = stablehlo.compare {test}, %a, %1 : (tensor<i32>, tensor<i32>) -> tensor<i1>",
        "  stablehlo.return %2 : tensor<i1>",
        "} do {",
        "  %1 = stablehlo.add %a, %c2 : tensor<i32>",
        f"  %3 = stablehlo.multiply %b, %b : {S}",
        f"  stablehlo.return %3, %1 : {S}, tensor<i32>",
        "}",
    ]


@pytest.mark.parametrize(("init", "bound", "step", "test", "trips"), [
    (0, 5, 1, "LT", 5), (2, 9, 3, "LT", 3), (0, 5, 1, "LE", 6),
    (10, 0, -2, "GT", 5), (10, 0, -2, "GE", 6), (5, 5, 1, "LT", 0), (7, 3, 1, "LT", 0),
])
def test_counted_loops_use_their_trip_count(init: int, bound: int, step: int, test: str,
                                            trips: int) -> None:
    # one secret multiply per iteration; the public counter costs nothing
    assert rounds(*while_loop(str(bound), test, init, step), loops=100) == trips


@pytest.mark.parametrize(("iterations", "expected"), [(0, 7), (1, 7 + 8), (7, 7 * 8 + 7)])
def test_loops_with_a_secret_bound_use_the_assumed_iterations(iterations: int,
                                                              expected: int) -> None:
    # the bound is secret: each test is a secret comparison (7), each body a multiply (1)
    assert rounds(*while_loop("", secret_bound=True), loops=iterations) == expected


def test_a_loop_value_becomes_secret_when_the_body_makes_it_so() -> None:
    # %a starts public but takes the secret %b's value: from then on the test is secret
    lines = [line.replace("stablehlo.return %3, %1", "stablehlo.return %3, %4")
             for line in while_loop("5")]
    lines.insert(-2, f"  %5 = stablehlo.slice %b [0:1] : ({S}) -> tensor<1xi32>")
    lines.insert(-2, "  %4 = stablehlo.reshape %5 : (tensor<1xi32>) -> tensor<i32>")
    assert rounds(*lines, loops=3) == (7 + 1) * 3 + 7


def test_if_costs_its_costlier_branch() -> None:
    assert rounds("%p = stablehlo.constant dense<true> : tensor<i1>",
                  '%0 = "stablehlo.if"(%p) ({',
                  f"  %4 = stablehlo.sqrt %arg0 : {SF}",
                  f"  stablehlo.return %4 : {SF}",
                  "}, {",
                  f"  %4 = stablehlo.exponential %arg0 : {SF}",
                  f"  stablehlo.return %4 : {SF}",
                  f"}}) : (tensor<i1>) -> {SF}", args=F2, out=SF) == 35


def test_reduce_applies_its_reducer_once_per_tree_level() -> None:
    scalar = "tensor<f32>"
    init = f"%i = stablehlo.constant dense<0.0> : {scalar}"
    assert rounds(init,
                  f"%0 = stablehlo.reduce(%arg0 init: %i) across dimensions = [0] : "
                  f"({SF}, {scalar}) -> {scalar}",
                  f" reducer(%a: {scalar}, %b: {scalar})  {{",
                  f"  %5 = stablehlo.compare LT, %b, %a : ({scalar}, {scalar}) -> tensor<i1>",
                  f"  %6 = stablehlo.select %5, %a, %b : tensor<i1>, {scalar}",
                  f"  stablehlo.return %6 : {scalar}",
                  "}", args=F2, out=scalar) == (7 + 1) * (3 + 1)  # 8 elements: 3 levels (+1)
    assert rounds(init, f"%0 = stablehlo.reduce(%arg0 init: %i) applies stablehlo.add "
                        f"across dimensions = [0] : ({SF}, {scalar}) -> {scalar}",
                  args=F2, out=scalar) == 0


def test_calls_are_followed_with_the_callee_visibility() -> None:
    code = "\n".join([
        "module @jit_f {",
        f"  func.func @main(%arg0: {S}, %arg1: {S}) -> {B} {{",
        f"    %0 = func.call @helper(%arg0, %arg1) : ({S}, {S}) -> {S}",
        f"    %1 = func.call @helper(%0, %arg1) : ({S}, {S}) -> {S}",
        f"    %2 = func.call @public(%1) : ({S}) -> {S}",
        f"    %3 = stablehlo.compare LT, %2, %2 : ({S}, {S}) -> {B}",
        f"    return %3 : {B}",
        "  }",
        f"  func.func private @helper(%arg0: {S}, %arg1: {S}) -> {S} {{",
        f"    %0 = stablehlo.maximum %arg0, %arg1 : {S}",
        f"    return %0 : {S}",
        "  }",
        f"  func.func private @public(%arg0: {S}) -> {S} {{",
        "    %0 = stablehlo.constant dense<1> : tensor<8xi32>",
        f"    return %0 : {S}",
        "  }",
        "}",
    ])
    assert estimate_spu_rounds(code) == 2 * 8  # the comparison of a public result is free


def test_unparsable_stablehlo_is_refused() -> None:
    with pytest.raises(ValueError, match="unparsable StableHLO"):
        estimate_spu_rounds("not a module")


# ---------------------------------------------------------------- real programs


def semi2k_pair() -> mp.ClusterSpec:
    """``ClusterSpec.simple(2)`` with SEMI2K, the protocol the round table was measured on
    (the default for 2 parties is CHEETAH)."""
    spec = mp.ClusterSpec.simple(2).to_dict()
    spec["devices"]["SP0"]["config"] = {"protocol": "SEMI2K", "field": "FM64"}
    return mp.ClusterSpec.from_dict(spec)


def spu_run_stablehlo(fn: Any, *args: Any) -> str:
    """The StableHLO of the one ``spu.run`` of ``fn`` on the 2-party SEMI2K SPU SP0."""
    def prog() -> Any:
        ins = [mp.device(f"P{i}")(lambda a=a: a)() for i, a in enumerate(args)]
        return mp.device("SP0")(fn)(*ins)

    program = mp.compile(prog, cluster=semi2k_pair())
    (run,) = [op for op in program.graph.walk() if op.opcode == "spu.run"]
    assert (run.attrs["protocol"], run.attrs["field"]) == ("SEMI2K", "FM64")
    return bytes(run.attrs["stablehlo"]).decode()


I8 = jnp.arange(8, dtype=jnp.int32)
F8 = jnp.arange(1, 9, dtype=jnp.float32)


@pytest.mark.parametrize(("name", "fn", "x", "expected"), [
    # measured by libspu (SEMI2K, 2 parties, FM64, send actions): 7, 2, 17, 38, 53, 36
    ("less", lambda a, b: a < b, I8, 7),
    ("fmul", lambda a, b: a * b, F8, 2),
    ("exp", lambda a, b: jnp.exp(a), F8, 17),
    ("div", lambda a, b: a / b, F8, 38),
    ("sigmoid", lambda a, b: jax.nn.sigmoid(a), F8, 53),
    ("reciprocal", lambda a, b: 1 / a, F8, 36),
])
def test_rounds_of_compiled_functions_match_libspu(name: str, fn: Any, x: Any,
                                                   expected: int) -> None:
    assert estimate_spu_rounds(spu_run_stablehlo(fn, x, x[::-1])) == expected


def descend(x: Any, w: Any) -> Any:
    return jax.lax.fori_loop(0, 4, lambda i, w: w - 0.1 * (x.T @ jax.nn.sigmoid(x @ w)), w)


def clipped_squares(x: Any, w: Any) -> Any:
    return jax.lax.fori_loop(2, 9, lambda i, w: jnp.maximum(w, x[0]) * w, w)


@pytest.mark.parametrize(("fn", "expected"), [(descend, 232), (clipped_squares, 70)])
def test_rounds_of_compiled_loops_match_libspu(fn: Any, expected: int) -> None:
    # measured by libspu (SEMI2K, 2 parties, FM64): 232 and 70 send actions
    text = spu_run_stablehlo(fn, jnp.ones((6, 3), jnp.float32), jnp.full(3, 0.5, jnp.float32))
    assert estimate_spu_rounds(text) == expected
    assert estimate_spu_rounds(text, loop_iterations=50) == expected  # counted: no guess
