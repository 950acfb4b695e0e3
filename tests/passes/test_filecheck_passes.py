"""FileCheck tests of the passes: a program's text in, one pass, the text out, checked
against the ``// CHECK`` lines written in the input (`tests.filecheck`)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

import mplang as mp
from mplang.edsl.graph import Graph
from mplang.passes import (
    batch_shuffles,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fuse_pcalls,
    optimize,
)
from tests.filecheck import filecheck


def header(outputs: int, world_size: int = 3) -> str:
    """The program line of a program with ``outputs`` outputs returned as a tuple."""
    leaf = {"kind": "leaf", "children": [], "meta": []}
    tree = {"kind": "tuple", "children": [leaf] * outputs, "meta": []}
    devices = ", ".join(["none"] * outputs)
    return (f"program @main {{world_size = {world_size}, out_devices = [{devices}], "
            f"out_tree = {json.dumps(tree, separators=(',', ':'))}}}")


def run_pass(fn: Callable[[Graph], Graph], text: str) -> str:
    """The text of the program of ``text`` after ``fn``; the program must stay valid."""
    program = mp.Program.from_text(text)
    after = mp.Program(fn(program.graph), program.out_tree, program.world_size, program.name,
                       program.out_devices)
    out = after.to_text()
    assert mp.Program.from_text(out).to_bytes() == after.to_bytes()
    return out


DCE = header(1) + """
func() -> (i32[]@{0}) {
  %a = simp.constant() {parties = @{0}, value = array<i32[]: 1>} : (i32[]@{0}) loc("f.py:1")
  %unused = simp.constant() {parties = @{1}, value = array<i32[]: 2>} : (i32[]@{1})
  %io = simp.pcall(%a) {fn = "log", parties = @{0}} : (i32[]@{0})
    region 0 (%v: i32[]) {
      %w = tensor.pyfunc(%v) {fn = "host:log", out_types = (i32[],)} : (i32[])
      %idle = tensor.constant() {value = array<i32[]: 3>} : (i32[])
      return %w
    }
  %moved = simp.shuffle_static(%a) {routes = {1: 0}} : (i32[]@{1})
  return %a
}
// CHECK:      %a = simp.constant() {parties = @{0}, value = array<i32[]: 1>}
// CHECK-SAME:   loc("f.py:1")
// CHECK-NOT:  %unused
// CHECK-NEXT: %io = simp.pcall(%a) {fn = "log", parties = @{0}} : (i32[]@{0})
// CHECK-NEXT:   region 0 (%v: i32[]) {
// CHECK-NEXT:     %w = tensor.pyfunc(%v)
// CHECK-NEXT:     return %w
// CHECK-NOT:  simp.shuffle_static
// CHECK:      return %a
"""


def test_dce_removes_unused_pure_ops_and_keeps_effects() -> None:
    filecheck(run_pass(eliminate_dead_code, DCE), DCE)


CSE = header(3) + """
func() -> (i32[]@{1}, i32[]@{1}, i64[]@{0}) {
  %a = simp.constant() {parties = @{0}, value = array<i32[]: 1>} : (i32[]@{0})
  %b = simp.constant() {parties = @{0}, value = array<i32[]: 1>} : (i32[]@{0})
  %c = simp.constant() {parties = @{0}, value = array<i64[]: 1>} : (i64[]@{0})
  %s = simp.shuffle_static(%a) {routes = {1: 0}} : (i32[]@{1})
  %t = simp.shuffle_static(%b) {routes = {1: 0}} : (i32[]@{1})
  return %s, %t, %c
}
// CHECK:      %a = simp.constant() {parties = @{0}, value = array<i32[]: 1>}
// CHECK-NEXT: %c = simp.constant() {parties = @{0}, value = array<i64[]: 1>}
// CHECK-NEXT: %s = simp.shuffle_static(%a) {routes = {1: 0}}
// CHECK-NOT:  %t =
// CHECK:      return %s, %s, %c
"""


def test_cse_keeps_the_first_of_equal_computations() -> None:
    filecheck(run_pass(eliminate_common_subexpressions, CSE), CSE)


FUSE = header(1) + """
func() -> (f32[]@{0}) {
  %a = simp.constant() {parties = @{0}, value = array<f32[]: 1.0>} : (f32[]@{0})
  %b = simp.pcall(%a) {fn = "f", parties = @{0}} : (f32[]@{0})
    region 0 (%x: f32[]) {
      %y = tensor.constant() {value = array<f32[]: 2.0>} : (f32[])
      return %y
    }
  %c = simp.pcall(%b, %a) {fn = "g", parties = @{0}} : (f32[]@{0})
    region 0 (%p: f32[], %x: f32[]) {
      %r = tensor.pyfunc(%p, %x) {fn = "host:g", out_types = (f32[],)} : (f32[])
      return %r
    }
  return %c
}
// CHECK:      %b, %c = simp.pcall(%a) {fn = "f+g", parties = @{0}} : (f32[]@{0}, f32[]@{0})
// CHECK-NEXT:   region 0 (%x: f32[]) {
// CHECK-NEXT:     %y = tensor.constant() {value = array<f32[]: 2.0>} : (f32[])
// CHECK-NEXT:     %[[R:r[.0-9]*]] = tensor.pyfunc(%y, %x) {fn = "host:g", out_types = (f32[],)}
// CHECK-NEXT:     return %y, %[[R]]
// CHECK-NEXT:   }
// CHECK-NEXT: return %c
"""


def test_fuse_pcalls_runs_both_bodies_in_one_region() -> None:
    filecheck(run_pass(fuse_pcalls, FUSE), FUSE)


FUSE_NONE = FUSE.replace('{fn = "g", parties = @{0}}', '{fn = "g", parties = none}')


def test_fuse_pcalls_leaves_pcalls_whose_parties_are_decided_at_run_time() -> None:
    filecheck(run_pass(fuse_pcalls, FUSE_NONE), """
        CHECK:      %b = simp.pcall(%a) {fn = "f", parties = @{0}}
        CHECK:      %c = simp.pcall(%b, %a) {fn = "g", parties = none}
        CHECK-NOT:  "f+g"
    """)


BATCH = header(3) + """
func() -> (i32[]@{1,2}, f32[]@{1,2}, i32[]@{1}) {
  %a = simp.constant() {parties = @{0}, value = array<i32[]: 1>} : (i32[]@{0})
  %b = simp.constant() {parties = @{0}, value = array<f32[]: 2.0>} : (f32[]@{0})
  %s = simp.shuffle_static(%a) {routes = {1: 0, 2: 0}} : (i32[]@{1,2}) loc("f.py:3")
  %t = simp.shuffle_static(%b) {routes = {2: 0, 1: 0}} : (f32[]@{1,2}) loc("f.py:4")
  %u = simp.shuffle_static(%a) {routes = {1: 0}} : (i32[]@{1})
  return %s, %t, %u
}
// CHECK:      %a = simp.constant()
// CHECK-NEXT: %b = simp.constant()
// CHECK-NEXT: %s, %t = simp.shuffle_static(%a, %b) {routes = {1: 0, 2: 0}}
// CHECK-SAME:   : (i32[]@{1,2}, f32[]@{1,2}){{$}}
// CHECK-NEXT: %u = simp.shuffle_static(%a) {routes = {1: 0}} : (i32[]@{1})
// CHECK-NEXT: return %s, %t, %u
"""


def test_batch_shuffles_merges_moves_on_the_same_routes() -> None:
    filecheck(run_pass(batch_shuffles, BATCH), BATCH)


def test_optimize_runs_the_default_pipeline() -> None:
    text = CSE.replace("return %s, %t, %c", "%d = simp.shuffle_static(%c) {routes = {1: 0}} "
                                             ": (i64[]@{1})\n  return %s, %t, %c")
    out = optimize(mp.Program.from_text(text)).to_text()
    filecheck(out, """
        CHECK:      %a = simp.constant()
        CHECK-NEXT: %c = simp.constant()
        CHECK-NEXT: %s = simp.shuffle_static(%a)
        CHECK-NEXT: return %s, %s, %c
        CHECK-NOT:  shuffle_static(%c)
    """)


@pytest.mark.parametrize("text", [DCE, CSE, FUSE, BATCH])
def test_inputs_print_back_as_written_without_comments(text: str) -> None:
    printed = mp.Program.from_text(text).to_text()
    source = "\n".join(line for line in text.splitlines() if not line.startswith("//"))
    assert printed == source + "\n"
