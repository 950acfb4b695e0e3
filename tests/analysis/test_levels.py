"""Dependencies, topological levels, independent sets and cycle detection."""

from __future__ import annotations

import pytest

import mplang as mp
from mplang.analysis import independent_sets, op_dependencies, topological_levels
from mplang.analysis.levels import op_levels, topological_order
from mplang.edsl.graph import Graph, Operation
from tests.analysis.graphs import I32, const, converge, pcall, val


def diamond() -> Graph:
    x, y, z, w = val("x"), val("y"), val("z"), val("w")
    return Graph([], [const(x), converge([x], y), converge([x], z), converge([y, z], w)], [w])


def test_levels_of_a_diamond() -> None:
    g = diamond()
    assert topological_levels(g) == [[0], [1, 2], [3]]
    assert independent_sets(g) == [[1, 2]]
    deps = op_dependencies(g)
    assert deps.preds == ((), (0,), (0,), (1, 2))
    assert deps.succs == ((1, 2), (3,), (3,), ())


def test_level_is_one_plus_the_highest_input_level() -> None:
    # op 3 reads a level-1 and a level-2 value: level 3, not 2
    a, x, y, z = val("a"), val("x"), val("y"), val("z")
    g = Graph([a], [const(x), converge([x], y), converge([a], val("u")), converge([x, y], z)],
              [z])
    deps = op_dependencies(g)
    assert op_levels(g, deps) == [1, 2, 1, 3]  # graph inputs are level 0: op 2 is level 1


def test_a_chain_has_one_op_per_level() -> None:
    vs = [val(f"v{i}") for i in range(6)]
    ops = [const(vs[0])] + [converge([vs[i]], vs[i + 1]) for i in range(5)]
    g = Graph([], ops, [vs[-1]])
    assert topological_levels(g) == [[i] for i in range(6)]
    assert independent_sets(g) == []


def test_ops_of_one_level_have_no_path_between_them() -> None:
    # a wider random-ish DAG: check the invariant directly
    vs = [val(f"v{i}") for i in range(12)]
    ops = [const(vs[0]), const(vs[1])]
    for i in range(2, 12):
        ops.append(converge([vs[i // 2], vs[i - 2]], vs[i]))
    g = Graph([], ops, [vs[-1]])
    deps = op_dependencies(g)
    reach: dict[int, set[int]] = {}
    for i in topological_order(g, deps):
        reach[i] = set(deps.preds[i]).union(*(reach[p] for p in deps.preds[i]))
    for level in topological_levels(g, deps):
        for i in level:
            assert not reach[i] & set(level)


def test_empty_graph_has_no_levels() -> None:
    assert topological_levels(Graph([], [], [])) == []


def test_ops_with_side_effects_keep_their_order() -> None:
    # two independent pyfunc calls: the second waits for the first (as the scheduler runs them)
    t = mp.TensorType("int32", ())
    a, b, c = val("a", t), val("b", t), val("c", t)
    attrs = {"fn": "log", "out_types": (t,)}
    ops = [Operation("tensor.pyfunc", (a,), (b,), attrs),
           Operation("tensor.run_jax", (a,), (val("d", t),), {"fn": "neg"}),
           Operation("tensor.pyfunc", (a,), (c,), attrs)]
    g = Graph([a], ops, [b, c])
    deps = op_dependencies(g)
    assert deps.preds == ((), (), (0,))
    assert deps.effect_preds == (None, None, 0)
    assert topological_levels(g, deps) == [[0, 1], [2]]


def two_op_cycle() -> Graph:
    """Op 0 reads op 1's output and op 1 reads op 0's."""
    x, y = val("x"), val("y")
    region = Graph([val("a", I32)], [], [])
    return Graph([], [pcall([y], [x], region), converge([x], y)], [y])


def test_cycle_is_rejected_by_the_verifier_naming_the_op() -> None:
    with pytest.raises(mp.MPVerifyError) as info:
        two_op_cycle().verify()
    msg = str(info.value)
    assert "op #0 simp.pcall" in msg
    assert "%y" in msg and "used before it is defined" in msg


def test_cycle_is_rejected_by_analyze_naming_the_op() -> None:
    with pytest.raises(mp.MPVerifyError, match=r"op #0 simp.pcall: input %y"):
        mp.analyze(two_op_cycle())


def test_cycle_is_rejected_by_the_levels_naming_the_ops() -> None:
    # without the verifier, the dependency analysis finds the cycle itself
    with pytest.raises(mp.MPVerifyError) as info:
        topological_levels(two_op_cycle())
    msg = str(info.value)
    assert "dependency cycle" in msg
    assert "op #1 simp.converge -> op #0 simp.pcall -> op #1 simp.converge" in msg


def test_cycle_behind_an_acyclic_prefix_names_only_the_cycle() -> None:
    x, y, z = val("x"), val("y"), val("z")
    g = Graph([], [const(x), converge([x, z], y), converge([y], z)], [z])
    with pytest.raises(mp.MPVerifyError) as info:
        topological_levels(g)
    assert "op #0" not in str(info.value)
    assert "op #1 simp.converge" in str(info.value) and "op #2 simp.converge" in str(info.value)
