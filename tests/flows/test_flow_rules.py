"""Flow rules, text in and verdict out: the label `tensor_flows.transfer` gives each
result of a StableHLO module (lowered from JAX) for given argument labels, and the
verdict `check` gives whole programs written as text under the policy `mplang init`
writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.cluster.local import DEV_POLICY
from mplang.flows.labels import (
    ENFORCED,
    FOREIGN,
    Flow,
    Label,
    Rows,
    compared,
    source,
    subset,
    with_rows,
)
from mplang.flows.tensor_flows import Result, transfer
from mplang.policy.check import Guard, PolicyRefusedError, check
from mplang.policy.policy import Policy
from tests.policy.hints import raw_hint

X = np.zeros(20, np.float32)
"""A party's 20-row column (its label: `source("x", 20)`)."""
M = np.zeros((20, 3), np.float32)
"""A party's 20-row table of 3 columns."""
ONEHOT = np.eye(20, dtype=np.float32)[3]


def flows(fn: Callable[..., Any], *args: Any, labels: Sequence[Label]) -> Result:
    """The labels of ``fn``'s results given ``labels`` of its arguments."""
    got = transfer(jax.jit(fn, keep_unused=True).lower(*args).as_text(), list(labels))
    assert got is not None
    return got


def label(fn: Callable[..., Any], *args: Any, labels: list[Label] | None = None) -> Flow:
    """The one result's label of ``fn`` on x (``source("x", 20)``) and ``args``."""
    got = flows(fn, X, *args, labels=labels or [source("x", 20)] + [None] * len(args))
    assert len(got.outputs) == 1 and got.observed is None
    out = got.outputs[0]
    assert out is not None
    return out


def rows(lo: int, hi: int, step: int = 0, name: str = "x") -> Rows:
    return Rows(frozenset([name]), lo, hi, step)


# ---------------------------------------------------------------- aggregates

@pytest.mark.parametrize("fn, count", [
    (jnp.sum, 20),
    (jnp.mean, 20),
    (jnp.var, 20),
    (lambda x: jnp.sum(x * 2.0 + 1.0), 20),
    (lambda x: jnp.sum(x > 5), 20),  # a count above a constant threshold
    (lambda x: x @ jnp.ones(20), 20),  # a dot with weights alike for every row
    (lambda x: jnp.sum(((x.astype(jnp.int32)[:, None] >> jnp.arange(31)) & 1), axis=0), 20),
    (lambda x: jnp.sum(x[5:]), 15),
    (lambda x: jnp.sum(x[:10]) * jnp.sum(x[:10]), 10),
    (lambda x: x.reshape(2, 10).sum(axis=1), 10),  # each block of 10 rows
    (lambda x: x.reshape(4, 5).sum(axis=1), 5),
    (lambda x: x.reshape(4, 5).sum(), 20),  # the blocks and their rows
    (lambda x: jnp.sum(jnp.concatenate([x[3:4], jnp.zeros(19, x.dtype)])), 1),
    (lambda x: jnp.sum(jnp.pad(x[3:4], (0, 19))), 1),
])
def test_a_sum_over_the_rows_is_an_aggregate_over_those_rows(fn: Any, count: int) -> None:
    out = label(fn)
    assert (out.form, out.rows, out.sources) == ("aggregate", count, frozenset(["x"]))


@pytest.mark.parametrize("fn", [
    lambda x: jnp.sum(jnp.where(x > 5, x, 0.0)),
    lambda x: jnp.sum(x * ((x >= 3) & (x < 4))),  # a band holding one value
    lambda x: (x > 5).astype(jnp.float32) @ x,
])
def test_values_selected_by_their_own_comparison_combine_a_data_dependent_count(fn: Any
                                                                                 ) -> None:
    out = label(fn)
    assert (out.form, out.gated, out.rows) == ("aggregate", True, None)
    assert out.declassified_as == "aggregate"


def test_an_aggregate_records_every_set_of_rows_it_combines() -> None:
    out = label(lambda x: jnp.sum(x) - jnp.sum(x[1:]))
    assert (out.form, out.rows, out.rowsets) == ("aggregate", 19, {rows(0, 20), rows(1, 20)})
    blocks = label(lambda x: x.reshape(4, 5).sum(axis=1))
    assert blocks.rowsets == {rows(0, 20, step=5)}


