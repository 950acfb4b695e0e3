"""The device API: run functions on named devices and move values between them.

Devices sit on top of ``simp``: a PPU call is a ``simp.pcall`` on the PPU's
party, a move between PPUs a ``simp.shuffle_static``, and SPU work goes through
the ``spu`` dialect (``seal`` / ``run`` / ``reveal``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mplang.device.cluster import ClusterSpec, Device
from mplang.dialects import simp, spu, tensor
from mplang.dialects.common import as_array
from mplang.edsl.function import function
from mplang.edsl.object import MPObject
from mplang.edsl.pytree import tree_flatten, tree_unflatten
from mplang.edsl.tracer import TraceObject, Tracer, current_tracer
from mplang.edsl.typing import Mask, MPType, SecretShareType, TensorType
from mplang.frontend.errors import MPTypeError


def _cluster(tracer: Tracer, what: str) -> ClusterSpec:
    cluster = tracer.cluster
    if not isinstance(cluster, ClusterSpec):
        raise MPTypeError(f"{what}: the current trace has no cluster; compile with cluster=... "
                          "or run in mp.Simulator(cluster)")
    return cluster


def get_dev_attr(obj: MPObject) -> str | None:
    """The name of the device ``obj`` lives on (None for a value not on a device)."""
    if not isinstance(obj, MPObject):
        raise TypeError(f"get_dev_attr takes an MPLang object, got {type(obj).__name__}")
    return obj.device


def _place(obj: MPObject, device: str) -> Any:
    if isinstance(obj, TraceObject):
        return obj.placed(device)
    raise MPTypeError(f"cannot place {obj!r} on {device}: not a traced value")


def _ppu_rank(cluster: ClusterSpec, dev: Device) -> int:
    return cluster.rank_of(dev.members[0])


def _describe(obj: MPObject) -> str:
    return f"{obj.mptype}" + (f" on {obj.device}" if obj.device else "")


def _move(cluster: ClusterSpec, obj: MPObject, dst: Device, what: str) -> Any:
    """``obj`` moved to device ``dst`` (seal into an SPU, reveal out of it, send between PPUs)."""
    src_name = obj.device
    if src_name == dst.name:
        return obj
    t = obj.mptype
    if not isinstance(t, MPType):
        raise MPTypeError(f"{what}: {obj!r} is a party-local value and cannot move to {dst.name}")
    if src_name is None:
        return _adopt(cluster, obj, t, dst, what)
    src = cluster.device(src_name)
    if src.kind == "PPU" and dst.kind == "PPU":
        src_rank, dst_rank = _ppu_rank(cluster, src), _ppu_rank(cluster, dst)
        return _place(simp.shuffle_static(obj, {dst_rank: src_rank}), dst.name)
    if src.kind == "PPU" and dst.kind == "SPU":
        _check_spu_dtype(obj, dst, what)
        return _place(spu.seal(obj, spu.SpuConfig.of(cluster, dst)), dst.name)
    if src.kind == "SPU" and dst.kind == "PPU":
        config = spu.SpuConfig.of(cluster, src)
        return _place(spu.reveal(obj, config, _ppu_rank(cluster, dst)), dst.name)
    raise MPTypeError(f"{what}: cannot move a value from {src.kind} {src.name} to "
                      f"{dst.kind} {dst.name}")


def _check_spu_dtype(obj: MPObject, dst: Device, what: str) -> None:
    base = obj.base_type
    if isinstance(base, TensorType) and base.dtype not in spu.SUPPORTED_DTYPES:
        raise MPTypeError(f"{what}: SPU {dst.name} cannot hold dtype {base.dtype} "
                          f"({_describe(obj)}); supported: "
                          f"{', '.join(sorted(spu.SUPPORTED_DTYPES))}")


def _adopt(cluster: ClusterSpec, obj: MPObject, t: MPType, dst: Device, what: str) -> Any:
    """A value not placed on any device joins ``dst`` if ``dst``'s parties hold it."""
    if dst.kind == "PPU":
        rank = _ppu_rank(cluster, dst)
        if t.pmask == Mask.of([rank]):
            return _place(obj, dst.name)
        raise MPTypeError(
            f"{what}: {_describe(obj)} is held by parties {t.pmask if t.pmask else '?'}, not by "
            f"{dst.name} (party {rank}) alone; move it explicitly with mp.put({dst.name!r}, x)")
    if dst.kind == "SPU":
        config = spu.SpuConfig.of(cluster, dst)
        if isinstance(t.base, SecretShareType) and t.pmask == Mask.of(config.members):
            return _place(obj, dst.name)
        if isinstance(t.base, TensorType) and t.pmask is not None and len(t.pmask) == 1:
            _check_spu_dtype(obj, dst, what)
            return _place(spu.seal(obj, config), dst.name)
    raise MPTypeError(f"{what}: {_describe(obj)} is not on a device and cannot move to "
                      f"{dst.kind} {dst.name}; place it first with mp.put")


