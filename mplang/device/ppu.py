"""The PPU device kind: one party computing in plaintext (a ``simp.pcall`` on its rank)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device
from mplang.device.kinds import DeviceKind, describe, place, register_kind, register_move
from mplang.dialects import simp, table, tensor
from mplang.edsl.context import ExecutionContext
from mplang.edsl.errors import MPTypeError
from mplang.edsl.object import MPObject
from mplang.edsl.pytree import tree_flatten, tree_unflatten
from mplang.edsl.typing import Mask, MPType, TensorType
from mplang.frontend.feop import is_feop


def rank_of(cluster: ClusterSpec, device: Device) -> int:
    """The rank of a single-member device's node."""
    return cluster.rank_of(device.members[0])


def call_on_party(rank: int, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], what: str,
                  bring: Callable[[MPObject], MPObject] | None = None) -> Any:
    """``fn(*args, **kwargs)`` traced as MPLang ops in a ``simp.pcall`` on party ``rank``.

    Arguments may be pytrees: their MPLang leaves (passed through ``bring`` first, to
    move them to ``rank``) are the pcall's inputs, numpy arrays become constants there,
    other leaves are passed as they are. A type error names the call (``what``)."""
    leaves, tree = tree_flatten((args, kwargs))
    inputs = [x if bring is None else bring(x) for x in leaves if isinstance(x, MPObject)]

    def body(*values: MPObject) -> Any:
        it = iter(values)
        local = [next(it) if isinstance(x, MPObject)
                 else tensor.constant(x) if isinstance(x, np.ndarray) else x for x in leaves]
        call_args, call_kwargs = tree_unflatten(tree, local)
        return fn(*call_args, **call_kwargs)

    body.__name__ = getattr(fn, "__name__", "fn")
    try:
        return simp.pcall((rank,), body, *inputs)
    except MPTypeError as e:
        raise MPTypeError(f"{what}: {e}") from None


class PPU(DeviceKind):
    """A plaintext processing unit: one node runs JAX functions on its own data."""

    name = "PPU"
    security_model = "plaintext on its one party: that party sees everything placed on it"

    def validate(self, device: Device, config: Mapping[str, Any]) -> None:
        if len(device.members) != 1:
            raise ClusterSpecError(f"PPU {device.name!r} needs exactly one member, "
                                   f"got {len(device.members)}")
        if config:
            raise ClusterSpecError(f"PPU {device.name!r}: unknown config keys {sorted(config)}")

    def call(self, cluster: ClusterSpec, device: Device, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> Any:
        rank = rank_of(cluster, device)
        def as_mplang(*a: Any) -> Any:
            return fn(*a, **kwargs)

        def as_jax(*a: Any) -> Any:
            return tensor.run_jax(fn, *a, **kwargs)

        name = getattr(fn, "__name__", "fn")
        as_mplang.__name__ = as_jax.__name__ = name
        # JAX runs on tensors only: a function of a table (say) calls MPLang ops
        tensors = all(not isinstance(a, MPObject) or isinstance(a.base_type, TensorType)
                      for a in args)
        body = as_jax if tensors and not is_feop(fn) else as_mplang
        try:
            return simp.pcall((rank,), body, *args)
        except MPTypeError as e:
            if body is not as_mplang:
                # not a JAX function: one that calls MPLang ops (tensor.load, say)
                with contextlib.suppress(MPTypeError):
                    return simp.pcall((rank,), as_mplang, *args)
            raise MPTypeError(f"{what}: {e}") from None

    def adopt(self, cluster: ClusterSpec, obj: MPObject, t: MPType, device: Device,
              what: str) -> MPObject:
        rank = rank_of(cluster, device)
        if t.pmask == Mask.of([rank]):
            return place(obj, device.name)
        raise MPTypeError(
            f"{what}: {describe(obj)} is held by parties {t.pmask if t.pmask else '?'}, not by "
            f"{device.name} (party {rank}) alone; move it explicitly with "
            f"mp.put({device.name!r}, x)")

    def constant(self, cluster: ClusterSpec, device: Device, value: Any, what: str) -> MPObject:
        return place(simp.constant((rank_of(cluster, device),), value), device.name)

    def table_constant(self, cluster: ClusterSpec, device: Device, value: Any,
                       what: str) -> MPObject:
        table_of = functools.partial(table.from_pandas, value)
        table_of.__name__ = "from_pandas"  # type: ignore[attr-defined]
        return place(call_on_party(rank_of(cluster, device), table_of, (), {}, what),
                     device.name)

    def fetch(self, ctx: ExecutionContext, cluster: ClusterSpec, device: Device,
              obj: MPObject) -> Any:
        """The party's value; a table as a pandas DataFrame."""
        value = ctx.fetch_object(obj)[rank_of(cluster, device)]
        return value.to_pandas() if isinstance(obj.base_type, table.TableType) else value


register_kind(PPU())


@register_move("PPU", "PPU")
def _send(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device, what: str) -> MPObject:
    moved = simp.shuffle_static(obj, {rank_of(cluster, dst): rank_of(cluster, src)})
    return place(moved, dst.name)
