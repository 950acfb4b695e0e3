"""Use-def chains of hand-built and traced graphs."""

from __future__ import annotations

import pytest

import mplang as mp
from mplang import simp
from mplang.analysis import GRAPH_INPUT, build_use_def
from mplang.edsl.graph import Graph, Operation
from tests.analysis.graphs import const, converge, pcall, val


def test_definers_and_users_of_a_diamond() -> None:
    a, x, y, z, w = val("a"), val("x"), val("y"), val("z"), val("w")
    ops = [const(x), converge([x, a], y), converge([x], z), converge([y, z], w)]
    ud = build_use_def(Graph([a], ops, [w, w]))
    assert ud.def_of(a) == GRAPH_INPUT
    assert [ud.def_of(v) for v in (x, y, z, w)] == [0, 1, 2, 3]
    assert ud.users_of(x) == (1, 2)
    assert ud.users_of(a) == (1,)
    assert ud.users_of(w) == ()
    assert ud.output_uses[w] == 2
    assert ud.operands_of(3) == (1, 2)
    assert ud.operands_of(1) == (0,)  # the graph input is not an op
    assert list(ud.values()) == [a, x, y, z, w]
    assert ud.dead_values() == []


def test_an_op_reading_a_value_twice_is_one_user() -> None:
    x, y = val("x"), val("y")
    ud = build_use_def(Graph([], [const(x), converge([x, x], y)], [y]))
    assert ud.users_of(x) == (1,)


def test_dead_values_are_neither_read_nor_returned() -> None:
    a, x, y = val("a"), val("x"), val("y")
    ud = build_use_def(Graph([a], [const(x), const(y)], [y]))
    assert ud.dead_values() == [a, x]


def test_values_are_keyed_by_identity_not_name() -> None:
    x1, x2 = val("x"), val("x")
    ud = build_use_def(Graph([], [const(x1), const(x2)], [x2]))
    assert (ud.def_of(x1), ud.def_of(x2)) == (0, 1)


def test_foreign_value_is_a_key_error() -> None:
    x = val("x")
    ud = build_use_def(Graph([], [const(x)], [x]))
    with pytest.raises(KeyError, match="%ghost"):
        ud.def_of(val("ghost"))
    with pytest.raises(KeyError, match="%ghost"):
        ud.users_of(val("ghost"))


def test_region_values_stay_in_their_region() -> None:
    a, b = val("a", mp.TensorType("int32", ())), val("b", mp.TensorType("int32", ()))
    body = Graph([a], [Operation("tensor.run_jax", (a,), (b,), {"fn": "neg"})], [b])
    x, y = val("x"), val("y")
    ud = build_use_def(Graph([], [const(x), pcall([x], [y], body)], [y]))
    assert b not in ud.definer
    inner = build_use_def(body)
    assert inner.def_of(a) == GRAPH_INPUT and inner.users_of(a) == (0,)


@pytest.mark.parametrize("case", ["undefined", "twice", "output"])
def test_malformed_graphs_name_the_problem(case: str) -> None:
    x, y, ghost = val("x"), val("y"), val("ghost")
    graphs = {
        "undefined": Graph([], [const(x), converge([ghost], y)], [y]),
        "twice": Graph([], [const(x), const(x)], [x]),
        "output": Graph([], [const(x)], [ghost]),
    }
    expected = {"undefined": "op #1 simp.converge: input %ghost",
                "twice": "op #1 simp.constant: output %x is defined twice",
                "output": "graph output %ghost"}
    with pytest.raises(mp.MPVerifyError, match=expected[case]):
        build_use_def(graphs[case])


def test_use_def_of_a_traced_program() -> None:
    def prog():  # type: ignore[no-untyped-def]
        r = simp.prank()
        return simp.shuffle_static(r, {1: 0}), simp.shuffle_static(r, {0: 1})

    graph = mp.compile(prog, world_size=2).graph
    ud = build_use_def(graph)
    rank = graph.operations[0].outputs[0]
    assert ud.def_of(rank) == 0
    assert ud.users_of(rank) == (1, 2)
    assert [ud.def_of(v) for v in graph.outputs] == [1, 2]
