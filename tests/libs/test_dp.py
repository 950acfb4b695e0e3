"""Noisy releases (`mplang.libs.dp`): the sampler's distribution, the noise scale on the
secure device for several epsilons and bounds, clipping, argument checks, and what each
party holds of a release.

Intervals: a discrete Laplace sample of scale ``t`` has variance ``2q / (1 - q)**2``,
``q = exp(-1/t)``, and kurtosis at most 6, so the sample variance of ``n`` samples has a
relative standard error of at most ``sqrt(5 / n)`` and the sample standard deviation
about half that; the tests allow five such standard errors (and five for the mean:
``5 * std / sqrt(n)``), which an exact sampler misses with probability below 1e-6.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.flows.vouched import bind
from mplang.libs import dp
from mplang.records.audit import PLAINTEXT
from mplang.transport.wire import privacy_kind

RNG = np.random.default_rng(11)


def dlap_std(epsilon: float, sensitivity: int) -> float:
    q = math.exp(-epsilon / sensitivity)
    return math.sqrt(2 * q) / (1 - q)


def draws(epsilon: float, sensitivity: int, samples: int, members: int = 3) -> list[Any]:
    words = dp.words_needed(epsilon, sensitivity, samples)
    return [jnp.asarray(RNG.integers(0, 1 << dp.WORD_BITS, words, dtype=np.int32))
            for _ in range(members)]


def check_scale(noise: np.ndarray, epsilon: float, sensitivity: int) -> None:
    n = noise.size
    sigma = dlap_std(epsilon, sensitivity)
    assert abs(noise.std() / sigma - 1) < 5 * 0.5 * math.sqrt(5 / n), (noise.std(), sigma)
    assert abs(noise.mean()) < 5 * sigma / math.sqrt(n), noise.mean()


@pytest.mark.parametrize("epsilon, sensitivity", [(1.0, 1), (0.5, 2), (0.25, 1024)])
def test_the_sampler_gives_the_discrete_laplace_distribution(epsilon: float,
                                                             sensitivity: int) -> None:
    """The sampler (plain JAX, members' words drawn here): its frequencies match the
    probabilities ``(1 - q) / (1 + q) * q**|z|`` (chi-square over the central values), its
    scale and mean match."""
    n = 100_000
    noise = np.asarray(dp._discrete_laplace(epsilon, sensitivity, (n,),
                                            draws(epsilon, sensitivity, n)))
    check_scale(noise, epsilon, sensitivity)
    q = math.exp(-epsilon / sensitivity)
    scale = sensitivity / epsilon
    width, cell = int(4 * scale) + 3, max(1, int(scale / 8))
    values = np.arange(-width, width + 1)
    pmf = n * (1 - q) / (1 + q) * q ** np.abs(values.astype(np.float64))
    edges = np.arange(-width, width + 2, cell)  # cells of `cell` values
    expected = np.add.reduceat(pmf, edges[:-1] + width)
    observed = np.histogram(noise, bins=edges - 0.5)[0]
    keep = expected > 20
    chi2 = (((observed - expected) ** 2 / expected)[keep]).sum()
    dof = int(keep.sum())
    assert dof >= 10
    assert chi2 < dof + 6 * math.sqrt(2 * dof), (chi2, dof)


def test_thresholds_are_the_digit_probabilities() -> None:
    """Digit ``i`` is one with probability ``q**(2**i) / (1 + q**(2**i))``; the digits drawn
    make truncation at most 2**-64 likely and stay within 30."""
    thresholds = dp.discrete_laplace_thresholds(0.5, 2)
    q = math.exp(-0.25)
    for i, t in enumerate(thresholds):
        assert t / 2 ** dp.PRECISION == pytest.approx(q ** 2 ** i / (1 + q ** 2 ** i), rel=1e-12,
                                                       abs=2 ** -60)
    assert math.exp(-2 ** len(thresholds) / 4) <= 2 ** -64
    with pytest.raises(mp.MPTypeError, match="raise epsilon"):
        dp.discrete_laplace_thresholds(1e-6, 1 << 16)
    with pytest.raises(mp.MPTypeError, match="integer sensitivity >= 1"):  # a forged levels
        dp.discrete_laplace_thresholds(1.0, -8191)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_histogram_noise_on_the_secure_device(sim: mp.Simulator, epsilon: float) -> None:
    """1000 groups, 3 rows each: 1000 noise samples of scale 2 / epsilon from ABY3."""
    groups = 1000
    keys = np.arange(3 * groups, dtype=np.int32) % groups

    def prog() -> Any:
        k = mp.device("P1")(lambda: jnp.asarray(keys))()
        return dp.noisy_histogram(k, groups, epsilon=epsilon, to="P0")

    counts = mp.fetch(sim, mp.evaluate(sim, prog))
    assert counts.shape == (groups,) and counts.dtype == np.int32
    check_scale(counts.astype(np.float64) - 3, epsilon, 2)


@pytest.mark.parametrize("bounds, epsilon", [((0.0, 10.0), 1.0), ((-5.0, 15.0), 0.5),
                                             ((0.0, 1.0), 4.0)])
def test_sum_and_mean_noise_on_the_secure_device(sim: mp.Simulator,
                                                 bounds: tuple[float, float],
                                                 epsilon: float) -> None:
    """40 releases of one sum and 40 of one mean over two parties' rows, some outside
    ``bounds``: in steps of ``(hi - lo) / levels``, the noise has the scale ``(levels + 1)
    / epsilon`` and is centred on the clipped sum (a step of slack for the rounding, and
    for the device's fixed point)."""
    lo, hi = bounds
    x = RNG.uniform(lo - 2, hi + 2, 500).astype(np.float32)
    runs = 40
    levels = dp.quantization_levels("test", x.size, epsilon)
    step = (hi - lo) / levels

    def prog() -> Any:  # batches of 10: a program of 80 independent releases deadlocks
        a = mp.device("P0")(lambda: jnp.asarray(x[:300]))()  # the simulator (as do 100
        b = mp.device("P1")(lambda: jnp.asarray(x[300:]))()  # secure_sums: every thread
        return ([dp.noisy_sum([a, b], bounds, epsilon, to="P2") for _ in range(10)],  # waits)
                [dp.noisy_mean([a, b], bounds, epsilon, to="P0") for _ in range(10)])

    batches = [mp.evaluate(sim, prog) for _ in range(runs // 10)]
    sums = [v for batch in batches for v in batch[0]]
    means = [v for batch in batches for v in batch[1]]
    steps = (np.clip(x.astype(np.float64), lo, hi) - lo).sum() / step
    sigma = dlap_std(epsilon, levels + 1)
    for values, rows in ((sums, 1), (means, x.size)):
        released = np.array([mp.fetch(sim, v) for v in values], np.float64)
        noise = (released * rows - lo * x.size) / step - steps
        assert abs(noise.std() / sigma - 1) < 5 * 0.5 * math.sqrt(5 / runs), noise.std()
        assert abs(noise.mean()) < 5 * sigma / math.sqrt(runs) + 2, noise.mean()


def test_values_outside_the_bounds_are_clipped_inside_the_device(sim: mp.Simulator) -> None:
    x = np.full(100, 1000.0, np.float32)

    def prog() -> Any:
        a = mp.device("P0")(lambda: jnp.asarray(x))()
        return (dp.noisy_mean(a, (0.0, 10.0), epsilon=50.0, to="P0"),
                dp.noisy_count(mp.device("P1")(lambda: jnp.arange(10) % 3)(), 50.0, to="P1"))

    mean, count = (mp.fetch(sim, v) for v in mp.evaluate(sim, prog))
    assert mean == pytest.approx(10.0, abs=0.05)
    assert abs(int(count) - 6) <= 2


@pytest.mark.parametrize("call, message", [
    (lambda a: dp.noisy_sum(a, (0, 1), 1.0, to=None), "goes to one party's device"),
    (lambda a: dp.noisy_sum(a, (0, 1), 0.0), "epsilon must be a number greater than 0"),
    (lambda a: dp.noisy_sum(a, (1, 0), 1.0), "bounds must be finite with lo < hi"),
    (lambda a: dp.noisy_sum(a, (0, 1), 1.0, device="P1"), "one party, which would see"),
    (lambda a: dp.noisy_histogram(a, 0, 1.0), "num_groups must be an int >= 1"),
    (lambda a: dp.noisy_count(3.0, 1.0), "values must be a value on a device"),
])
def test_bad_arguments_fail_at_trace_time(sim: mp.Simulator, call: Any, message: str) -> None:
    with pytest.raises(mp.MPTypeError, match=message):
        mp.evaluate(sim, lambda: call(mp.device("P0")(lambda: jnp.zeros(4, jnp.int32))()))


def test_each_party_holds_only_its_own_draw_and_the_noise_needs_every_draw(
        sim: mp.Simulator) -> None:
    """The sampler's inputs: each member's draw, held by that member only; the release,
    held by ``to`` only; on the device, every party holds a share, never plaintext. The
    noise is the function of all three draws: given any one of them, the others' words
    (uniform) leave it distributed as the noise itself."""
    data = np.arange(20, dtype=np.int32) % 2
    eps = 1.0

    def prog() -> Any:
        entropy = dp._entropy("t", "SP0", dp.words_needed(eps, 1, 1))
        noisy = mp.device("SP0")(bind(dp._noisy_count, eps, 3))(
            *entropy, mp.device("P1")(lambda: jnp.asarray(data))())
        return noisy, mp.put("P0", noisy), entropy

    secret, released, entropy = mp.evaluate(sim, prog)
    for i, draw in enumerate(entropy):
        held = sim.held(draw)
        assert [h is not None for h in held] == [r == i for r in range(3)]
    assert [h is not None for h in sim.held(released)] == [True, False, False]
    assert all(privacy_kind(h) != PLAINTEXT for h in sim.held(secret))
    words = [np.asarray(sim.held(d)[i]) for i, d in enumerate(entropy)]
    noise = int(sim.held(released)[0]) - int(data.sum())
    assert noise == int(dp._discrete_laplace(eps, 1, (), [jnp.asarray(w) for w in words]))
    # party 0's view: its own words; the others' unknown to it
    others = [np.asarray(dp._discrete_laplace(eps, 1, (4000,), [
        jnp.tile(jnp.asarray(words[0]), 4000), *draws(eps, 1, 4000, 2)]))]
    check_scale(np.concatenate(others).astype(np.float64), eps, 1)


@pytest.mark.filterwarnings("ignore::mplang.InsecureDeviceWarning")
def test_histogram_noise_drawn_inside_an_enclave() -> None:
    """On a TEE (mock attestation) the enclave draws the words: the same noise scale."""
    cluster = mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{9100 + i}"} for i in range(3)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]} for i in range(3)},
                    "T0": {"kind": "TEE", "members": ["node_2"],
                           "config": {"attestation": "mock"}}}})
    keys = np.arange(2000, dtype=np.int32) % 1000

    def prog() -> Any:
        k = mp.device("P1")(lambda: jnp.asarray(keys))()
        return dp.noisy_histogram(k, 1000, epsilon=1.0, device="T0", to="P0")

    with mp.Simulator(cluster) as sim:
        counts = mp.fetch(sim, mp.evaluate(sim, prog))
    check_scale(counts.astype(np.float64) - 2, 1.0, 2)
