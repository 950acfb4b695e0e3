"""Frontend ops (feops): user-facing callables that build IR, with metadata and state.

``@feop(...)`` attaches metadata (`FeOpInfo`) to a callable and registers it:
reflection (`mplang.frontend.introspect`), device routing
(`mplang.frontend.routing`) and config validation read it. ``state_scope``
gives the op a namespaced state dict: ``process`` (plain data shared by every
context, e.g. caches) or ``ctx`` (per execution context, may hold runtime
objects); MPLang objects in process state raise `FeStateError`.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from mplang.edsl.location import locate_error
from mplang.frontend.errors import FeConfigError, FeStateError, MPTypeError

OpKind = Literal["compiler", "transform", "special_op"]
FeExecutionModel = Literal["single_rank", "multi_party", "in_controller"]
StateScope = Literal["none", "process", "ctx"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ConfigField:
    """One configuration field: its Python type, whether it is required, its default,
    and optional bounds or choices."""

    type: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    choices: tuple[Any, ...] | None = None
    min: Any = None
    max: Any = None
    doc: str = ""


@dataclass(frozen=True)
class ConfigSchema:
    """The configuration an op accepts, by field name; `validate` fills defaults."""

    fields: Mapping[str, ConfigField]

    def validate(self, op: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` checked and completed; raise `FeConfigError` naming op and field."""
        unknown = sorted(set(config) - set(self.fields))
        if unknown:
            raise FeConfigError(f"{op}: unknown config field(s) {unknown}; the schema has "
                                f"{sorted(self.fields)}")
        out: dict[str, Any] = {}
        for name, spec in self.fields.items():
            if name not in config:
                if spec.required:
                    raise FeConfigError(f"{op}: config field {name!r} is required")
                out[name] = spec.default
                continue
            value: Any = config[name]
            types = spec.type if isinstance(spec.type, tuple) else (spec.type,)
            if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
                expected = " or ".join(t.__name__ for t in types)
                raise FeConfigError(f"{op}: config field {name!r} must be {expected}, got "
                                    f"{value!r}")
            if spec.choices is not None and value not in spec.choices:
                raise FeConfigError(f"{op}: config field {name!r} must be one of "
                                    f"{list(spec.choices)}, got {value!r}")
            if (spec.min is not None and value < spec.min) or \
                    (spec.max is not None and value > spec.max):
                raise FeConfigError(f"{op}: config field {name!r} must lie in "
                                    f"[{spec.min}, {spec.max}], got {value!r}")
            out[name] = value
        return out

    def to_dict(self) -> dict[str, Any]:
        """Each field's type names, required flag, default, choices, bounds and doc as
        plain data."""
        return {name: {"type": [t.__name__ for t in (f.type if isinstance(f.type, tuple)
                                                     else (f.type,))],
                       "required": f.required, "default": f.default,
                       "choices": None if f.choices is None else list(f.choices),
                       "min": f.min, "max": f.max, "doc": f.doc}
                for name, f in self.fields.items()}


@dataclass(frozen=True)
class FeOpInfo:
    """The metadata of one frontend op.

    ``family``: the frontend it belongs to (``simp``, ``tensor``, a
    plugin's name). ``op_kind``: ``compiler`` (compiles a user function),
    ``transform`` (takes functions: control flow, calls) or ``special_op``.
    ``dialects``: the IR it produces; ``primitives``: the ops it emits.
    ``execution_model``: ``single_rank`` (in one party's local region),
    ``multi_party`` (across parties) or ``in_controller`` (at trace time).
    ``inputs`` / ``outputs``: IO constraints (kinds such as Tensor, Table, Key).
    ``targets``: device kinds it can run on (empty: decided by execution model).
    ``capabilities``: further constraints (``requires_device``: ``{"kind": [...],
    "members": "=1" | ">=2"}``, ``stability``, ``caching``).
    """

    name: str
    family: str
    op_kind: OpKind
    execution_model: FeExecutionModel
    dialects: tuple[str, ...] = ()
    primitives: tuple[str, ...] = ()
    version: str = "1"
    inputs: tuple[Mapping[str, Any], ...] = ()
    outputs: tuple[Mapping[str, Any], ...] = ()
    config_schema: ConfigSchema | None = None
    side_effects: bool = False
    targets: tuple[str, ...] = ()
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    state_scope: StateScope = "none"
    doc: str = ""
    example: str = ""


_REGISTRY: dict[str, Callable[..., Any]] = {}
_LOCK = threading.Lock()
_PROCESS_STATE: dict[str, _ProcessState] = {}
_CTX_STATE: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = \
    weakref.WeakKeyDictionary()


