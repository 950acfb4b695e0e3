"""Policy files, data-flow analysis and verdicts (`mplang.policy`), without running."""

from __future__ import annotations

import hashlib

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects import simp, tensor
from mplang.policy import Policy, PolicyError, check
from mplang.policy.labels import Flow, join, reduced, sliced, source

CLUSTER = mp.ClusterSpec.simple(2)


def load(party: int, n: int = 10) -> mp.MPObject:
    return simp.pcall((party,), lambda: tensor.load("x.npy", dtype="float32", shape=(n,)))


def graph(fn):
    return mp.compile(fn, cluster=CLUSTER).graph


def policy(text: str) -> Policy:
    return Policy.parse(text, "p.yaml")


def test_parse_every_key() -> None:
    p = policy("drivers: [driver]\nplaintext_to: [node_1]\nprotocols: [ABY3]\n"
               f"programs: ['{'a' * 64}']\nmax_uses: {{v: 2}}\n"
               "declassify:\n  - to: [driver, node_1]\n    when: aggregate\n"
               "    min_elements: 10\n")
    assert p.drivers == ("driver",) and p.plaintext_to == ("node_1",)
    assert p.protocols == ("ABY3",) and p.programs == frozenset(["a" * 64])
    assert p.max_uses == {"v": 2}
    assert p.declassify[0].to == ("driver", "node_1") and p.declassify[0].min_elements == 10
    assert p.declassify[0].line == 7


@pytest.mark.parametrize("text, line, words", [
    ("drivers: [driver]\nplaintext_to: node_1\n", 2, "expected a list"),
    ("declassify:\n  - to: [driver]\n    when: sometimes\n", 3, "when must be one of"),
    ("declassify:\n  - to: [driver]\n    when: count\n    min_elements: 0\n", 4, "at least 1"),
    ("drivers: [driver]\nreveal: all\n", 2, "unknown key 'reveal'"),
    ("max_uses:\n  v: many\n", 2, "max_uses.v must be an integer"),
    ("programs: [abc]\n", 1, "not a sha256 digest"),
    ("drivers: [driver\n", 2, "not valid YAML"),
])
def test_malformed_policy_names_the_line(text: str, line: int, words: str) -> None:
    with pytest.raises(PolicyError, match=rf"^p\.yaml:{line}: .*{words}"):
        policy(text)


def test_load_missing_file(tmp_path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy"):
        Policy.load(tmp_path / "none.yaml")


def test_label_lattice() -> None:
    x = source("x")
    total, part = reduced(x, 10), reduced(sliced(x), 9)
    assert total == Flow("aggregate", 10, True, frozenset(["x"]))
    assert join(total, part) is not None and join(total, part).form == "raw"  # type: ignore[union-attr]
    assert join(total, total) == total
    assert join(None, x) == x


def test_plaintext_to_another_party_refused_then_allowed() -> None:
    g = graph(lambda: simp.shuffle_static(load(0), {1: 0}))
    v = check(g, 2, 0, Policy.default())
    assert not v.accepted
    assert "op simp.shuffle_static at test_policy_check.py:" in v.reasons[0]
    assert "raw of x.npy, to node_1; add node_1 to plaintext_to" in v.reasons[0]
    assert check(g, 2, 0, policy("plaintext_to: [node_1]\n")).accepted
    assert check(g, 2, 1, Policy.default()).accepted  # node_1's own data does not move


def test_plaintext_to_driver_refused() -> None:
    g = graph(lambda: simp.pcall((0,), lambda a: a + 1, load(0)))
    v = check(g, 2, 0, Policy.default())
    assert not v.accepted and "program output 0, raw of x.npy, to driver" in v.reasons[0]
    assert check(g, 2, 0, policy("plaintext_to: [driver]\n")).accepted


def test_secure_device_selecting_other_input_refused_by_its_owner() -> None:
    def prog():
        return mp.put("P0", mp.device("SP0")(lambda a, b: b)(load(0), load(1)))

    g = graph(prog)
    v = check(g, 2, 1, Policy.default())
    assert not v.accepted
    assert "op spu.reveal" in v.reasons[0] and "raw of x.npy, to node_0" in v.reasons[0]
    assert check(g, 2, 0, Policy.default(), outputs_fetchable=False).accepted


def test_aggregate_rule_needs_k_elements() -> None:
    def prog(n: int):
        return lambda: mp.put("P0", mp.device("SP0")(lambda a, b: jnp.sum(b))(load(0), load(1, n)))

    rule = policy("declassify:\n  - to: [node_0]\n    when: aggregate\n    min_elements: 10\n")
    assert check(graph(prog(10)), 2, 1, rule).accepted
    v = check(graph(prog(5)), 2, 1, rule)
    assert not v.accepted
    assert "aggregate of 5 elements of x.npy, to node_0" in v.reasons[0]
    assert "min_elements: 5" in v.reasons[0]


def test_difference_of_aggregates_is_raw() -> None:
    def prog():
        s = mp.device("SP0")(lambda a, b: jnp.sum(b) - jnp.sum(b[1:]))(load(0), load(1))
        return mp.put("P0", s)

    rule = policy("declassify:\n  - to: ['*']\n    when: aggregate\n")
    v = check(graph(prog), 2, 1, rule)
    assert not v.accepted and "raw of x.npy" in v.reasons[0]


def test_compare_rule_millionaire() -> None:
    def prog():
        return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(load(0, 1), load(1, 1)))

    g = graph(prog)
    assert not check(g, 2, 1, Policy.default()).accepted
    assert check(g, 2, 1, policy("declassify:\n  - to: [node_0]\n    when: compare\n")).accepted
    assert not check(g, 2, 1, policy("declassify:\n  - to: [node_0]\n    when: count\n")
                     ).accepted


