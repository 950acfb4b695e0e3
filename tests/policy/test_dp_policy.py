"""The ``dp`` declassification rule in the simulator: releases within ``max_epsilon`` are
accepted and charged to each owner's budget at accept time, the budget runs out, an
exact aggregate of the same data is refused, a refused run is refunded; and a malicious
driver's tries: a smaller epsilon than the noise added, known or reused randomness, a
lie about the members, rows counted twice, a release in a loop, replaying a program.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.flows.vouched import bind
from mplang.libs import dp
from mplang.libs.aggregation import secure_mean

X = np.linspace(0.0, 10.0, 100).astype(np.float32)
DP_ONLY = "declassify:\n  - {to: ['*'], when: dp, max_epsilon: 1.0, budget: 2.0}\n"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[mp.Simulator]:
    """node_0 holds x.npy, allows only dp releases of at most epsilon 1, 2 in all; node_1
    holds y.npy and allows dp releases of up to 1 too (budget 10); node_2 holds nothing."""
    roots = {}
    for node in ("node_0", "node_1", "node_2"):
        roots[node] = tmp_path / node
        roots[node].mkdir()
    np.save(roots["node_0"] / "x.npy", X)
    np.save(roots["node_1"] / "y.npy", X[::-1].copy())
    (tmp_path / "p0.yaml").write_text(DP_ONLY)
    (tmp_path / "p1.yaml").write_text(DP_ONLY.replace("budget: 2.0", "budget: 10"))
    with mp.Simulator(3, data_roots={n: str(r) for n, r in roots.items()},
                      policies={"node_0": str(tmp_path / "p0.yaml"),
                                "node_1": str(tmp_path / "p1.yaml")}) as s:
        yield s


def x() -> Any:
    return mp.device("P0")(lambda: tensor.load("x.npy"))()


def spent(sim: mp.Simulator, rank: int = 0) -> dict[str, float]:
    guard = sim.mesh.workers[rank].guard
    assert guard is not None
    return guard.ledger.spent()


def mean(eps: float, to: str = "P1") -> Any:
    return dp.noisy_mean(x(), (0.0, 10.0), eps, to=to)


def test_a_release_within_max_epsilon_runs_and_is_charged(sim: mp.Simulator) -> None:
    assert mp.fetch(sim, mp.evaluate(sim, lambda: mean(0.5))) == pytest.approx(5.0, abs=2.0)
    assert spent(sim) == {"x.npy": 0.5}
    assert spent(sim, 1) == {}  # node_1's data is not in it


def test_the_per_release_cap_refuses_a_larger_epsilon(sim: mp.Simulator) -> None:
    with pytest.raises(mp.MPRefusedError, match=(
            r"^node_0 refuses the program: op spu\.reveal at .* sends the value revealed from "
            r"SP0, a noisy release \(epsilon 1\.5\) of x\.npy, to node_1; add a rule \{to: "
            r"\[node_1\], when: dp, max_epsilon: 1\.5\}")):
        mp.evaluate(sim, lambda: mean(1.5))
    assert spent(sim) == {}


def test_the_budget_runs_out(sim: mp.Simulator) -> None:
    for _ in range(2):
        mp.evaluate(sim, lambda: mean(0.75))
    with pytest.raises(mp.MPRefusedError, match=(
            r"^node_0 refuses the program: the privacy budget is spent: its releases of "
            r"x\.npy spend epsilon 0\.75, but only 0\.5 of the budget 2 is left \(1\.5 spent\)")):
        mp.evaluate(sim, lambda: mean(0.75))
    assert spent(sim) == {"x.npy": 1.5}
    mp.evaluate(sim, lambda: mean(0.5))  # what is left can still be spent
    assert spent(sim) == {"x.npy": 2.0}


def test_two_releases_of_one_program_are_charged_together(sim: mp.Simulator) -> None:
    """Each within the cap, together over the budget: refused, nothing charged."""
    mp.evaluate(sim, lambda: mean(0.5))
    with pytest.raises(mp.MPRefusedError, match=r"spend epsilon 2, but only 1\.5"):
        mp.evaluate(sim, lambda: (mean(1.0), mean(1.0, to="P2")))
    assert spent(sim) == {"x.npy": 0.5}


def test_a_histogram_of_two_owners_charges_each(sim: mp.Simulator) -> None:
    def prog() -> Any:
        k0 = mp.device("P0")(lambda v: v.astype(jnp.int32))(x())
        k1 = mp.device("P1")(lambda v: v.astype(jnp.int32))(
            mp.device("P1")(lambda: tensor.load("y.npy"))())
        return dp.noisy_histogram([k0, k1], 11, epsilon=0.8, to="P2")

    counts = mp.fetch(sim, mp.evaluate(sim, prog))
    assert counts.shape == (11,) and abs(int(counts.sum()) - 200) < 100
    assert spent(sim) == {"x.npy": 0.8} and spent(sim, 1) == {"y.npy": 0.8}


def test_a_nonnegative_histogram_is_clamped_by_its_receiver(sim: mp.Simulator) -> None:
    """Noise makes counts of empty groups negative; ``nonnegative`` clamps them at 0 on
    the receiver after the reveal: the secure device's op (the StableHLO its members vouch
    for) is the same, the dp rule accepts it, and it costs the same epsilon."""
    def prog(nonnegative: bool) -> Any:
        keys = mp.device("P0")(lambda v: v.astype(jnp.int32))(x())  # 11 of 200 groups
        return dp.noisy_histogram(keys, 200, 0.1, to="P2", nonnegative=nonnegative)

    def release(nonnegative: bool) -> dict[str, Any]:
        with sim:
            program = mp.compile(lambda: prog(nonnegative), cluster=sim.cluster)
        op = next(op for op in program.graph.operations if op.attrs.get("library"))
        return {k: op.attrs[k] for k in ("library", "library_args", "stablehlo")}

    assert release(True) == release(False)
    raw = mp.fetch(sim, mp.evaluate(sim, lambda: prog(False)))
    clamped = mp.fetch(sim, mp.evaluate(sim, lambda: prog(True)))
    # 189 empty groups, each below 0 with probability 0.49 (scale 20)
    assert raw.min() < 0 <= clamped.min() and clamped.dtype == np.int32
    assert spent(sim) == {"x.npy": 0.2}


def test_an_exact_aggregate_of_the_same_data_is_refused(sim: mp.Simulator) -> None:
    with pytest.raises(mp.MPRefusedError, match=(
            "sends the value revealed from SP0, aggregate over 100 rows of x.npy, to node_1; "
            r"add a rule \{to: \[node_1\], when: aggregate, min_rows: 100\}")):
        mp.evaluate(sim, lambda: mp.put("P1", mp.device("SP0")(jnp.mean)(x())))
    with pytest.raises(mp.MPRefusedError, match=r"aggregate over 100 rows of x\.npy, to node_2"):
        mp.evaluate(sim, lambda: secure_mean([mp.device("P0")(jnp.sum)(x()),
                                              mp.device("P1")(lambda: jnp.float32(1))()],
                                             to="P2"))


def test_a_run_another_party_refuses_is_refunded(sim: mp.Simulator) -> None:
    """node_0 accepts (and is charged), node_1 refuses: the run never starts, node_0 gets
    its epsilon back."""
    def prog() -> Any:
        y = mp.device("P1")(lambda: tensor.load("y.npy"))()
        return mean(0.5), mp.put("P2", y)  # node_1's raw data: refused by node_1

    with pytest.raises(mp.MPRefusedError, match=r"^node_1 refuses the program"):
        mp.evaluate(sim, prog)
    guard = sim.mesh.workers[0].guard
    assert guard is not None
    report = guard.ledger.report(2.0)
    assert report["spent"] == {"x.npy": 0.0}
    assert [c["refunded"] for c in report["charges"]] == [True]


# ---------------------------------------------------------------- a malicious driver

def test_claiming_a_smaller_epsilon_than_the_noise_added_is_refused(sim: mp.Simulator) -> None:
    """The op adds the noise of epsilon 50 but names epsilon 0.5: the members derive other
    StableHLO for 0.5, vouch for nothing, and the result is raw data of x.npy."""
    with sim:
        program = mp.compile(lambda: mean(50.0), cluster=sim.cluster)
    ops = program.graph.operations
    i = next(i for i, op in enumerate(ops) if op.attrs.get("library", "").endswith("_noisy_sum"))
    args = ops[i].attrs["library_args"]
    ops[i] = ops[i].replace(attrs={**ops[i].attrs, "library_args": (0.5, *args[1:])})
    with pytest.raises(mp.MPRefusedError, match=(
            r"^node_0 refuses the program: op spu\.reveal .* raw of .*x\.npy, to node_1")):
        mp.evaluate(sim, program)
    assert spent(sim) == {}


def _release(entropy: list[Any], *data: Any, members: int = 3) -> Any:
    levels = dp.quantization_levels("t", 100, 1.0)
    return mp.put("P1", mp.device("SP0")(bind(dp._noisy_sum, 1.0, members, 0.0, 10.0, levels))(
        *entropy, *data))


def _draws() -> list[Any]:
    return dp._entropy("t", "SP0", dp.words_needed(1.0, dp.quantization_levels("t", 100, 1.0),
                                                   1))


@pytest.mark.parametrize("attack, reason", [
    (lambda: _release([mp.device(f"P{i}")(lambda: jnp.zeros(
        dp.words_needed(1.0, dp.quantization_levels("t", 100, 1.0), 1), jnp.int32))()
        for i in range(3)], x()),
     "this party's random input is not a fresh crypto.random_bits draw of its own"),
    (lambda: (lambda d: (_release(d, x()), _release(d, x())))(_draws()),
     "its random draw is used by another release"),
    (lambda: _release(_draws(), x(), members=1), "its random inputs are not one per member"),
    (lambda: _release(_draws(), x(), x()), "two data inputs hold the same rows"),
    (lambda: _release(_draws(), mp.device("P0")(lambda v: jnp.concatenate([v, v]))(x())),
     "data input 3 is .* not one element per row"),
    (lambda: _release([*_draws()[:2], mp.device("P0")(
        lambda v: jnp.zeros(88, jnp.int32) + v[0].astype(jnp.int32))(x())], x()),
     "the random input of party 2 carries"),
])
def test_releases_a_member_cannot_vouch_for_are_refused(sim: mp.Simulator, attack: Any,
                                                        reason: str) -> None:
    with pytest.raises(mp.MPRefusedError, match="^node_0 refuses the program: .*" + reason):
        mp.evaluate(sim, attack)
    assert spent(sim) == {}


def test_a_release_in_a_loop_is_refused(sim: mp.Simulator) -> None:
    """A loop would release an unknown number of times, each charged once."""
    def prog() -> Any:
        def body(i: Any) -> Any:
            mean(0.1)
            return i + 1

        return simp.while_loop(lambda i: i < 3, body, simp.constant((0, 1, 2), np.int32(0)))

    with pytest.raises(mp.MPRefusedError, match="it runs in a loop"):
        mp.evaluate(sim, prog)


def test_replaying_a_program_is_charged_each_time(sim: mp.Simulator) -> None:
    with sim:
        program = mp.compile(lambda: mean(0.75), cluster=sim.cluster)
    mp.evaluate(sim, program)
    mp.evaluate(sim, program)
    with pytest.raises(mp.MPRefusedError, match="the privacy budget is spent"):
        mp.evaluate(sim, program)
    assert spent(sim) == {"x.npy": 1.5}


# ---------------------------------------------------------------- in a TEE enclave

@pytest.fixture
def tee_sim(tmp_path: Path) -> Iterator[mp.Simulator]:
    """node_0's x.npy and dp-only policy; a TEE ``T0`` (mock attestation) on node_2."""
    (tmp_path / "node_0").mkdir()
    np.save(tmp_path / "node_0" / "x.npy", X)
    (tmp_path / "p0.yaml").write_text(DP_ONLY)
    cluster = mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{9100 + i}"}
                  for i in range(3)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]} for i in range(3)},
                    "T0": {"kind": "TEE", "members": ["node_2"],
                           "config": {"attestation": "mock"}}}})
    with mp.Simulator(cluster, data_roots={"node_0": str(tmp_path / "node_0")},
                      policies={"node_0": str(tmp_path / "p0.yaml")}) as s:
        yield s


