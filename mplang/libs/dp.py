"""Differentially private releases: noisy sums, means, counts and histograms whose
noise is drawn inside the secure device, where no party knows it.

Every function clips the data, adds noise and reveals the noisy result to the one
device ``to``, inside the secure device ``device``:

- **Joint randomness.** Each member of the device draws uniform random words on its
  own side (``crypto.random_bits``) and secret-shares them into the device; there
  they are added modulo ``2**30``. The sum is uniform as long as one member's words
  are, and no member knows it: a coalition the device's model allows (one party of
  ABY3, one of the two of CHEETAH) holds at most its own words.
- **Exact discrete noise.** The noise is discrete Laplace of scale ``t =
  sensitivity / epsilon`` (``P(Z = z)`` proportional to ``exp(-|z| / t)``), the
  difference of two geometric variables. A geometric variable's binary digits are
  independent Bernoulli variables, digit ``i`` one with probability ``q**(2**i) /
  (1 + q**(2**i))``, ``q = exp(-1 / t)``; each is drawn by comparing 60 random bits
  with that probability, computed publicly to 80 decimal digits. Only integer
  comparisons, shifts and additions run on secret data: no floating-point
  logarithm or exponential whose rounding could leak (Mironov, CCS 2012).
- **Distance from the ideal.** Each of the ``2K`` digits is off by at most
  ``2**-60`` and the digits above ``K`` are dropped, which changes the result with
  probability at most ``2**-64`` (``K`` is chosen so): each noise sample is within
  total variation ``2K * 2**-60 + 2 * 2**-64 < 2**-53`` of the ideal discrete
  Laplace (``K <= 30``). A release of ``m`` noise samples is then ``(epsilon,
  delta)``-differentially private with ``delta <= (1 + e**epsilon) * m * 2**-53``.
- **Neighbouring data.** Row counts are public in MPLang (they are in the types),
  so two data sets are neighbours when they differ in one row's value (replace one
  row). Each element of a value is one row. Sensitivities: a sum of values clipped to
  ``bounds = (lo, hi)``, in steps of ``(hi - lo) / levels``, ``levels + 1`` steps (a
  row moves it by ``levels`` steps at most, its rounding by one more); a count, 1; a
  histogram, 2 (one row leaves a group and joins another).
- **Fixed point.** Inside the device each clipped value is scaled to ``(x - lo) /
  (hi - lo) * levels`` (fixed point, off by at most a unit in the last place, far
  below a step), the values are summed and the sum is rounded once to an integer
  number of steps; the noisy integer is revealed, and the receiver rescales it
  (post-processing, which costs no privacy). ``levels`` is the largest power of two up
  to ``2**16`` that keeps the sum and its noise within 32-bit integers: the rounding
  is at most half a step off.

A noisy mean is the noisy sum divided by the (public) row count: all of ``epsilon``
goes to the sum. On a TEE device (attestation SIMULATED here) the enclave draws the
random words itself, inside the computation the data owners attest. The policies'
``dp`` rule accepts a release only if its members derived this module's function for
the epsilon the op names (`mplang.flows.vouched`) and each member's random input is
its own fresh draw, or the enclave's (`mplang.flows.dp_flows`); every release is
charged to each data owner's budget when it accepts the program.
"""

from __future__ import annotations

import decimal
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

import mplang as mp
from mplang.device.cluster import ClusterSpec
from mplang.device.kinds import get_kind
from mplang.dialects import crypto, tensor
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject
from mplang.edsl.tracer import current_tracer
from mplang.flows.vouched import bind, releasing
from mplang.libs.aggregation import device_value, secure_device
from mplang.libs.groupby import digit_bases, digit_counts, secret_digits

mark_library(__file__)

__all__ = ["discrete_laplace_thresholds", "noise_bits", "noisy_count", "noisy_histogram",
           "noisy_mean", "noisy_sum"]

WORD_BITS = 30
"""Random bits per word a member contributes."""
PRECISION = 2 * WORD_BITS
"""Random bits compared with each Bernoulli probability (two words)."""
TAIL_BITS = 64
"""The digits kept make a geometric variable's truncation at most ``2**-TAIL_BITS`` likely."""
MAX_BITS = 30
"""The most digits of a geometric variable (it stays a 32-bit integer)."""
INT_LIMIT = 1 << 30
"""Sums and their noise stay below this (32-bit integers with room)."""
MECHANISM = "discrete Laplace"


