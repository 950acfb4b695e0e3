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

from mplang.edsl.attrs import ConfigSchema
from mplang.edsl.errors import FeStateError, MPTypeError
from mplang.edsl.location import locate_error
from mplang.edsl.primitive import Primitive
from mplang.edsl.traits import ExecutionModel, OpKind

StateScope = Literal["none", "process", "ctx"]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class FeOpInfo:
    """The metadata of one frontend op.

    ``family``: the frontend it belongs to (``simp``, ``tensor``, a
    plugin's name). ``op_kind`` and ``execution_model`` use the primitives' vocabulary
    (`mplang.edsl.traits`). ``dialects``: the IR it produces; ``primitives``: the ops
    it emits.
    ``inputs`` / ``outputs``: IO constraints (kinds such as Tensor, Table, Key).
    ``targets``: device kinds it can run on (empty: decided by execution model).
    ``capabilities``: further constraints (``requires_device``: ``{"kind": [...],
    "members": "=1" | ">=2"}``, ``stability``, ``caching``).
    """

    name: str
    family: str
    op_kind: OpKind
    execution_model: ExecutionModel
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


def feop(*emits: Primitive, name: str | None = None, family: str | None = None,
         execution_model: ExecutionModel | None = None, op_kind: OpKind | None = None,
         dialects: Sequence[str] | None = None, version: str = "1",
         inputs: Sequence[Mapping[str, Any]] = (), outputs: Sequence[Mapping[str, Any]] = (),
         config_schema: ConfigSchema | None = None, targets: Sequence[str] | None = None,
         side_effects: bool | None = None,
         capabilities: Mapping[str, Any] | None = None, state_scope: StateScope = "none",
         example: str = "") -> Callable[[F], F]:
    """Decorate a frontend op that emits the primitives ``emits``: attach its metadata and
    register it.

    Everything the primitives declare is derived from them, the first one leading: the
    name, family (its dialect), execution model, kind, dialects, targets and side
    effects; a keyword given here overrides it (a frontend op that emits no primitive
    states ``name``, ``family`` and ``execution_model``). With a ``config_schema``,
    keyword arguments named in the schema are validated (and defaults filled in)
    before each call; a violation raises `FeConfigError`.
    """
    lead = emits[0] if emits else None
    op_name = name or (lead.name if lead is not None else None)
    if op_name is None or (lead is None and (family is None or execution_model is None)):
        raise TypeError("feop: a frontend op that emits no primitive needs name, family and "
                        "execution_model")
    model: ExecutionModel = execution_model or (lead.execution_model if lead else "any")
    kind: OpKind = op_kind or (lead.kind if lead is not None else "transform")

    def deco(fn: F) -> F:
        info = FeOpInfo(
            name=op_name, family=family or (lead.dialect if lead else op_name.split(".")[0]),
            op_kind=kind, execution_model=model,
            dialects=tuple(dialects if dialects is not None
                           else dict.fromkeys(p.dialect for p in emits)),
            primitives=tuple(dict.fromkeys(p.name for p in emits)), version=version,
            inputs=tuple(inputs), outputs=tuple(outputs), config_schema=config_schema,
            side_effects=side_effects if side_effects is not None
            else any(p.side_effects for p in emits),
            targets=tuple(targets if targets is not None else (lead.targets if lead else ())),
            capabilities=dict(capabilities or {}), state_scope=state_scope,
            doc=(fn.__doc__ or "").strip().split("\n\n")[0], example=example)
        if config_schema is not None:
            @functools.wraps(fn)
            def checked(*args: Any, **kwargs: Any) -> Any:
                given = {k: v for k, v in kwargs.items() if k in config_schema.fields}
                rest = {k: v for k, v in kwargs.items() if k not in config_schema.fields}
                return fn(*args, **rest, **config_schema.validate(op_name, given))

            target: Callable[..., Any] = checked
        else:
            target = fn
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