def test_pyfunc_output_is_raw_and_goes_to_other_party() -> None:
    def prog():
        y = simp.pcall((0,), lambda a: tensor.pyfunc("numpy.sum", a,
                                                     out=np.zeros((), np.float32)), load(0))
        return simp.shuffle_static(y, {1: 0})

    v = check(graph(prog), 2, 0, policy("declassify:\n  - to: ['*']\n    when: aggregate\n"))
    assert not v.accepted and "raw of x.npy, to node_1" in v.reasons[0]


def test_uniform_cond_predicate_from_private_data() -> None:
    def prog():
        x = load(0)
        p0 = simp.pcall((0,), lambda a: jnp.sum(a) > 3, x)
        pred = simp.converge(p0, simp.shuffle_static(p0, {1: 0}))
        return simp.uniform_cond(pred, lambda: simp.constant((0, 1), 1),
                                 lambda: simp.constant((0, 1), 2))

    v = check(graph(prog), 2, 0, policy("plaintext_to: []\n"), outputs_fetchable=False)
    assert not v.accepted
    assert any("op simp.uniform_cond" in r and "the predicate every party sees" in r
               for r in v.reasons)


def test_program_digest_allow_list() -> None:
    g = graph(lambda: simp.shuffle_static(load(0), {1: 0}))
    digest = hashlib.sha256(b"this program").hexdigest()
    assert check(g, 2, 0, policy(f"programs: ['{digest}']\n"), digest=digest).accepted
    assert not check(g, 2, 0, policy(f"programs: ['{digest}']\n"), digest="0" * 64).accepted


def test_driver_not_listed() -> None:
    g = graph(lambda: simp.pcall((0,), lambda: tensor.constant(1.0)))
    v = check(g, 2, 0, policy("drivers: [alice]\n"), driver="mallory")
    assert not v.accepted and v.reasons == [
        "driver 'mallory' is not in drivers [alice] of p.yaml"]
    assert check(g, 2, 0, policy("drivers: [alice]\n"), driver="alice").accepted


def test_protocols() -> None:
    g = graph(lambda: mp.put("P0", mp.device("SP0")(lambda a, b: a + b)(load(0), load(1))))
    v = check(g, 2, 1, policy("protocols: [ABY3]\nplaintext_to: ['*']\n"))
    assert not v.accepted and "protocol CHEETAH" in v.reasons[0]


def test_max_uses() -> None:
    g = graph(lambda: simp.pcall((0,), lambda a: a + 1, simp.load(0, "vec", dtype="float32",
                                                                  shape=(3,))))
    p = policy("max_uses: {vec: 2}\nplaintext_to: [driver]\n")
    assert check(g, 2, 0, p, uses=lambda name: 1).accepted
    v = check(g, 2, 0, p, uses=lambda name: 2)
    assert not v.accepted and "uses 'vec', already used by 2 executions: max_uses vec: 2" \
        in v.reasons[0]


def test_shuffle_index_is_a_flow() -> None:
    def prog():
        idx = simp.pcall((0,), lambda a: (jnp.sum(a) > 0).astype(jnp.int32), load(0))
        value = simp.constant((0, 1), 7)
        return simp.shuffle(value, idx)

    v = check(graph(prog), 2, 0, Policy.default(), outputs_fetchable=False)
    assert not v.accepted and "the index party 0 asks with" in v.reasons[0]
