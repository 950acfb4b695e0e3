"""Policies choose the PSI protocols a party takes part in (``psi_protocols``): the
parser, the default (the protocols that reveal only their result), programs refused
before they run and accepted ones, and the init policies against the examples."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.local import write_dev_policies
from mplang.dialects import psi as psi_dialect
from mplang.dialects import table
from mplang.flows.engine import analyze
from mplang.libs import psi
from mplang.libs.demo import simulated
from mplang.policy.check import check
from mplang.policy.policy import Policy, PolicyError
from mplang.policy.psi_protocols import DEFAULT_PSI_PROTOCOLS, PSI_PROTOCOLS
from tests.examples.test_examples import load

IDS = pa.table({"id": pa.array(range(20), pa.int64())})
DECLASSIFY = "declassify:\n  - {to: ['*'], when: compare}\n  - {to: ['*'], when: intersection}\n"
WRITES = "writes: ['ub-psi/*']\n"


def held(party: int) -> Any:
    """``party``'s own table (its ``ids.csv``)."""
    return simp.pcall((party,), lambda: table.read_csv("ids.csv", {"id": "int64"}))


# ---------------------------------------------------------------- the policy file


def test_the_parser_takes_a_list_of_known_protocols() -> None:
    assert Policy.parse("psi_protocols: [rr22, ecdh_npc]\n").psi_protocols == ("rr22", "ecdh_npc")
    assert Policy.parse("psi_protocols: []\n").psi_protocols == ()
    assert Policy.parse("drivers: [driver]\n").psi_protocols == DEFAULT_PSI_PROTOCOLS
    assert Policy.default().psi_protocols == DEFAULT_PSI_PROTOCOLS


@pytest.mark.parametrize("text, message", [
    ("drivers: [driver]\npsi_protocols:\n  - rr22\n  - rr23\n",
     "p.yaml:4: psi_protocols: unknown 'rr23' (known: rr22, kkrt, ecdh, ecdh_cardinality, "
     "aby3, ecdh_3pc, ecdh_npc, kkrt_npc, ecdh_oprf_ub)"),
    ("psi_protocols: rr22\n", "p.yaml:1: expected a list"),
    ("psi_protocols: [rr22, {a: 1}]\n", "p.yaml:1: psi_protocols: every entry must be a name"),
])
def test_a_bad_list_names_the_line(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match="^" + re.escape(message)):
        Policy.parse(text, "p.yaml")


def test_the_default_is_the_protocols_that_reveal_only_their_result() -> None:
    """Every protocol an op can run is known; those revealing more are left out."""
    ops = {*psi_dialect.PROTOCOLS, *psi_dialect.NPC_PROTOCOLS, psi_dialect.COUNT_PROTOCOL,
           psi_dialect.UB_PROTOCOL}
    assert ops == set(PSI_PROTOCOLS)
    assert set(PSI_PROTOCOLS) - set(DEFAULT_PSI_PROTOCOLS) == {
        "ecdh_3pc", "ecdh_npc", "kkrt_npc", "ecdh_oprf_ub"}


# ---------------------------------------------------------------- the check, by definition

PROGRAMS: list[tuple[str, Callable[[], Any], tuple[int, ...]]] = [
    *[(p, lambda p=p: psi.join(held(0), held(1), "id", protocol=p), (0, 1))
      for p in psi_dialect.PROTOCOLS],
    ("ecdh_cardinality", lambda: psi.intersection_size(held(0), held(1), "id",
                                                       reveal_to=(1, 2)), (0, 1, 2)),
    *[(p, lambda p=p: psi.join_n([held(1), held(2), held(3)], "id", protocol=p), (1, 2, 3))
      for p in psi_dialect.NPC_PROTOCOLS],
    ("ecdh_oprf_ub", lambda: psi.ub_prepare(held(2), "id", name="n"), (2,)),
    ("ecdh_oprf_ub", lambda: psi.ub_join(held(0), "id", server=3, name="n"), (0, 3)),
]
"""(protocol, program, the parties that take part)."""