@pytest.mark.parametrize("fn, count", [
    (lambda m: jnp.sum(m, axis=0), 20),  # column sums
    (lambda m: m.T @ m, 20),  # a Gram matrix
    (lambda m: jnp.sum(m @ jnp.array([1.0, 2.0, 3.0])), 20),  # weights over columns
    (lambda m: jnp.mean(m, axis=0), 20),
])
def test_tables_aggregate_over_their_rows(fn: Any, count: int) -> None:
    got = flows(fn, M, labels=[source("m", 20)])
    out = got.outputs[0]
    assert out is not None and (out.form, out.rows) == ("aggregate", count)


# ---------------------------------------------------------------- row-wise values

@pytest.mark.parametrize("fn, window, axis, pure", [
    (lambda x: x, rows(0, 20), 0, True),
    (lambda x: x.astype(jnp.int32), rows(0, 20), 0, True),  # converted: still the data
    (lambda x: x * 2.0 + 1.0, rows(0, 20), 0, False),
    (lambda x: x > 5, rows(0, 20), 0, False),  # against a driver constant: row-wise
    (lambda x: x[:, None] > jnp.array([1.0, 2.0, 3.0]), rows(0, 20), 0, False),  # a ladder
    (lambda x: ((x.astype(jnp.int32)[:, None] >> jnp.arange(31)) & 1) == 1, rows(0, 20), 0,
     False),  # every bit of every row
    (lambda x: x[3:8], rows(3, 8), 0, True),
    (lambda x: x[3], rows(3, 4), None, True),  # one row, its axis gone
    (lambda x: jnp.sum(jnp.broadcast_to(x[3], (10,))), rows(3, 4), None, False),  # copies
    (lambda x: jax.lax.dynamic_slice(x, (4,), (2,)), rows(4, 6), 0, True),
    (lambda x: jnp.sum(x[:, None] * jnp.ones((20, 3)), axis=1), rows(0, 20), 0, False),
])
def test_row_wise_values_keep_their_rows(fn: Any, window: Rows, axis: int | None,
                                         pure: bool) -> None:
    out = label(fn)
    assert (out.form, out.window, out.axis, out.pure) == ("rowwise", window, axis, pure)
    assert out.rows is None and out.declassified_as == "raw"


@pytest.mark.parametrize("fn", [
    lambda x: x @ jnp.eye(20),  # weights differ by row
    lambda x: jnp.sum(x * ONEHOT),
    lambda x: jnp.sum(x * (2.0 ** jnp.arange(20))),
    lambda x: jnp.sum(jnp.where(jnp.arange(20) == 3, x, 0.0)),
    lambda x: jnp.sum(jnp.stack([x, jnp.roll(x, 1)]), axis=1),
    lambda x: jnp.sum(x * x[3]),  # every row times one row
    jnp.sort,
    jnp.max,
    jnp.min,
    jnp.median,
    lambda x: jnp.quantile(x, 0.25),
    jnp.argmax,
    jnp.cumsum,
    lambda x: jax.lax.top_k(x, 3)[0],
    lambda x: x[::2],
    lambda x: x[jnp.array([3, 3, 3])],
])
def test_ops_that_single_out_rows_are_raw(fn: Any) -> None:
    out = label(fn)
    assert (out.form, out.rows, out.sources) == ("raw", None, frozenset(["x"]))


def test_driver_weights_passed_as_arguments() -> None:
    weighted = label(lambda x, w: jnp.sum(x * w), np.arange(20, dtype=np.float32))
    assert weighted.form == "raw"  # not known to be alike for every row
    scaled = label(lambda x, w: jnp.sum(x * w), np.float32(3.0))
    assert (scaled.form, scaled.rows) == ("aggregate", 20)  # a scalar is alike for every row
    at = label(lambda x, i: jax.lax.dynamic_slice(x, (i,), (1,)), np.int32(3))
    assert at.form == "raw"  # which row: chosen at run time


# ---------------------------------------------------------------- two owners

