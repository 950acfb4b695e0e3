"""The graph IR built by hand: SSA verification, `Operation.replace`, `Graph.walk`."""

import dataclasses
import re

import pytest

import mplang as mp
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.typing import Mask, MPType, scalar

I32 = scalar("int32")
I32_01 = MPType(I32, Mask.of([0, 1]))


def v(name, t=I32_01):
    return Value(name, t)


def const(out):
    return Operation("simp.constant", (), (out,), {"parties": Mask.of([0, 1])})


def pcall(inputs, outputs, region):
    return Operation("simp.pcall", tuple(inputs), tuple(outputs),
                     {"parties": None, "fn": "f"}, (region,))


def local_region():
    """A pcall body: one local input, one run_jax op."""
    a, b = v("a", I32), v("b", I32)
    return Graph([a], [Operation("tensor.run_jax", (a,), (b,), {"fn": "neg"})], [b])


def well_formed():
    x, y = v("x"), v("y")
    return Graph([], [const(x), pcall([x], [y], local_region())], [y])


def verify_error(graph):
    with pytest.raises(mp.MPVerifyError) as info:
        graph.verify()
    return str(info.value)


def test_well_formed_graph_verifies():
    well_formed().verify()


def test_empty_graph_verifies():
    Graph([], [], []).verify()


def test_graph_input_can_be_used_and_returned():
    a = v("a")
    Graph([a], [], [a]).verify()


def test_use_before_define_names_the_op():
    x, y = v("x"), v("y")
    g = Graph([], [pcall([x], [y], local_region()), const(x)], [y])
    msg = verify_error(g)
    assert "op #0 simp.pcall" in msg
    assert "%x" in msg
    assert "before it is defined" in msg


def test_use_of_value_never_defined_names_the_op():
    x, y, ghost = v("x"), v("y"), v("ghost")
    g = Graph([], [const(x), pcall([x, ghost], [y], local_region())], [y])
    msg = verify_error(g)
    assert "op #1 simp.pcall" in msg
    assert "%ghost" in msg


def test_double_definition_names_the_op():
    x = v("x")
    g = Graph([], [const(x), const(x)], [x])
    msg = verify_error(g)
    assert "op #1 simp.constant" in msg
    assert "%x" in msg
    assert "defined twice" in msg


def test_op_redefining_a_graph_input_is_rejected():
    a = v("a")
    msg = verify_error(Graph([a], [const(a)], [a]))
    assert "op #0 simp.constant" in msg
    assert "defined twice" in msg


def test_input_listed_twice_is_rejected():
    a = v("a")
    msg = verify_error(Graph([a, a], [], [a]))
    assert "%a" in msg
    assert "twice" in msg


def test_same_name_different_values_is_not_a_redefinition():
    # values are compared by identity, not by name
    g = Graph([], [const(v("x")), const(v("x"))], [])
    g.verify()


def test_undefined_output_is_rejected():
    x, dangling = v("x"), v("dangling")
    msg = verify_error(Graph([], [const(x)], [dangling]))
    assert "output %dangling" in msg
    assert "not defined" in msg


def test_unknown_op_name_is_rejected():
    x, y = v("x"), v("y")
    g = Graph([], [const(x), Operation("simp.teleport", (x,), (y,))], [y])
    msg = verify_error(g)
    assert "op #1 simp.teleport" in msg
    assert "unknown op" in msg


def test_unknown_op_inside_region_names_the_path():
    a, b = v("a", I32), v("b", I32)
    region = Graph([a], [Operation("tensor.does_not_exist", (a,), (b,))], [b])
    x, y = v("x"), v("y")
    g = Graph([], [const(x), pcall([x], [y], region)], [y])
    msg = verify_error(g)
    assert "op #1 simp.pcall region 0" in msg
    assert "op #0 tensor.does_not_exist" in msg


def test_region_reading_an_outer_value_is_rejected():
    # regions are closed: an outer value must arrive as a region input
    x, y = v("x"), v("y")
    a, b = v("a", I32), v("b", I32)
    region = Graph([a], [Operation("tensor.run_jax", (x,), (b,), {"fn": "neg"})], [b])
    g = Graph([], [const(x), pcall([x], [y], region)], [y])
    msg = verify_error(g)
    assert "op #1 simp.pcall region 0: op #0 tensor.run_jax" in msg
    assert "%x" in msg


