"""Type rules run at trace time: ill-typed programs fail inside `mp.compile`,
with a message naming the op and the offending types / pmasks."""

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor

WORLD = 3


def compile_error(fn, world_size=WORLD):
    """The message of the MPTypeError that compiling ``fn`` raises."""
    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(fn, world_size=world_size)
    return str(info.value)


def assert_in(msg, *parts):
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"


def uniform_pred():
    """A bool scalar held by every party."""
    return simp.pcall(None, lambda r: r < 1, simp.prank())


def on(parties, value):
    return simp.constant(parties, value)


# ---------------------------------------------------------------- pcall


def test_pcall_on_parties_that_do_not_hold_the_input():
    msg = compile_error(lambda: simp.pcall((0, 1), lambda v: v, on((0,), 1)))
    assert_in(msg, "simp.pcall", "{0,1}", "i32[]@{0}", "input 0")
    assert "parties {1} do not hold it" in msg


def test_pcall_on_parties_holding_the_input_compiles():
    p = mp.compile(lambda: simp.pcall((0, 1), lambda v: v, on((0, 1, 2), 1)), world_size=WORLD)
    assert [str(t) for t in p.output_types] == ["i32[]@{0,1}"]


def test_pcall_names_the_offending_input():
    def fn():
        return simp.pcall((1,), lambda a, b: a + b, on((0, 1), 1.0), on((0,), 2.0))

    msg = compile_error(fn)
    assert_in(msg, "simp.pcall", "input 1", "f32[]@{0}", "{1}")


@pytest.mark.parametrize(
    "body, opname",
    [
        (lambda v: simp.prank(), "simp.prank"),
        (lambda v: simp.constant((0,), 1), "simp.constant"),
        (lambda v: simp.shuffle_static(v, {1: 0}), "simp.shuffle_static"),
        (lambda v: simp.converge(v), "simp.converge"),
    ],
    ids=["prank", "constant", "shuffle_static", "converge"],
)
def test_pcall_body_cannot_use_simp_ops(body, opname):
    msg = compile_error(lambda: simp.pcall((0,), body, on((0,), 1)))
    assert_in(msg, opname, "party-local", "pcall body")


def test_pcall_outside_the_world():
    msg = compile_error(lambda: simp.pcall((5,), lambda v: v, on((0, 1, 2), 1)))
    assert_in(msg, "simp.pcall", "{5}", "outside the world of 3 parties")


def test_pcall_without_inputs_needs_parties():
    msg = compile_error(lambda: simp.pcall(None, lambda: tensor.constant(1)))
    assert_in(msg, "simp.pcall", "explicit parties")


def test_tensor_constant_at_simp_level_is_rejected():
    msg = compile_error(lambda: tensor.constant(1))
    assert_in(msg, "tensor.constant", "party-local", "simp.pcall")


@pytest.mark.parametrize(
    "fn",
    [
        lambda: on((0,), 1) + on((1,), 2),
        lambda: simp.pcall(None, lambda a, b: tensor.run_jax(jnp.add, a, b),
                           on((0,), 1), on((1,), 2)),
        lambda: simp.pcall(None, jnp.add, on((0,), 1), on((1,), 2)),
    ],
    ids=["operator", "pcall-run_jax", "pcall-jax-fn"],
)
def test_local_op_on_disjoint_parties(fn):
    msg = compile_error(fn)
    assert_in(msg, "simp.pcall", "no party holds all inputs", "i32[]@{0}", "i32[]@{1}")


def test_local_op_on_overlapping_parties_runs_on_the_intersection():
    p = mp.compile(lambda: on((0, 1), 1) + on((1, 2), 2), world_size=WORLD)
    assert [str(t) for t in p.output_types] == ["i32[]@{1}"]


# ---------------------------------------------------------------- converge


def test_converge_with_overlapping_pmasks():
    msg = compile_error(lambda: simp.converge(on((0, 1), 1), on((1, 2), 2)))
    assert_in(msg, "simp.converge", "disjoint", "i32[]@{0,1}", "i32[]@{1,2}", "overlap on {1}")


def test_converge_overlap_among_many_inputs():
    msg = compile_error(lambda: simp.converge(on((0,), 1), on((1,), 2), on((0, 2), 3)))
    assert_in(msg, "simp.converge", "input 0", "input 2", "overlap on {0}")


def test_converge_with_different_base_types():
    msg = compile_error(lambda: simp.converge(on((0,), 1), on((1,), 2.0)))
    assert_in(msg, "simp.converge", "i32[]", "f32[]", "input 1")


def test_converge_with_different_shapes():
    msg = compile_error(lambda: simp.converge(on((0,), [1, 2]), on((1,), [1, 2, 3])))
    assert_in(msg, "simp.converge", "i32[2]", "i32[3]")


