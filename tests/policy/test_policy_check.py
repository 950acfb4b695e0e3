"""Verdicts of the data-flow analysis (`mplang.policy.check`) on traced programs,
without running: which sends a policy allows, the reasons and hints it gives."""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects import simp, table, tensor
from mplang.flows.labels import Rows, combine, join, smallest_part, source
from mplang.flows.tensor_flows import transfer
from mplang.policy import Policy, PolicyError, check
from tests.policy.hints import raw_hint

CLUSTER = mp.ClusterSpec.simple(2)


def load(party: int, n: int = 10) -> mp.MPObject:
    return simp.pcall((party,), lambda: tensor.load("x.npy", dtype="float32", shape=(n,)))


def graph(fn):
    return mp.compile(fn, cluster=CLUSTER).graph


def policy(text: str) -> Policy:
    return Policy.parse(text, "p.yaml")


def aggregate(min_rows: int, to: str = "'*'") -> Policy:
    return policy(f"declassify:\n  - {{to: [{to}], when: aggregate, min_rows: {min_rows}}}\n")


def test_load_missing_file(tmp_path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy"):
        Policy.load(tmp_path / "none.yaml")


def test_label_lattice() -> None:
    x = source("x", 10)
    assert (x.form, x.window, x.axis, x.pure) == ("rowwise", Rows(frozenset(["x"]), 0, 10), 0,
                                                 True)
    assert source("x", None).form == "raw"  # a scalar is no rows: raw
    module = jax.jit(lambda v: (jnp.sum(v), jnp.sum(v[1:]))).lower(np.zeros(10, np.float32))
    sums = transfer(module.as_text(), [x])
    assert sums is not None
    total, part = sums.outputs
    assert total is not None and part is not None
    assert (total.form, total.rows, part.form, part.rows) == ("aggregate", 10, "aggregate", 9)
    both = join(total, part)
    assert both is not None and both.form == "aggregate" and both.rows == 9
    assert both.rowsets == total.rowsets | part.rowsets
    assert smallest_part(both.rowsets, both.rowsets) == (Rows(frozenset(["x"]), 0, 1), 1)
    assert join(total, total) == total and join(None, x) == x
    raw = combine(x, total)
    assert raw is not None and raw.form == "rowwise" and raw.declassified_as == "raw"


def test_plaintext_to_another_party_refused_then_allowed() -> None:
    g = graph(lambda: simp.shuffle_static(load(0), {1: 0}))
    v = check(g, 2, 0, Policy.default(), outputs_fetchable=False)
    assert not v.accepted and len(v.reasons) == 1
    assert v.reasons[0].startswith("op simp.shuffle_static at test_policy_check.py:")
    assert v.reasons[0].endswith(
        "sends the value party 0 sends, row-wise (raw) values of x.npy, to node_1; "
        f"{raw_hint('node_1')} in the default policy")
    assert check(g, 2, 0, policy("plaintext_to: [node_1]\n"), outputs_fetchable=False).accepted
    fetched = check(g, 2, 0, policy("plaintext_to: [node_1]\n"))  # node_1's copy is an output
    assert not fetched.accepted and len(fetched.reasons) == 1
    assert "sends program output 0, held by node_1, row-wise (raw) values of x.npy, to driver" \
        in fetched.reasons[0]
    assert check(g, 2, 0, policy("plaintext_to: [node_1, driver]\n")).accepted
    assert check(g, 2, 1, Policy.default()).accepted  # node_1's own data does not move


def test_an_output_kept_by_its_owner_is_judged_when_fetched_unless_allowed_now() -> None:
    g = graph(lambda: simp.pcall((0,), lambda a: a + 1, load(0)))
    v = check(g, 2, 0, Policy.default())
    assert v.accepted and v.judged == [False]
    assert v.flows[0].startswith("row-wise (raw) values of x.npy -> driver (program output 0, "
                                 "held by node_0, op simp.pcall at test_policy_check.py:")
    assert v.flows[0].endswith("): kept, judged when fetched or used")
    assert check(g, 2, 0, policy("plaintext_to: [driver]\n")).judged == [True]
    assert check(g, 2, 0, policy("plaintext_to: [driver]\n"), outputs_fetchable=False
                 ).judged == [False]  # one op of a program: its fetch is judged then


def test_secure_device_selecting_other_input_refused_by_its_owner() -> None:
    def prog():
        return mp.put("P0", mp.device("SP0")(lambda a, b: b)(load(0), load(1)))

    g = graph(prog)
    v = check(g, 2, 1, Policy.default())
    assert not v.accepted and len(v.reasons) == 2
    assert "op spu.reveal" in v.reasons[0]
    assert "the value revealed from SP0, row-wise (raw) values of x.npy, to node_0" \
        in v.reasons[0]
    assert "program output 0, held by node_0, row-wise (raw) values of x.npy, to driver" \
        in v.reasons[1]
    assert check(g, 2, 0, Policy.default()).accepted  # none of node_0's data leaves it


def test_aggregate_rule_needs_min_rows() -> None:
    def prog(n: int):
        return lambda: mp.put("P0", mp.device("SP0")(lambda a, b: jnp.sum(b))(load(0), load(1, n)))

    rule = aggregate(10, to="node_0")
    assert check(graph(prog(10)), 2, 1, rule, outputs_fetchable=False).accepted
    assert check(graph(prog(10)), 2, 1, aggregate(10)).accepted
    v = check(graph(prog(5)), 2, 1, rule, outputs_fetchable=False)
    assert not v.accepted and len(v.reasons) == 1
    assert "the value revealed from SP0, aggregate over 5 rows of x.npy, to node_0; add a rule " \
        "{to: [node_0], when: aggregate, min_rows: 5} to declassify" in v.reasons[0]
    # the reveal to node_0 is allowed; node_0's copy, fetched by the driver, is not
    v = check(graph(prog(10)), 2, 1, rule)
    assert not v.accepted and len(v.reasons) == 1
    assert "program output 0, held by node_0, aggregate over 10 rows of x.npy, to driver" \
        in v.reasons[0]


def test_difference_of_overlapping_aggregates_is_refused() -> None:
    def prog():
        s = mp.device("SP0")(lambda a, b: jnp.sum(b) - jnp.sum(b[1:]))(load(0), load(1))
        return mp.put("P0", s)

    v = check(graph(prog), 2, 1, aggregate(2))
    assert not v.accepted
    assert "the value revealed from SP0, aggregate over 9 rows of x.npy, which overlaps " \
        "another release of this party's data: subtracting them isolates rows 0..0 of " \
        "x.npy, fewer than min_rows 2 of {to: [\"*\"], when: aggregate, min_rows: 2} in " \
        "p.yaml" in v.reasons[0]
    assert check(graph(prog), 2, 1, aggregate(1)).accepted  # one row is allowed anyway


def test_disjoint_aggregates_may_both_go() -> None:
    def prog():
        halves = mp.device("SP0")(lambda a, b: (jnp.sum(b[:5]), jnp.sum(b[5:])))(load(0), load(1))
        return tuple(mp.put("P0", h) for h in halves)

    assert check(graph(prog), 2, 1, aggregate(5)).accepted
    v = check(graph(prog), 2, 1, aggregate(6))
    assert not v.accepted and "aggregate over 5 rows of x.npy" in v.reasons[0]


def test_aggregate_gated_by_another_party_s_mask_has_no_static_row_count() -> None:
    def prog():
        return mp.put("P0", mp.device("SP0")(lambda a, b: jnp.sum(b * (a > 3)))(load(0), load(1)))

    v = check(graph(prog), 2, 1, aggregate(2))
    assert not v.accepted
    assert v.reasons[0].endswith(
        "sends the value revealed from SP0, aggregate over a data-dependent number of rows of "
        "x.npy, to node_0; aggregate it in the secure device with groups of at least min_rows "
        "rows enforced at run time (mplang.libs.groupby), or add approve: - {program: DIGEST} in "
        "p.yaml")


def test_compare_rule_millionaire() -> None:
    def prog():
        return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(load(0, 1), load(1, 1)))

    g = graph(prog)
    assert not check(g, 2, 1, Policy.default()).accepted
    everyone = policy("declassify:\n  - {to: ['*'], when: compare}\n")
    assert check(g, 2, 1, everyone).accepted and check(g, 2, 0, everyone).accepted
    v = check(g, 2, 1, aggregate(1))  # a comparison is not an aggregate
    assert not v.accepted
    assert "compare of x.npy, to node_0; add a rule {to: [node_0], when: compare}" \
        in v.reasons[0]


