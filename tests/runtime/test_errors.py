"""Run-time failures: how they surface, how fast they stop the other parties,
and that the simulator stays usable afterwards. Also the checks `evaluate`
makes on compiled programs and their runtime inputs.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.analysis.cost_model import local_cost
from mplang.edsl.attrs import ConfigField as Attr
from mplang.edsl.primitive import Operand, Primitive, Result, Signature
from mplang.flows.engine import local_conservative
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call

# ---------------------------------------------------------------- a kernel that fails on demand
# Created once per session at import (op names can be registered only once).

FAIL_OP = "testing.runtime_fail_on"

fail_on_p = Primitive(FAIL_OP, kind="compute", execution_model="single_rank",
                      operands=[Operand("x")],
                      attrs={"party": Attr(int, required=True, doc="the party that raises")},
                      results=[Result("out")], cost=local_cost, local_flow=local_conservative,
                      doc="Test-only: identity, except that it raises on party `party`.")


@fail_on_p.def_type_rule
def _fail_on_rule(sig: Signature) -> list[Any]:
    return [sig.x]


@register_backend("testing").kernel(fail_on_p)
def _fail_on_kernel(call: Call, x: Any, *, party: int) -> list[Any]:
    if call.interp.party == party:
        raise ValueError("injected failure")  # the message itself names no party
    return [x]


def fail_on(x: Any, party: int) -> Any:
    """Inside a pcall body: ``x``, except that the kernel raises on ``party``."""
    return fail_on_p.bind([x], {"party": party})[0]


def ring_program(n: int) -> Any:
    """A correct program: party i receives 10 * (i - 1 mod n) + 1."""

    def prog() -> Any:
        return simp.shuffle_static(simp.prank() * 10 + 1, {i: (i - 1) % n for i in range(n)})

    return prog


def check_still_usable(sim: mp.Simulator, mode: str) -> None:
    n = sim.world_size
    out = mp.evaluate(sim, ring_program(n), mode=mode)
    assert [int(v) for v in mp.fetch(sim, out)] == [10 * ((i - 1) % n) + 1 for i in range(n)]


# ---------------------------------------------------------------- kernel failures


def test_kernel_failure_names_the_party_and_the_op(sim: mp.Simulator, mode: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    def prog() -> Any:
        return simp.pcall(None, lambda v: fail_on(v + 1, 1), simp.prank())

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog, mode=mode)
    err = info.value
    assert not isinstance(err, mp.MPCommunicationError)  # the root cause, not a side effect
    assert "party 1" in str(err)
    assert FAIL_OP in str(err)
    assert "injected failure" not in str(err)  # the kernel's text stays in the party's log
    assert "ValueError: injected failure" in caplog.text
    assert err.party == 1
    assert err.op == FAIL_OP
    check_still_usable(sim, mode)


@pytest.mark.parametrize("failing", [0, 2])
def test_kernel_failure_on_other_parties(sim: mp.Simulator, mode: str, failing: int) -> None:
    def prog() -> Any:
        return simp.pcall(None, lambda v: fail_on(v, failing), simp.prank())

    with pytest.raises(mp.MPRuntimeError, match=f"party {failing}") as info:
        mp.evaluate(sim, prog, mode=mode)
    assert info.value.party == failing


def test_failure_inside_a_loop_body(sim: mp.Simulator, mode: str) -> None:
    def prog() -> Any:
        i = simp.constant((0, 1, 2), 0)

        def body(k: Any) -> Any:
            return simp.pcall(None, lambda v: fail_on(v + 1, 2), k)

        return simp.while_loop(lambda k: k < 3, body, i)

    with pytest.raises(mp.MPRuntimeError, match="party 2") as info:
        mp.evaluate(sim, prog, mode=mode)
    assert FAIL_OP in str(info.value)
    check_still_usable(sim, mode)


def test_a_failed_party_releases_the_parties_waiting_for_it(sim: mp.Simulator,
                                                             mode: str) -> None:
    """Party 0 waits for party 1's message; party 1 fails first. The wait must end at
    once (the simulator's message timeout is 60 s)."""

    def prog() -> Any:
        y = simp.pcall((1,), lambda v: fail_on(v, 1), simp.prank())
        return simp.shuffle_static(y, {0: 1})

    start = time.monotonic()
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog, mode=mode)
    elapsed = time.monotonic() - start
    assert elapsed < 10, f"evaluation took {elapsed:.1f} s to fail"
    assert not isinstance(info.value, mp.MPCommunicationError)
    assert "party 1" in str(info.value) and FAIL_OP in str(info.value)
    check_still_usable(sim, mode)