def test_converge_of_disjoint_values_compiles():
    p = mp.compile(lambda: simp.converge(on((0,), 1), on((2,), 5)), world_size=WORLD)
    assert [str(t) for t in p.output_types] == ["i32[]@{0,2}"]


def test_converge_of_nothing():
    msg = compile_error(lambda: simp.converge())
    assert_in(msg, "simp.converge", "at least one input")


# ---------------------------------------------------------------- uniform_cond


def test_uniform_cond_predicate_held_by_some_parties():
    def fn():
        r = simp.prank()
        return simp.uniform_cond(on((0,), True), lambda a: a, lambda a: a, r)

    msg = compile_error(fn)
    assert_in(msg, "simp.uniform_cond", "bool[]@{0}", "{0,1,2}", "every party")


@pytest.mark.parametrize(
    "make_pred, shown",
    [
        (lambda: simp.prank(), "i32[]@{0,1,2}"),
        (lambda: on((0, 1, 2), [True, False]), "bool[2]@{0,1,2}"),
        (lambda: on((0, 1, 2), 1.0), "f32[]@{0,1,2}"),
    ],
    ids=["int", "bool-vector", "float"],
)
def test_uniform_cond_predicate_must_be_bool_scalar(make_pred, shown):
    def fn():
        r = simp.prank()
        return simp.uniform_cond(make_pred(), lambda a: a, lambda a: a, r)

    msg = compile_error(fn)
    assert_in(msg, "simp.uniform_cond", "boolean scalar", shown)


def test_uniform_cond_branches_with_different_dtypes():
    def fn():
        return simp.uniform_cond(uniform_pred(), lambda: on((0, 1, 2), 1),
                                 lambda: on((0, 1, 2), 1.0))

    msg = compile_error(fn)
    assert_in(msg, "simp.uniform_cond", "same types", "i32[]@{0,1,2}", "f32[]@{0,1,2}")


def test_uniform_cond_branches_with_different_pmasks():
    def fn():
        return simp.uniform_cond(uniform_pred(), lambda: on((0, 1, 2), 1), lambda: on((0,), 1))

    msg = compile_error(fn)
    assert_in(msg, "simp.uniform_cond", "i32[]@{0,1,2}", "i32[]@{0}")


def test_uniform_cond_branches_with_different_structures():
    def fn():
        r = simp.prank()
        return simp.uniform_cond(uniform_pred(), lambda a: (a, a), lambda a: a, r)

    msg = compile_error(fn)
    assert_in(msg, "simp.uniform_cond", "different structures")


def test_well_typed_uniform_cond_compiles():
    def fn():
        r = simp.prank()
        return simp.uniform_cond(uniform_pred(), lambda a: a + 1, lambda a: a * 2, r)

    p = mp.compile(fn, world_size=WORLD)
    assert [str(t) for t in p.output_types] == ["i32[]@{0,1,2}"]


# ---------------------------------------------------------------- while_loop


def lt3(i):
    return simp.pcall(None, lambda v: v < 3, i)


def test_while_loop_body_changes_dtype():
    def fn():
        return simp.while_loop(lt3, lambda i: simp.pcall(None, lambda v: v * 1.5, i),
                               simp.prank())

    msg = compile_error(fn)
    assert_in(msg, "simp.while_loop", "state 0", "i32[]@{0,1,2}", "f32[]@{0,1,2}")


def test_while_loop_body_changes_pmask():
    def fn():
        return simp.while_loop(lt3, lambda i: simp.pcall((0,), lambda v: v + 1, i),
                               simp.prank())

    msg = compile_error(fn)
    assert_in(msg, "simp.while_loop", "changes type", "i32[]@{0,1,2}", "i32[]@{0}")


def test_while_loop_body_changes_structure():
    def fn():
        return simp.while_loop(lambda s: lt3(s[0]), lambda s: s[0], (simp.prank(),))

    msg = compile_error(fn)
    assert_in(msg, "simp.while_loop", "same structure")


def test_while_loop_cond_with_non_uniform_pred():
    def fn():
        return simp.while_loop(lambda i: simp.pcall((0,), lambda v: v < 3, i),
                               lambda i: i + 1, simp.prank())

    msg = compile_error(fn)
    assert_in(msg, "simp.while_loop", "bool[]@{0}", "{0,1,2}", "every party")


def test_while_loop_cond_not_bool():
    msg = compile_error(lambda: simp.while_loop(lambda i: i, lambda i: i + 1, simp.prank()))
    assert_in(msg, "simp.while_loop", "boolean scalar", "i32[]@{0,1,2}")


def test_while_loop_state_must_be_mplang_values():
    msg = compile_error(lambda: simp.while_loop(lt3, lambda i: i, 0))
    assert_in(msg, "simp.while_loop", "plain int")


def test_well_typed_while_loop_compiles():
    p = mp.compile(lambda: simp.while_loop(lt3, lambda i: i + 1, simp.prank()),
                   world_size=WORLD)
    assert [str(t) for t in p.output_types] == ["i32[]@{0,1,2}"]


