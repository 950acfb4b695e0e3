"""`CostModel`: estimated seconds and message rounds of one op without regions.

Local ops (compute, sources) cost ``op_s + element_s * elements`` (inputs plus
outputs). A message costs ``latency_s + bytes / bandwidth_bytes_per_s``;
messages of one op that travel in parallel (the routes of a shuffle, the
shares of a seal) count once. Every primitive declares its cost rule in its dialect
(`local_cost` for a local op). Ops with regions get their cost from their regions
(see `mplang.analysis.schedule`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from mplang.edsl.graph import Operation, Value
from mplang.edsl.typing import BaseType, MPType, ValueType, numpy_dtype


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
    """Assumed iterations of ``simp.while_loop`` and of loops in secure-device code
    without a constant trip count."""
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


SYMBOLIC_ROWS = 10_000
"""The size estimates assume for a dimension known only at run time."""


def elements(t: ValueType) -> int:
    """Tensor elements of a value of type ``t`` (the plaintext of shares and ciphertexts)."""
    plain = _base(t).plaintext()
    return 0 if plain is None else plain.size_estimate(SYMBOLIC_ROWS)


def value_bytes(t: ValueType, model: CostModel) -> float:
    """Bytes of one party's copy of a value of type ``t``.

    Tensors: itemsize x elements; shares and ciphertexts (types without a fixed
    ``expansion``): ``share_factor`` x their plaintext's bytes; types of unknown
    size (keys): 0.
    """
    base = _base(t)
    plain = base.plaintext()
    if plain is None:
        return 0.0
    factor = model.share_factor if base.expansion is None else base.expansion
    return factor * numpy_dtype(plain.dtype).itemsize * plain.size_estimate(SYMBOLIC_ROWS)


def _elements_of(values: tuple[Value, ...]) -> int:
    return sum(elements(v.type) for v in values)


def local_cost(op: Operation, model: CostModel) -> OpCost:
    """The cost of a local op: fixed plus per element of its inputs and outputs."""
    return OpCost(model.local_s(_elements_of(op.inputs) + _elements_of(op.outputs)))


def leaf_cost(op: Operation, model: CostModel) -> OpCost:
    """The estimated cost of ``op``, an op whose cost does not come from regions: its
    primitive's cost rule, else (an unknown op) the cost of a local op."""
    rule = None if op.prim is None else op.prim.rule("cost")
    cost = local_cost(op, model) if rule is None else rule(op, model)
    if op.opcode in model.op_costs:
        return OpCost(float(model.op_costs[op.opcode]), cost.rounds)
    return cost


def predicate_check(model: CostModel) -> OpCost:
    """One round in which every party sends its boolean predicate to every other."""
    return OpCost(model.message_s(1.0), 1)
