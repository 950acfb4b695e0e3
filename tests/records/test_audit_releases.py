"""What left a party, in its audit log and ``mplang audit``: each release its verdict
allowed (`mplang.policy.check.Verdict.releases`), by the entry of its policy that allowed
it: an aggregate or compare rule, an approved library, the program's digest, a dp rule
with its epsilon."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import pytest

import mplang as mp
from mplang import tensor
from mplang.cli.main import main
from mplang.cluster.local import DEV_POLICY
from mplang.libs import dp, linear
from mplang.policy.check import Guard
from mplang.policy.policy import Policy
from mplang.records.audit import AuditLog, read_events, summarize

NODES = ["node_0", "node_1", "node_2"]
DRIVER = ("driver", "ab" * 32)
ALLOWED = "d" * 64
"""The digest of the one program node_0 allows whatever it reveals."""
POLICY = Policy.parse(
    DEV_POLICY.format(node="node_0", drivers="driver", protocols="CHEETAH, ABY3, SEMI2K",
                      protocol_note="")
    .replace("approve: []", "approve:\n  - {library: mplang.libs.linear, to: ['*']}")
    .replace("programs: []", f"programs: [{ALLOWED}]")
    + "  - {to: ['*'], when: dp, max_epsilon: 1.0}\n", "node_0.yaml")
"""node_0's policy: `mplang init`'s, with the linear models approved, a reviewed program
and dp releases of epsilon at most 1."""
AGGREGATE = 'rule {to: ["*"], when: aggregate, min_rows: 10}'
DP = 'rule {to: ["*"], when: dp, max_epsilon: 1.0}'
LINEAR = 'approve {library: mplang.libs.linear, to: ["*"]}'


def load(party: int, name: str, shape: tuple[int, ...] = (20,)) -> Any:
    return mp.device(f"P{party}")(lambda: tensor.load(name, dtype=jnp.float32, shape=shape))()


def stats() -> Any:
    total = mp.device("P0")(jnp.sum)(load(0, "x.npy"))
    richer = mp.device("SP0")(lambda a, b: a < b)(load(0, "w.npy", ()), load(1, "w.npy", ()))
    return total, mp.put("P0", richer)


def scores() -> Any:
    weights = [mp.device(f"P{i}")(lambda: jnp.ones(3, jnp.float32))() for i in (0, 1)]
    return linear.predict_proba([load(0, "f.npy", (20, 3)), load(1, "f.npy", (20, 3))],
                                weights, to="P1")


def rows() -> Any:
    return load(0, "x.npy")


def noisy() -> Any:
    return dp.noisy_mean(load(0, "x.npy"), (0.0, 10.0), 0.5, to="P1")


RELEASES = [  # (program, digest): (description, receiver, allowed by, kind, epsilon)
    ((stats, "a" * 64), [("aggregate over 20 rows of x.npy", "driver", AGGREGATE, "rule", 0),
                         ("compare of w.npy", "driver", 'rule {to: ["*"], when: compare}',
                          "rule", 0)]),
    ((scores, "b" * 64), [
        ("the output of mplang.libs.linear.predict_proba on f.npy", to, LINEAR, "approval", 0)
        for to in ("node_1", "driver")]),
    ((rows, ALLOWED), [("row-wise (raw) values of x.npy", "driver",
                        "the program digest is allow-listed", "digest", 0)]),
    ((noisy, "c" * 64), [("a noisy release (epsilon 0.5) of x.npy", to, DP, "rule", 0.5)
                         for to in ("node_1", "driver")]),
]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """node_0's log of the four programs, each vetted by its guard, accepted at time 0."""
    guard = Guard(POLICY, 0, NODES)
    verdicts = []
    for (fn, digest), _ in RELEASES:
        graph = mp.compile(fn, cluster=mp.ClusterSpec.simple(3)).graph
        verdict = guard.vet(graph, digest, DRIVER[1], whole=True)
        assert verdict.accepted, verdict.reasons
        verdicts.append((fn.__name__, digest, verdict))
    log = AuditLog(tmp_path_factory.mktemp("releases") / "node_0.jsonl", "node_0", NODES)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: 0.0)
        for number, (name, digest, verdict) in enumerate(verdicts):
            log.execution(f"e{number}", "", digest, DRIVER, "accepted", name=name,
                          rule="node_0.yaml", releases=verdict.releases)
    log.close()
    return log.path


def test_the_execution_event_lists_what_the_verdict_lets_leave(log: Path) -> None:
    events = read_events([log])
    assert [[(r["description"], r["receiver"], r["allowed_by"], r["kind"], r["epsilon"])
             for r in e["releases"]] for e in events] == [want for _, want in RELEASES]


def test_mplang_audit_lists_each_release_with_its_rule_time_and_epsilon(
        log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(log)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "released" in line]
    at = "node_0 released at 1970-01-01 00:00:00Z: "
    assert lines == [
        f"  {at}aggregate over 20 rows of x.npy -> driver, allowed by {AGGREGATE} (rule; "
        "epsilon 0)",
        f'  {at}compare of w.npy -> driver, allowed by rule {{to: ["*"], when: compare}} '
        "(rule; epsilon 0)",
        *(f" *{at}the output of mplang.libs.linear.predict_proba on f.npy -> {to}, allowed "
          f"by {LINEAR} (approval; epsilon 0)" for to in ("node_1", "driver")),
        f" *{at}row-wise (raw) values of x.npy -> driver, allowed by the program digest is "
        "allow-listed (digest; epsilon 0)",
        *(f"  {at}a noisy release (epsilon 0.5) of x.npy -> {to}, allowed by {DP} (rule; "
          "epsilon 0.5)" for to in ("node_1", "driver")),
    ]


def test_mplang_audit_json_gives_the_releases_per_run(
        log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(log), "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert runs == summarize([log])["runs"]
    assert [[(r["node"], r["time"], r["description"], r["receiver"], r["allowed_by"],
              r["kind"], r["epsilon"]) for r in run["releases"]] for run in runs] == \
        [[("node_0", 0.0, *release) for release in want] for _, want in RELEASES]


def test_a_refused_program_lists_no_release(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "node_0.jsonl", "node_0", NODES)
    log.execution("e1", "", "f" * 64, DRIVER, "refused", "op simp.pcall sends raw of x.npy")
    log.close()
    (event,) = read_events([log.path])
    assert event["releases"] == []
    assert summarize([log.path])["runs"][0]["releases"] == []
