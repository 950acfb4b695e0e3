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

Small groups are suppressed: every group of fewer than ``min_rows`` rows (10 by
default, the bound of the policies ``mplang init`` writes) is reported as 0, its sum,
count or mean alike. The suppression runs inside the secure device, with counts
that stay secret there, so no party learns which groups were small. That is the
rule these functions rely on: a group's size depends on the keys, which a values
owner cannot see, and each of its parties accepts a release only if its policy's
``aggregate`` rule allows ``min_rows``-row groups (its members derive the
suppressing function themselves: `mplang.flows.vouched`). Pass
``min_rows=1`` to suppress nothing, where no policy asks for more. The key holder's
rows are weighted by the values (a peer's ``2 ** i`` would spell out its keys): its
policy approves the group-by by name (``approve: - {library: mplang.libs.groupby,
to: [...]}``). Sums, counts and means over the same keys in one program are one
release; two group-bys over different keys of one party's values are refused, as is
one beside another aggregate of the same values: their groups could differ by a
single row. Group several value columns at once as one ``[n, m]`` matrix.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

import mplang as mp
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.typing import Dim
from mplang.flows.vouched import bind, suppressing
from mplang.libs.aggregation import device_value, on_party, reveal, secure_device

__all__ = ["digit_bases", "groupby_count", "groupby_mean", "groupby_sum"]


def _check_keys(op: str, keys: Any, num_groups: Any) -> Dim:
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


def _check_min_rows(op: str, min_rows: Any) -> int:
    if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1:
        raise MPTypeError(f"{op}: min_rows must be a positive int (groups of fewer rows "
                          f"are reported as 0), got {min_rows!r}")
    return min_rows


def _check_values(op: str, rows: Dim, values: Any) -> None:
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


def _suppress(out: Any, counts: Any, min_rows: int) -> Any:
    """``out`` (one row per group) with the groups of fewer than ``min_rows`` rows zeroed."""
    keep = (counts >= min_rows).reshape(counts.shape + (1,) * (out.ndim - 1))
    return jnp.where(keep, out, jnp.zeros_like(out))


def _bit_hot(k: Any, bits: range, start: Any) -> Any:
    """``start`` [n, 1] times the one-hot of the bits ``bits`` of ``k``: [n, 2**len(bits)]."""
    table = start
    for j in bits:
        bit = ((k >> j) & 1)[:, None]
        on = table * bit
        table = jnp.concatenate([table - on, on], axis=1)
    return table


def secret_digits(num_groups: int, high: int, low: int, keys: Any) -> tuple[Any, Any]:
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


def digit_counts(num_groups: int, high_hot: Any, low_hot: Any) -> Any:
    return _columns_times(low_hot, high_hot).reshape(-1)[:num_groups]


@suppressing(min_rows_arg=1, release="groupby_sum")
def _suppressed_sums(num_groups: int, min_rows: int, high_hot: Any, low_hot: Any,
                     values: Any) -> Any:
    """Per-group sums from the keys' digit one-hots, small groups zeroed."""
    sums = _digit_sums(num_groups, high_hot, low_hot, values)
    return _suppress(sums, digit_counts(num_groups, high_hot, low_hot), min_rows)


@suppressing(min_rows_arg=1, release="groupby_count")
def _suppressed_counts(num_groups: int, min_rows: int, high_hot: Any, low_hot: Any) -> Any:
    """Rows per group from the keys' digit one-hots, small groups zeroed."""
    counts = digit_counts(num_groups, high_hot, low_hot)
    return _suppress(counts, counts, min_rows)


@suppressing(min_rows_arg=3, release="groupby_sum")
def _secret_sums(num_groups: int, high: int, low: int, min_rows: int, keys: Any,
                 values: Any) -> Any:
    """Per-group sums of secret keys, small groups zeroed."""
    digits = secret_digits(num_groups, high, low, keys)
    return _suppressed_sums(num_groups, min_rows, *digits, values)


@suppressing(min_rows_arg=3, release="groupby_count")
def _secret_counts(num_groups: int, high: int, low: int, min_rows: int, keys: Any) -> Any:
    """Rows per group of secret keys, small groups zeroed."""
    counts = digit_counts(num_groups, *secret_digits(num_groups, high, low, keys))
    return _suppress(counts, counts, min_rows)


def _with_ones(values: Any) -> Any:
    """``values`` as float32 columns and a column of ones, whose group sums are the
    groups' row counts."""
    columns = values.reshape(values.shape[0], -1).astype(jnp.float32)
    return jnp.concatenate([columns, jnp.ones((columns.shape[0], 1), jnp.float32)], axis=1)


def _mean(vector: bool, sums: Any) -> Any:
    """Means from the group sums of `_with_ones` columns (a vector of one column each if
    ``vector``)."""
    means = sums[:, :-1] / jnp.maximum(sums[:, -1:], 1.0)
    return means[:, 0] if vector else means


def _sums(op: str, keys: Any, values: Any, num_groups: int, device: str, to: str | None,
          min_rows: int) -> Any:
    """Per-group sums (small groups zeroed), secret on ``device``."""
    secure_device(op, device, to)
    _check_values(op, _check_keys(op, keys, num_groups), values)
    min_rows = _check_min_rows(op, min_rows)
    if on_party(op, keys):
        digits = _digits_of(keys, num_groups, device)
        return mp.device(device)(bind(_suppressed_sums, num_groups, min_rows))(*digits, values)
    high, low = digit_bases(num_groups, binary=True)
    return mp.device(device)(bind(_secret_sums, num_groups, high, low, min_rows))(keys, values)


def _digits_of(keys: Any, num_groups: int, device: str) -> Any:
    """The key holder's digit one-hots of ``keys``, sealed in ``device``: made once per
    traced keys value, so that the group-bys over the same keys in one program group by
    the same value, and their releases are one (the device's flow rule tells groups
    apart by their first input)."""
    def make() -> Any:
        high, low = digit_bases(num_groups, binary=False)
        digits = mp.device(keys.device)(bind(_plain_digits, num_groups, high, low))(keys)
        return [mp.put(device, d) for d in digits]

    tracer = getattr(keys, "tracer", None)
    if tracer is None:
        return make()
    key = ("groupby digits", id(keys.value), num_groups, device)
    if key not in tracer.memo:
        tracer.memo[key] = make()
    return tracer.memo[key]


def _counts(op: str, keys: Any, num_groups: int, device: str, to: str | None,
            min_rows: int) -> Any:
    """Per-group counts (small groups zeroed), secret on ``device``: from the digits of
    party-held keys that a sum over the same keys uses too (one grouping)."""
    secure_device(op, device, to)
    _check_keys(op, keys, num_groups)
    min_rows = _check_min_rows(op, min_rows)
    if on_party(op, keys):
        digits = _digits_of(keys, num_groups, device)
        return mp.device(device)(bind(_suppressed_counts, num_groups, min_rows))(*digits)
    high, low = digit_bases(num_groups, binary=True)
    return mp.device(device)(bind(_secret_counts, num_groups, high, low, min_rows))(keys)


@function
def groupby_sum(keys: Any, values: Any, num_groups: int, device: str = "SP0",
                to: str | None = "P0", min_rows: int = 10) -> Any:
    """Per-group sums ``out[g] = sum(values[i] for i with keys[i] == g)``, shape
    ``(num_groups,)`` or ``(num_groups, m)``, computed obliviously on ``device`` and
    revealed to ``to`` only (None: kept secret on ``device``). A group of fewer than
    ``min_rows`` rows is reported as 0. Relies on the ``aggregate`` rule of each values
    owner's policy (groups of ``min_rows`` rows, suppressed in the device)."""
    return reveal(_sums("groupby_sum", keys, values, num_groups, device, to, min_rows), to)


@function
def groupby_count(keys: Any, num_groups: int, device: str = "SP0",
                  to: str | None = "P0", min_rows: int = 10) -> Any:
    """Rows per group (int32, shape ``(num_groups,)``), revealed to ``to`` only; a group
    of fewer than ``min_rows`` rows is reported as 0.

    Counted obliviously on ``device``, from the same digits of the keys as a
    `groupby_sum` or `groupby_mean` over them in the program: the counts and the sums
    are one release of the groups. The key holder's policy judges the counts as an
    aggregate of its keys.
    """
    return reveal(_counts("groupby_count", keys, num_groups, device, to, min_rows), to)


@function
def groupby_mean(keys: Any, values: Any, num_groups: int, device: str = "SP0",
                 to: str | None = "P0", min_rows: int = 10) -> Any:
    """Per-group means (float32; 0 for an empty group or one of fewer than ``min_rows``
    rows), computed on ``device`` from the sums and counts, which stay secret there; only
    the means are revealed to ``to``. Relies on the ``aggregate`` rule like
    `groupby_sum`: the counts are the group sums of a column of ones beside the values,
    so one suppressed sum over the same groups gives both (two would be two releases of
    the key holder's rows, when it owns values too)."""
    op = "groupby_mean"
    secure_device(op, device, to)
    _check_values(op, _check_keys(op, keys, num_groups), values)
    vector = len(device_value(op, values, "values").shape) == 1
    augmented = mp.device(values.device)(_with_ones)(values)
    sums = _sums(op, keys, augmented, num_groups, device, to, min_rows)
    return reveal(mp.device(device)(bind(_mean, vector))(sums), to)