def test_comparisons_between_owners_and_others_data() -> None:
    """A compare has one side a single value or an aggregate of p's, the other side
    another owner's data; a row-wise vector compared row by row is no comparison."""
    y = np.zeros(20, np.float32)
    both = [source("x", 20), FOREIGN]
    for fn in (lambda x, y: x[3] < y[5], lambda x, y: x[3:4] < y[5]):
        cmp = flows(fn, X, y, labels=both).outputs[0]
        assert cmp is not None and (cmp.form, cmp.sources) == ("compare", frozenset(["x"]))
    total = flows(lambda x, y: jnp.sum(x) < jnp.sum(y), X, y, labels=both).outputs[0]
    assert total is not None and total.form == "aggregate"  # a function of aggregates
    # each row against the other owner's rows, and another owner's row-aligned values
    # inside a row's function: no comparison, and no aggregate of x's rows
    for fn in (lambda x, y: x < y, lambda x, y: jnp.sum(x < y), lambda x, y: x * 2.0 < y,
               lambda x, y: jnp.sum(x + y),
               lambda x, y: (x[11] <= jnp.sum(y)).astype(x.dtype) * jnp.sum(x)):
        out = flows(fn, X, y, labels=both).outputs[0]
        assert out is not None and out.form == "raw", out
    gated = flows(lambda x, y: jnp.sum(x * (y > 3)), X, y, labels=both).outputs[0]
    assert gated is not None and (gated.form, gated.gated, gated.rows) == ("aggregate", True,
                                                                         None)


def test_values_without_the_party_s_data() -> None:
    y = np.zeros(20, np.float32)
    assert flows(lambda y: y * 2.0, y, labels=[None]).outputs == [None]
    other = flows(lambda y: y * 2.0, y, labels=[FOREIGN]).outputs[0]
    assert other == Flow("foreign")
    mask = flows(lambda y: y > 3, y, labels=[FOREIGN]).outputs[0]
    assert mask == Flow("foreign", mask=True)
    mine = flows(lambda x, c: x + c, X, np.float32(1.0), labels=[source("x", 20), None])
    assert mine.outputs[0] is not None and mine.outputs[0].form == "rowwise"


# ---------------------------------------------------------------- rows a PSI join kept

KEPT = Flow("rowwise", frozenset(["x"]), Rows(frozenset(["x"]), 0, 20, gate=7), 0, 0,
            gated=True, enforced=ENFORCED)
"""x's rows a join kept (20 of them, counted at run time against each holder's min_rows);
the other holder's joined rows have the same label for x's owner (`subset`)."""


@pytest.mark.parametrize("fn, args", [
    (jnp.sum, ()),
    (lambda x: jnp.sum(x[:, 0]), ()),  # a column: every kept row
    (lambda x, y: jnp.sum(x[:, 0] * y[:, 1]), (M,)),  # with the other holder's rows
    (lambda x, y: jnp.sum(x[:, 0] + y[:, 1] * 2.0), (M,)),
    (lambda x: jnp.sum((x - x.mean(0)) / (x.std(0) + 1e-6)), ()),  # standardized first
    (lambda x: jnp.sum((x - x.mean(0))[:0]) + jnp.sum(x), ()),  # no row: its mean's rows
])
def test_aggregates_over_every_row_a_join_kept_are_checked_at_run_time(fn: Any, args: Any
                                                                       ) -> None:
    out = flows(fn, M, *args, labels=[KEPT] * (1 + len(args))).outputs[0]
    assert out is not None and (out.form, out.rows) == ("aggregate", ENFORCED)


@pytest.mark.parametrize("fn, args", [
    (lambda x: jnp.sum((x == 45.0) * x), ()),  # one customer, chosen by the driver
    (lambda x: jnp.sum(jnp.where(x[:, 0] == 45.0, x[:, 1], 0.0)), ()),
    (lambda x, y: jnp.sum((y[:, 0] == 45.0) * x[:, 1]), (M,)),  # by the other's column
    (lambda x, y: (y[:, 0] == 45.0).astype(jnp.float32) @ x, (M,)),
    (lambda x: jnp.sum(x[:5]), ()),  # a part of the rows the run-time check counted
])
def test_rows_a_join_kept_selected_again_are_a_data_dependent_count(fn: Any, args: Any
                                                                    ) -> None:
    """A run-time check of the join's size says nothing of a part of its rows: a mask (or
    a slice) over them makes an aggregate whose row count the analysis cannot bound."""
    out = flows(fn, M, *args, labels=[KEPT] * (1 + len(args))).outputs[0]
    assert out is not None and out.form == "aggregate" and out.rows is None


def test_rows_a_join_kept_beside_a_small_aggregate_are_bounded_by_it() -> None:
    out = flows(lambda x, y: jnp.sum(x - jnp.sum(y[:5])), M, M,
                labels=[KEPT, source("y", 20)]).outputs[0]
    assert out is not None and (out.form, out.rows) == ("aggregate", 5)