def noise_bits(scale: float) -> int:
    """``K``: the binary digits of a geometric variable of discrete Laplace ``scale`` to
    draw so that dropping the others changes it with probability at most
    ``2**-TAIL_BITS`` (``exp(-2**K / scale) <= 2**-64``)."""
    return max(1, math.ceil(math.log2(TAIL_BITS * math.log(2) * scale)))


@functools.lru_cache(maxsize=256)
def discrete_laplace_thresholds(epsilon: float, sensitivity: int) -> tuple[int, ...]:
    """For discrete Laplace noise of scale ``sensitivity / epsilon``: per binary digit
    ``i`` of a geometric variable, ``floor(p_i * 2**PRECISION)`` where ``p_i = q**(2**i) /
    (1 + q**(2**i))``, ``q = exp(-epsilon / sensitivity)``, computed to 80 digits."""
    if type(sensitivity) is not int or sensitivity < 1 or not 0 < epsilon < math.inf:
        raise MPTypeError(f"noise needs an integer sensitivity >= 1 and epsilon > 0, got "
                          f"{sensitivity!r} and {epsilon!r}")
    bits = noise_bits(sensitivity / epsilon)
    if bits > MAX_BITS:
        raise MPTypeError(f"noise of scale {sensitivity / epsilon:g} needs {bits} binary "
                          f"digits, over {MAX_BITS}: raise epsilon")
    with decimal.localcontext() as ctx:
        ctx.prec = 80
        rate = decimal.Decimal(epsilon) / decimal.Decimal(sensitivity)
        out = []
        for i in range(bits):
            power = (-rate * (1 << i)).exp()
            out.append(int(power / (1 + power) * (1 << PRECISION)))
    return tuple(out)


def _joint_words(entropy: Sequence[Any], shape: tuple[int, ...], bits: int) -> Any:
    """The members' words added modulo ``2**WORD_BITS``: ``[*shape, 2, bits, 2]``."""
    total = functools.reduce(jnp.add, entropy)
    return (total & ((1 << WORD_BITS) - 1)).reshape((*shape, 2, bits, 2))


def _discrete_laplace(epsilon: float, sensitivity: int, shape: tuple[int, ...],
                      entropy: Sequence[Any]) -> Any:
    """int32 noise of ``shape``, discrete Laplace of scale ``sensitivity / epsilon``,
    from the members' words: each sample is the difference of two geometric variables,
    each the sum of its independent Bernoulli binary digits."""
    thresholds = discrete_laplace_thresholds(epsilon, sensitivity)
    words = _joint_words(entropy, shape, len(thresholds))
    high = jnp.array([t >> WORD_BITS for t in thresholds], jnp.int32)
    low = jnp.array([t & ((1 << WORD_BITS) - 1) for t in thresholds], jnp.int32)
    u_high, u_low = words[..., 0], words[..., 1]
    digit = (u_high < high) | ((u_high == high) & (u_low < low))
    weights = jnp.array([1 << i for i in range(len(thresholds))], jnp.int32)
    geometric = jnp.sum(digit.astype(jnp.int32) * weights, axis=-1)
    return geometric[..., 0] - geometric[..., 1]


def words_needed(epsilon: float, sensitivity: int, samples: int) -> int:
    """The random words each member contributes for ``samples`` noise samples."""
    return samples * 2 * len(discrete_laplace_thresholds(epsilon, sensitivity)) * 2


def _rows(parts: Sequence[Any]) -> Any:
    return jnp.concatenate([p.reshape(-1) for p in parts])


@releasing(epsilon_arg=0, members_arg=1, mechanism=MECHANISM)
def _noisy_sum(epsilon: float, members: int, lo: float, hi: float, levels: int,
               *shares: Any) -> Any:
    """The sum of the rows clipped to ``[lo, hi]``, less ``rows * lo``, in steps of ``(hi -
    lo) / levels`` rounded once (int32), plus discrete Laplace noise of sensitivity
    ``levels + 1`` (a row moves the sum by at most ``levels`` steps and its fixed-point
    error, the rounding by one step more)."""
    entropy, parts = shares[:members], shares[members:]
    x = jnp.clip(_rows(parts).astype(jnp.float32), lo, hi)
    # each row scaled to [0, levels] before the sum: the device's fixed point would
    # overflow scaling the sum itself (a product of two encodings over 2**63)
    steps = (jnp.sum((x - lo) * (levels / (hi - lo))) + 0.5).astype(jnp.int32)
    return steps + _discrete_laplace(epsilon, levels + 1, (), entropy)


@releasing(epsilon_arg=0, members_arg=1, mechanism=MECHANISM)
def _noisy_count(epsilon: float, members: int, *shares: Any) -> Any:
    """The number of nonzero rows plus discrete Laplace noise of sensitivity 1."""
    entropy, parts = shares[:members], shares[members:]
    count = jnp.sum((_rows(parts) != 0).astype(jnp.int32))
    return count + _discrete_laplace(epsilon, 1, (), entropy)