def test_region_values_are_not_visible_outside():
    x, y = v("x"), v("y")
    region = local_region()
    inner = region.outputs[0]
    g = Graph([], [const(x), pcall([x], [y], region)], [inner])
    msg = verify_error(g)
    assert f"output %{inner.name}" in msg


def test_undefined_region_output_is_reported_with_its_op():
    a, b = v("a", I32), v("b", I32)
    region = Graph([a], [], [b])
    x, y = v("x"), v("y")
    msg = verify_error(Graph([], [const(x), pcall([x], [y], region)], [y]))
    assert "op #1 simp.pcall region 0" in msg
    assert "output %b" in msg


# ---------------------------------------------------------------- Operation


def test_operation_is_immutable():
    op = const(v("x"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        op.opcode = "simp.prank"  # type: ignore[misc]


def test_operation_replace_returns_a_changed_copy():
    x, z = v("x"), v("z")
    op = const(x)
    new = op.replace(outputs=(z,), attrs={"parties": Mask.of([1])})
    assert new is not op
    assert new.outputs == (z,)
    assert new.attrs == {"parties": Mask.of([1])}
    assert new.opcode == "simp.constant"
    # the original is unchanged
    assert op.outputs == (x,)
    assert op.attrs == {"parties": Mask.of([0, 1])}


def test_operation_replace_keeps_unchanged_fields():
    region = local_region()
    x, y = v("x"), v("y")
    op = pcall([x], [y], region)
    new = op.replace(opcode="simp.uniform_cond")
    assert new.opcode == "simp.uniform_cond"
    assert new.inputs == (x,)
    assert new.outputs == (y,)
    assert new.regions[0] is region
    assert new.attrs is op.attrs


def test_operation_replace_rejects_unknown_field():
    with pytest.raises(TypeError):
        const(v("x")).replace(color="red")


def test_operation_defaults():
    op = Operation("simp.prank", (), (v("r"),))
    assert op.attrs == {}
    assert op.regions == ()


def test_value_identity_and_repr():
    a, b = Value("0", I32), Value("0", I32)
    assert a != b  # identity, not structure
    assert a == a
    assert repr(Value("7", I32_01)) == "%7: i32[]@{0,1}"


# ---------------------------------------------------------------- walk


def test_walk_visits_region_ops_after_their_parent():
    g = well_formed()
    assert [op.opcode for op in g.walk()] == ["simp.constant", "simp.pcall", "tensor.run_jax"]


def test_walk_visits_nested_regions_in_order():
    inner = local_region()
    c, d = v("c"), v("d")
    middle = Graph([c], [pcall([c], [d], inner)], [d])
    x, y, z = v("x"), v("y"), v("z")
    cond = Operation("simp.uniform_cond", (x, x), (y,), {}, (middle, middle))
    g = Graph([], [const(x), cond, Operation("simp.converge", (y,), (z,))], [z])
    names = [op.opcode for op in g.walk()]
    assert names == ["simp.constant", "simp.uniform_cond",
                     "simp.pcall", "tensor.run_jax",   # region 0
                     "simp.pcall", "tensor.run_jax",   # region 1
                     "simp.converge"]


def test_walk_on_compiled_program_finds_every_op():
    from mplang import simp

    def fn():
        x = simp.constant((0,), 2)
        return simp.pcall((0,), lambda a: -a, x)

    program = mp.compile(fn, world_size=2)
    ops = [op.opcode for op in program.graph.walk()]
    assert ops == ["simp.constant", "simp.pcall", "tensor.run_jax"]
    program.graph.verify()


def test_verify_message_format_matches_op_index():
    x, y, ghost = v("x"), v("y"), v("ghost")
    ops = [const(x), const(v("x2")), pcall([ghost], [y], local_region())]
    msg = verify_error(Graph([], ops, [y]))
    assert re.search(r"\bop #2 simp\.pcall\b", msg)