def test_the_other_holder_s_joined_rows_are_row_wise_over_the_rows_kept() -> None:
    mine = Flow("rowwise", frozenset(["x"]), Rows(frozenset(["x"]), 0, 20), 0, 0, pure=True)
    seen = compared(mine, FOREIGN)
    theirs = subset(FOREIGN, seen, 7)
    assert theirs is not None and theirs.form == "rowwise" and theirs.enforced == ENFORCED
    kept = subset(mine, compared(FOREIGN, mine), 7)
    assert kept is not None and with_rows(theirs, 20).window == with_rows(kept, 20).window


# ---------------------------------------------------------------- control flow

def test_a_loop_whose_trip_count_is_a_row_is_observed() -> None:
    got = flows(lambda x: jax.lax.while_loop(lambda c: c < x[3], lambda c: c + 1.0, 0.0), X,
                labels=[source("x", 20)])
    assert got.observed is not None and got.observed.form == "rowwise"
    assert got.observed.window == rows(3, 4)
    out = got.outputs[0]
    assert out is not None and out.form == "raw"


def test_a_branch_on_the_data_is_observed_a_branch_on_a_constant_is_not() -> None:
    def branch(x: Any, p: Any) -> Any:
        return jax.lax.cond(p, lambda: jnp.float32(1.0), lambda: jnp.float32(2.0))

    on_data = flows(lambda x: branch(x, jnp.sum(x) > 5), X, labels=[source("x", 20)])
    assert on_data.observed is not None and on_data.observed.form == "aggregate"
    on_driver = flows(branch, X, True, labels=[source("x", 20), None])
    assert on_driver.observed is None and on_driver.outputs == [None]


# ---------------------------------------------------------------- whole programs

PROGRAM = """
program @p {world_size = 2, out_devices = [none], out_tree = {"kind":"leaf","children":[],
  "meta":[]}}
func() -> (OUT@{0}) {
  %x = simp.pcall() {fn = "load", parties = @{0}} : (f32[20]@{0})
    region 0 () {
      %d = tensor.load() {key = none, path = "salaries.npy", type = f32[20]} : (f32[20])
      return %d
    }
  %y = simp.pcall(%x) {fn = "f", parties = @{0}} : (OUT@{0}) loc("flows.py:3")
    region 0 (%v: f32[20]) {
      %r = tensor.run_jax(%v) {fn = "f", module = #stablehlo<
        |{"calling_convention":10,"in":[["float32",[20]]],"kept":[0],
        |"out":[["DTYPE",SHAPE]],"platform":"cpu","version":1}
        |// StableHLO_v1.12.1
        |func.func public @main(%arg0: tensor<20xf32>) -> TENSOR {
        |  %c5 = stablehlo.constant dense<5.0> : tensor<f32>
        |  %zero = stablehlo.constant dense<0.0> : tensor<f32>
        BODY
        |}
      >} : (OUT) loc("flows.py:4")
      return %r
    }
  return %y
}
"""
"""node_0 loads 20 salaries, a pcall computes BODY from them (returning TENSOR, of type
OUT) and the program returns it."""

SCALAR = ("f32[]", "float32", "[]", "tensor<f32>")
BOOLS = ("bool[20]", "bool", "[20]", "tensor<20xi1>")

