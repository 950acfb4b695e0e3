"""`CostModel`: estimated seconds and message rounds of one op without regions.

Local ops (compute, sources) cost ``op_s + element_s * elements`` (inputs plus
outputs). A message costs ``latency_s + bytes / bandwidth_bytes_per_s``;
messages of one op that travel in parallel (the routes of a shuffle, the
shares of a seal) count once. Ops with regions get their cost from their
regions (see `mplang.analysis.schedule`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mplang.analysis.spu_rounds import estimate_spu_rounds
from mplang.edsl.graph import Operation, Value
from mplang.edsl.typing import (
    BaseType,
    CiphertextType,
    MPType,
    SecretShareType,
    TensorType,
    ValueType,
    numpy_dtype,
)
from mplang.frontend.registry import get_op, is_registered


@dataclass(frozen=True)
class CostModel:
    """The parameters of the estimates; every field has a documented default.

    Defaults: a 1 ms, 1 Gbit/s LAN (``latency_s=1e-3``, ``bandwidth_bytes_per_s=125e6``),
    1 µs per local op plus 1 ns per element it reads or writes, a share twice the
    size of its plaintext (a 64-bit ring element per 32-bit value), one iteration
    per ``simp.while_loop`` (its trip count is data-dependent).
    """

    latency_s: float = 1e-3
    """One-way latency of one message between two parties."""
    bandwidth_bytes_per_s: float = 125e6
    """Bandwidth of one link."""
    op_s: float = 1e-6
    """Fixed cost of a local op (dispatch, kernel launch)."""
    element_s: float = 1e-9
    """Cost per tensor element a local op reads or writes."""
    share_factor: float = 2.0
    """Bytes of one party's secret share (or ciphertext) per plaintext byte."""
    loop_iterations: int = 1
    """Assumed iterations of ``simp.while_loop`` and of SPU loops without a constant trip count."""
    op_costs: Mapping[str, float] = field(default_factory=dict)
    """Fixed seconds of ops by opcode, replacing the estimate of ops without regions
    (their rounds are kept)."""

    def __post_init__(self) -> None:
        for name in ("latency_s", "op_s", "element_s", "share_factor"):
            if getattr(self, name) < 0:
                raise ValueError(f"CostModel.{name} must be >= 0, got {getattr(self, name)}")
        if self.bandwidth_bytes_per_s <= 0:
            raise ValueError("CostModel.bandwidth_bytes_per_s must be > 0")
        if isinstance(self.loop_iterations, bool) or not isinstance(self.loop_iterations, int) \
                or self.loop_iterations < 0:
            raise ValueError(f"CostModel.loop_iterations must be an int >= 0, "
                             f"got {self.loop_iterations!r}")

    def message_s(self, nbytes: float) -> float:
        """The time of one message of ``nbytes`` bytes."""
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s

    def local_s(self, elements: int) -> float:
        """The time of a local op touching ``elements`` tensor elements."""
        return self.op_s + self.element_s * elements


@dataclass(frozen=True)
class OpCost:
    """Estimated seconds and sequential message rounds of one op."""

    seconds: float
    rounds: int = 0


def _base(t: ValueType) -> BaseType:
    return t.base if isinstance(t, MPType) else t


def elements(t: ValueType) -> int:
    """Tensor elements of a value of type ``t`` (its plaintext for shares and ciphertexts)."""
    base = _base(t)
    if isinstance(base, (SecretShareType, CiphertextType)):
        base = base.plaintext
    return math.prod(base.shape) if isinstance(base, TensorType) else 0


def value_bytes(t: ValueType, model: CostModel) -> float:
    """Bytes of one party's copy of a value of type ``t``.

    Tensors: itemsize x elements; shares and ciphertexts: ``share_factor`` x
    their plaintext's bytes; types of unknown size (tables, keys): 0.
    """
    base = _base(t)
    if isinstance(base, TensorType):
        return float(numpy_dtype(base.dtype).itemsize * math.prod(base.shape))
    if isinstance(base, (SecretShareType, CiphertextType)):
        return model.share_factor * value_bytes(base.plaintext, model)
    return 0.0


def _elements_of(values: tuple[Value, ...]) -> int:
    return sum(elements(v.type) for v in values)


def _local(op: Operation, model: CostModel) -> OpCost:
    return OpCost(model.local_s(_elements_of(op.inputs) + _elements_of(op.outputs)))


def _bytes_of(values: tuple[Value, ...], model: CostModel) -> float:
    return sum(value_bytes(v.type, model) for v in values)


def _shuffle_static(op: Operation, model: CostModel) -> OpCost:
    """One message per route, all routes at once; several values share each message."""
    routes: Mapping[int, int] = op.attrs["routes"]
    if all(dst == src for dst, src in routes.items()):
        return OpCost(0.0)
    return OpCost(model.message_s(_bytes_of(op.inputs, model)), 1)


def _shuffle(op: Operation, model: CostModel) -> OpCost:
    x, index = op.inputs
    ask, give = value_bytes(index.type, model), value_bytes(x.type, model)
    return OpCost(model.message_s(ask) + model.message_s(give), 2)


def _one_share_message(op: Operation, model: CostModel) -> OpCost:
    """Seal: the owner sends each member its shares; reveal: each member sends the receiver
    its shares. The members' messages travel in parallel."""
    shares = op.outputs if op.opcode == "spu.seal" else op.inputs
    return OpCost(model.message_s(_bytes_of(shares, model)), 1)


def spu_run_rounds(op: Operation, model: CostModel) -> int:
    """Estimated protocol rounds of an ``spu.run`` (see `mplang.analysis.spu_rounds`)."""
    return estimate_spu_rounds(bytes(op.attrs["executable"]), str(op.attrs.get("field", "FM64")),
                               model.loop_iterations)


def _spu_run(op: Operation, model: CostModel) -> OpCost:
    """Each round moves about one share of the largest operand or result."""
    rounds = spu_run_rounds(op, model)
    largest = max((value_bytes(v.type, model) for v in (*op.inputs, *op.outputs)), default=0.0)
    compute = _local(op, model).seconds
    return OpCost(compute + rounds * model.message_s(largest), rounds)


LeafCost = Callable[[Operation, CostModel], OpCost]

LEAF_COSTS: dict[str, LeafCost] = {
    "simp.shuffle_static": _shuffle_static,
    "simp.shuffle": _shuffle,
    "spu.seal": _one_share_message,
    "spu.reveal": _one_share_message,
    "spu.run": _spu_run,
}
"""Cost rules by opcode; other ops without regions cost as local ops, except
unlisted communication ops, which cost one message of their outputs."""


def leaf_cost(op: Operation, model: CostModel) -> OpCost:
    """The estimated cost of ``op``, an op whose cost does not come from regions."""
    rule = LEAF_COSTS.get(op.opcode)
    if rule is not None:
        cost = rule(op, model)
    elif is_registered(op.opcode) and get_op(op.opcode).kind == "communication":
        nbytes = max((value_bytes(v.type, model) for v in op.outputs), default=0.0)
        cost = OpCost(model.message_s(nbytes), 1)
    else:
        cost = _local(op, model)
    if op.opcode in model.op_costs:
        return OpCost(float(model.op_costs[op.opcode]), cost.rounds)
    return cost


def predicate_check(model: CostModel) -> OpCost:
    """One round in which every party sends its boolean predicate to every other."""
    return OpCost(model.message_s(1.0), 1)
