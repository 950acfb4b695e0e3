"""FileCheck tests of the flow analysis: a program's text in (its run_jax modules as
StableHLO text), party 0's labels and policy verdict out (`mplang.policy.flows`,
`mplang.policy.check`)."""

from __future__ import annotations

import mplang as mp
from mplang.policy.check import check
from mplang.policy.flows import analyze
from mplang.policy.labels import Label
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

POLICY = """
declassify:
  - to: [node_1]
    when: aggregate
    min_elements: 4
"""


def _label(label: Label) -> str:
    return "none" if label is None else f"{label.form}/{label.elements}/{label}"


def test_labels_follow_the_stablehlo_module() -> None:
    program = mp.Program.from_text(PAYROLL)
    analysis, outs = analyze(program.graph, program.world_size, 0)
    lines = [f"output {i}: " + ", ".join(f"party {q}: {_label(lab)}" for q, lab in
                                         sorted(out.items()))
             for i, out in enumerate(outs)]
    lines += [f"send {s.receiver}: {s.label} at {s.where}" for s in analysis.sends]
    lines += [f"load {name} at {op.opcode}" for op, name in analysis.loads]
    filecheck("\n".join(lines), """
        CHECK:      output 0: party 1: aggregate/4/aggregate of 4 elements of salaries.npy
        CHECK-NEXT: output 1: party 2: raw/1/raw of salaries.npy
        CHECK-NEXT: send 1: aggregate of 4 elements of salaries.npy at op simp.shuffle_static
        CHECK-SAME:   at payroll.py:7
        CHECK-NEXT: send 2: raw of salaries.npy at op simp.shuffle_static at payroll.py:8
        CHECK-NEXT: load salaries.npy at tensor.load
        CHECK-NOT:  send 0
    """)


def test_policy_verdict_allows_the_aggregate_and_refuses_the_raw_copy() -> None:
    program = mp.Program.from_text(PAYROLL)
    verdict = check(program.graph, 3, 0, Policy.parse(POLICY, "node_0.yaml"),
                    outputs_fetchable=False)
    filecheck("\n".join([f"accepted: {verdict.accepted}", *verdict.flows, *verdict.reasons]), """
        CHECK:      accepted: False
        CHECK-NEXT: aggregate of 4 elements of salaries.npy -> node_1
        CHECK-SAME:   (the value party 0 sends, op simp.shuffle_static at payroll.py:7):
        CHECK-SAME:   allowed: rule declassify
        CHECK-SAME:   {to: [node_1], when: aggregate, min_elements: 4}
        CHECK-NEXT: raw of salaries.npy -> node_2 ({{.*}}payroll.py:8): REFUSED
        CHECK-NEXT: op simp.shuffle_static at payroll.py:8 sends
        CHECK-SAME:   raw of salaries.npy, to node_2; add node_2 to plaintext_to
        CHECK-SAME:   in node_0.yaml
    """)


def test_a_smaller_sum_is_not_declassified() -> None:
    policy = Policy.parse(POLICY.replace("min_elements: 4", "min_elements: 5"), "node_0.yaml")
    verdict = check(mp.Program.from_text(PAYROLL).graph, 3, 0, policy, outputs_fetchable=False)
    filecheck("\n".join(verdict.reasons), """
        CHECK:      op simp.shuffle_static at payroll.py:7 sends
        CHECK-SAME:   aggregate of 4 elements of salaries.npy, to node_1; add a rule
        CHECK-SAME:   {to: [node_1], when: aggregate, min_elements: 4} to declassify
        CHECK:      op simp.shuffle_static at payroll.py:8
    """)
