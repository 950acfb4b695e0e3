"""Secure aggregation: the elementwise sum and mean of several parties' tensors, and the
mean and variance of their values pooled.

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
import math
from collections.abc import Sequence
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
from mplang.flows.vouched import bind

__all__ = ["bind", "device_value", "on_party", "reveal", "secure_device", "secure_mean",
           "secure_mean_variance", "secure_sum"]

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
    kind = get_kind(dev.kind)
    if not kind.joint:
        raise MPTypeError(f"{op}: device {device!r} is a {dev.kind} of one party, which would "
                          "see every input in plaintext; name a secure device such as 'SP0'")
    if not kind.runs_jax:
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


def _scale(fixed_point: tuple[int, int] | None, bound: float, count: int) -> float:
    """The power of two the values are divided by so that ``count`` squared deviations of
    values within ``bound`` fit a fixed-point ring (with a bit to spare): deviations of
    at most ``2**k``, with a product ``2**(2k + 2 fraction bits)`` and a sum
    ``2**(2k + log2 count + fraction bits)`` below the ring's ``2**(bits - 2)``."""
    if fixed_point is None:
        return 1.0
    ring, fraction = fixed_point
    k = min((ring - 2) // 2 - fraction,
            (ring - 2 - fraction - math.ceil(math.log2(count + 1))) // 2) - 1
    return 2.0 ** max(0, math.ceil(math.log2(2 * bound)) - k)


def _pooled_sum(*parts: Any) -> Any:
    return functools.reduce(jnp.add, [jnp.sum(p, dtype=jnp.float32) for p in parts])


def _centered_squares(mean: Any, *parts: Any) -> Any:
    return functools.reduce(jnp.add, [jnp.sum(jnp.square(p - mean)) for p in parts])


def _scaled(scale: float, x: Any) -> Any:
    return x.astype(jnp.float32) / scale


def _divided(count: int, scale: float, total: Any) -> Any:
    return total / count * scale


@function
def secure_mean_variance(values: Sequence[Any], device: str = "SP0", to: str = "P0",
                         bound: float = 1e6) -> tuple[Any, Any]:
    """The mean and the population variance of all the elements of ``values`` (one tensor
    per party, any shapes), revealed to ``to`` only.

    Precision: a secure device computes in fixed point (``docs/security.md``), where a
    division by the public count ``n`` multiplies by ``1/n`` rounded to the fraction bits
    (a relative error up to ``n * 2**-19`` on the default ring). Here the device only
    adds: it reveals the sum to ``to``, which divides it by ``n`` in plaintext, puts
    the mean back into the device for the sum of squared deviations, and divides that.
    Each party first divides its values by a power of two chosen from ``bound`` (the
    largest magnitude expected), the ring and the count, so that the squares fit the
    ring. Measured (benchmarks/bench_precision.py): below 1e-6 relative for values up
    to 1e6 on the default 64-bit ring. Policies: reveals the sum and the sum of squared
    deviations of every party's values (the ``aggregate`` rule), and the mean goes back
    into the device from ``to``."""
    op = "secure_mean_variance"
    if to is None:
        raise MPTypeError(f"{op}: to must name a party's device such as 'P0', which divides "
                          "the sums the secure device reveals to it")
    dev = secure_device(op, device, to)
    if isinstance(values, MPObject) or not isinstance(values, Sequence) or not values:
        raise MPTypeError(f"{op}: values must be a non-empty list of device values, one per "
                          f"party, got {type(values).__name__}")
    if isinstance(bound, bool) or not isinstance(bound, int | float) or not bound > 0:
        raise MPTypeError(f"{op}: bound must be a positive number, got {bound!r}")
    count = 0
    for i, v in enumerate(values):
        t = device_value(op, v, f"values[{i}]")
        if not t.is_static or not on_party(op, v):
            raise MPTypeError(f"{op}: values[{i}] must be a party's tensor of a size known "
                              f"while tracing, got {v.mptype} on {v.device}")
        count += t.size_estimate(1)
    if count == 0:
        raise MPTypeError(f"{op}: values hold no element")
    scale = _scale(get_kind(dev.kind).fixed_point(dev), bound, count)
    parts = [mp.device(v.device)(bind(_scaled, scale))(v) for v in values]
    total = mp.put(to, mp.device(device)(_pooled_sum)(*parts))
    mean = mp.device(to)(bind(_divided, count, 1.0))(total)
    squares = mp.put(to, mp.device(device)(_centered_squares)(mp.put(device, mean), *parts))
    return (mp.device(to)(bind(_divided, count, scale))(total),
            mp.device(to)(bind(_divided, count, scale * scale))(squares))
