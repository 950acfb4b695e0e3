"""FileCheck tests of the flow analysis: a program's text in (its run_jax modules as
StableHLO text), party 0's labels and policy verdict out (`mplang.flows.engine`,
`mplang.policy.check`)."""

from __future__ import annotations

import mplang as mp
from mplang.flows.engine import analyze
from mplang.flows.labels import Label
from mplang.policy.check import check
from mplang.policy.policy import Policy
from tests.filecheck import filecheck

PAYROLL = """
program @payroll {world_size = 3, out_devices = [none, none], out_tree = {"kind":"tuple",
  "children":[{"kind":"leaf","children":[],"meta":[]},{"kind":"leaf","children":[],"meta":[]}],
  "meta":[]}}
func() -> (f32[]@{1}, f32[4]@{2}) {
  %x = simp.pcall() {fn = "load", parties = @{0}} : (f32[4]@{0})
    region 0 () {
      %d = tensor.load() {key = none, path = "salaries.npy", type = f32[4]} : (f32[4])
      return %d
    }
  %s = simp.pcall(%x) {fn = "total", parties = @{0}} : (f32[]@{0})
    region 0 (%v: f32[4]) {
      %t = tensor.run_jax(%v) {fn = "total", module = #stablehlo<
        |{"calling_convention":10,"in":[["float32",[4]]],"kept":[0],
        |"out":[["float32",[]]],"platform":"cpu","version":1}
        |// StableHLO_v1.12.1
        |func.func public @main(%arg0: tensor<4xf32>) -> tensor<f32> {
        |  %zero = stablehlo.constant dense<0.0> : tensor<f32>
        |  %sum = stablehlo.reduce(%arg0 init: %zero) applies stablehlo.add
        |      across dimensions = [0] : (tensor<4xf32>, tensor<f32>) -> tensor<f32>
        |  return %sum : tensor<f32>
        |}
      >} : (f32[])
      return %t
    }
  %r = simp.shuffle_static(%s) {routes = {1: 0}} : (f32[]@{1}) loc("payroll.py:7")
  %raw = simp.shuffle_static(%x) {routes = {2: 0}} : (f32[4]@{2}) loc("payroll.py:8")
  return %r, %raw
}
"""

SUMS = """
program @sums {world_size = 2, out_devices = [none, none], out_tree = {"kind":"tuple",
  "children":[{"kind":"leaf","children":[],"meta":[]},{"kind":"leaf","children":[],"meta":[]}],
  "meta":[]}}
func() -> (f32[]@{0}, f32[]@{0}) {
  %x = simp.pcall() {fn = "load", parties = @{0}} : (f32[12]@{0})
    region 0 () {
      %d = tensor.load() {key = none, path = "salaries.npy", type = f32[12]} : (f32[12])
      return %d
    }
  %a, %b = simp.pcall(%x) {fn = "sums", parties = @{0}} : (f32[]@{0}, f32[]@{0})
      loc("sums.py:3")
    region 0 (%v: f32[12]) {
      %s, %t = tensor.run_jax(%v) {fn = "sums", module = #stablehlo<
        |{"calling_convention":10,"in":[["float32",[12]]],"kept":[0],
        |"out":[["float32",[]],["float32",[]]],"platform":"cpu","version":1}
        |// StableHLO_v1.12.1
        |func.func public @main(%arg0: tensor<12xf32>) -> (tensor<f32>, tensor<f32>) {
        |  %zero = stablehlo.constant dense<0.0> : tensor<f32>
        |  %all = stablehlo.reduce(%arg0 init: %zero) applies stablehlo.add
        |      across dimensions = [0] : (tensor<12xf32>, tensor<f32>) -> tensor<f32>
        |  %tail = stablehlo.slice %arg0 [@LO@:12] : (tensor<12xf32>) -> tensor<@SIZE@xf32>
        |  %part = stablehlo.reduce(%tail init: %zero) applies stablehlo.add
        |      across dimensions = [0] : (tensor<@SIZE@xf32>, tensor<f32>) -> tensor<f32>
        |  return %all, %part : tensor<f32>, tensor<f32>
        |}
      >} : (f32[], f32[])
      return %s, %t
    }
  return %a, %b
}
"""
"""A program returning the sum of 12 rows and the sum of rows @LO@..11."""

POLICY = """
declassify:
  - to: [node_1]
    when: aggregate
    min_rows: 4
"""


def _label(label: Label) -> str:
    return "none" if label is None else f"{label.form}/{label.rows}/{label}"


def _sums(lo: int) -> mp.Program:
    return mp.Program.from_text(SUMS.replace("@LO@", str(lo)).replace("@SIZE@", str(12 - lo)))


def test_labels_follow_the_stablehlo_module() -> None:
    program = mp.Program.from_text(PAYROLL)
    analysis, outs = analyze(program.graph, program.world_size, 0)
    lines = [f"output {i}: " + ", ".join(f"party {q}: {_label(lab)}" for q, lab in
                                         sorted(out.items()))
             for i, out in enumerate(outs)]
    lines += [f"send {s.receiver}: {s.label} at {s.where}" for s in analysis.sends]
    lines += [f"load {name} at {op.opcode}" for op, name in analysis.loads]
    filecheck("\n".join(lines), """
        CHECK:      output 0: party 1: aggregate/4/aggregate over 4 rows of salaries.npy
        CHECK-NEXT: output 1: party 2: rowwise/None/row-wise (raw) values of salaries.npy
        CHECK-NEXT: send 1: aggregate over 4 rows of salaries.npy at op simp.shuffle_static
        CHECK-SAME:   at payroll.py:7
        CHECK-NEXT: send 2: row-wise (raw) values of salaries.npy at op simp.shuffle_static
        CHECK-SAME:   at payroll.py:8
        CHECK-NEXT: load salaries.npy at tensor.load
        CHECK-NOT:  send 0
    """)