@pytest.mark.filterwarnings("ignore::mplang.InsecureDeviceWarning")
def test_a_release_in_an_enclave_draws_its_noise_there_and_is_charged(
        tee_sim: mp.Simulator) -> None:
    def prog() -> Any:
        keys = mp.device("P0")(lambda v: v.astype(jnp.int32))(x())
        return (dp.noisy_mean(x(), (0.0, 10.0), 0.5, device="T0", to="P1"),
                dp.noisy_histogram(keys, 11, 0.5, device="T0", to="P1"))

    mean, counts = (mp.fetch(tee_sim, v) for v in mp.evaluate(tee_sim, prog))
    assert mean == pytest.approx(5.0, abs=2.0)
    assert counts.shape == (11,) and abs(int(counts.sum()) - 100) < 100
    assert tee_sim.budget("node_0")["spent"] == {"x.npy": 1.0}


@pytest.mark.filterwarnings("ignore::mplang.InsecureDeviceWarning")
def test_an_enclave_release_with_words_from_outside_is_refused(tee_sim: mp.Simulator) -> None:
    """Words the TEE's host (or the driver) chose are no noise the enclave drew."""
    levels = dp.quantization_levels("t", 100, 1.0)
    words = dp.words_needed(1.0, levels + 1, 1)

    def prog() -> Any:
        known = mp.device("P2")(lambda: jnp.zeros(words, jnp.int32))()
        return mp.put("P1", mp.device("T0")(bind(dp._noisy_sum, 1.0, 1, 0.0, 10.0, levels))(
            known, x()))

    with pytest.raises(mp.MPRefusedError, match=(
            r"^node_0 refuses the program: .*the random input is not drawn inside the "
            r"attested enclave")):
        mp.evaluate(tee_sim, prog)
    assert tee_sim.budget("node_0")["spent"] == {}


def test_a_release_in_standard_mode_is_refused(sim: mp.Simulator) -> None:
    """One op at a time, a party cannot see that the random input is its own fresh draw."""
    with pytest.raises(mp.MPRefusedError, match=(
            r"^node_0 refuses the program: .*this party's random input is not a fresh "
            r"crypto\.random_bits draw of its own")):
        mp.evaluate(sim, lambda: mean(0.5), mode="standard")
    assert spent(sim) == {}
