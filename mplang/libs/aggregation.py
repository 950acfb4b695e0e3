"""Secure aggregation: the elementwise sum and mean of several parties' tensors.

Each party's tensor is secret-shared into a secure device (``device``, "SP0" of
`mp.ClusterSpec.simple`), added there, and only the result is revealed, to the
one device ``to``. The functions are traced: call them inside ``@mp.function``
(or ``mp.evaluate`` / ``with simulator:``) with values placed on devices
(``mp.put("P0", x)``, ``mp.device("P1")(load)()``).

The helpers every secure analytic needs (``secure_device``, ``device_value``,
``on_party``, ``bind``, ``reveal``) live here and are shared by the other modules
of `mplang.libs`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

import mplang as mp
from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device
from mplang.device.kinds import get_kind
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.object import MPObject
from mplang.edsl.pytree import tree_flatten, tree_unflatten
from mplang.edsl.tracer import current_tracer
from mplang.edsl.typing import TensorType

__all__ = ["bind", "device_value", "on_party", "reveal", "secure_device", "secure_mean",
           "secure_sum"]

NOT_SECURE_KINDS = ("PHE",)
"""Joint device kinds that evaluate only their own ops, not a JAX function."""


def _cluster(op: str) -> ClusterSpec:
    cluster = current_tracer(op).cluster
    if not isinstance(cluster, ClusterSpec):
        raise MPTypeError(f"{op}: the current trace has no cluster; run it in "
                          "mp.Simulator(cluster) or compile with cluster=...")
    return cluster


def _named_device(op: str, cluster: ClusterSpec, name: Any, what: str) -> Device:
    if not isinstance(name, str):
        raise MPTypeError(f"{op}: {what} must be a device name such as 'P0', got {name!r}")
    try:
        return cluster.device(name)
    except ClusterSpecError as err:
        raise MPTypeError(f"{op}: {what}: {err}") from None


def secure_device(op: str, device: str, to: str | None) -> Device:
    """The device named ``device``, checked to be a secure device that runs JAX functions
    (secret sharing or an enclave), and ``to`` checked to be a single-party device (or
    None: the result stays on ``device``). Raises `MPTypeError` naming ``op``."""
    cluster = _cluster(op)
    dev = _named_device(op, cluster, device, "device")
    if not get_kind(dev.kind).joint:
        raise MPTypeError(f"{op}: device {device!r} is a {dev.kind} of one party, which would "
                          "see every input in plaintext; name a secure device such as 'SP0'")
    if dev.kind in NOT_SECURE_KINDS:
        raise MPTypeError(f"{op}: device {device!r} is a {dev.kind} device, which evaluates "
                          "only its own ops; name a secret-sharing device such as 'SP0'")
    if to is not None:
        target = _named_device(op, cluster, to, "to")
        if get_kind(target.kind).joint:
            raise MPTypeError(f"{op}: to={to!r} is a {target.kind} device; a result is "
                              "revealed to one party's device such as 'P0' (or pass "
                              "to=None to keep it secret on the secure device)")
    return dev


def device_value(op: str, x: Any, what: str, min_ndim: int = 0) -> TensorType:
    """The tensor type of ``x``, checked to be a tensor placed on a device, with at least
    ``min_ndim`` dimensions. Raises `MPTypeError` naming ``op`` and ``what``."""
    if not isinstance(x, MPObject) or x.device is None:
        got = type(x).__name__ if not isinstance(x, MPObject) else f"{x.mptype} on no device"
        raise MPTypeError(f"{op}: {what} must be a value on a device (mp.put('P0', x) or "
                          f"mp.device('P0')(fn)(...)), got {got}")
    t = x.base_type.plaintext()
    if t is None:
        raise MPTypeError(f"{op}: {what} must be a tensor, got {x.mptype}")
    if len(t.shape) < min_ndim:
        raise MPTypeError(f"{op}: {what} must have at least {min_ndim} dimension(s), got "
                          f"shape {t.shape}")
    return t


def on_party(op: str, x: MPObject) -> bool:
    """True if ``x`` (a value on a device) is on one party's device, in plaintext; False
    if it is on a joint (secure) device."""
    return not get_kind(_cluster(op).device(x.device or "").kind).joint


def reveal(x: Any, to: str | None) -> Any:
    """``x`` (a pytree of secure-device values) revealed to device ``to`` only; None: kept
    secret where it is."""
    if to is None:
        return x
    leaves, tree = tree_flatten(x)
    return tree_unflatten(tree, [mp.put(to, leaf) for leaf in leaves])


@functools.lru_cache(maxsize=512)
def bind(fn: Callable[..., Any], *static: Any) -> Callable[..., Any]:
    """``fn`` with its leading arguments fixed to the (hashable) ``static`` ones: one
    function object per (fn, static), so devices' compile caches hit, and every
    argument left is a device value (as a TEE requires)."""
    @functools.wraps(fn)
    def bound(*args: Any) -> Any:
        return fn(*static, *args)

    bound.static_args = static  # type: ignore[attr-defined]  # read by mplang.policy.vouched
    return bound


def _party_values(op: str, values: Any) -> list[MPObject]:
    if isinstance(values, MPObject) or not isinstance(values, Sequence) or not values:
        raise MPTypeError(f"{op}: values must be a non-empty list of device values, one per "
                          f"party, got {type(values).__name__}")
    types = [device_value(op, v, f"values[{i}]") for i, v in enumerate(values)]
    if len({t.shape for t in types}) > 1:
        listed = ", ".join(f"values[{i}] {t.shape} on {v.device}"
                           for i, (v, t) in enumerate(zip(values, types, strict=True)))
        raise MPTypeError(f"{op}: every party's value must have the same shape, got {listed}")
    return list(values)


def _sum(*parts: Any) -> Any:
    return functools.reduce(jnp.add, parts)


def _mean(*parts: Any) -> Any:
    return jnp.mean(jnp.stack(parts), axis=0)


@function
def secure_sum(values: Sequence[Any], device: str = "SP0", to: str | None = "P0") -> Any:
    """The elementwise sum of ``values`` (one tensor per party, all of one shape),
    computed on ``device``'s secret shares and revealed to ``to`` only (None: kept on
    ``device``). Integer sums are exact (modulo the ring); floats are fixed point.
    Policies: each element reveals the parties' elements added, so a party's value
    should already be an aggregate of its rows (column sums, a model update: the
    ``aggregate`` rule); elementwise over its raw rows it is raw (``plaintext_to``)."""
    op = "secure_sum"
    secure_device(op, device, to)
    parts = _party_values(op, values)
    return reveal(mp.device(device)(_sum)(*parts), to)


@function
def secure_mean(values: Sequence[Any], device: str = "SP0", to: str | None = "P0") -> Any:
    """The elementwise mean of ``values`` (one tensor per party, all of one shape) over
    the parties, computed on ``device`` and revealed to ``to`` only (None: kept on
    ``device``). Integers give a float32 mean. Policies as `secure_sum`."""
    op = "secure_mean"
    secure_device(op, device, to)
    parts = _party_values(op, values)
    return reveal(mp.device(device)(_mean)(*parts), to)