def test_a_failed_party_releases_everyone_in_an_all_to_all_exchange(mode: str) -> None:
    """In a dynamic shuffle every party waits for every other; one of ten fails."""
    sim = mp.Simulator(10)
    try:

        def prog() -> Any:
            r = simp.prank()
            x = simp.pcall(None, lambda v: fail_on(v * 2, 7), r)
            return simp.shuffle(x, (r + 1) % 10)

        start = time.monotonic()
        with pytest.raises(mp.MPRuntimeError, match="party 7") as info:
            mp.evaluate(sim, prog, mode=mode)
        assert time.monotonic() - start < 10
        assert FAIL_OP in str(info.value)
        check_still_usable(sim, mode)
    finally:
        sim.close()


def test_a_failed_evaluation_leaves_nothing_in_the_stores(sim: mp.Simulator, mode: str) -> None:
    """Parties that finished before another failed must not keep orphaned results."""

    def prog() -> Any:
        y = simp.pcall(None, lambda v: fail_on(v, 1), simp.prank())
        return y, y * 2

    gc.collect()
    time.sleep(0.1)  # let objects of earlier tests be freed
    before = [len(w.store) for w in sim.mesh.workers]
    with pytest.raises(mp.MPRuntimeError):
        mp.evaluate(sim, prog, mode=mode)
    assert [len(w.store) for w in sim.mesh.workers] == before


SHUFFLE_FAILED = r"^op simp\.shuffle at test_errors\.py:\d+ failed on node_(\d) \(party \1; its " \
                 r"log has the details\)$"
"""The error a party's failed shuffle leaves it as."""


def test_shuffle_index_out_of_range(sim: mp.Simulator, mode: str,
                                    caplog: pytest.LogCaptureFixture) -> None:
    def prog() -> Any:
        return simp.shuffle(simp.prank(), simp.constant((0, 1, 2), 5))

    with pytest.raises(mp.MPRuntimeError, match=SHUFFLE_FAILED):  # the index is data
        mp.evaluate(sim, prog, mode=mode)
    assert "index 5 is not a party of a 3-party world" in caplog.text
    check_still_usable(sim, mode)