SUM = """
  |  %s = stablehlo.reduce(%arg0 init: %zero) applies stablehlo.add
  |      across dimensions = [0] : (tensor<20xf32>, tensor<f32>) -> tensor<f32>
  |  return %s : tensor<f32>
"""
MAX = SUM.replace("stablehlo.add", "stablehlo.maximum")
ONE_ROW = """
  |  %one = stablehlo.slice %arg0 [3:4] : (tensor<20xf32>) -> tensor<1xf32>
  |  %s = stablehlo.reduce(%one init: %zero) applies stablehlo.add
  |      across dimensions = [0] : (tensor<1xf32>, tensor<f32>) -> tensor<f32>
  |  return %s : tensor<f32>
"""
ABOVE = """
  |  %t = stablehlo.broadcast_in_dim %c5, dims = [] : (tensor<f32>) -> tensor<20xf32>
  |  %b = stablehlo.compare GT, %arg0, %t, FLOAT : (tensor<20xf32>, tensor<20xf32>)
  |      -> tensor<20xi1>
"""
THRESHOLD = ABOVE + "  |  return %b : tensor<20xi1>\n"
COUNT = ABOVE + """
  |  %f = stablehlo.convert %b : (tensor<20xi1>) -> tensor<20xf32>
  |  %s = stablehlo.reduce(%f init: %zero) applies stablehlo.add
  |      across dimensions = [0] : (tensor<20xf32>, tensor<f32>) -> tensor<f32>
  |  return %s : tensor<f32>
"""
LOOP = """
  |  %n = stablehlo.slice %arg0 [3:4] : (tensor<20xf32>) -> tensor<1xf32>
  |  %m = stablehlo.reshape %n : (tensor<1xf32>) -> tensor<f32>
  |  %w = stablehlo.while(%i = %zero) : tensor<f32>
  |  cond {
  |    %lt = stablehlo.compare LT, %i, %m, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
  |    stablehlo.return %lt : tensor<i1>
  |  } do {
  |    %one = stablehlo.constant dense<1.0> : tensor<f32>
  |    %j = stablehlo.add %i, %one : tensor<f32>
  |    stablehlo.return %j : tensor<f32>
  |  }
  |  return %w : tensor<f32>
"""
"""A loop running as many times as salary 3: its run time tells (and its result)."""


def program(body: str, out: tuple[str, str, str, str] = SCALAR) -> mp.Program:
    mptype, dtype, shape, tensor = out
    body = "\n".join("        " + line.strip() for line in body.splitlines() if line.strip())
    text = (PROGRAM.replace("        BODY", body).replace("OUT", mptype)
            .replace("DTYPE", dtype).replace("SHAPE", shape).replace("TENSOR", tensor))
    return mp.Program.from_text(text)


INIT = Policy.parse(DEV_POLICY.format(node="node_0", drivers="driver",
                                      protocols="CHEETAH, ABY3", protocol_note=""),
                    "node_0.yaml")
"""node_0's policy as `mplang init` writes it."""
RAW = raw_hint("driver")


@pytest.mark.parametrize("body, out, flow", [
    (SUM, SCALAR, "aggregate over 20 rows of salaries.npy -> driver (program output 0, held "
     "by node_0, op simp.pcall at flows.py:3): allowed: rule {to: [\"*\"], when: aggregate, "
     "min_rows: 10}"),
    (COUNT, SCALAR, "aggregate over 20 rows of salaries.npy -> driver"),
])
def test_programs_the_init_policy_accepts(body: str, out: Any, flow: str) -> None:
    verdict = check(program(body, out).graph, 2, 0, INIT)
    assert verdict.accepted and verdict.reasons == [] and verdict.judged == [True]
    assert len(verdict.flows) == 1 and verdict.flows[0].startswith(flow)
    assert check(program(body, out).graph, 2, 1, INIT).accepted  # not node_1's data


FETCH = "node_0 refuses to send object out to the driver: it is "
IN_INIT = " in node_0.yaml (or reveal it under a rule)"


@pytest.mark.parametrize("body, out, reasons, fetch", [
    (MAX, SCALAR, [], f"raw of salaries.npy; {RAW}"),
    (THRESHOLD, BOOLS, [], f"row-wise (raw) values of salaries.npy; {RAW}"),
    (ONE_ROW, SCALAR, [], "aggregate over 1 rows of salaries.npy; add a rule {to: [driver], "
     "when: aggregate, min_rows: 1} to declassify, or approve: - {program: DIGEST}"),
    (LOOP, SCALAR, [
        f"op tensor.run_jax at flows.py:4 sends the run time of a loop or branch that depends "
        f"on it, row-wise (raw) values of salaries.npy, to {who}; "
        + RAW.replace("driver", who) + " in node_0.yaml" for who in ("driver", "node_1")],
     f"raw of salaries.npy; {RAW}"),
])
def test_programs_the_init_policy_refuses(body: str, out: Any, reasons: list[str],
                                          fetch: str) -> None:
    """Refused when accepted (``reasons``), else node_0 keeps its output and refuses the
    driver's fetch of it (``fetch``)."""
    verdict = check(program(body, out).graph, 2, 0, INIT)
    assert verdict.accepted == (not reasons) and verdict.reasons == reasons
    assert verdict.judged == [False]
    guard = Guard(INIT, 0, ["node_0", "node_1"])
    guard.record(["out"], verdict)
    with pytest.raises(PolicyRefusedError) as refused:
        guard.check_fetch("out")
    assert str(refused.value) == FETCH + fetch + IN_INIT
