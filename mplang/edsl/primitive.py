"""Primitives: one object per op name, with a type rule attached separately.

``bind`` records the op in the current tracer after running the type rule on
the operand types, so ill-typed programs fail while tracing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mplang.edsl.graph import Graph, Operation
from mplang.edsl.location import locate_error, user_location
from mplang.edsl.object import MPObject
from mplang.edsl.tracer import TraceObject, current_tracer
from mplang.edsl.typing import Mask, ValueType
from mplang.frontend.errors import MPLangError, MPTypeError, MPVerifyError
from mplang.frontend.registry import ExecutionModel, OpInfo, OpKind, OpTraits, register_op

TypeRule = Callable[[list[ValueType], dict[str, Any], Sequence[Graph], int], list[ValueType]]
"""``rule(input types, attrs, regions, world size) -> output types``; pure, raises MPTypeError."""

PrivateRule = Callable[[Operation], dict[str, Mask | None]]
"""``rule(op) -> {attr name: parties that may see it}`` for the attributes of ``op`` that
hold private data (None: the parties that run the op)."""


_PRIMITIVES: dict[str, Primitive] = {}


def get_primitive(name: str) -> Primitive | None:
    """The primitive called ``name`` (None if no dialect defines it)."""
    return _PRIMITIVES.get(name)


def check_types(graph: Graph, world_size: int, where: str = "graph") -> None:
    """Re-derive every op's output types with its type rule (recursively into regions).

    For graphs that did not come from the tracer (loaded or received): raises
    `MPVerifyError` naming the op, its region path and its source line when
    attributes are malformed or types disagree.
    """
    for index, op in enumerate(graph.operations):
        label = f"{where}: op #{index} {op.opcode}" + (f" (traced at {op.loc})" if op.loc else "")
        prim = _PRIMITIVES.get(op.opcode)
        if prim is None:
            raise MPVerifyError(f"{label}: unknown op")
        for region_index, region in enumerate(op.regions):
            check_types(region, world_size, f"{where}: op #{index} region {region_index}")
        try:
            expected = prim.infer([v.type for v in op.inputs], dict(op.attrs), op.regions,
                                  world_size)
        except MPLangError as e:
            raise MPVerifyError(f"{label}: {e}") from None
        except Exception as e:
            raise MPVerifyError(f"{label}: malformed attributes ({type(e).__name__}: {e})"
                                ) from None
        found = [v.type for v in op.outputs]
        if found != list(expected):
            raise MPVerifyError(f"{label}: outputs are typed ({', '.join(map(str, found))}) but "
                                f"its type rule gives ({', '.join(map(str, expected))})")


class Primitive:
    """A named op. Creating one registers it in the op registry with its traits
    (`OpTraits`: effects, communication, fusion, batching, cost); an op that
    declares no traits gets the safe defaults."""

    def __init__(
        self,
        name: str,
        *,
        kind: OpKind,
        execution_model: ExecutionModel,
        traits: OpTraits | None = None,
        doc: str = "",
    ):
        self.name = name
        self.info = OpInfo(name, name.split(".")[0], kind, execution_model, doc,
                           traits or OpTraits())
        register_op(self.info)
        _PRIMITIVES[name] = self
        self._type_rule: TypeRule | None = None
        self._private_rule: PrivateRule | None = None

    def def_private(self, rule: PrivateRule) -> PrivateRule:
        """Declare which attributes of this op hold private data, and who may see them."""
        if self._private_rule is not None:
            raise ValueError(f"{self.name} already has a private-attribute rule")
        self._private_rule = rule
        return rule

    def private_attrs(self, op: Operation) -> dict[str, Mask | None]:
        """The private attributes of ``op`` and the parties that may see each."""
        return {} if self._private_rule is None else self._private_rule(op)

    def def_type_rule(self, rule: TypeRule) -> TypeRule:
        """Attach ``rule`` as this primitive's type rule (once); usable as a decorator."""
        if self._type_rule is not None:
            raise ValueError(f"{self.name} already has a type rule")
        self._type_rule = rule
        return rule

    def infer(self, in_types: list[ValueType], attrs: dict[str, Any],
              regions: Sequence[Graph], world_size: int) -> list[ValueType]:
        """The output types of this op on ``in_types``, by its type rule."""
        if self._type_rule is None:
            raise NotImplementedError(f"{self.name} has no type rule")
        return self._type_rule(in_types, attrs, regions, world_size)

    def bind(
        self,
        operands: Sequence[MPObject],
        attrs: dict[str, Any] | None = None,
        regions: Sequence[Graph] = (),
    ) -> list[TraceObject]:
        """Record this op with ``operands`` in the current tracer; return its outputs."""
        tracer = current_tracer(self.name)
        loc = user_location(2)
        try:
            model = self.info.execution_model
            if model == "single_rank" and not tracer.local:
                raise MPTypeError(
                    f"{self.name} is a party-local op; at the simp level run it inside "
                    "simp.pcall(parties, fn, ...)"
                )
            if model == "multi_party" and tracer.local:
                raise MPTypeError(
                    f"{self.name} runs across parties and cannot be used inside a party-local "
                    "region (a pcall body)"
                )
            inputs = [tracer.lift(x) for x in operands]
            attrs = attrs or {}
            out_types = self.infer([v.type for v in inputs], attrs, regions, tracer.world_size)
        except MPTypeError as e:
            locate_error(e)
            raise
        return tracer.add_op(self.name, inputs, out_types, attrs, regions, loc)

    def __repr__(self) -> str:
        return f"Primitive({self.name})"
