"""An output kept by the party whose data it derives from is no release: that party
runs the program and stores the output's label, judges the driver's later fetch of it
against that label, and judges a later program using it with it. An output of its data
that another party holds is judged when the program is accepted (that party's fetch is
out of its sight). In the simulator, with the policies `mplang init` writes."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cluster.local import write_dev_policies
from mplang.dialects import simp
from mplang.policy import Guard, Policy, check
from tests.policy.hints import raw_hint, undigested

X = [np.arange(20, dtype=np.float32) * 37 + 1001 + 5000 * i for i in range(2)]
"""Each node's x.npy (20 rows); node_1's is the one kept."""
FETCH = (r"node_1 refuses to send object mem://party1/[0-9a-f]+ to the driver: it is "
         r"row-wise \(raw\) values of x\.npy; ")


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cluster")
    write_dev_policies(mp.ClusterSpec.simple(2), out)
    return out / "policies"


def _simulator(tmp_path_factory: pytest.TempPathFactory, policies: dict[str, Path]
               ) -> Iterator[mp.Simulator]:
    roots = {}
    for i, node in enumerate(("node_0", "node_1")):
        root = tmp_path_factory.mktemp(node)
        np.save(root / "x.npy", X[i])
        roots[node] = str(root)
    with mp.Simulator(2, data_roots=roots, policies={n: str(p) for n, p in policies.items()}
                      ) as s:
        yield s


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory, policies: Path) -> Iterator[mp.Simulator]:
    yield from _simulator(tmp_path_factory, {n: policies / f"{n}.yaml"
                                             for n in ("node_0", "node_1")})


def kept(sim: mp.Simulator) -> Any:
    """node_1's raw x, kept on node_1 by a program of its own."""
    return mp.evaluate(sim, lambda: mp.device("P1")(lambda: tensor.load("x.npy"))())


def refused(run: Any) -> str:
    """The message of the `mp.MPRefusedError` ``run()`` raises; none of node_1's values
    is in it."""
    with pytest.raises(mp.MPRefusedError) as caught:
        run()
    message = str(caught.value)
    for value in X[1]:
        assert str(int(value)) not in undigested(message), (value, message)
    return message


def test_a_kept_value_feeds_a_later_aggregate_and_its_fetch_is_refused(
        sim: mp.Simulator, policies: Path) -> None:
    x = kept(sim)
    mean = mp.evaluate(sim, lambda v: mp.put("P0", mp.device("SP0")(jnp.mean)(v)), x)
    assert float(mp.fetch(sim, mean)) == pytest.approx(float(np.mean(X[1])), rel=1e-4)
    total = mp.evaluate(sim, lambda v: mp.device("P1")(jnp.sum)(v), x)
    assert float(mp.fetch(sim, total)) == pytest.approx(float(np.sum(X[1])))
    message = refused(lambda: mp.fetch(sim, x))
    assert re.match(FETCH + re.escape(f"{raw_hint('driver')} in {policies / 'node_1.yaml'} "
                                      "(or reveal it under a rule)"), undigested(message)), message


def test_a_later_program_is_judged_with_the_kept_value_s_label(sim: mp.Simulator) -> None:
    x = kept(sim)
    message = refused(lambda: mp.evaluate(
        sim, lambda v: mp.put("P0", mp.device("SP0")(lambda a: a[3])(v)), x))
    assert re.match(r"node_1 refuses the program: op spu\.reveal at test_kept_outputs\.py:\d+ "
                    r"sends the value revealed from SP0, row-wise \(raw\) values of x\.npy, to "
                    r"node_0; ", message), message
    again = mp.evaluate(sim, lambda v: mp.device("P1")(lambda a: a * 2)(v), x)
    assert re.match(FETCH, refused(lambda: mp.fetch(sim, again)))  # kept again, still raw


def test_releases_of_a_kept_value_in_two_programs_do_not_single_out_a_row(
        sim: mp.Simulator) -> None:
    """Each program using the kept value is judged against the earlier programs'
    releases, as if it loaded the data itself: sum(x) then sum(x[1:]) is x[0]."""
    x = kept(sim)

    def tail(start: int) -> Any:
        return mp.evaluate(sim, lambda v: mp.put("P0", mp.device("SP0")(
            lambda a: jnp.sum(a[start:]))(v)), x)

    assert float(mp.fetch(sim, tail(0))) == pytest.approx(float(np.sum(X[1])))
    message = refused(lambda: tail(1))
    assert re.match(r"node_1 refuses the program: op spu\.reveal at test_kept_outputs\.py:\d+ "
                    r"sends the value revealed from SP0, aggregate over 19 rows of x\.npy, which "
                    r"overlaps another release of this party's data: subtracting them isolates "
                    r"rows 0\.\.0 of x\.npy, fewer than min_rows 10", message), message


def test_an_output_of_node_1_s_data_held_by_node_0_is_refused_at_accept(
        tmp_path_factory: pytest.TempPathFactory, policies: Path) -> None:
    """node_1 lets node_0 have its data, not the driver: node_0's copy is judged when the
    program is accepted, since node_1 cannot judge node_0's fetch of it."""
    lenient = tmp_path_factory.mktemp("lenient") / "node_1.yaml"
    lenient.write_text((policies / "node_1.yaml").read_text().replace(
        "plaintext_to: []", "plaintext_to: [node_0]"))

    def moved() -> Any:
        return mp.put("P0", mp.device("P1")(lambda: tensor.load("x.npy"))())

    for s in _simulator(tmp_path_factory, {"node_0": policies / "node_0.yaml",
                                           "node_1": lenient}):
        message = refused(functools.partial(mp.evaluate, s, moved))
        assert re.match(r"node_1 refuses the program: op simp\.shuffle_static at "
                        r"test_kept_outputs\.py:\d+ sends program output 0, held by node_0, "
                        r"row-wise \(raw\) values of x\.npy, to driver; "
                        + re.escape(f"{raw_hint('driver')} in {lenient}") + "$",
                        undigested(message)), message


def test_a_kept_output_a_program_digest_allows_is_judged_at_accept() -> None:
    """`judge` needs the digest (``programs``), which a fetch does not have: the verdict
    marks the output judged, and its fetch passes."""
    graph = mp.compile(lambda: simp.pcall((0,), lambda: tensor.load(
        "x.npy", dtype="float32", shape=(20,))), cluster=mp.ClusterSpec.simple(2)).graph
    digest = "ab" * 32
    for text, judged in (("", False), (f"programs: [{digest}]\n", True)):
        guard = Guard(Policy.parse(text, "p.yaml"), 0, ["node_0", "node_1"])
        verdict = guard.vet(graph, digest, "driver", whole=True)
        assert verdict.accepted and verdict.judged == [judged]
        guard.record(["out"], guard.admit(graph, []))
        if judged:
            guard.check_fetch("out")
        else:
            with pytest.raises(mp.MPRefusedError, match="node_0 refuses to send object out "):
                guard.check_fetch("out")
    assert not check(graph, 2, 0, Policy.default(), outputs_fetchable=False).judged[0]