@pytest.mark.parametrize("protocol, prog, parties", PROGRAMS)
def test_a_party_refuses_exactly_the_protocols_its_policy_does_not_list(
        protocol: str, prog: Callable[[], Any], parties: tuple[int, ...]) -> None:
    """For every PSI op and party of a four-party world: refused iff the party takes part
    and its list leaves the op's protocol out, naming the op, its line and the protocol."""
    graph = mp.compile(prog, world_size=4).graph
    others = [p for p in PSI_PROTOCOLS if p != protocol]
    for listed in ([protocol], others, [], list(DEFAULT_PSI_PROTOCOLS)):
        text = f"psi_protocols: [{', '.join(listed)}]\n" + DECLASSIFY + WRITES
        for rank in range(4):
            verdict = check(graph, 4, rank, Policy.parse(text, "p.yaml"),
                            outputs_fetchable=False)
            refused = [r for r in verdict.reasons if "psi_protocols" in r]
            assert bool(refused) == (rank in parties and protocol not in listed), \
                (listed, rank, verdict.reasons)
            assert verdict.accepted == (not refused), verdict.reasons
            for reason in refused:
                assert re.fullmatch(rf"op psi\.\w+ at test_psi_policy\.py:\d+ uses PSI protocol "
                                    rf"{protocol}, which psi_protocols \[{', '.join(listed)}\] "
                                    r"of p\.yaml does not accept", reason), reason


# ---------------------------------------------------------------- in the simulator


def test_a_program_with_an_unlisted_protocol_is_refused_before_it_runs(tmp_path: Path) -> None:
    """node_1 joins with RR22 only: a KKRT join with node_0 is refused (though node_0
    lists KKRT), an RR22 join runs; node_2, which takes no part, has no say."""
    for name, listed in (("node_0", "kkrt, rr22"), ("node_1", "rr22"), ("node_2", "")):
        (tmp_path / f"{name}.yaml").write_text(f"psi_protocols: [{listed}]\n")

    with mp.Simulator(mp.ClusterSpec.simple(3), policies={
            f"node_{i}": str(tmp_path / f"node_{i}.yaml") for i in range(3)}) as sim:
        with pytest.raises(mp.MPRefusedError, match=(
                r"node_1 refuses the program: op psi\.join at test_psi_policy\.py:\d+ uses "
                r"PSI protocol kkrt, which psi_protocols \[rr22\] of .*node_1\.yaml does not "
                r"accept")) as refused:
            mp.evaluate(sim, lambda: psi.join(*constants(), "id", protocol="kkrt"))
        assert "node_0" not in str(refused.value) and "node_2" not in str(refused.value)
        ja, jb = mp.evaluate(sim, lambda: psi.join(*constants(), "id", protocol="rr22"))
        assert mp.fetch(sim, ja)[0].num_rows == mp.fetch(sim, jb)[1].num_rows == 20


def constants() -> list[Any]:
    """``IDS`` at node_0 and at node_1 (chosen by the driver: no party's own data)."""
    return [simp.pcall((p,), lambda: table.constant(IDS)) for p in (0, 1)]


# ---------------------------------------------------------------- the init policies


def test_the_init_policies_accept_the_protocols_the_examples_use(tmp_path: Path) -> None:
    """``mplang init`` lists the default protocols, and the PSI programs of the examples
    (``examples/psi.py`` with each of its protocols, ``examples/joint_customers.py``) use
    none outside them (the tutorial's, RR22 and the count, are among them)."""
    (path, *_) = write_dev_policies(mp.ClusterSpec.simple(3), tmp_path)
    init = Policy.load(path)
    assert init.psi_protocols == DEFAULT_PSI_PROTOCOLS
    example, joint = load("psi"), load("joint_customers")
    programs = [example.count_shared, *(example.study(p) for p in psi_dialect.PROTOCOLS),
                joint.count_shared, joint.joined]
    cluster = mp.ClusterSpec.simple(3)
    with simulated(cluster, lambda roots: joint.save_tables(roots, *joint.make_data())
                   ) as sim, sim:  # joint_customers' tables have their types looked up
        graphs = [mp.compile(prog, cluster=cluster).graph for prog in programs]
    for graph in graphs:
        used = {p for _, p in analyze(graph, 3, 0)[0].psi}
        assert used and used <= set(DEFAULT_PSI_PROTOCOLS), used
        for rank in range(3):
            reasons = check(graph, 3, rank, init).reasons
            assert not [r for r in reasons if "psi_protocols" in r], reasons
