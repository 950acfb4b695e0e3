"""Sorting and top-k on secret shares.

The values (one party's tensor, or several parties' parts joined along the last
axis) are secret-shared into the secure device, sorted there along the last
axis, and only the sorted values and/or the positions they came from are
revealed to ``to``. The sort is the secure device's own secret sort (a sort
over secure shuffles where the protocol has them, ABY3 and SEMI2K, else an
odd-even merge sorting network): the members learn neither the order nor the
values, only what is revealed.

Ties are broken by position, so results are deterministic and equal numpy's
stable ``argsort`` (ascending: equal values keep their order; descending: the
earlier position first, like ``jax.lax.top_k``). Each sort uses a second sort
key (the position) for this: the sorting network is not stable.

`top_k` sorts everything and keeps ``k``: the device's own top-k neither
orders its result (on CHEETAH) nor picks the earliest of tied values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

import mplang as mp
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.object import MPObject
from mplang.edsl.typing import Dim
from mplang.flows.vouched import bind
from mplang.libs.aggregation import device_value, reveal, secure_device

__all__ = ["argsort", "sort", "sort_with_indices", "top_k"]


def _parts(op: str, x: Any) -> tuple[list[Any], tuple[Dim, ...]]:
    """``x`` as a list of parts to join along the last axis, and the joined shape."""
    parts = [x] if isinstance(x, MPObject) or not isinstance(x, Sequence) else list(x)
    if not parts:
        raise MPTypeError(f"{op}: x must be a device value or a non-empty list of them")
    what = (lambda i: "x") if len(parts) == 1 else (lambda i: f"x[{i}]")
    types = [device_value(op, p, what(i), min_ndim=1) for i, p in enumerate(parts)]
    if len({t.shape[:-1] for t in types}) > 1:
        shapes = ", ".join(str(t.shape) for t in types)
        raise MPTypeError(f"{op}: parts are joined along the last axis, so their other "
                          f"dimensions must agree; got shapes {shapes}")
    widths = [t.shape[-1] for t in types]
    if not all(isinstance(w, int) for w in widths):
        raise MPTypeError(f"{op}: the parts' last dimensions must be known while tracing, "
                          f"got {', '.join(map(str, types))}")
    return parts, (*types[0].shape[:-1], sum(w for w in widths if isinstance(w, int)))


def _sorted(descending: bool, *parts: Any) -> tuple[Any, Any]:
    """(sorted values, int32 positions) along the last axis, ties by position."""
    x = jnp.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]
    position = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    if not descending:
        values, index = jax.lax.sort((x, position), dimension=-1, num_keys=2)
        return values, index
    # ascending by (value, -position), reversed: descending values, earlier position first
    values, negative = jax.lax.sort((x, -position), dimension=-1, num_keys=2)
    return jnp.flip(values, axis=-1), -jnp.flip(negative, axis=-1)


def _sort_values(descending: bool, *parts: Any) -> Any:
    return _sorted(descending, *parts)[0]


def _sort_index(descending: bool, *parts: Any) -> Any:
    return _sorted(descending, *parts)[1]


def _top(k: int, *parts: Any) -> tuple[Any, Any]:
    values, index = _sorted(True, *parts)
    return values[..., :k], index[..., :k]


def _check_flag(op: str, name: str, flag: Any) -> bool:
    if not isinstance(flag, bool):
        raise MPTypeError(f"{op}: {name} must be True or False, got {flag!r}")
    return flag


@function
def sort(x: Any, device: str = "SP0", to: str | None = "P0", descending: bool = False) -> Any:
    """``x`` sorted along its last axis (like ``np.sort``; ``descending`` reverses), on
    ``device``'s secret shares; the sorted values are revealed to ``to`` only (None: kept
    secret on ``device``). ``x``: a device value, or a list of them (e.g. one per party)
    joined along the last axis. Policies: sorted values and positions are order
    statistics, the rows themselves: each owner must allow ``to`` its data
    (``plaintext_to``); the same holds for `argsort`, `sort_with_indices` and
    `top_k`."""
    op = "sort"
    secure_device(op, device, to)
    parts, _ = _parts(op, x)
    flag = _check_flag(op, "descending", descending)
    return reveal(mp.device(device)(bind(_sort_values, flag))(*parts), to)


@function
def argsort(x: Any, device: str = "SP0", to: str | None = "P0",
            descending: bool = False) -> Any:
    """The int32 positions that sort ``x`` along its last axis (like ``np.argsort(x,
    stable=True)``), computed on ``device`` and revealed to ``to`` only."""
    op = "argsort"
    secure_device(op, device, to)
    parts, _ = _parts(op, x)
    flag = _check_flag(op, "descending", descending)
    return reveal(mp.device(device)(bind(_sort_index, flag))(*parts), to)


@function
def sort_with_indices(x: Any, device: str = "SP0", to: str | None = "P0",
                      descending: bool = False) -> tuple[Any, Any]:
    """``(sort(x), argsort(x))`` from one secure sort, both revealed to ``to`` only."""
    op = "sort_with_indices"
    secure_device(op, device, to)
    parts, _ = _parts(op, x)
    flag = _check_flag(op, "descending", descending)
    return reveal(mp.device(device)(bind(_sorted, flag))(*parts), to)


@function
def top_k(x: Any, k: int, device: str = "SP0", to: str | None = "P0") -> tuple[Any, Any]:
    """The ``k`` largest entries along the last axis, largest first, and their int32
    positions (like ``jax.lax.top_k``; ties: the earlier position first), computed on
    ``device`` and revealed to ``to`` only (None: kept secret on ``device``)."""
    op = "top_k"
    secure_device(op, device, to)
    parts, shape = _parts(op, x)
    width = shape[-1]  # known while tracing (`_parts`)
    if isinstance(k, bool) or not isinstance(k, int) or not isinstance(width, int) \
            or not 1 <= k <= width:
        raise MPTypeError(f"{op}: k must be an int in 1..{shape[-1]} (the length of the last "
                          f"axis), got {k!r}")
    return reveal(mp.device(device)(bind(_top, k))(*parts), to)