@releasing(epsilon_arg=0, members_arg=1, mechanism=MECHANISM)
def _noisy_histogram(epsilon: float, members: int, num_groups: int, high: int, low: int,
                     *shares: Any) -> Any:
    """Rows per key in ``[0, num_groups)`` plus independent discrete Laplace noise of
    sensitivity 2 per group."""
    entropy, parts = shares[:members], shares[members:]
    keys = _rows(parts).astype(jnp.int32)
    counts = digit_counts(num_groups, *secret_digits(num_groups, high, low, keys))
    return counts + _discrete_laplace(epsilon, 2, (num_groups,), entropy)


# ---------------------------------------------------------------- the public functions


def _cluster(op: str) -> ClusterSpec:
    cluster = current_tracer(op).cluster
    assert isinstance(cluster, ClusterSpec)  # secure_device checked it
    return cluster


def _party_device(op: str, cluster: ClusterSpec, node: str) -> str:
    """The name of ``node``'s own plaintext device (``P0`` of node_0)."""
    for dev in cluster.devices.values():
        if dev.members == (node,) and not get_kind(dev.kind).joint:
            return dev.name
    raise MPTypeError(f"{op}: node {node} has no device of its own to draw randomness on")


def _entropy(op: str, device: str, words: int) -> list[MPObject]:
    """One fresh draw of ``words`` random words per member of ``device``, each on the
    member's own device, in member order."""
    cluster = _cluster(op)
    draws = []
    for node in cluster.device(device).members:
        party = _party_device(op, cluster, node)
        draws.append(mp.device(party)(
            lambda: crypto.random_bits(count=words, bits=WORD_BITS))())
    return draws


def _parts(op: str, values: Any) -> tuple[list[MPObject], int]:
    """The values (one, or a list of them on any devices), and their total rows."""
    parts = list(values) if isinstance(values, list | tuple) else [values]
    if not parts:
        raise MPTypeError(f"{op}: values must be a device value or a non-empty list of them")
    rows = 0
    for i, v in enumerate(parts):
        t = device_value(op, v, f"values[{i}]" if len(parts) > 1 else "values")
        size = math.prod(t.shape)
        if not isinstance(size, int):
            raise MPTypeError(f"{op}: values[{i}] has a size known only at run time ({t}); a "
                              "release needs its row count in the type")
        rows += size
    return parts, rows


def _check(op: str, epsilon: Any, device: str, to: Any) -> float:
    if to is None:
        raise MPTypeError(f"{op}: a noisy release goes to one party's device, e.g. to='P0'")
    secure_device(op, device, to)
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or \
            not 0 < epsilon < math.inf:
        raise MPTypeError(f"{op}: epsilon must be a number greater than 0, got {epsilon!r}")
    return float(epsilon)