def test_pyfunc_output_is_raw_and_goes_to_other_party() -> None:
    def prog():
        y = simp.pcall((0,), lambda a: tensor.pyfunc("numpy.sum", a,
                                                     out=np.zeros((), np.float32)), load(0))
        return simp.shuffle_static(y, {1: 0})

    v = check(graph(prog), 2, 0, aggregate(1), outputs_fetchable=False)
    assert not v.accepted and "the value party 0 sends, raw of x.npy, to node_1" in v.reasons[0]


def test_uniform_cond_predicate_from_private_data() -> None:
    def prog():
        x = load(0)
        p0 = simp.pcall((0,), lambda a: jnp.sum(a) > 3, x)
        pred = simp.converge(p0, simp.shuffle_static(p0, {1: 0}))
        return simp.uniform_cond(pred, lambda: simp.constant((0, 1), 1),
                                 lambda: simp.constant((0, 1), 2))

    v = check(graph(prog), 2, 0, Policy.default(), outputs_fetchable=False)
    assert not v.accepted
    assert any(r.startswith("op simp.uniform_cond at test_policy_check.py:") and
               "sends the predicate every party sees, aggregate over 10 rows of x.npy, to "
               "node_1" in r for r in v.reasons), v.reasons
    assert check(graph(prog), 2, 0, aggregate(10), outputs_fetchable=False).accepted


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
    assert not v.accepted
    assert [r.split(" at ")[0] for r in v.reasons] == ["op spu.seal", "op spu.run",
                                                       "op spu.reveal"]
    assert all(r.endswith(" uses device SP0 with protocol CHEETAH, which protocols of p.yaml "
                          "does not accept") for r in v.reasons), v.reasons
    assert check(g, 2, 1, policy("protocols: [CHEETAH]\nplaintext_to: ['*']\n")).accepted