# ---------------------------------------------------------------- shuffles


def test_shuffle_static_from_party_not_holding_the_value():
    msg = compile_error(lambda: simp.shuffle_static(on((0,), 1), {1: 2}))
    assert_in(msg, "simp.shuffle_static", "party 2", "i32[]@{0}", "1 <- 2")


@pytest.mark.parametrize("routes, role, rank", [({3: 0}, "destination", "3"),
                                                ({1: 7}, "source", "7")])
def test_shuffle_static_outside_the_world(routes, role, rank):
    msg = compile_error(lambda: simp.shuffle_static(on((0, 1, 2), 1), routes))
    assert_in(msg, "simp.shuffle_static", role, rank, "3-party world")


def test_shuffle_static_empty_routes():
    msg = compile_error(lambda: simp.shuffle_static(on((0,), 1), {}))
    assert_in(msg, "simp.shuffle_static", "must not be empty")


def test_shuffle_static_routes_must_be_a_dict():
    msg = compile_error(lambda: simp.shuffle_static(on((0,), 1), [(1, 0)]))
    assert_in(msg, "simp.shuffle_static", "dict")


def test_valid_shuffle_static_compiles_with_destination_pmask():
    p = mp.compile(lambda: simp.shuffle_static(on((0,), 1), {1: 0, 2: 0}), world_size=WORLD)
    assert [str(t) for t in p.output_types] == ["i32[]@{1,2}"]


@pytest.mark.parametrize(
    "make_index, shown",
    [(lambda: on((0, 1, 2), 1.0), "f32[]@{0,1,2}"),
     (lambda: on((0, 1, 2), True), "bool[]@{0,1,2}"),
     (lambda: on((0, 1, 2), [0, 1]), "i32[2]@{0,1,2}")],
    ids=["float", "bool", "vector"],
)
def test_shuffle_index_must_be_integer_scalar(make_index, shown):
    msg = compile_error(lambda: simp.shuffle(simp.prank(), make_index()))
    assert_in(msg, "simp.shuffle", "integer scalar", shown)


def test_valid_shuffle_takes_the_index_pmask():
    p = mp.compile(lambda: simp.shuffle(simp.prank(), on((1, 2), 0)), world_size=WORLD)
    assert [str(t) for t in p.output_types] == ["i32[]@{1,2}"]


# ---------------------------------------------------------------- constant


@pytest.mark.parametrize("parties, shown", [((3,), "{3}"), ((0, 4), "{0,4}")])
def test_constant_on_party_outside_the_world(parties, shown):
    msg = compile_error(lambda: simp.constant(parties, 1))
    assert_in(msg, "simp.constant", shown, "outside the world of 3 parties")


def test_constant_outside_a_smaller_world():
    msg = compile_error(lambda: simp.constant((2,), 1), world_size=2)
    assert_in(msg, "simp.constant", "{2}", "2 parties")


def test_constant_on_no_party():
    msg = compile_error(lambda: simp.constant((), 1))
    assert_in(msg, "simp.constant", "empty")


def test_constant_with_negative_rank():
    msg = compile_error(lambda: simp.constant((-1,), 1))
    assert_in(msg, "simp.constant", "-1")


@pytest.mark.parametrize("value", [np.array(["a", "b"]), "abc", [b"x"], object()],
                         ids=["str-array", "str", "bytes", "object"])
def test_constant_of_non_numeric_value(value):
    msg = compile_error(lambda: simp.constant((0,), value))
    assert_in(msg, "simp.constant", "not supported")


def test_tensor_constant_of_string_array_in_pcall_body():
    def fn():
        return simp.pcall((0,), lambda: tensor.constant(np.array(["x"])))

    msg = compile_error(fn)
    assert_in(msg, "tensor.constant", "not supported")


# ---------------------------------------------------------------- run_jax


def python_float(x):
    return float(x)  # needs a concrete value: JAX cannot trace this


def test_run_jax_of_untraceable_function_names_it():
    def fn():
        return simp.pcall((0,), lambda v: tensor.run_jax(python_float, v), on((0,), 1))

    msg = compile_error(fn)
    assert_in(msg, "tensor.run_jax[python_float]", "could not trace", "i32[]")


def test_pcall_of_untraceable_jax_function_names_it():
    # a plain JAX function is accepted as a pcall body; if JAX cannot trace it,
    # the error is still a trace-time type error naming the function
    msg = compile_error(lambda: simp.pcall((0,), python_float, on((0,), 1)))
    assert_in(msg, "python_float")


def test_run_jax_unhashable_static_argument():
    def fn():
        return simp.pcall((0,), lambda v: tensor.run_jax(lambda a, s: a, v, {1, 2}), on((0,), 1))

    msg = compile_error(fn)
    assert_in(msg, "tensor.run_jax", "not hashable")

