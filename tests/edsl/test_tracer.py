"""Tracing Python functions into graphs: captures, pytrees, inlining, and the
Python constructs that cannot be traced."""

import dataclasses
from dataclasses import dataclass

import jax.numpy as jnp
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.dialects.simp import prank_p
from mplang.edsl.typing import Mask, MPType, TensorType

WORLD = 3


@dataclass
class Pair:
    first: object
    second: object


def compile3(fn, *args, **kwargs):
    return mp.compile(fn, *args, world_size=WORLD, **kwargs)


def top_ops(program):
    return [op.opcode for op in program.graph.operations]


def all_ops(program):
    return [op.opcode for op in program.graph.walk()]


def only_op(program, opcode):
    ops = [op for op in program.graph.operations if op.opcode == opcode]
    assert len(ops) == 1, f"expected one {opcode}, got {top_ops(program)}"
    return ops[0]


def producer(program, value):
    """The top-level op that defines ``value``."""
    for op in program.graph.operations:
        if any(out is value for out in op.outputs):
            return op
    raise AssertionError(f"no top-level op defines %{value.name}")


def types(values):
    return [str(v.type) for v in values]


# ---------------------------------------------------------------- captures


def test_pcall_capture_becomes_an_explicit_region_input():
    def fn():
        x = simp.constant((0,), 10)
        y = simp.constant((0,), 2)
        return simp.pcall((0,), lambda v: v + x, y)

    p = compile3(fn)
    x_val, y_val = (op.outputs[0] for op in p.graph.operations[:2])
    call = only_op(p, "simp.pcall")
    assert call.inputs == (y_val, x_val)  # declared input first, then the capture
    (region,) = call.regions
    assert len(region.inputs) == 2
    assert types(region.inputs) == ["i32[]", "i32[]"]  # party-local: no pmask
    inner = [op.opcode for op in region.operations]
    assert inner == ["tensor.run_jax"]
    assert region.operations[0].inputs == tuple(region.inputs)
    p.graph.verify()


def test_pcall_capture_of_run_jax_operand():
    def fn():
        x = simp.constant((0,), 4.0)
        return simp.pcall((0,), lambda: tensor.run_jax(jnp.sqrt, x))

    p = compile3(fn)
    call = only_op(p, "simp.pcall")
    assert call.inputs == p.graph.operations[0].outputs
    assert types(call.regions[0].inputs) == ["f32[]"]
    assert types(p.graph.outputs) == ["f32[]@{0}"]


def test_pcall_capture_returned_directly():
    def fn():
        x = simp.constant((0,), 1)
        y = simp.constant((0,), 2.0)
        return simp.pcall((0,), lambda v: (v, x), y)

    p = compile3(fn)
    x_val, y_val = (op.outputs[0] for op in p.graph.operations[:2])
    call = only_op(p, "simp.pcall")
    assert call.inputs == (y_val, x_val)
    region = call.regions[0]
    assert len(region.inputs) == 2
    assert region.outputs == region.inputs
    assert types(p.graph.outputs) == ["f32[]@{0}", "i32[]@{0}"]


def test_capture_used_twice_is_one_region_input():
    def fn():
        x = simp.constant((0, 1, 2), 1)
        pred = simp.pcall(None, lambda r: r < 1, simp.prank())
        return simp.uniform_cond(pred, lambda: simp.converge(x), lambda: simp.converge(x))

    p = compile3(fn)
    cond = only_op(p, "simp.uniform_cond")
    x_val = p.graph.operations[0].outputs[0]
    assert cond.inputs[1:] == (x_val,)
    for region in cond.regions:
        assert len(region.inputs) == 1


def test_branch_captures_are_unified_across_branches():
    def fn():
        a = simp.constant((0, 1, 2), 1)
        b = simp.constant((0, 1, 2), 2)
        pred = simp.pcall(None, lambda r: r < 1, simp.prank())
        return simp.uniform_cond(pred, lambda: simp.converge(a), lambda: simp.converge(b))

    p = compile3(fn)
    cond = only_op(p, "simp.uniform_cond")
    a_val, b_val = (op.outputs[0] for op in p.graph.operations[:2])
    assert cond.inputs[1:] == (a_val, b_val)
    then_g, else_g = cond.regions
    # both branches take both captures, each uses its own
    assert len(then_g.inputs) == len(else_g.inputs) == 2
    assert then_g.operations[0].inputs == (then_g.inputs[0],)
    assert else_g.operations[0].inputs == (else_g.inputs[1],)
    assert types(then_g.inputs) == ["i32[]@{0,1,2}"] * 2


