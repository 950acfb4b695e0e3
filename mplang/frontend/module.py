"""`FeModule`: a dialect's frontend ops written in a few lines each.

``simple_op`` turns a type-only function into a primitive plus its frontend op::

    cms = FeModule("cms")

    @cms.simple_op()
    def build(x: TensorType, *, width: int, depth: int) -> SketchType:
        return SketchType(width, depth)

Calling ``cms.build(obj, width=64, depth=4)`` binds ``cms.build``: positional
arguments are MPLang objects (the op's inputs), keyword arguments are
attributes stored in the op. The decorated function is the type rule: it gets
the inputs' types and the attributes and returns the output type (or a tuple of
them); it never sees data. Its signature is the op's declaration: positional
parameters are the operands (an annotation naming `BaseType` classes constrains
their types), keyword-only ones the attributes (their annotations the attribute
types, their defaults the defaults; ``attrs=`` and a ``config_schema`` add bounds,
choices and docs), and the return annotation the results. The primitive is
``cms.prims.build``; its kernels are registered on it by the backend.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mplang.analysis.cost_model import local_cost
from mplang.edsl.attrs import Attr, ConfigSchema, NoneType
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import (
    LOCAL,
    SIMP,
    Constraint,
    Operand,
    Primitive,
    Result,
    Signature,
    held,
    of_type,
)
from mplang.edsl.traits import LOCAL_PURE, ExecutionModel, OpKind, OpTraits
from mplang.edsl.typing import BaseType, MPType, ValueType
from mplang.flows.engine import conservative, local_conservative
from mplang.frontend.feop import feop


def _attr_type(hint: Any) -> type | tuple[type, ...]:
    """The Python type(s) an attribute annotation admits (``object`` when it names none)."""
    if hint is float:
        return (float, int)
    if isinstance(hint, type):
        return hint
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        parts = [NoneType if a is None else a for a in typing.get_args(hint)]
        if all(isinstance(a, type) for a in parts):
            return tuple(parts)
    origin = typing.get_origin(hint)
    return origin if isinstance(origin, type) else object


def _constraint(hint: Any, multi: bool) -> Constraint:
    """The constraint of an operand or result annotated ``hint``: the `BaseType` classes
    it names (a class or a union of them; held at the simp level for a multi-party op),
    else any value of the op's level."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    parts = typing.get_args(hint) if union else (hint,)
    if not all(isinstance(p, type) and issubclass(p, BaseType) and p is not BaseType
               for p in parts):
        return SIMP if multi else LOCAL
    return held(*parts) if multi else of_type(*parts)


def _results(hints: Mapping[str, Any], multi: bool) -> list[Result]:
    ret = hints.get("return")
    if typing.get_origin(ret) is tuple:
        return [Result(f"out{i}", _constraint(h, multi))
                for i, h in enumerate(typing.get_args(ret))]
    return [Result("out", _constraint(ret, multi))]