def _bounds(op: str, bounds: Any) -> tuple[float, float]:
    try:
        lo, hi = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise MPTypeError(f"{op}: bounds must be (lo, hi), got {bounds!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise MPTypeError(f"{op}: bounds must be finite with lo < hi, got {bounds!r}")
    return lo, hi


def quantization_levels(op: str, rows: int, epsilon: float) -> int:
    """The largest power of two up to ``2**16`` that keeps a sum of ``rows`` quantized
    rows and its noise below `INT_LIMIT`."""
    for bits in range(16, 3, -1):
        levels = 1 << bits
        if rows * levels + (2 << noise_bits((levels + 1) / epsilon)) < INT_LIMIT:
            return levels
    raise MPTypeError(f"{op}: {rows} rows at epsilon {epsilon:g} do not fit a 32-bit noisy "
                      "sum; release sums of fewer rows")


def _release(op: str, fn: Any, static: tuple[Any, ...], parts: list[MPObject],
             epsilon: float, sensitivity: int, samples: int, device: str, to: str) -> Any:
    dev = _cluster(op).device(device)
    words = words_needed(epsilon, sensitivity, samples)
    if get_kind(dev.kind).enclave:  # it draws the noise itself
        noisy = mp.device(device)(_in_enclave(bind(fn, epsilon, 1, *static), words))(*parts)
    else:
        entropy = _entropy(op, device, words)
        noisy = mp.device(device)(bind(fn, epsilon, len(dev.members), *static))(
            *entropy, *parts)
    return mp.put(to, noisy)


def _in_enclave(release: Any, words: int) -> Any:
    """What an enclave runs: ``release`` with random words it draws itself."""
    def body(*parts: Any) -> Any:
        return tensor.run_jax(release, crypto.random_bits(count=words, bits=WORD_BITS),
                              *parts)

    body.mplang_ops = True  # type: ignore[attr-defined]  # read by the TEE device
    body.__name__ = release.__name__
    return body


def _noisy_steps(op: str, values: Any, bounds: Any, epsilon: Any, device: str, to: str
                 ) -> tuple[Any, float, float, int, int]:
    """The noisy sum of clipped ``values`` in steps, revealed to ``to``; ``lo``, ``hi``,
    ``levels`` and the rows, to rescale it."""
    eps = _check(op, epsilon, device, to)
    lo, hi = _bounds(op, bounds)
    parts, rows = _parts(op, values)
    levels = quantization_levels(op, rows, eps)
    noisy = _release(op, _noisy_sum, (lo, hi, levels), parts, eps, levels + 1, 1, device, to)
    return noisy, lo, hi, levels, rows


@function
def noisy_sum(values: Any, bounds: tuple[float, float], epsilon: float,
              device: str = "SP0", to: str = "P0") -> Any:
    """The sum of ``values`` (a device value, or a list of them on any parties' devices or
    on ``device``; every element is one row) clipped to ``bounds``, plus discrete Laplace
    noise for ``epsilon``-differential privacy, released to ``to`` only (float32). Noise
    scale: ``(hi - lo) / epsilon`` (and a step more; standard deviation about ``sqrt(2)``
    times that)."""
    noisy, lo, hi, levels, rows = _noisy_steps("dp.noisy_sum", values, bounds, epsilon,
                                               device, to)
    return mp.device(to)(bind(_rescale, lo * rows, (hi - lo) / levels))(noisy)


@function
def noisy_mean(values: Any, bounds: tuple[float, float], epsilon: float,
               device: str = "SP0", to: str = "P0") -> Any:
    """The mean of ``values`` (as `noisy_sum`) clipped to ``bounds``: the noisy sum over
    the public row count, released to ``to`` only. Noise scale ``(hi - lo) / (rows *
    epsilon)``."""
    noisy, lo, hi, levels, rows = _noisy_steps("dp.noisy_mean", values, bounds, epsilon,
                                               device, to)
    return mp.device(to)(bind(_rescale, lo, (hi - lo) / levels / rows))(noisy)


@function
def noisy_count(values: Any, epsilon: float, device: str = "SP0", to: str = "P0") -> Any:
    """How many rows of ``values`` (as `noisy_sum`) are nonzero, plus discrete Laplace
    noise of scale ``1 / epsilon``, released to ``to`` only (int32)."""
    op = "dp.noisy_count"
    eps = _check(op, epsilon, device, to)
    parts, _ = _parts(op, values)
    return _release(op, _noisy_count, (), parts, eps, 1, 1, device, to)


@function
def noisy_histogram(keys: Any, num_groups: int, epsilon: float, device: str = "SP0",
                    to: str = "P0", *, nonnegative: bool = False) -> Any:
    """Rows per group of ``keys`` (integers in ``[0, num_groups)``, one per row; a device
    value or a list of them), each count plus independent discrete Laplace noise of scale
    ``2 / epsilon``, released to ``to`` only: int32 ``[num_groups]``. Groups are disjoint,
    so the whole histogram costs ``epsilon`` (parallel composition). A key out of range
    counts in no group. The noise can make a count negative (an empty group's with
    probability ``q / (1 + q)``, ``q = exp(-epsilon / 2)``: 0.38 at epsilon 1).
    ``nonnegative``: ``to`` replaces each negative count by 0 after the reveal
    (post-processing, no privacy cost; the secure device runs the same function), which
    biases the counts of small groups upwards."""
    op = "dp.noisy_histogram"
    eps = _check(op, epsilon, device, to)
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups < 1:
        raise MPTypeError(f"{op}: num_groups must be an int >= 1, got {num_groups!r}")
    parts, _ = _parts(op, keys)
    high, low = digit_bases(num_groups, binary=True)
    counts = _release(op, _noisy_histogram, (num_groups, high, low), parts, eps, 2,
                      num_groups, device, to)
    return mp.device(to)(_nonnegative)(counts) if nonnegative else counts


def _nonnegative(counts: Any) -> Any:
    """Negative noisy counts as 0: post-processing."""
    return jnp.maximum(counts, 0)


def _rescale(offset: float, step: float, noisy: Any) -> Any:
    """A noisy integer count of quantization steps as a value: post-processing."""
    return offset + step * noisy.astype(jnp.float32)