def test_max_uses() -> None:
    g = graph(lambda: simp.pcall((0,), jnp.sum, simp.load(0, "vec", dtype="float32",
                                                          shape=(3,))))
    p = policy("max_uses: {vec: 2}\ndeclassify:\n  - {to: [driver], when: aggregate}\n")
    assert check(g, 2, 0, p, uses=lambda name: 1).accepted
    v = check(g, 2, 0, p, uses=lambda name: 2)
    assert not v.accepted and v.reasons == [
        f"{v.reasons[0].split(' uses ')[0]} uses 'vec', already used by 2 executions: "
        "max_uses vec: 2 in p.yaml"]
    assert v.reasons[0].startswith("op simp.load at test_policy_check.py:")


def test_shuffle_index_is_a_flow() -> None:
    def prog():
        idx = simp.pcall((0,), lambda a: (jnp.sum(a) > 0).astype(jnp.int32), load(0))
        value = simp.constant((0, 1), 7)
        return simp.shuffle(value, idx)

    v = check(graph(prog), 2, 0, Policy.default(), outputs_fetchable=False)
    assert not v.accepted
    assert "sends the index party 0 asks with, aggregate over 10 rows of x.npy, to node_1" \
        in v.reasons[0]


def test_writes_into_the_data_root_are_judged_against_writes() -> None:
    def prog():
        t = simp.pcall((1,), lambda: table.constant({"a": np.array([7, 8], np.int64)}))
        return simp.pcall((1,), lambda u: table.write_csv(u, "out/r.csv"), t)

    v = check(graph(prog), 2, 1, policy("writes: [in/*.csv]\n"))
    assert not v.accepted and len(v.reasons) == 1
    assert v.reasons[0].startswith("op table.write at test_policy_check.py:")
    assert v.reasons[0].endswith("writes 'out/r.csv' into this party's data root: writes: "
                                 "[in/*.csv] in p.yaml does not allow it")
    assert check(graph(prog), 2, 1, policy("writes: [out/*.csv]\n")).accepted
    assert check(graph(prog), 2, 0, Policy.default()).accepted  # node_0 writes nothing
