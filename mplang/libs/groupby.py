"""Oblivious group-by: per-group sums, counts and means of values whose group keys
another party holds.

Keys are integers in ``[0, num_groups)``, one per row, held in plaintext by one
party or secret on the secure device; values (a vector, or a matrix of rows) are
held by any party or secret. The result is ``one_hot(keys).T @ values``,
computed by a fixed sequence of operations whatever the data (no branch, index
or memory access depends on a key or a value) and revealed only to ``to``.

The ``[rows, num_groups]`` one-hot matrix is never built. A key is written with
two digits, ``key = high * LOW + low``, and the one-hot of the key is the outer
product of the one-hots of its digits, so

    out[high * LOW + low] = sum_i high_hot[i, high] * low_hot[i, low] * values[i]
                          = ((high_hot * values).T @ low_hot)[high, low]

one product per row and high digit, then ``LOW`` vector-matrix products: about
``2 * sqrt(num_groups)`` secret values per row instead of ``num_groups``. The
digit one-hots are made

* by the key holder, locally in plaintext, when a party holds the keys (it
  learns nothing new: the keys are its own); they are then secret-shared;
* on secret shares when the keys are secret: the low bits of each key are
  extracted (one bit decomposition per row) and the one-hot of a group of bits
  is built by products of those bits; two secure comparisons per row mark the
  keys in range.

A key outside ``[0, num_groups)`` matches no group: its row is counted in none.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

import mplang as mp
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.libs.aggregation import bind, device_value, on_party, reveal, secure_device

__all__ = ["digit_bases", "groupby_count", "groupby_mean", "groupby_sum"]


def _check_keys(op: str, keys: Any, num_groups: Any) -> int:
    """The number of rows ``keys`` has."""
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise MPTypeError(f"{op}: num_groups must be a positive int, got {num_groups!r}")
    t = device_value(op, keys, "keys", min_ndim=1)
    if len(t.shape) != 1:
        raise MPTypeError(f"{op}: keys must be a vector (one key per row), got shape {t.shape}")
    if not jnp.issubdtype(jnp.dtype(t.dtype), jnp.integer):
        raise MPTypeError(f"{op}: keys must be integers in [0, num_groups), got dtype "
                          f"{t.dtype}; cast them on their owner first")
    return t.shape[0]


def _check_values(op: str, rows: int, values: Any) -> None:
    t = device_value(op, values, "values", min_ndim=1)
    if len(t.shape) > 2 or t.shape[0] != rows:
        raise MPTypeError(f"{op}: values must have one row per key: shape ({rows},) or "
                          f"({rows}, m), got {t.shape}")


def digit_bases(num_groups: int, binary: bool) -> tuple[int, int]:
    """``(high, low)``: how many values each digit of a key takes (``high * low >=
    num_groups``, both about its square root; powers of two when ``binary``)."""
    if binary:
        bits = max(1, (num_groups - 1).bit_length())
        return 1 << (bits // 2), 1 << (bits - bits // 2)
    low = math.isqrt(num_groups - 1) + 1
    return -(-num_groups // low), low


def _plain_digits(num_groups: int, high: int, low: int, keys: Any) -> tuple[Any, Any]:
    """The key holder's digit one-hots, int32 ``[n, high]`` (zero for keys out of range)
    and ``[n, low]``."""
    k = keys.astype(jnp.int32)
    valid = (k >= 0) & (k < num_groups)
    high_hot = (k // low)[:, None] == jnp.arange(high, dtype=jnp.int32)[None, :]
    low_hot = (k % low)[:, None] == jnp.arange(low, dtype=jnp.int32)[None, :]
    return (high_hot & valid[:, None]).astype(jnp.int32), low_hot.astype(jnp.int32)


def _plain_counts(num_groups: int, keys: Any) -> Any:
    """The key holder's own counts (plaintext), int32 ``[num_groups]``."""
    k = keys.astype(jnp.int32)
    valid = ((k >= 0) & (k < num_groups)).astype(jnp.int32)
    return jnp.zeros(num_groups, jnp.int32).at[k].add(valid, mode="drop")


def _bit_hot(k: Any, bits: range, start: Any) -> Any:
    """``start`` [n, 1] times the one-hot of the bits ``bits`` of ``k``: [n, 2**len(bits)]."""
    table = start
    for j in bits:
        bit = ((k >> j) & 1)[:, None]
        on = table * bit
        table = jnp.concatenate([table - on, on], axis=1)
    return table


def _secret_digits(num_groups: int, high: int, low: int, keys: Any) -> tuple[Any, Any]:
    """The digit one-hots of secret keys, from their bits (``high``, ``low``: powers of
    two); int32 like `_plain_digits`."""
    k = keys.astype(jnp.int32)
    valid = ((k >= 0) & (k < num_groups)).astype(jnp.int32)[:, None]
    low_bits = low.bit_length() - 1
    low_hot = _bit_hot(k, range(low_bits), jnp.ones_like(valid))
    high_hot = _bit_hot(k, range(low_bits, low_bits + high.bit_length() - 1), valid)
    return high_hot, low_hot