class FeModule:
    """A namespace of frontend ops belonging to dialect ``name`` (also their family)."""

    def __init__(self, name: str):
        if not name.isidentifier():
            raise ValueError(f"a module name is an identifier, got {name!r}")
        self.name = name
        self.ops: dict[str, Callable[..., Any]] = {}
        self.prims = types.SimpleNamespace()
        """The primitives of the module's ops by short name (``crypto.prims.sha256``)."""

    def simple_op(self, name: str | None = None, *,
                  execution_model: ExecutionModel = "single_rank",
                  traits: OpTraits | None = None, kind: OpKind = "compute",
                  attrs: Mapping[str, Attr] | None = None,
                  config_schema: ConfigSchema | None = None, targets: Sequence[str] = (),
                  capabilities: Mapping[str, Any] | None = None,
                  cost: Callable[..., Any] = local_cost, flow: Callable[..., Any] | None = None,
                  example: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Make a type-only function an op ``{module}.{name}`` (default: its own name).

        ``single_rank`` ops (the default) run in party-local regions and get base
        types; ``multi_party`` ops get simp-level types. ``traits`` default to a
        pure local op. Keyword-only parameters are the attributes; ``*args`` and
        ``**kwargs`` are refused, since the signature must be explicit. The fields of
        ``config_schema``, then ``attrs``, replace the declarations the signature gives
        the attributes they name (to add bounds, choices and docs). ``cost`` is the cost
        rule (a local op's by default) and ``flow`` the flow rule (the conservative one by
        default: every result is raw of every input).
        """
        def deco(rule: Callable[..., Any]) -> Callable[..., Any]:
            op_name = f"{self.name}.{name or rule.__name__}"
            params = list(inspect.signature(rule).parameters.values())
            if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
                raise TypeError(f"{op_name}: a simple op's signature must be explicit "
                                "(no *args or **kwargs)")
            positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                           p.POSITIONAL_OR_KEYWORD)]
            keyword = [p for p in params if p.kind == p.KEYWORD_ONLY]
            attr_names = {p.name for p in keyword}
            schema = dict(config_schema.fields) if config_schema is not None else {}
            for given, what in ((schema, "config fields"), (attrs or {}, "attrs")):
                if not set(given) <= attr_names:
                    extra = sorted(set(given) - attr_names)
                    raise TypeError(f"{op_name}: {what} {extra} are not keyword-only "
                                    "attributes of the op")
            multi = execution_model == "multi_party"
            hints = typing.get_type_hints(rule)
            declared = {p.name: Attr(_attr_type(hints.get(p.name, object)),
                                     required=p.default is p.empty,
                                     default=None if p.default is p.empty else p.default)
                        for p in keyword}
            declared.update(schema)
            declared.update(attrs or {})
            if flow is not None:
                flows = {"flow" if multi else "local_flow": flow}
            else:
                flows = {"flow": conservative} if multi else {"local_flow": local_conservative}
            prim = Primitive(op_name, kind=kind, execution_model=execution_model,
                             traits=traits or LOCAL_PURE, targets=targets,
                             operands=[Operand(p.name, _constraint(hints.get(p.name), multi))
                                       for p in positional],
                             attrs=declared, results=_results(hints, multi), regions=(),
                             doc=(rule.__doc__ or op_name).strip().split("\n\n")[0],
                             cost=cost, **flows)
            setattr(self.prims, name or rule.__name__, prim)

            @prim.def_type_rule
            def _rule(sig: Signature) -> list[ValueType]:
                try:
                    out = rule(*sig.inputs, **sig.attrs)
                except MPTypeError:
                    raise
                except (TypeError, ValueError) as e:
                    raise MPTypeError(f"{op_name}: {e}") from None
                outs = list(out) if isinstance(out, tuple) else [out]
                for t in outs:
                    if not isinstance(t, BaseType | MPType):
                        raise MPTypeError(f"{op_name}: the type rule returned {t!r}, not a type")
                return outs

            @functools_wraps(rule)
            def call(*args: Any, **kwargs: Any) -> Any:
                for i, a in enumerate(args):
                    if not isinstance(a, MPObject):
                        raise MPTypeError(f"{op_name}: positional argument {i} must be an MPLang "
                                          f"value, got {type(a).__name__}; pass Python values "
                                          "as keyword attributes")
                unknown = sorted(set(kwargs) - attr_names)
                if unknown:
                    raise MPTypeError(f"{op_name}: unknown attribute(s) {unknown}; it takes "
                                      f"{sorted(attr_names)}")
                outs = prim.bind(list(args), dict(kwargs))
                return outs[0] if len(outs) == 1 else tuple(outs)

            op = feop(prim, config_schema=config_schema, capabilities=capabilities,
                      example=example)(function(call))
            self.ops[op_name] = op
            return op

        return deco


def functools_wraps(rule: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``functools.wraps`` without ``__wrapped__`` (the op's signature is its own)."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__name__ = rule.__name__
        fn.__qualname__ = rule.__qualname__
        fn.__doc__ = rule.__doc__
        fn.__module__ = rule.__module__
        return fn

    return deco
