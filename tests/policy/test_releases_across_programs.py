"""Releases across programs: each owner remembers the rows its exact releases combined
(with its privacy ledger, in its state folder), so two programs cannot be differenced
into fewer than ``min_rows`` rows; identical selections are not refused; a rule's
``max_releases`` caps how many releases of a source it allows, over every program."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cluster.local import write_dev_policies
from mplang.policy.ledger import Ledger
from tests.policy.hints import undigested

X = np.arange(20, dtype=np.float32) * 37 + 1000


INIT_RULE = '  - {to: ["*"], when: aggregate, min_rows: 10}\n'


def simulator(tmp: Path, rule: str = INIT_RULE) -> mp.Simulator:
    """Two nodes under the init policies (node_1's aggregate rule replaced by ``rule``),
    node_1 holding ``X``."""
    write_dev_policies(mp.ClusterSpec.simple(2), tmp)
    roots = {n: tmp / n for n in ("node_0", "node_1")}
    for root in roots.values():
        root.mkdir()
        np.save(root / "x.npy", X)
    policy = tmp / "policies" / "node_1.yaml"
    policy.write_text(policy.read_text().replace(INIT_RULE, rule))
    return mp.Simulator(2, data_roots={n: str(r) for n, r in roots.items()},
                        policies={n: str(tmp / "policies" / f"{n}.yaml") for n in roots})


def release(fn: Callable[[Any], Any]) -> Callable[[], Any]:
    """A program revealing ``fn`` of node_1's x to P0."""
    return lambda: mp.put("P0", mp.device("SP0")(fn)(
        mp.device("P1")(lambda: tensor.load("x.npy"))()))


def refusal(sim: mp.Simulator, fn: Callable[[Any], Any]) -> str:
    with pytest.raises(mp.MPRefusedError) as caught:
        mp.evaluate(sim, release(fn))
    message = str(caught.value)
    for value in X:
        assert str(int(value)) not in undigested(message)
    return message


def test_a_sum_and_then_the_sum_less_one_row_is_refused(tmp_path: Path) -> None:
    with simulator(tmp_path) as sim:
        assert float(mp.fetch(sim, mp.evaluate(sim, release(jnp.sum)))) == X.sum()
        # the same rows again (a mean of the rows summed) is no new selection
        assert float(mp.fetch(sim, mp.evaluate(sim, release(jnp.mean)))) == \
            pytest.approx(X.mean(), rel=1e-4)
        message = refusal(sim, lambda x: jnp.sum(x[1:]))
    assert "node_1 refuses the program: op spu.reveal at " in message
    assert "aggregate over 19 rows of x.npy, which overlaps another release of this " \
        "party's data: subtracting them isolates rows 0..0 of x.npy, fewer than min_rows " \
        "10" in message, message


def test_a_release_disjoint_enough_from_earlier_ones_passes(tmp_path: Path) -> None:
    with simulator(tmp_path) as sim:
        mp.evaluate(sim, release(lambda x: jnp.sum(x[:10])))
        assert float(mp.fetch(sim, mp.evaluate(sim, release(lambda x: jnp.sum(x[10:]))))) == \
            X[10:].sum()
        message = refusal(sim, lambda x: jnp.sum(x[5:15]))
        assert "isolates rows 0..4 of x.npy" in message, message


def test_the_memory_survives_a_restart(tmp_path: Path) -> None:
    """A worker keeps it in its ledger file: a new guard reading it refuses as before."""
    state = tmp_path / "budget.json"
    with simulator(tmp_path) as sim:
        sim.mesh.workers[1].guard.ledger = Ledger(state)
        mp.evaluate(sim, release(jnp.sum))
    (tmp_path / "again").mkdir()
    with simulator(tmp_path / "again") as sim:
        sim.mesh.workers[1].guard.ledger = Ledger(state)
        assert "isolates rows 0..0 of x.npy" in refusal(sim, lambda x: jnp.sum(x[1:]))


def test_a_release_whose_run_never_starts_is_forgotten(tmp_path: Path) -> None:
    """node_0 refuses the first program (its own data in it goes out raw): node_1's record
    of its release is refunded, so the next program is judged alone."""
    with simulator(tmp_path) as sim:
        def both() -> Any:
            mine = mp.device("P0")(lambda: tensor.load("x.npy"))()
            return release(jnp.sum)(), mp.put("P1", mine)

        with pytest.raises(mp.MPRefusedError, match="node_0 refuses the program"):
            mp.evaluate(sim, both)
        assert sim.mesh.workers[1].guard.ledger.selections("x.npy") == []
        mp.evaluate(sim, release(lambda x: jnp.sum(x[1:])))


def test_max_releases_caps_the_releases_of_a_source_under_a_rule(tmp_path: Path) -> None:
    rule = "  - {to: [node_0, driver], when: aggregate, min_rows: 20, max_releases: 2}\n"
    with simulator(tmp_path, rule) as sim:
        for _ in range(2):  # the same selection twice: allowed, and counted
            mp.evaluate(sim, release(jnp.sum))
        message = refusal(sim, jnp.mean)
    assert "its 1 release(s) of x.npy under rule {to: [node_0, driver], when: aggregate, " \
        "min_rows: 20, max_releases: 2} would make 3, over max_releases 2 in " in message, message