def _digit_sums(num_groups: int, high_hot: Any, low_hot: Any, values: Any) -> Any:
    """``one_hot(keys).T @ values`` from the keys' digit one-hots."""
    n, high, low = high_hot.shape[0], high_hot.shape[1], low_hot.shape[1]
    v = values.reshape(n, -1)
    m = v.shape[1]
    weighted = (high_hot[:, :, None].astype(v.dtype) * v[:, None, :]).reshape(n, high * m)
    sums = _columns_times(low_hot.astype(v.dtype), weighted)  # [high * m, low]
    sums = sums.reshape(high, m, low).transpose(0, 2, 1).reshape(high * low, m)
    return sums[:num_groups].reshape((num_groups, *values.shape[1:]))


def _columns_times(a: Any, b: Any) -> Any:
    """``b.T @ a`` as one vector-matrix product per column of ``a``: the secure device's
    matrix product over a long inner dimension is slow for some output shapes (30x10:
    over 20 s for 10**5 rows), its vector-matrix product is not."""
    return jnp.stack([a[:, j] @ b for j in range(a.shape[1])], axis=1)


def _digit_counts(num_groups: int, high_hot: Any, low_hot: Any) -> Any:
    return _columns_times(low_hot, high_hot).reshape(-1)[:num_groups]


def _secret_sums(num_groups: int, high: int, low: int, keys: Any, values: Any) -> Any:
    return _digit_sums(num_groups, *_secret_digits(num_groups, high, low, keys), values)


def _secret_counts(num_groups: int, high: int, low: int, keys: Any) -> Any:
    return _digit_counts(num_groups, *_secret_digits(num_groups, high, low, keys))


def _mean(sums: Any, counts: Any) -> Any:
    counts = counts.reshape(counts.shape + (1,) * (sums.ndim - 1))
    return sums / jnp.maximum(counts, 1).astype(jnp.float32)


def _sums(op: str, keys: Any, values: Any, num_groups: int, device: str, to: str | None
          ) -> Any:
    """Per-group sums, secret on ``device``."""
    secure_device(op, device, to)
    _check_values(op, _check_keys(op, keys, num_groups), values)
    if on_party(op, keys):
        high, low = digit_bases(num_groups, binary=False)
        digits = mp.device(keys.device)(bind(_plain_digits, num_groups, high, low))(keys)
        return mp.device(device)(bind(_digit_sums, num_groups))(*digits, values)
    high, low = digit_bases(num_groups, binary=True)
    return mp.device(device)(bind(_secret_sums, num_groups, high, low))(keys, values)


def _counts(op: str, keys: Any, num_groups: int, device: str, to: str | None) -> Any:
    """Per-group counts: on the key holder's device, or secret on ``device``."""
    secure_device(op, device, to)
    _check_keys(op, keys, num_groups)
    if on_party(op, keys):
        return mp.device(keys.device)(bind(_plain_counts, num_groups))(keys)
    high, low = digit_bases(num_groups, binary=True)
    return mp.device(device)(bind(_secret_counts, num_groups, high, low))(keys)


@function
def groupby_sum(keys: Any, values: Any, num_groups: int, device: str = "SP0",
                to: str | None = "P0") -> Any:
    """Per-group sums ``out[g] = sum(values[i] for i with keys[i] == g)``, shape
    ``(num_groups,)`` or ``(num_groups, m)``, computed obliviously on ``device`` and
    revealed to ``to`` only (None: kept secret on ``device``)."""
    return reveal(_sums("groupby_sum", keys, values, num_groups, device, to), to)


@function
def groupby_count(keys: Any, num_groups: int, device: str = "SP0",
                  to: str | None = "P0") -> Any:
    """Rows per group (int32, shape ``(num_groups,)``), revealed to ``to`` only.

    Keys held by a party: that party counts its own keys locally (it knows them
    already) and sends the counts to ``to`` (or secret-shares them into ``device``
    when ``to`` is None). Secret keys: counted obliviously on ``device``.
    """
    counts = _counts("groupby_count", keys, num_groups, device, to)
    return mp.put(device if to is None else to, counts)


@function
def groupby_mean(keys: Any, values: Any, num_groups: int, device: str = "SP0",
                 to: str | None = "P0") -> Any:
    """Per-group means (float32; 0 for an empty group), computed on ``device`` from the
    sums and counts, which stay secret there; only the means are revealed to ``to``."""
    op = "groupby_mean"
    sums = _sums(op, keys, values, num_groups, device, to)
    counts = _counts(op, keys, num_groups, device, to)
    return reveal(mp.device(device)(_mean)(sums, counts), to)