def test_policy_verdict_allows_the_aggregate_and_refuses_the_raw_copy() -> None:
    program = mp.Program.from_text(PAYROLL)
    verdict = check(program.graph, 3, 0, Policy.parse(POLICY, "node_0.yaml"),
                    outputs_fetchable=False)
    filecheck("\n".join([f"accepted: {verdict.accepted}", *verdict.flows, *verdict.reasons]), """
        CHECK:      accepted: False
        CHECK-NEXT: aggregate over 4 rows of salaries.npy -> node_1
        CHECK-SAME:   (the value party 0 sends, op simp.shuffle_static at payroll.py:7):
        CHECK-SAME:   allowed: rule {to: [node_1], when: aggregate, min_rows: 4}
        CHECK-NEXT: row-wise (raw) values of salaries.npy -> node_2 ({{.*}}payroll.py:8): REFUSED
        CHECK-NEXT: op simp.shuffle_static at payroll.py:8 sends the value party 0 sends,
        CHECK-SAME:   row-wise (raw) values of salaries.npy, to node_2; approve this program
        CHECK-SAME:   alone with approve: - {program: DIGEST} (row-wise or raw values are never
        CHECK-SAME:   declassified by aggregate or compare rules; plaintext_to would give node_2
        CHECK-SAME:   every row of every program) in node_0.yaml
        CHECK-NOT:  payroll.py:7
    """)


def test_the_outputs_reach_the_driver_whoever_holds_them() -> None:
    """node_1's copy of the aggregate and node_2's of the raw data are program outputs:
    the driver may fetch them, so a rule for node_1 alone does not let them go."""
    program = mp.Program.from_text(PAYROLL)
    verdict = check(program.graph, 3, 0, Policy.parse(POLICY, "node_0.yaml"))
    filecheck("\n".join([f"accepted: {verdict.accepted}", *verdict.flows, *verdict.reasons]), """
        CHECK:      accepted: False
        CHECK:      aggregate over 4 rows of salaries.npy -> driver (program output 0, held by
        CHECK-SAME:   node_1, op simp.shuffle_static at payroll.py:7): REFUSED
        CHECK-NEXT: row-wise (raw) values of salaries.npy -> driver (program output 1, held by
        CHECK-SAME:   node_2, op simp.shuffle_static at payroll.py:8): REFUSED
        CHECK:      op simp.shuffle_static at payroll.py:7 sends program output 0, held by
        CHECK-SAME:   node_1, aggregate over 4 rows of salaries.npy, to driver; add a rule
        CHECK-SAME:   {to: [driver], when: aggregate, min_rows: 4} to declassify
    """)


def test_a_smaller_sum_is_not_declassified() -> None:
    policy = Policy.parse(POLICY.replace("min_rows: 4", "min_rows: 5"), "node_0.yaml")
    verdict = check(mp.Program.from_text(PAYROLL).graph, 3, 0, policy, outputs_fetchable=False)
    filecheck("\n".join(verdict.reasons), """
        CHECK:      op simp.shuffle_static at payroll.py:7 sends the value party 0 sends,
        CHECK-SAME:   aggregate over 4 rows of salaries.npy, to node_1; add a rule
        CHECK-SAME:   {to: [node_1], when: aggregate, min_rows: 4} to declassify
        CHECK:      op simp.shuffle_static at payroll.py:8
    """)


def test_overlapping_sums_are_refused_disjoint_bounds_are_not() -> None:
    policy = Policy.parse("declassify:\n  - {to: [driver], when: aggregate, min_rows: 4}\n",
                          "node_0.yaml")
    verdict = check(_sums(1).graph, 2, 0, policy)
    filecheck("\n".join([f"accepted: {verdict.accepted}", *verdict.flows, *verdict.reasons]), """
        CHECK:      accepted: False
        CHECK-NEXT: aggregate over 12 rows of salaries.npy -> driver (program output 0, held by
        CHECK-SAME:   node_0, op simp.pcall at sums.py:3): allowed: rule
        CHECK-NEXT: aggregate over 11 rows of salaries.npy -> driver (program output 1,
        CHECK-SAME:   {{.*}}): allowed: rule
        CHECK-NEXT: op simp.pcall at sums.py:3 sends program output 0, held by node_0,
        CHECK-SAME:   aggregate over 12 rows of salaries.npy, which overlaps another release of
        CHECK-SAME:   this party's data: subtracting them isolates rows 0..0 of salaries.npy,
        CHECK-SAME:   fewer than min_rows 4 of {to: [driver], when: aggregate, min_rows: 4}
        CHECK-SAME:   in node_0.yaml
        CHECK-NOT:  program output 1
    """)
    assert not check(_sums(3).graph, 2, 0, policy).accepted  # rows 0..2: 3 rows
    assert check(_sums(4).graph, 2, 0, policy).accepted  # rows 0..3 and 4..11: 4 and 8
