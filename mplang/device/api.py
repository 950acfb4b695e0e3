"""The device API: run functions on named devices and move values between them.

Devices sit on top of ``simp``. What a device of each kind does (run a
function, take a constant, adopt a value, be fetched) is its kind's module
(`mplang.device.kinds`); moves between kinds are registered per pair of kinds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device
from mplang.device.kinds import get_kind, get_move, place, warn_if_trusted
from mplang.dialects.common import as_array
from mplang.dialects.table_arrow import is_table_value
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.location import locate_error
from mplang.edsl.object import MPObject
from mplang.edsl.pytree import leaf_paths, tree_flatten, tree_unflatten
from mplang.edsl.tracer import Tracer, current_tracer
from mplang.edsl.typing import MPType
from mplang.frontend.feop import is_feop
from mplang.frontend.routing import check_route


def _cluster(tracer: Tracer, what: str) -> ClusterSpec:
    cluster = tracer.cluster
    if not isinstance(cluster, ClusterSpec):
        raise MPTypeError(f"{what}: the current trace has no cluster; compile with cluster=... "
                          "or run in mp.Simulator(cluster)")
    return cluster


def _device(cluster: ClusterSpec, name: str) -> Device:
    """Device ``name`` of ``cluster``; an unknown name's error names the user's line."""
    try:
        return cluster.device(name)
    except ClusterSpecError as e:
        locate_error(e)
        raise


def get_dev_attr(obj: MPObject) -> str | None:
    """The name of the device ``obj`` lives on (None for a value not on a device)."""
    if not isinstance(obj, MPObject):
        raise TypeError(f"get_dev_attr takes an MPLang object, got {type(obj).__name__}")
    return obj.device


def _move(cluster: ClusterSpec, obj: MPObject, dst: Device, what: str) -> Any:
    """``obj`` moved to device ``dst`` by the move registered for the two devices' kinds."""
    warn_if_trusted(dst)
    if obj.device == dst.name:
        return obj
    t = obj.mptype
    if not isinstance(t, MPType):
        raise MPTypeError(f"{what}: {obj!r} is a party-local value and cannot move to {dst.name}")
    if obj.device is None:
        return get_kind(dst.kind).adopt(cluster, obj, t, dst, what)
    src = cluster.device(obj.device)
    warn_if_trusted(src)
    move = get_move(src.kind, dst.kind)
    if move is None:
        raise MPTypeError(f"{what}: cannot move a value from {src.kind} {src.name} to "
                          f"{dst.kind} {dst.name}")
    return move(cluster, obj, src, dst, what)


def _infer_device(cluster: ClusterSpec, leaves: list[MPObject], what: str) -> str:
    names = sorted({x.device for x in leaves if x.device is not None})
    if not names:
        raise MPTypeError(f"{what}: no argument is on a device; name the device: mp.device('P0')")
    if len(names) == 1:
        return names[0]
    joint = [n for n in names if get_kind(cluster.device(n).kind).joint]
    if not joint:
        # values of several parties meet on the one joint device that spans all of them
        nodes = {m for n in names for m in cluster.device(n).members}
        joint = [d.name for d in cluster.devices.values()
                 if get_kind(d.kind).joint and nodes.issubset(d.members)]
    if len(joint) == 1:
        return joint[0]
    raise MPTypeError(f"{what}: arguments live on {', '.join(names)}; name the device to use")


def _call_on_device(name: str | None, fn: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    fn_name = getattr(fn, "__name__", "fn")
    tracer = current_tracer(f"device({name!r})({fn_name})")
    cluster = _cluster(tracer, f"device({name!r})")
    leaves, tree = tree_flatten((args, kwargs))
    mp_args = [x for x in leaves if isinstance(x, MPObject)]
    dev_name = name if name is not None else _infer_device(cluster, mp_args, f"device()({fn_name})")
    dev = _device(cluster, dev_name)
    what = f"device {dev.name!r} ({fn_name})"
    moved = [_move(cluster, x, dev, f"{what}, argument {i}") if isinstance(x, MPObject) else x
             for i, x in enumerate(leaves)]
    call_args, call_kwargs = tree_unflatten(tree, moved)
    kind = get_kind(dev.kind)
    warn_if_trusted(dev)
    if is_feop(fn):  # routed by its metadata; a plain function is a JAX function
        check_route(fn, dev.name, dev.kind, kind.joint, len(dev.members))
    out = kind.call(cluster, dev, fn, call_args, call_kwargs, what)
    out_leaves, out_tree = tree_flatten(out)
    return tree_unflatten(out_tree, [place(x, dev.name) for x in out_leaves])


def device(name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``device(name)(fn)(*args)`` runs JAX function ``fn`` on device ``name``.

    What running means is the device kind's: a PPU runs ``fn`` on its party in
    plaintext; a secure device (``SP0`` of `ClusterSpec.simple`) compiles it for
    its protocol and runs it on its members' secret shares. A frontend op
    (`feop`) runs only where its metadata allows (else `FeCapabilityError`
    naming op and device). Arguments on other devices move first (by the move
    registered for the two kinds: secret-shared into a secure device, revealed
    to a PPU, sent between PPUs). Without a name the device is inferred from the
    arguments (single-party devices and a joint device: the joint one).
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        def on_device(*args: Any, **kwargs: Any) -> Any:
            return _call_on_device(name, fn, args, kwargs)

        functools.update_wrapper(on_device, fn)
        on_device.__mplang_name__ = f"device({name!r})({getattr(fn, '__name__', 'fn')})"  # type: ignore[attr-defined]
        return function(on_device)

    return wrap


@function
def put(device_name: str, obj: Any) -> Any:
    """Move ``obj`` onto device ``device_name``: an MPLang value, a constant, or a pytree
    (tuples, lists, dicts, dataclasses) of them, moved leaf by leaf; an error names the
    leaf's path (``put('P0'): leaf [1]['w']: ...``). A pandas DataFrame or a pyarrow
    Table put on a PPU becomes a table with its column names and types
    (`mplang.dialects.table.from_pandas`)."""
    tracer = current_tracer(f"put({device_name!r})")
    cluster = _cluster(tracer, f"put({device_name!r})")
    dev = _device(cluster, device_name)
    what = f"put({device_name!r})"
    warn_if_trusted(dev)
    leaves, tree = tree_flatten(obj)
    if tree.kind == "leaf":
        return _put_leaf(cluster, dev, obj, what)
    moved = [_put_leaf(cluster, dev, leaf, f"{what}: leaf {path}")
             for leaf, path in zip(leaves, leaf_paths(tree), strict=True)]
    return tree_unflatten(tree, moved)


def _put_leaf(cluster: ClusterSpec, dev: Device, obj: Any, what: str) -> Any:
    try:
        if isinstance(obj, MPObject):
            return _move(cluster, obj, dev, what)
        if is_table_value(obj):
            return get_kind(dev.kind).table_constant(cluster, dev, obj, what)
        return get_kind(dev.kind).constant(cluster, dev, as_array(what, obj), what)
    except MPTypeError as e:
        locate_error(e)
        raise