def holds_mplang_object(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is an MPLang object or a container (list, tuple, set, dict)
    holding one, up to a few levels deep."""
    if getattr(value, "__mplang_object__", False):
        return True
    if depth >= 8:
        return False
    if isinstance(value, dict):
        return any(holds_mplang_object(k, depth + 1) or holds_mplang_object(v, depth + 1)
                   for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return any(holds_mplang_object(item, depth + 1) for item in value)
    return False


class _ProcessState(MutableMapping[str, Any]):
    """A process-wide state dict that refuses MPLang objects (also inside containers)."""

    def __init__(self, op: str):
        self._op = op
        self._data: dict[str, Any] = {}

    def __setitem__(self, key: str, value: Any) -> None:
        if holds_mplang_object(value):
            raise FeStateError(f"{self._op}: {value!r} is or holds an MPLang object; process "
                               "state holds plain data only (use state_scope='ctx' for runtime "
                               "objects)")
        self._data[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _state_getter(info: FeOpInfo) -> Callable[[Any], MutableMapping[str, Any]]:
    def get_state(ctx: Any = None) -> MutableMapping[str, Any]:
        if info.state_scope == "none":
            raise FeStateError(f"{info.name} declares no state (state_scope='none')")
        if info.state_scope == "process":
            with _LOCK:
                return _PROCESS_STATE.setdefault(info.name, _ProcessState(info.name))
        if ctx is None:
            raise FeStateError(f"{info.name}: context state needs a context")
        with _LOCK:
            return _CTX_STATE.setdefault(ctx, {}).setdefault(info.name, {})

    return get_state


def register(op: Callable[..., Any]) -> Callable[..., Any]:
    """Add a feop (a callable carrying ``__feop_meta__``); one op per name."""
    info = getattr(op, "__feop_meta__", None)
    if not isinstance(info, FeOpInfo):
        raise TypeError(f"{op!r} is not a feop; decorate it with @feop(...)")
    with _LOCK:
        if info.name in _REGISTRY:
            raise ValueError(f"frontend op {info.name!r} is already registered")
        _REGISTRY[info.name] = op
    return op


def feop(*, name: str, family: str, execution_model: FeExecutionModel,
         op_kind: OpKind = "special_op", dialects: Sequence[str] = (),
         primitives: Sequence[str] = (), version: str = "1",
         inputs: Sequence[Mapping[str, Any]] = (), outputs: Sequence[Mapping[str, Any]] = (),
         config_schema: ConfigSchema | None = None, side_effects: bool = False,
         targets: Sequence[str] = (), capabilities: Mapping[str, Any] | None = None,
         state_scope: StateScope = "none", example: str = "") -> Callable[[F], F]:
    """Decorate a frontend op: attach its metadata and register it.

    With a ``config_schema``, keyword arguments named in the schema are validated
    (and defaults filled in) before each call; a violation raises `FeConfigError`.
    """
    def deco(fn: F) -> F:
        info = FeOpInfo(
            name=name, family=family, op_kind=op_kind, execution_model=execution_model,
            dialects=tuple(dialects), primitives=tuple(primitives), version=version,
            inputs=tuple(inputs), outputs=tuple(outputs), config_schema=config_schema,
            side_effects=side_effects, targets=tuple(targets),
            capabilities=dict(capabilities or {}), state_scope=state_scope,
            doc=(fn.__doc__ or "").strip().split("\n\n")[0], example=example)
        target: Callable[..., Any] = fn
        if config_schema is not None:
            @functools.wraps(fn)
            def checked(*args: Any, **kwargs: Any) -> Any:
                given = {k: v for k, v in kwargs.items() if k in config_schema.fields}
                rest = {k: v for k, v in kwargs.items() if k not in config_schema.fields}
                return fn(*args, **rest, **config_schema.validate(name, given))

            target = checked
        target = _located(target)
        target.__feop__ = True  # type: ignore[attr-defined]
        target.__feop_meta__ = info  # type: ignore[attr-defined]
        target.__get_state__ = _state_getter(info)  # type: ignore[attr-defined]
        register(target)
        return target  # type: ignore[return-value]

    return deco


def _located(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose type errors name the user's line that called it, like the errors of
    type rules do (``(at file.py:LINE)``); also for errors raised before any op is bound
    (a JAX function that does not trace, a Python value where a tensor belongs)."""
    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except MPTypeError as e:
            locate_error(e)
            raise

    return op


def is_feop(x: Any) -> bool:
    """Whether ``x`` is a frontend op (decorated with `feop`)."""
    return bool(getattr(x, "__feop__", False)) and isinstance(
        getattr(x, "__feop_meta__", None), FeOpInfo)


def meta(op: Callable[..., Any] | str) -> FeOpInfo:
    """The metadata of a feop or of the feop registered under a name."""
    fn = get(op) if isinstance(op, str) else op
    info = getattr(fn, "__feop_meta__", None)
    if not isinstance(info, FeOpInfo):
        raise TypeError(f"{op!r} is not a frontend op")
    return info


def get(name: str) -> Callable[..., Any]:
    """The feop registered under ``name`` (KeyError naming it if none)."""
    with _LOCK:
        op = _REGISTRY.get(name)
    if op is None:
        raise KeyError(f"unknown frontend op {name!r}")
    return op


def registered() -> list[Callable[..., Any]]:
    """Every registered feop, sorted by name."""
    with _LOCK:
        return [_REGISTRY[n] for n in sorted(_REGISTRY)]
