"""Primitives: one object per op, declared once in its dialect, with every rule keyed on it.

A declaration states the op's operands (with type constraints), typed attributes,
results, regions, traits and targets::

    shuffle_p = Primitive(
        "simp.shuffle", kind="communication", execution_model="multi_party",
        operands=[Operand("x", SIMP), Operand("index", SIMP)], results=[Result("y", SIMP)],
        traits=OpTraits(pure=True, runtimes=WORKER_AND_DRIVER), cost=shuffle_cost,
        doc="Each party holding an index receives the value of party `index`.")

    @shuffle_p.def_type_rule
    def _rule(sig: Signature) -> list[ValueType]: ...

Arity, attribute types and defaults are checked from the declaration before the
type rule runs, so a rule reads its operands and attributes by name (``sig.x``,
``sig.routes``). The dialect attaches its type, flow, cost and private-attribute
rules; the backend attaches kernels per runtime and the payload check. A second
registration of the same rule is refused, naming both places.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from mplang.edsl.attrs import Attr
from mplang.edsl.errors import MPLangError, MPTypeError, MPVerifyError
from mplang.edsl.location import locate_error, user_location
from mplang.edsl.registry import PRIMITIVES, get_primitive, primitive, primitives
from mplang.edsl.tracer import current_tracer
from mplang.edsl.traits import RUNTIMES, ExecutionModel, OpKind, OpTraits, Runtime
from mplang.edsl.typing import BaseType, Mask, MPType, ValueType

if TYPE_CHECKING:
    from mplang.edsl.graph import Graph, Operation
    from mplang.edsl.tracer import TraceObject

__all__ = ["ANY", "LOCAL", "SIMP", "Constraint", "Operand", "Primitive", "Result", "Signature",
           "check_types", "get_primitive", "held", "of_type", "primitive", "primitives"]


# ---------------------------------------------------------------- type constraints


@dataclass(frozen=True)
class Constraint:
    """A predicate on an operand's or result's type, with the name errors use for it;
    ``classes``: the test is exactly ``isinstance(t, classes)`` (checked inline)."""

    name: str
    test: Callable[[ValueType], bool]
    classes: tuple[type, ...] | None = None

    def __str__(self) -> str:
        return self.name


def of_type(*classes: type, name: str | None = None) -> Constraint:
    """Types that are instances of ``classes`` (party-local values)."""
    label = name or " | ".join(c.__name__ for c in classes)
    return Constraint(label, lambda t: isinstance(t, classes), classes)


def held(*classes: type, name: str | None = None) -> Constraint:
    """Simp-level values (`MPType`) whose base type is an instance of ``classes``."""
    label = name or "mp<" + " | ".join(c.__name__ for c in classes) + ">"
    return Constraint(label, lambda t: isinstance(t, MPType) and isinstance(t.base, classes))


ANY = Constraint("any", lambda t: True, (object,))
"""Any type, at either level."""
LOCAL = of_type(BaseType, name="a party-local value")
"""A party-local value (a bare base type)."""
SIMP = of_type(MPType, name="a simp-level value")
"""A simp-level value (an `MPType`: a base type and its holders)."""


@dataclass(frozen=True)
class Operand:
    """A declared operand; a ``variadic`` one takes any number of values (at most one per op)."""

    name: str
    type: Constraint = ANY
    variadic: bool = False
    doc: str = ""


@dataclass(frozen=True)
class Result(Operand):
    """A declared result; a ``variadic`` one stands for any number of outputs."""


def _arity(decls: Sequence[Operand] | Sequence[Result]) -> tuple[int, bool]:
    return sum(1 for d in decls if not d.variadic), any(d.variadic for d in decls)


# ---------------------------------------------------------------- what a type rule sees


class Signature:
    """What a type rule sees: operand types (``inputs``, or by declared name as
    attributes), attributes (checked, defaults filled; also by name), regions and the
    world size. Type rules are pure: they never see data."""

    prim: Primitive
    inputs: list[ValueType]
    attrs: dict[str, Any]
    regions: Sequence[Graph]
    world_size: int

    def __init__(self, prim: Primitive, inputs: list[ValueType], attrs: dict[str, Any],
                 regions: Sequence[Graph], world_size: int):
        # one dict build: a type rule runs for every traced op
        self.__dict__ = {**attrs, **prim.named_operands(inputs), "prim": prim,
                         "inputs": inputs, "attrs": attrs, "regions": regions,
                         "world_size": world_size}

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"{self.prim.name} declares no operand or attribute {name!r}")


_RESERVED = frozenset(["prim", "inputs", "attrs", "regions", "world_size"])
"""Names a declaration may not give an operand or attribute (the `Signature`'s own)."""


TypeRule = Callable[[Signature], Sequence[ValueType]]
"""``rule(sig) -> output types``; pure, raises `MPTypeError` naming the op."""
PrivateRule = Callable[["Operation"], dict[str, Mask | None]]
"""``rule(op) -> {attr name: parties that may see it}`` for the attributes of ``op`` that
hold private data (None: the parties that run the op)."""


_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def _place(path: str, line: int) -> str:
    """``path:line``, the path relative to the package's parent folder when inside it."""
    return f"{path[len(_ROOT):] if path.startswith(_ROOT) else path}:{line}"


def _where(fn: Callable[..., Any]) -> str:
    """``path:line`` of a rule's definition (of the function a wrapper wraps)."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    return repr(fn) if code is None else _place(code.co_filename, code.co_firstlineno)


def _caller(frame: FrameType) -> str:
    """``path:line`` of the code that declared a primitive."""
    return _place(frame.f_code.co_filename, frame.f_lineno)


RULES = ("type", "flow", "local_flow", "cost", "private", "payload_check")
"""The rules a primitive may carry besides its kernels: the type rule, the flow rules at
the simp level and inside party-local regions, the cost rule, the private-attribute rule
and the check of native payloads (bytes that C++ code parses)."""

_MISSING: Any = object()


class Primitive:
    """A declared op. Creating one registers it; every rule and kernel registers on it."""

    def __init__(
        self,
        name: str,
        *,
        kind: OpKind,
        execution_model: ExecutionModel,
        results: Sequence[Result],
        operands: Sequence[Operand] = (),
        attrs: Mapping[str, Attr] | None = None,
        regions: Sequence[str] = (),
        traits: OpTraits | None = None,
        targets: Sequence[str] = (),
        doc: str = "",
        cost: Callable[..., Any] | None = None,
        flow: Callable[..., Any] | None = None,
        local_flow: Callable[..., Any] | None = None,
    ):
        dialect, dot, short = name.partition(".")
        if not dot or not dialect.isidentifier() or not short:
            raise ValueError(f"op {name!r} must be named DIALECT.OP")
        here = _caller(sys._getframe(1))
        if name in PRIMITIVES:
            raise ValueError(f"op {name!r} is already declared (at {PRIMITIVES[name].declared_at});"
                             f" a second declaration at {here} is refused")
        for decls, what in ((operands, "operand"), (results, "result")):
            if sum(d.variadic for d in decls) > 1:
                raise ValueError(f"{name}: at most one variadic {what}")
        taken = _RESERVED & ({d.name for d in operands} | set(attrs or {}))
        if taken:
            raise ValueError(f"{name}: {sorted(taken)} cannot name an operand or attribute "
                             "(a type rule's signature uses them)")
        self.name = name
        self.declared_at: str = here
        """``path:line`` of the declaration."""
        self.dialect = dialect
        self.kind: OpKind = kind
        self.execution_model: ExecutionModel = execution_model
        self.operands = tuple(operands)
        self.attrs: dict[str, Attr] = dict(attrs or {})
        self.required_attrs = tuple(n for n, a in self.attrs.items() if not a.optional)
        """The attributes every op of this primitive has (the others only when given)."""
        self.results = tuple(results)
        self._arities = {"operand": _arity(self.operands), "result": _arity(self.results)}
        self._names = tuple(d.name for d in self.operands)
        self._attr_checks = [(name, spec, spec.types, spec.simple)
                             for name, spec in self.attrs.items()]
        self._variadic = next((i for i, d in enumerate(self.operands) if d.variadic), -1)
        self.regions = tuple(regions)
        self.traits = traits or OpTraits()
        self.targets = tuple(targets)
        self.doc = doc
        self.kernels: dict[Runtime, Callable[..., Any]] = {}
        self.rules: dict[str, Callable[..., Any]] = {}
        self._places: dict[str, str] = {}
        for rule, fn in (("cost", cost), ("flow", flow), ("local_flow", local_flow)):
            if fn is not None:
                self._attach(rule, fn)
        PRIMITIVES[name] = self

    # -- registration

    def _attach(self, slot: str, fn: Callable[..., Any], override: bool = False) -> None:
        place = _where(fn)
        if slot in self._places and not override:
            raise ValueError(f"{self.name} already has a {slot.replace('_', ' ')} "
                             f"(registered at {self._places[slot]}); a second one at {place} "
                             "is refused")
        self._places[slot] = place
        if slot.startswith("kernel:"):
            self.kernels[slot.split(":", 1)[1]] = fn  # type: ignore[index]
        else:
            self.rules[slot] = fn

    def _decorator(self, slot: str, override: bool = False
                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._attach(slot, fn, override)
            return fn
        return deco

    def def_type_rule(self, rule: TypeRule) -> TypeRule:
        """Attach this primitive's type rule (once); usable as a decorator."""
        self._attach("type", rule)
        return rule

    def def_flow(self, rule: Callable[..., Any]) -> Callable[..., Any]:
        """Attach the flow rule at the simp level (`mplang.flows.engine`)."""
        self._attach("flow", rule)
        return rule

    def def_local_flow(self, rule: Callable[..., Any]) -> Callable[..., Any]:
        """Attach the flow rule inside party-local regions (`mplang.flows.engine`)."""
        self._attach("local_flow", rule)
        return rule

    def def_cost(self, rule: Callable[..., Any]) -> Callable[..., Any]:
        """Attach the cost rule: ``rule(op, cost_model) -> OpCost``."""
        self._attach("cost", rule)
        return rule

    def def_private(self, rule: PrivateRule) -> PrivateRule:
        """Declare which attributes of this op hold private data, and who may see them."""
        self._attach("private", rule)
        return rule

    def def_payload_check(self, check: Callable[[Operation], None]) -> Callable[..., None]:
        """Attach the check of this op's native payloads (raises `MPSerializationError`)."""
        self._attach("payload_check", check)
        return check

    def def_kernel(self, runtime: Runtime = "worker", *, override: bool = False
                   ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register this op's kernel for ``runtime`` (decorator); once unless ``override``."""
        if runtime not in RUNTIMES:
            raise ValueError(f"{self.name}: unknown runtime {runtime!r}")
        return self._decorator(f"kernel:{runtime}", override)

    def rule(self, slot: str) -> Callable[..., Any] | None:
        """The rule in ``slot`` (one of `RULES`), or None."""
        return self.rules.get(slot)

    def registered_at(self, slot: str) -> str | None:
        """Where the rule or kernel (``kernel:RUNTIME``) in ``slot`` was defined."""
        return self._places.get(slot)

    # -- derived behaviour

    @property
    def side_effects(self) -> bool:
        """Whether the op has effects (not ``traits.pure``)."""
        return not self.traits.pure

    def private_attrs(self, op: Operation) -> dict[str, Mask | None]:
        """The private attributes of ``op`` and the parties that may see each."""
        rule = self.rules.get("private")
        return {} if rule is None else rule(op)

    def named_operands(self, types: Sequence[Any]) -> dict[str, Any]:
        """Operand name -> its type (a list for the variadic operand)."""
        v = self._variadic
        if v < 0:
            return dict(zip(self._names, types, strict=True))
        if len(self._names) == 1:
            return {self._names[0]: list(types)}
        after = len(self._names) - v - 1
        end = len(types) - after
        named = dict(zip(self._names[:v], types[:v], strict=True))
        named[self._names[v]] = list(types[v:end])
        named.update(zip(self._names[v + 1:], types[end:], strict=True))
        return named

    def check_attrs(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """``attrs`` checked against the declaration, defaults filled (`MPTypeError`)."""
        out: dict[str, Any] = {}
        given = 0
        for name, spec, types, simple in self._attr_checks:
            value = attrs.get(name, _MISSING)
            if value is _MISSING:
                if spec.required:
                    raise MPTypeError(f"{self.name}: attribute {name!r} is required")
                if spec.optional:
                    continue
                value = spec.default
            else:
                given += 1
                if not (simple and isinstance(value, types) and type(value) is not bool):
                    problem = spec.problem(value)
                    if problem is not None:
                        raise MPTypeError(f"{self.name}: attribute {name!r} {problem}")
            out[name] = value
        if given != len(attrs):
            unknown = sorted(set(attrs) - set(self.attrs))
            raise MPTypeError(f"{self.name}: unknown attribute(s) {unknown}; it declares "
                              f"{sorted(self.attrs) or 'none'}")
        return out

    def _check_arity(self, what: str, decls: Sequence[Operand] | Sequence[Result],
                     types: Sequence[ValueType]) -> None:
        fixed, variadic = self._arities[what]
        if len(types) < fixed or (not variadic and len(types) != fixed):
            names = ", ".join(d.name + ("..." if d.variadic else "") for d in decls) or "none"
            count = f"at least {fixed}" if variadic else str(fixed)
            raise MPTypeError(f"{self.name}: takes {count} {what}s ({names}), got "
                              f"{len(types)}")
        extra = len(types) - fixed
        i = 0
        for decl in decls:
            n = extra if decl.variadic else 1
            classes = decl.type.classes
            for j in range(i, i + n):
                one = types[j]
                if not (isinstance(one, classes) if classes is not None else decl.type.test(one)):
                    label = f"{decl.name}[{j - i}]" if decl.variadic else decl.name
                    raise MPTypeError(f"{self.name}: {what} {label} must be {decl.type}, "
                                      f"got {one}")
            i += n

    def infer(self, in_types: list[ValueType], attrs: Mapping[str, Any],
              regions: Sequence[Graph], world_size: int) -> list[ValueType]:
        """The output types of this op, after checking it against its declaration."""
        return self._infer(in_types, self.check_attrs(attrs), regions, world_size)

    def _infer(self, in_types: list[ValueType], checked: dict[str, Any],
               regions: Sequence[Graph], world_size: int) -> list[ValueType]:
        rule = self.rules.get("type")
        if rule is None:
            raise NotImplementedError(f"{self.name} has no type rule")
        self._check_arity("operand", self.operands, in_types)
        if len(regions) != len(self.regions):
            raise MPTypeError(f"{self.name}: takes {len(self.regions)} region(s) "
                              f"({', '.join(self.regions) or 'none'}), got {len(regions)}")
        outs = list(rule(Signature(self, in_types, checked, regions, world_size)))
        self._check_arity("result", self.results, outs)
        return outs

    def bind(self, operands: Sequence[Any], attrs: Mapping[str, Any] | None = None,
             regions: Sequence[Graph] = ()) -> list[TraceObject]:
        """Record this op with ``operands`` in the current tracer; return its outputs.

        Attributes are stored with the declaration's defaults filled in."""
        tracer = current_tracer(self.name)
        loc = user_location(2)
        try:
            model = self.execution_model
            if model == "single_rank" and not tracer.local:
                raise MPTypeError(
                    f"{self.name} is a party-local op; at the simp level run it inside "
                    "simp.pcall(parties, fn, ...)")
            if model == "multi_party" and tracer.local:
                raise MPTypeError(
                    f"{self.name} runs across parties and cannot be used inside a party-local "
                    "region (a pcall body)")
            inputs = [tracer.lift(x) for x in operands]
            checked = self.check_attrs(attrs or {})
            out_types = self._infer([v.type for v in inputs], checked, regions,
                                    tracer.world_size)
        except MPTypeError as e:
            locate_error(e)
            raise
        return tracer.add_op(self.name, inputs, out_types, checked, regions, loc)

    def describe(self) -> dict[str, Any]:
        """The whole contract as plain data: operands, attributes, results, regions,
        traits, targets, kernels per runtime, and the type, flow, cost, private-attribute
        and payload rules (each with where it is defined, or None). ``flow`` is the op's
        flow rule at its level (inside party-local regions for a single-rank op);
        ``local_flow`` the rule inside local regions of an op that runs at both."""
        t = self.traits

        def decl(d: Operand | Result) -> dict[str, Any]:
            return {"name": d.name, "type": str(d.type), "variadic": d.variadic, "doc": d.doc}

        def rule(slot: str) -> dict[str, Any] | None:
            fn = self.rules.get(slot)
            if fn is None:
                return None
            return {"name": getattr(fn, "__qualname__", repr(fn)),
                    "module": getattr(fn, "__module__", None),
                    "doc": (fn.__doc__ or "").strip().split("\n\n")[0],
                    "where": self._places[slot]}

        return {
            "name": self.name, "dialect": self.dialect, "kind": self.kind,
            "execution_model": self.execution_model, "doc": self.doc,
            "declared_at": self.declared_at,
            "operands": [decl(d) for d in self.operands],
            "attributes": [{"name": n, **a.to_dict()} for n, a in self.attrs.items()],
            "results": [decl(d) for d in self.results],
            "regions": list(self.regions),
            "traits": {"pure": t.pure, "communicates": t.communicates, "regions": t.regions,
                       "fusable": t.fusable, "batchable": t.batchable,
                       "runtimes": list(t.runtimes)},
            "side_effects": self.side_effects,
            "targets": list(self.targets),
            "kernels": {r: r in self.kernels for r in RUNTIMES},
            "kernel_sources": {r: self._places[f"kernel:{r}"] for r in RUNTIMES
                               if r in self.kernels},
            "type_rule": rule("type"),
            "flow": rule("flow") if "flow" in self.rules else rule("local_flow"),
            "local_flow": rule("local_flow"),
            "cost": rule("cost"), "private": rule("private"),
            "payload_check": rule("payload_check"),
        }

    def __repr__(self) -> str:
        return f"Primitive({self.name})"


# ---------------------------------------------------------------- the registry


def check_types(graph: Graph, world_size: int, where: str = "graph") -> None:
    """Re-derive every op's output types with its type rule (recursively into regions).

    For graphs that did not come from the tracer (loaded or received): raises
    `MPVerifyError` naming the op, its region path and its source line when its
    operands, attributes or regions do not fit its declaration or types disagree.
    """
    for index, op in enumerate(graph.operations):
        label = f"{where}: op #{index} {op.opcode}" + (f" (traced at {op.loc})" if op.loc else "")
        prim = op.prim
        if prim is None:
            raise MPVerifyError(f"{label}: unknown op")
        for region_index, region in enumerate(op.regions):
            check_types(region, world_size, f"{where}: op #{index} region {region_index}")
        if not set(prim.required_attrs) <= set(op.attrs) <= set(prim.attrs):
            missing = sorted(set(prim.required_attrs) - set(op.attrs))
            extra = sorted(set(op.attrs) - set(prim.attrs))
            raise MPVerifyError(f"{label}: attributes do not match the declaration "
                                f"(missing {missing}, unknown {extra})")
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
