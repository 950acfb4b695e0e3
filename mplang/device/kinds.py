"""Device kinds: each kind is one module implementing `DeviceKind` and registering it.

A kind says how its devices are configured (validation for `ClusterSpec`),
how a function runs on one (``device(name)(fn)``), how a driver constant and a
value not yet on any device join one, and what ``fetch`` returns. Moves
between devices of two kinds are registered per (source kind, destination kind)
by the module that knows both, usually the newer kind's.
"""

from __future__ import annotations

import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from mplang.edsl.errors import MPLangError, MPTypeError
from mplang.edsl.location import user_stacklevel
from mplang.edsl.object import MPObject
from mplang.edsl.tracer import TraceObject
from mplang.edsl.typing import MPType
from mplang.frontend.introspect import register_device_profile

if TYPE_CHECKING:
    from mplang.device.cluster import ClusterSpec, Device
    from mplang.edsl.context import ExecutionContext


class InsecureDeviceWarning(UserWarning):
    """A device whose privacy rests on trusting one party or service (e.g. a secure device
    whose multiplication triples one member or a third party makes) is in use; the
    message says whom."""


class DeviceKind(ABC):
    """The behaviour of every device of one kind (``name``, e.g. "PPU").

    ``joint`` kinds compute on values of several parties (secure devices); a
    function whose arguments live on several single-party devices runs on the
    one joint device that spans them all. Libraries ask a kind what it is (``joint``,
    ``runs_jax``, ``enclave``), never its name.
    """

    name: str
    joint: bool = False
    runs_jax: bool = True
    """Its devices run JAX functions; False: only the kind's own ops (PHE's arithmetic)."""
    enclave: bool = False
    """One node's enclave: it computes in the clear inside, and draws its own randomness."""
    security_model: str = ""
    """Who must be honest for the device to keep its inputs private (shown to users)."""

    def security_model_of(self, device: Device) -> str:
        """``security_model`` for one device (kinds whose model depends on the config,
        e.g. a secure device's protocol, say it per device)."""
        return self.security_model

    def trust(self, device: Device) -> str | None:
        """The party or service ``device`` (a validated device of this kind) makes users
        trust beyond its members following the protocol, e.g. "node_0 generates the
        Beaver triples ...": a plain statement users are warned with once per process
        (`InsecureDeviceWarning`) when the device is used; None: nobody."""
        return None

    @abstractmethod
    def validate(self, device: Device, config: Mapping[str, Any]) -> None:
        """Check ``device``'s member count and ``config``; raise `ClusterSpecError`."""

    @abstractmethod
    def call(self, cluster: ClusterSpec, device: Device, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> Any:
        """Trace ``fn(*args, **kwargs)`` on ``device``; arguments are already on it."""

    @abstractmethod
    def adopt(self, cluster: ClusterSpec, obj: MPObject, t: MPType, device: Device,
              what: str) -> MPObject:
        """``obj``, a value on no device, as a value of ``device`` (or an `MPTypeError`)."""

    @abstractmethod
    def constant(self, cluster: ClusterSpec, device: Device, value: Any, what: str) -> MPObject:
        """A driver constant (a numpy array) placed on ``device``."""

    @abstractmethod
    def fetch(self, ctx: ExecutionContext, cluster: ClusterSpec, device: Device,
              obj: MPObject) -> Any:
        """The value ``mp.fetch`` returns for ``obj``, which lives on ``device``."""

    def fixed_point(self, device: Device) -> tuple[int, int] | None:
        """The ring's bits and the fraction bits of ``device``'s fixed-point numbers, for
        kinds that compute on floats in fixed point (None: floats are floats)."""
        return None

    def table_constant(self, cluster: ClusterSpec, device: Device, value: Any,
                       what: str) -> MPObject:
        """A driver's pandas DataFrame or Arrow table placed on ``device`` as a table; by
        default an `MPTypeError`: only a party's own device holds a table."""
        raise MPTypeError(
            f"{what}: a {type(value).__name__} is a table, which one party holds: put it on "
            f"a party's PPU (mp.put('P0', df)), then move a tensor of its numeric columns "
            f"(table.to_tensor) to {self.name} {device.name}")


Move = Callable[["ClusterSpec", MPObject, "Device", "Device", str], MPObject]
"""``move(cluster, obj, src, dst, what)``: ``obj`` (on ``src``) moved onto ``dst``."""

_KINDS: dict[str, DeviceKind] = {}
_MOVES: dict[tuple[str, str], Move] = {}


def register_kind(kind: DeviceKind) -> DeviceKind:
    """Make devices of ``kind.name`` available to cluster specs and the device API."""
    if kind.name in _KINDS:
        raise ValueError(f"device kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    register_device_profile(kind.name, kind.joint, 2 if kind.joint else 1,
                            security_model=kind.security_model)
    return kind


def register_move(src: str, dst: str) -> Callable[[Move], Move]:
    """Register how a value moves from a ``src``-kind device to a ``dst``-kind device."""
    def deco(move: Move) -> Move:
        if (src, dst) in _MOVES:
            raise ValueError(f"a move from {src} to {dst} is already registered")
        _MOVES[(src, dst)] = move
        return move

    return deco


def adopt_move(kind: DeviceKind) -> Move:
    """The move onto a ``kind`` device that hands the value to ``kind.adopt`` (a kind whose
    devices take a PPU's value as they take a value on no device)."""
    def move(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device,
             what: str) -> MPObject:
        t = obj.mptype
        assert isinstance(t, MPType)
        return kind.adopt(cluster, obj, t, dst, what)

    return move


_WARNED: set[tuple[str, str]] = set()
_WARNED_LOCK = threading.Lock()


def warn_if_trusted(device: Device) -> None:
    """Warn (`InsecureDeviceWarning`, once per process per statement) that ``device``'s
    privacy rests on the party or service its kind's `DeviceKind.trust` names."""
    statement = get_kind(device.kind).trust(device)
    if statement is None:
        return
    with _WARNED_LOCK:
        if (device.kind, statement) in _WARNED:
            return
        _WARNED.add((device.kind, statement))
    warnings.warn(f"{device.kind} {device.name!r}: {statement}", InsecureDeviceWarning,
                  stacklevel=user_stacklevel())


def get_kind(name: str) -> DeviceKind:
    """The registered kind ``name``; raises `MPLangError` naming the known kinds."""
    kind = _KINDS.get(name)
    if kind is None:
        raise MPLangError(f"unknown device kind {name!r}; known kinds: "
                          f"{', '.join(sorted(_KINDS)) or 'none'}")
    return kind


def kind_names() -> list[str]:
    """The names of all registered device kinds, sorted."""
    return sorted(_KINDS)


def get_move(src: str, dst: str) -> Move | None:
    """The move registered from device kind ``src`` to kind ``dst`` (None: there is none)."""
    return _MOVES.get((src, dst))


def place(obj: MPObject, device: str) -> MPObject:
    """``obj`` tagged as living on ``device`` (a traced value only)."""
    if isinstance(obj, TraceObject):
        return obj.placed(device)
    raise MPTypeError(f"cannot place {obj!r} on {device}: not a traced value")


def describe(obj: MPObject) -> str:
    """``obj``'s type and device, for messages."""
    return f"{obj.mptype}" + (f" on {obj.device}" if obj.device else "")