def _infer_device(cluster: ClusterSpec, leaves: list[MPObject], what: str) -> str:
    names = sorted({x.device for x in leaves if x.device is not None})
    if not names:
        raise MPTypeError(f"{what}: no argument is on a device; name the device: mp.device('P0')")
    if len(names) == 1:
        return names[0]
    spus = [n for n in names if cluster.device(n).kind == "SPU"]
    if not spus:
        # values of several parties meet on the one SPU that spans all of them
        nodes = {m for n in names for m in cluster.device(n).members}
        spus = [d.name for d in cluster.devices.values()
                if d.kind == "SPU" and nodes.issubset(d.members)]
    if len(spus) == 1:
        return spus[0]
    raise MPTypeError(f"{what}: arguments live on {', '.join(names)}; name the device to use")


def _call_on_device(name: str | None, fn: Callable[..., Any], args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
    fn_name = getattr(fn, "__name__", "fn")
    tracer = current_tracer(f"device({name!r})({fn_name})")
    cluster = _cluster(tracer, f"device({name!r})")
    leaves, tree = tree_flatten((args, kwargs))
    mp_args = [x for x in leaves if isinstance(x, MPObject)]
    dev_name = name if name is not None else _infer_device(cluster, mp_args, f"device()({fn_name})")
    dev = cluster.device(dev_name)
    what = f"device {dev.name!r} ({fn_name})"
    moved = [_move(cluster, x, dev, f"{what}, argument {i}") if isinstance(x, MPObject) else x
             for i, x in enumerate(leaves)]
    call_args, call_kwargs = tree_unflatten(tree, moved)
    if dev.kind == "PPU":
        rank = _ppu_rank(cluster, dev)
        try:
            out = simp.pcall((rank,), lambda *a: tensor.run_jax(fn, *a, **call_kwargs),
                             *call_args)
        except MPTypeError as e:
            raise MPTypeError(f"{what}: {e}") from None
    elif dev.kind == "SPU":
        out = spu.run(fn, spu.SpuConfig.of(cluster, dev), *call_args, label=what, **call_kwargs)
    else:
        raise MPTypeError(f"{what}: {dev.kind} devices cannot run functions yet")
    out_leaves, out_tree = tree_flatten(out)
    return tree_unflatten(out_tree, [_place(x, dev.name) for x in out_leaves])


def device(name: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``device(name)(fn)(*args)`` runs JAX function ``fn`` on device ``name``.

    On a PPU it runs on that party in plaintext; on an SPU it is compiled by
    libspu and run on secret shares by all members. Arguments on other devices
    move first (seal into an SPU, reveal to a PPU, send between PPUs). Without a
    name the device is inferred from the arguments (mixed PPU and SPU: the SPU).
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @function
        @functools.wraps(fn)
        def on_device(*args: Any, **kwargs: Any) -> Any:
            return _call_on_device(name, fn, args, kwargs)

        return on_device

    return wrap


@function
def put(device_name: str, obj: Any) -> Any:
    """Move ``obj`` (an MPLang value or a constant) onto device ``device_name``."""
    tracer = current_tracer(f"put({device_name!r})")
    cluster = _cluster(tracer, f"put({device_name!r})")
    dev = cluster.device(device_name)
    what = f"put({device_name!r})"
    if isinstance(obj, MPObject):
        return _move(cluster, obj, dev, what)
    value = as_array(what, obj)
    if dev.kind == "PPU":
        return _place(simp.constant((_ppu_rank(cluster, dev),), value), dev.name)
    if dev.kind == "SPU":
        config = spu.SpuConfig.of(cluster, dev)
        owner = simp.constant((config.members[0],), value)
        _check_spu_dtype(owner, dev, what)
        return _place(spu.seal(owner, config), dev.name)
    raise MPTypeError(f"{what}: cannot put a constant on {dev.kind} {dev.name}")