def test_while_loop_capture_follows_the_state():
    def fn():
        limit = simp.constant((0, 1, 2), 5)
        return simp.while_loop(lambda i: simp.pcall(None, lambda a, b: a < b, i, limit),
                               lambda i: i + 1, simp.prank())

    p = compile3(fn)
    loop = only_op(p, "simp.while_loop")
    limit_val = p.graph.operations[0].outputs[0]
    assert loop.inputs[1] is limit_val
    assert len(loop.inputs) == 2
    cond_g, body_g = loop.regions
    assert len(cond_g.inputs) == len(body_g.inputs) == 2
    assert len(loop.outputs) == 1  # captures are not loop state
    assert len(body_g.outputs) == 1


def test_capture_through_two_levels_of_regions():
    @mp.func.func
    def g(a):
        pred = simp.pcall(None, lambda r: r < 1, simp.prank())
        return simp.uniform_cond(pred, lambda v: simp.converge(outer[0]), lambda v: v, a)

    outer = []

    def fn():
        outer.append(simp.constant((0, 1, 2), 7))
        return g(simp.prank())

    p = compile3(fn)
    x_val = p.graph.operations[0].outputs[0]
    call = only_op(p, "func.call")
    assert call.inputs[-1] is x_val  # captured by the func region ...
    func_region = call.regions[0]
    cond = next(op for op in func_region.operations if op.opcode == "simp.uniform_cond")
    # ... and passed on into the branch region as a region input of the func body
    assert cond.inputs[-1] is func_region.inputs[-1]
    p.graph.verify()


# ---------------------------------------------------------------- pytrees


def test_pcall_body_takes_and_returns_dicts():
    def fn():
        a = simp.constant((0,), 1)
        b = simp.constant((0,), 2.0)
        out = simp.pcall((0,), lambda d: {"sum": d["b"] * 2.0, "a": (d["a"],)}, {"a": a, "b": b})
        assert set(out) == {"sum", "a"}
        assert isinstance(out["a"], tuple)
        return out

    p = compile3(fn)
    assert p.out_tree.kind == "dict"
    assert p.out_tree.meta == ("a", "sum")
    assert types(p.graph.outputs) == ["i32[]@{0}", "f32[]@{0}"]


def test_pcall_body_takes_and_returns_lists_and_tuples():
    def fn():
        xs = [simp.constant((1,), i) for i in range(3)]
        out = simp.pcall((1,), lambda vs, t: [vs[2], (t[0], vs[0])], xs, (xs[1],))
        assert isinstance(out, list)
        assert isinstance(out[1], tuple)
        return out

    p = compile3(fn)
    call = only_op(p, "simp.pcall")
    assert len(call.inputs) == 4
    assert [op.attrs["value"].item() for op in p.graph.operations[:3]] == [0, 1, 2]
    region = call.regions[0]
    # [vs2, (t0, vs0)] with inputs vs0, vs1, vs2, t0
    assert region.outputs == [region.inputs[2], region.inputs[3], region.inputs[0]]


def test_pcall_body_takes_and_returns_dataclasses():
    def fn():
        p = Pair(simp.constant((0,), 1), simp.constant((0,), 2))
        out = simp.pcall((0,), lambda q: Pair(q.second, q.first + q.second), p)
        assert isinstance(out, Pair)
        return out

    p = compile3(fn)
    assert p.out_tree.kind == "dataclass"
    assert p.out_tree.meta[2] == ("first", "second")


def test_pcall_body_returns_a_locally_defined_dataclass():
    @dataclasses.dataclass
    class Local:
        value: object

    seen = []

    def fn():
        out = simp.pcall((0,), lambda v: Local(v), simp.constant((0,), 1))
        seen.append(out)
        return simp.prank()

    compile3(fn)
    assert isinstance(seen[0], Local), f"got {type(seen[0]).__name__}: {seen[0]!r}"



def test_pcall_body_returning_none_has_no_outputs():
    def fn():
        out = simp.pcall((0,), lambda v: None, simp.constant((0,), 1))
        assert out is None
        return simp.prank()

    p = compile3(fn)
    assert only_op(p, "simp.pcall").outputs == ()


