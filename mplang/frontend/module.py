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
them); it never sees data. Kernels are registered separately, by the backend.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mplang.edsl.function import function
from mplang.edsl.graph import Graph
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Primitive
from mplang.edsl.typing import BaseType, MPType, ValueType
from mplang.frontend.errors import MPTypeError
from mplang.frontend.feop import ConfigSchema, FeExecutionModel, feop
from mplang.frontend.feop import OpKind as FeOpKind
from mplang.frontend.registry import LOCAL_PURE, ExecutionModel, OpKind, OpTraits


class FeModule:
    """A namespace of frontend ops belonging to dialect ``name`` (also their family)."""

    def __init__(self, name: str):
        if not name.isidentifier():
            raise ValueError(f"a module name is an identifier, got {name!r}")
        self.name = name
        self.ops: dict[str, Callable[..., Any]] = {}

    def simple_op(self, name: str | None = None, *,
                  execution_model: FeExecutionModel = "single_rank",
                  traits: OpTraits | None = None, kind: OpKind = "compute",
                  op_kind: FeOpKind = "special_op",
                  config_schema: ConfigSchema | None = None, targets: Sequence[str] = (),
                  capabilities: Mapping[str, Any] | None = None,
                  example: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Make a type-only function an op ``{module}.{name}`` (default: its own name).

        ``single_rank`` ops (the default) run in party-local regions and get base
        types; ``multi_party`` ops get simp-level types. ``traits`` default to a
        pure local op. Keyword-only parameters are the attributes; ``*args`` and
        ``**kwargs`` are refused, since the signature must be explicit.
        """
        def deco(rule: Callable[..., Any]) -> Callable[..., Any]:
            op_name = f"{self.name}.{name or rule.__name__}"
            params = list(inspect.signature(rule).parameters.values())
            if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params):
                raise TypeError(f"{op_name}: a simple op's signature must be explicit "
                                "(no *args or **kwargs)")
            positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                           p.POSITIONAL_OR_KEYWORD)]
            attr_names = {p.name for p in params if p.kind == p.KEYWORD_ONLY}
            if config_schema is not None and not set(config_schema.fields) <= attr_names:
                extra = sorted(set(config_schema.fields) - attr_names)
                raise TypeError(f"{op_name}: config fields {extra} are not keyword-only "
                                "attributes of the op")
            model: ExecutionModel = "multi_party" if execution_model == "multi_party" \
                else "single_rank"
            prim = Primitive(op_name, kind=kind, execution_model=model,
                             traits=traits or LOCAL_PURE,
                             doc=(rule.__doc__ or op_name).strip().split("\n\n")[0])

            @prim.def_type_rule
            def _rule(in_types: list[ValueType], attrs: dict[str, Any],
                      regions: Sequence[Graph], world_size: int) -> list[ValueType]:
                if len(in_types) != len(positional):
                    raise MPTypeError(f"{op_name}: takes {len(positional)} inputs, got "
                                      f"{len(in_types)}")
                try:
                    out = rule(*in_types, **attrs)
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

            op = feop(name=op_name, family=self.name, execution_model=execution_model,
                      op_kind=op_kind,
                      dialects=[self.name], primitives=[op_name], config_schema=config_schema,
                      side_effects=not (traits or LOCAL_PURE).pure, targets=targets,
                      capabilities=capabilities, example=example)(function(call))
            op.primitive = prim  # type: ignore[attr-defined]
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
