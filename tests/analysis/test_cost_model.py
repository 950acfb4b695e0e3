"""`CostModel`: defaults, validation, value sizes and the cost of ops without regions."""

from __future__ import annotations

import pytest

from mplang.analysis import CostModel, OpCost, value_bytes
from mplang.analysis.cost_model import elements, leaf_cost, predicate_check
from mplang.dialects.spu import SecretShareType, SpuConfig
from mplang.edsl.graph import Operation, Value
from mplang.edsl.typing import BaseType, Mask, MPType, TensorType, ValueType


class OpaqueKey(BaseType):
    """A type of no tensor (as a key is): it has no size for the cost model."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpaqueKey)

    def __hash__(self) -> int:
        return 0

F32_10 = TensorType("float32", (10,))
SPU = SpuConfig("S", (0, 1), "SEMI2K", "FM64")


def v(name: str, t: ValueType) -> Value:
    return Value(name, t)


def mp_t(base: TensorType | SecretShareType, *parties: int) -> MPType:
    return MPType(base, Mask.of(parties))


def test_defaults() -> None:
    m = CostModel()
    assert (m.latency_s, m.bandwidth_bytes_per_s, m.op_s, m.element_s) == (1e-3, 125e6, 1e-6, 1e-9)
    assert (m.share_factor, m.loop_iterations, dict(m.op_costs)) == (2.0, 1, {})


@pytest.mark.parametrize("kwargs", [
    {"latency_s": -1.0}, {"bandwidth_bytes_per_s": 0.0}, {"op_s": -1e-6},
    {"element_s": -1.0}, {"share_factor": -2.0}, {"loop_iterations": -1},
    {"loop_iterations": 1.5}, {"loop_iterations": True},
])
def test_invalid_parameters_are_rejected(kwargs: dict[str, object]) -> None:
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        CostModel(**kwargs)  # type: ignore[arg-type]


def test_value_sizes(model: CostModel) -> None:
    assert value_bytes(TensorType("float32", (3, 4)), model) == 48
    assert value_bytes(mp_t(TensorType("float32", (3, 4)), 0), model) == 48
    assert value_bytes(TensorType("bool", ()), model) == 1
    assert value_bytes(TensorType("float64", (0, 5)), model) == 0
    share = SecretShareType("spu", TensorType("int32", (5,)))
    assert value_bytes(share, model) == 40  # 2 x 20 plaintext bytes
    assert value_bytes(share, CostModel(share_factor=3.0)) == 60
    assert value_bytes(OpaqueKey(), model) == 0
    assert elements(share) == 5 and elements(mp_t(F32_10, 0)) == 10
    assert elements(OpaqueKey()) == 0


def test_local_ops_cost_by_elements(model: CostModel) -> None:
    x, y = v("x", F32_10), v("y", F32_10)
    const = Operation("tensor.constant", (), (x,), {"value": None})
    assert leaf_cost(const, model) == OpCost(pytest.approx(0.01 + 10 * 0.001))
    neg = Operation("tensor.run_jax", (x,), (y,), {"fn": "neg"})
    assert leaf_cost(neg, model) == OpCost(pytest.approx(0.01 + 20 * 0.001))


def test_op_costs_replace_the_seconds_and_keep_the_rounds(model: CostModel) -> None:
    x, y = v("x", mp_t(F32_10, 0)), v("y", mp_t(F32_10, 1))
    fixed = CostModel(op_costs={"tensor.run_jax": 2.5, "simp.shuffle_static": 7.0})
    neg = Operation("tensor.run_jax", (v("a", F32_10),), (v("b", F32_10),), {"fn": "neg"})
    assert leaf_cost(neg, fixed) == OpCost(2.5, 0)
    move = Operation("simp.shuffle_static", (x,), (y,), {"routes": {1: 0}})
    assert leaf_cost(move, fixed) == OpCost(7.0, 1)


def test_shuffle_static_is_one_message_whatever_the_routes(model: CostModel) -> None:
    x = v("x", mp_t(F32_10, 0))
    one = Operation("simp.shuffle_static", (x,), (v("y", mp_t(F32_10, 1)),), {"routes": {1: 0}})
    many = Operation("simp.shuffle_static", (x,), (v("z", mp_t(F32_10, 1, 2, 3)),),
                     {"routes": {1: 0, 2: 0, 3: 0}})
    message = OpCost(pytest.approx(0.5 + 40 / 1000), 1)
    assert leaf_cost(one, model) == message
    assert leaf_cost(many, model) == message  # routes run in parallel


def test_values_moved_together_share_one_message(model: CostModel) -> None:
    x, y = v("x", mp_t(F32_10, 0)), v("y", mp_t(TensorType("int32", (5,)), 0))
    op = Operation("simp.shuffle_static", (x, y),
                   (v("x1", mp_t(F32_10, 1)), v("y1", mp_t(TensorType("int32", (5,)), 1))),
                   {"routes": {1: 0}})
    assert leaf_cost(op, model) == OpCost(pytest.approx(0.5 + (40 + 20) / 1000), 1)


def test_shuffle_static_that_keeps_values_in_place_is_free(model: CostModel) -> None:
    x = v("x", mp_t(F32_10, 0, 1))
    op = Operation("simp.shuffle_static", (x,), (v("y", mp_t(F32_10, 0, 1)),),
                   {"routes": {0: 0, 1: 1}})
    assert leaf_cost(op, model) == OpCost(0.0, 0)


def test_dynamic_shuffle_is_two_rounds(model: CostModel) -> None:
    x = v("x", mp_t(F32_10, 0, 1))
    index = v("i", mp_t(TensorType("int32", ()), 0, 1))
    op = Operation("simp.shuffle", (x, index), (v("y", mp_t(F32_10, 0, 1)),))
    # request (a 4-byte index), then transfer (40 bytes)
    assert leaf_cost(op, model) == OpCost(pytest.approx(0.5 + 4 / 1000 + 0.5 + 40 / 1000), 2)


def test_seal_and_reveal_are_one_round_of_shares(model: CostModel) -> None:
    plain = TensorType("int32", (5,))
    x = v("x", mp_t(plain, 0))
    shared = v("s", SPU.share_type(plain))
    seal = Operation("spu.seal", (x,), (shared,), SPU.attrs())
    reveal = Operation("spu.reveal", (shared,), (v("r", mp_t(plain, 1)),),
                       {**SPU.attrs(), "to": 1})
    one_share = OpCost(pytest.approx(0.5 + 40 / 1000), 1)  # 2 x 20 bytes
    assert leaf_cost(seal, model) == one_share
    assert leaf_cost(reveal, model) == one_share


def test_predicate_check_is_one_round_of_one_byte(model: CostModel) -> None:
    assert predicate_check(model) == OpCost(pytest.approx(0.5 + 1 / 1000), 1)


def test_message_time_is_linear_in_the_parameters() -> None:
    assert CostModel(latency_s=2.0, bandwidth_bytes_per_s=10.0).message_s(30) == 5.0
    assert CostModel(latency_s=4.0, bandwidth_bytes_per_s=10.0).message_s(30) == 7.0
    assert CostModel(latency_s=2.0, bandwidth_bytes_per_s=5.0).message_s(30) == 8.0