def test_mp_function_with_pytrees_is_inlined():
    @mp.function
    def combine(d, pair):
        return {"total": d["x"] + pair.first, "kept": [pair.second]}

    def fn():
        d = {"x": simp.constant((0, 1), 1)}
        pair = Pair(simp.constant((0, 1), 2), simp.constant((1,), 3))
        out = combine(d, pair)
        assert isinstance(out["kept"], list)
        return out

    p = compile3(fn)
    assert "func.call" not in all_ops(p)
    assert top_ops(p) == ["simp.constant"] * 3 + ["simp.pcall"]
    assert p.out_tree.meta == ("kept", "total")
    assert types(p.graph.outputs) == ["i32[]@{1}", "i32[]@{0,1}"]


def test_compile_output_pytree_and_constant_arguments():
    def fn(n, scale, *, offset):
        xs = [simp.constant((i,), n * scale + offset) for i in range(2)]
        return (xs[0], {"b": xs[1], "none": None})

    p = compile3(fn, 2, 10, offset=1)
    assert [op.attrs["value"].item() for op in p.graph.operations] == [21, 21]
    assert p.graph.inputs == []  # plain values are compile-time constants
    assert p.out_tree.kind == "tuple"
    assert types(p.graph.outputs) == ["i32[]@{0}", "i32[]@{1}"]


def test_python_control_flow_on_constants_is_fine():
    def fn(a):
        if a > 2:
            return simp.constant((0,), a)
        return simp.constant((1,), a)

    assert types(compile3(fn, 3).graph.outputs) == ["i32[]@{0}"]
    assert types(compile3(fn, 1).graph.outputs) == ["i32[]@{1}"]


# ---------------------------------------------------------------- function / func.func


def test_nested_mp_function_is_inlined():
    @mp.function
    def square(x):
        return simp.pcall(None, lambda v: v * v, x)

    @mp.function
    def twice(x):
        return square(square(x))

    def fn():
        return twice(simp.constant((0,), 3))

    p = compile3(fn)
    assert "func.call" not in all_ops(p)
    assert top_ops(p) == ["simp.constant", "simp.pcall", "simp.pcall"]
    p.graph.verify()


def test_func_func_makes_one_call_op_with_a_region():
    @mp.func.func
    def square(x):
        return simp.pcall(None, lambda v: v * v, x)

    def fn():
        return square(simp.constant((0, 1), 3))

    p = compile3(fn)
    assert top_ops(p) == ["simp.constant", "func.call"]
    call = only_op(p, "func.call")
    assert call.attrs["callee"] == "square"
    (region,) = call.regions
    assert types(region.inputs) == ["i32[]@{0,1}"]
    assert [op.opcode for op in region.operations] == ["simp.pcall"]
    assert types(call.outputs) == ["i32[]@{0,1}"]
    assert all_ops(p).count("func.call") == 1


def test_func_func_called_twice_makes_two_calls():
    @mp.func.func
    def inc(x):
        return simp.pcall(None, lambda v: v + 1, x)

    def fn():
        return inc(inc(simp.constant((0,), 3)))

    p = compile3(fn)
    assert top_ops(p) == ["simp.constant", "func.call", "func.call"]
    first, second = p.graph.operations[1:]
    assert second.inputs == first.outputs


def test_func_func_returns_pytrees():
    @mp.func.func
    def split(x):
        return {"a": x, "b": (simp.pcall(None, lambda v: -v, x),)}

    def fn():
        out = split(simp.constant((2,), 3))
        assert set(out) == {"a", "b"}
        return out["b"][0]

    p = compile3(fn)
    call = only_op(p, "func.call")
    assert len(call.outputs) == 2
    assert types(p.graph.outputs) == ["i32[]@{2}"]


# ---------------------------------------------------------------- untraceable Python


def test_python_if_on_traced_value():
    def fn():
        x = simp.constant((0,), 1)
        if x:
            return x
        return x

    with pytest.raises(mp.MPTraceError, match="truth value") as info:
        compile3(fn)
    assert "uniform_cond" in str(info.value)


def test_python_if_on_comparison_inside_pcall_body():
    def body(v):
        if v > 0:
            return v
        return -v

    with pytest.raises(mp.MPTraceError, match="truth value"):
        compile3(lambda: simp.pcall((0,), body, simp.constant((0,), 1)))


def test_python_and_while_on_traced_values():
    def with_and():
        x = simp.prank()
        return x and x

    def with_while():
        x = simp.prank()
        while x:
            pass
        return x

    for fn in (with_and, with_while):
        with pytest.raises(mp.MPTraceError, match="while_loop"):
            compile3(fn)