def test_shuffle_from_a_party_that_holds_nothing(sim: mp.Simulator, mode: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def prog() -> Any:
        x = simp.constant((0, 1), 5)
        return simp.shuffle(x, simp.constant((0, 1, 2), 2))  # party 2 holds no x

    with pytest.raises(mp.MPRuntimeError, match=SHUFFLE_FAILED):
        mp.evaluate(sim, prog, mode=mode)
    assert "party 2 does not hold the value requested from it" in caplog.text
    check_still_usable(sim, mode)


# ---------------------------------------------------------------- uniformity checks


def _non_uniform_cond(verify: bool) -> Any:
    def prog() -> Any:
        pred = simp.pcall(None, lambda r: r == 0, simp.prank())  # True on party 0 only
        x = simp.prank()
        return simp.uniform_cond(pred, lambda v: v + 100, lambda v: v + 200, x,
                                 verify_uniform=verify)

    return prog


def test_uniform_cond_rejects_a_non_uniform_predicate(sim: mp.Simulator, mode: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, _non_uniform_cond(True), mode=mode)
    assert "simp.uniform_cond" in str(info.value)
    reason = "the predicate is not uniform (party 0: True, party 1: False, party 2: False)"
    if mode == "launch":  # each party's predicate is its data: no party's value is named
        assert isinstance(info.value, mp.MPPublicError)
        assert "the predicate is not uniform: the parties computed different values" in \
            str(info.value)
        assert "True" not in str(info.value) and "False" not in str(info.value)
    else:  # the driver, which decides the branch, fetched the predicates itself
        assert reason in str(info.value)
    check_still_usable(sim, mode)


def test_uniform_cond_without_verification_runs(sim: mp.Simulator, mode: str) -> None:
    out = mp.evaluate(sim, _non_uniform_cond(False), mode=mode)
    got = [int(v) for v in mp.fetch(sim, out)]
    # The predicate was promised uniform but is not: each party ends up in one branch.
    assert all(g in (r + 100, r + 200) for r, g in enumerate(got))
    if mode == "launch":  # every party decides on its own predicate
        assert got == [100, 201, 202]
    else:  # the driver decides once for everyone
        assert got in ([100, 101, 102], [200, 201, 202])


def test_while_loop_rejects_a_non_uniform_predicate(sim: mp.Simulator, mode: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    def prog() -> Any:
        x = simp.prank()
        return simp.while_loop(lambda v: v < 2, lambda v: v + 1, x)  # party 2 stops at once

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(sim, prog, mode=mode)
    assert "simp.while_loop" in str(info.value)
    assert "not uniform" in caplog.text + str(info.value)
    check_still_usable(sim, mode)


# ---------------------------------------------------------------- compiled programs and inputs


def _int_on_all(sim: mp.Simulator, value: int = 1) -> Any:
    return mp.evaluate(sim, lambda: simp.constant((0, 1, 2), value))


def test_program_rejects_an_input_of_another_type(sim: mp.Simulator, mode: str) -> None:
    x = _int_on_all(sim)
    program = mp.compile(lambda v: v + 1, x, world_size=3)

    wrong_dtype = mp.evaluate(sim, lambda: simp.constant((0, 1, 2), 1.0))
    wrong_pmask = mp.evaluate(sim, lambda: simp.constant((0, 1), 1))
    wrong_shape = mp.evaluate(sim, lambda: simp.constant((0, 1, 2), [1, 2]))
    for bad in (wrong_dtype, wrong_pmask, wrong_shape):
        with pytest.raises(mp.MPLangError, match="runtime input 0"):
            mp.evaluate(sim, program, bad, mode=mode)
    # the right type still works
    assert [int(v) for v in mp.fetch(sim, mp.evaluate(sim, program, x, mode=mode))] == [2] * 3


def test_program_rejects_an_object_of_another_simulator(sim: mp.Simulator, mode: str) -> None:
    x = _int_on_all(sim)
    program = mp.compile(lambda v: v + 1, x, world_size=3)
    other = mp.Simulator(3)
    try:
        foreign = _int_on_all(other)
        with pytest.raises(mp.MPLangError):
            mp.evaluate(sim, program, foreign, mode=mode)
        with pytest.raises(mp.MPLangError):
            mp.fetch(sim, foreign)
    finally:
        other.close()


def test_program_rejects_plain_values_and_wrong_arity(sim: mp.Simulator) -> None:
    x = _int_on_all(sim)
    program = mp.compile(lambda v: v + 1, x, world_size=3)
    with pytest.raises(mp.MPLangError):
        mp.evaluate(sim, program, 1)
    with pytest.raises(mp.MPLangError):
        mp.evaluate(sim, program, np.int32(1))
    with pytest.raises(mp.MPLangError):
        mp.evaluate(sim, program)
    with pytest.raises(mp.MPLangError):
        mp.evaluate(sim, program, x, x)


def test_program_compiled_for_another_world_size(mode: str) -> None:
    program = mp.compile(ring_program(3), world_size=3)
    sim4 = mp.Simulator(4)
    try:
        with pytest.raises(mp.MPLangError, match="3 parties"):
            mp.evaluate(sim4, program, mode=mode)
    finally:
        sim4.close()


def test_evaluate_needs_an_execution_context() -> None:
    with pytest.raises(mp.MPLangError):
        mp.evaluate(None, ring_program(3))  # type: ignore[arg-type]


def test_a_closed_simulator_refuses_to_run(mode: str) -> None:
    sim = mp.Simulator(3)
    x = _int_on_all(sim, 5)
    program = mp.compile(ring_program(3), world_size=3)
    sim.close()
    with pytest.raises(mp.MPLangError, match="closed"):
        mp.evaluate(sim, ring_program(3), mode=mode)
    with pytest.raises(mp.MPLangError, match="closed"):
        mp.evaluate(sim, program, mode=mode)
    with pytest.raises(mp.MPLangError, match="closed"):
        mp.fetch(sim, x)
    sim.close()  # closing twice is harmless


def test_a_timeout_naming_the_silent_party_is_reported_as_it_is() -> None:
    """Parties 0 and 2 both waited for party 1: 0's wait was abandoned, 2's ran out of
    time. The error is 2's timeout, whichever came first, not a sentence joining them."""
    from mplang.driver.base import _end_of_waits
    from mplang.edsl.errors import MPCommunicationError, MPTimeoutError

    abandoned = MPCommunicationError("party 0: execution e was abandoned while waiting "
                                     "for party 1", party=0, peer=1)
    timeout = MPTimeoutError("party 2: no vote of party 1 came in time", party=2, peer=1)
    for errors in ([abandoned, timeout], [timeout, abandoned]):
        end = _end_of_waits(errors)
        assert end is not None and end.party == 1
        assert str(end).startswith("party 1 sent nothing in time: party 2: no vote of party 1 "
                                   "came in time"), str(end)