def test_iterating_over_traced_value():
    def fn():
        a, _ = simp.constant((0,), [1, 2])
        return a

    with pytest.raises(mp.MPTraceError, match="iterate"):
        compile3(fn)


def test_returning_a_lambda():
    with pytest.raises(mp.MPTraceError, match="returned a Python function"):
        compile3(lambda: (simp.prank(), lambda: 1))


def test_returning_a_named_function_names_it():
    def helper():
        return 1

    def fn():
        return helper

    with pytest.raises(mp.MPTraceError, match="returned a Python function") as info:
        compile3(fn)
    assert "helper" in str(info.value)
    assert "'fn'" in str(info.value)


def test_pcall_body_returning_a_function():
    with pytest.raises(mp.MPTraceError, match="returned a Python function"):
        compile3(lambda: simp.pcall((0,), lambda v: (lambda: v), simp.constant((0,), 1)))


@pytest.mark.parametrize("value, tname", [(1, "int"), (2.5, "float"), ("s", "str")])
def test_returning_a_plain_value(value, tname):
    def fn():
        return value

    with pytest.raises(mp.MPTraceError, match=f"plain Python value of type {tname}"):
        compile3(fn)


def test_returning_a_plain_value_inside_a_tree():
    with pytest.raises(mp.MPTraceError, match="plain Python value of type int"):
        compile3(lambda: {"ok": simp.prank(), "bad": 3})


def test_value_escaping_its_trace():
    leaked = []

    def first():
        x = simp.constant((0,), 1)
        leaked.append(x)
        return x

    compile3(first)

    def second():
        return simp.pcall((0,), lambda v: v, leaked[0])

    with pytest.raises(mp.MPTraceError, match="escaped"):
        compile3(second)


def test_value_escaping_a_pcall_body():
    inner = []

    def body(v):
        inner.append(v)
        return v

    def fn():
        x = simp.constant((0,), 1)
        simp.pcall((0,), body, x)
        return inner[0]

    with pytest.raises(mp.MPTraceError, match="escaped"):
        compile3(fn)


def test_returning_an_escaped_value_from_a_later_trace():
    leaked = []
    compile3(lambda: leaked.append(simp.prank()) or leaked[0])
    with pytest.raises(mp.MPTraceError, match="escaped"):
        compile3(lambda: leaked[0])


def test_primitive_without_context():
    with pytest.raises(mp.MPTraceError, match="context"):
        simp.prank()
    with pytest.raises(mp.MPTraceError, match="context"):
        simp.constant((0,), 1)


def test_primitive_bind_without_context():
    with pytest.raises(mp.MPTraceError, match=r"simp\.prank was called outside a trace"):
        prank_p.bind([])


def test_mp_function_without_context():
    @mp.function
    def prog():
        return simp.prank()

    with pytest.raises(mp.MPTraceError, match="needs a context") as info:
        prog()
    assert "prog" in str(info.value)


# ---------------------------------------------------------------- placements


def test_function_on_a_single_party_traces():
    def fn():
        x = simp.constant((1,), jnp.ones(3, jnp.float32))
        y = simp.constant((1,), 2.0)
        z = simp.pcall(None, lambda a, b: a * b, x, y)
        return x + z

    p = compile3(fn)
    assert types(p.graph.outputs) == ["f32[3]@{1}"]
    for op in p.graph.operations:
        assert all(v.type.pmask == Mask.of([1]) for v in op.outputs)


def test_pcall_without_parties_runs_on_the_holders():
    def fn():
        return simp.pcall(None, lambda a, b: a - b, simp.constant((0, 2), 1),
                          simp.constant((1, 2), 2))

    p = compile3(fn)
    assert only_op(p, "simp.pcall").attrs["parties"] is None
    assert p.graph.outputs[0].type == MPType(TensorType("int32", ()), Mask.of([2]))


def test_value_names_are_unique_across_regions():
    def fn():
        x = simp.constant((0,), 1)
        return simp.pcall((0,), lambda v: v * 2 + 1, x)

    p = compile3(fn)
    names = [v.name for v in p.graph.inputs]
    for op in p.graph.walk():
        names += [v.name for v in op.outputs]
        for region in op.regions:
            names += [v.name for v in region.inputs]
    assert len(names) == len(set(names))


def test_program_name_comes_from_the_function():
    def my_prog():
        return simp.prank()

    p = compile3(my_prog)
    assert p.name == "my_prog"
    assert str(p).startswith("func @my_prog(")
    assert compile3(lambda: simp.prank()).name == "main"  # '<lambda>' is no identifier
