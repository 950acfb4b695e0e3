"""Bad device programs fail at compile time with messages naming the device and
the argument; a failing SPU kernel on one party fails the run quickly, names the
party and the op, and leaves the simulator usable."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.dialects import spu as spu_dialect
from mplang.runtime.backend import get_backend, worker_kernels
from mplang.runtime.interpreter import Call, Kernel
from tests.op_failures import assert_generic, logged_failure, traced_at

CLUSTER = mp.ClusterSpec.simple(3)


def compile_error(fn: Any, *args: Any, error: type[Exception] = mp.MPLangError) -> str:
    with pytest.raises(error) as info:
        mp.compile(fn, *args, cluster=CLUSTER)
    return str(info.value)


# ---------------------------------------------------------------- unknown devices


def test_unknown_device_in_device_call() -> None:
    msg = compile_error(lambda: mp.device("GPU7")(lambda: jnp.int32(1))(),
                        error=mp.ClusterSpecError)
    assert "unknown device" in msg and "GPU7" in msg


def test_unknown_device_in_put() -> None:
    msg = compile_error(lambda: mp.put("SP9", np.int32(1)), error=mp.ClusterSpecError)
    assert "unknown device" in msg and "SP9" in msg


def test_unknown_device_is_a_value_error_too() -> None:
    with pytest.raises(ValueError):
        mp.compile(lambda: mp.device("nope")(lambda: jnp.int32(1))(), cluster=CLUSTER)


def test_device_call_outside_a_cluster_context_fails() -> None:
    with pytest.raises(mp.MPLangError):
        mp.device("P0")(lambda: jnp.int32(1))()


# ---------------------------------------------------------------- functions SPU cannot compile


def python_branch(v: Any) -> Any:
    if v > 0:  # data-dependent Python control flow: not traceable
        return v
    return -v


def test_spu_function_that_is_not_traceable() -> None:
    def prog() -> Any:
        return mp.device("SP0")(python_branch)(mp.put("P0", np.float32(2.0)))

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "SP0" in msg
    assert "python_branch" in msg


def test_spu_function_that_converts_to_python() -> None:
    def to_int(v: Any) -> Any:
        return int(v) + 1

    msg = compile_error(lambda: mp.device("SP0")(to_int)(mp.put("P1", np.int32(3))),
                        error=mp.MPTypeError)
    assert "SP0" in msg and "to_int" in msg


# ---------------------------------------------------------------- dtypes SPU cannot hold


def test_complex_argument_to_an_spu_function() -> None:
    def prog() -> Any:
        x = mp.put("P0", np.float32(1.0))
        c = mp.put("P1", np.array([1 + 2j, 3j], dtype=np.complex64))
        return mp.device("SP0")(lambda a, b: a * b)(x, c)

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "SP0" in msg
    assert "complex64" in msg or "c64" in msg
    assert "argument 1" in msg, f"the message does not say which argument: {msg!r}"


def test_complex_put_on_an_spu() -> None:
    msg = compile_error(lambda: mp.put("SP0", np.array([1j], dtype=np.complex64)),
                        error=mp.MPTypeError)
    assert "SP0" in msg and ("complex64" in msg or "c64" in msg)


def test_string_argument_to_an_spu_function() -> None:
    def prog() -> Any:
        x = mp.put("P0", np.int32(1))
        return mp.device("SP0")(lambda a, s: a + s)(x, np.array(["ab", "c"]))

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "SP0" in msg


def test_string_put_on_an_spu() -> None:
    msg = compile_error(lambda: mp.put("SP0", np.array(["secret", "words"])),
                        error=mp.MPTypeError)
    assert "SP0" in msg, f"the message does not name the device: {msg!r}"


# ---------------------------------------------------------------- shapes


def test_mismatched_shapes_on_an_spu() -> None:
    def prog() -> Any:
        x = mp.put("P0", np.ones((2, 3), np.float32))
        y = mp.put("P1", np.ones((4,), np.float32))
        return mp.device("SP0")(lambda a, b: a + b)(x, y)

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "SP0" in msg
    assert "f32[2,3]" in msg and "f32[4]" in msg


def test_mismatched_matmul_on_an_spu() -> None:
    def prog() -> Any:
        x = mp.put("P0", np.ones((2, 3), np.float32))
        y = mp.put("P2", np.ones((2, 3), np.float32))
        return mp.device("SP0")(lambda a, b: a @ b)(x, y)

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "SP0" in msg and "f32[2,3]" in msg


def test_mismatched_shapes_on_a_ppu() -> None:
    def prog() -> Any:
        x = mp.put("P0", np.ones((2, 3), np.float32))
        y = mp.put("P0", np.ones((4,), np.float32))
        return mp.device("P0")(lambda a, b: a + b)(x, y)

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "f32[2,3]" in msg and "f32[4]" in msg
    assert "P0" in msg, f"the message does not name the device: {msg!r}"


# ---------------------------------------------------------------- values of other parties


def test_ppu_given_another_partys_plain_value() -> None:
    def prog() -> Any:
        return mp.device("P0")(lambda a: a + 1)(simp.constant((1,), 5))

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "P0" in msg
    assert "argument 0" in msg
    assert "mp.put" in msg  # says how to fix it


def test_ppu_given_another_partys_plain_value_as_second_argument() -> None:
    def prog() -> Any:
        mine = mp.put("P2", np.int32(1))
        theirs = simp.constant((0,), np.int32(2))
        return mp.device("P2")(lambda a, b: a + b)(mine, theirs)

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "P2" in msg and "argument 1" in msg


def test_ppu_given_a_value_held_by_everyone() -> None:
    def prog() -> Any:
        return mp.device("P1")(lambda a: a * 2)(simp.constant((0, 1, 2), 5))

    msg = compile_error(prog, error=mp.MPTypeError)
    assert "P1" in msg and "argument 0" in msg


def test_value_cannot_jump_between_spus() -> None:
    spec = mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"n{i}", "endpoint": f"h:{i}"} for i in range(3)],
        "devices": {"S01": {"kind": "SPU", "members": ["n0", "n1"]},
                    "S12": {"kind": "SPU", "members": ["n1", "n2"]}}})

    def via_call() -> Any:
        return mp.device("S12")(lambda v: v + 1)(mp.put("S01", 1.0))

    def via_put() -> Any:
        return mp.put("S12", mp.put("S01", 1.0))

    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(via_call, cluster=spec)
    assert "S01" in str(info.value) and "S12" in str(info.value)
    assert "argument 0" in str(info.value)
    with pytest.raises(mp.MPTypeError, match=r"S01.*S12"):
        mp.compile(via_put, cluster=spec)


def test_errors_surface_before_anything_runs() -> None:
    """`mp.evaluate` of a bad function fails at trace time: no party runs anything."""
    sim = mp.Simulator(CLUSTER)
    try:
        def prog() -> Any:
            return mp.device("P0")(lambda a: a + 1)(simp.constant((1,), 5))

        with pytest.raises(mp.MPTypeError):
            mp.evaluate(sim, prog)
        assert all(len(w.store) == 0 for w in sim.mesh.workers)
    finally:
        sim.close()


# ---------------------------------------------------------------- a failing SPU kernel

SPU_BACKEND = get_backend("spu")
assert SPU_BACKEND is not None
FAILING_PARTY = 1


def restore_spu_run(original: Kernel) -> None:
    """Register ``original``, the worker kernel of ``spu.run`` a test replaced, again as
    it was: a registered kernel takes the interpreter's arguments, so it goes back
    through the primitive (``SPU_BACKEND.kernel`` would wrap it a second time)."""
    spu_dialect.run_p.def_kernel(override=True)(original)


class FailingSpuRun:
    """Replaces the worker kernel of ``spu.run``: party ``FAILING_PARTY`` raises once
    the other members have entered the real kernel (so they are inside libspu,
    waiting for it); the others run the original kernel."""

    def __init__(self, members: int):
        self.original = worker_kernels().get(spu_dialect.run_p)
        assert self.original is not None
        self.entered = threading.Semaphore(0)
        self.others = members - 1

    def __call__(self, call: Call, *args: Any) -> list[Any]:
        assert self.original is not None
        if call.interp.party == FAILING_PARTY:
            for _ in range(self.others):
                self.entered.acquire(timeout=2)
            time.sleep(0.2)
            raise RuntimeError("injected SPU failure")
        self.entered.release()
        return self.original(call.interp, call.op, list(args), call.key)


@pytest.fixture
def failing_spu_run() -> Iterator[FailingSpuRun]:
    failing = FailingSpuRun(members=3)
    SPU_BACKEND.kernel(spu_dialect.run_p, override=True)(failing)
    try:
        yield failing
    finally:
        assert failing.original is not None
        restore_spu_run(failing.original)


def joint(a: Any, b: Any) -> Any:
    x = mp.put("P0", a)
    y = mp.put("P2", b)
    return mp.put("P0", mp.device("SP0")(lambda u, v: u * v + 1)(x, y))  # @joint


def test_failing_spu_kernel_fails_fast_and_names_party_and_op(
        failing_spu_run: FailingSpuRun, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    sim = mp.Simulator(CLUSTER, timeout=3)
    a = np.array([1.0, 2.0, -3.0], np.float32)
    b = np.array([4.0, 0.5, 2.0], np.float32)
    try:
        start = time.monotonic()
        with pytest.raises(mp.MPRuntimeError) as info:
            mp.evaluate(sim, joint, a, b, mode=mode)
        elapsed = time.monotonic() - start
        # restore the real kernel; the same simulator must run the next program correctly
        assert failing_spu_run.original is not None
        restore_spu_run(failing_spu_run.original)
        out = mp.evaluate(sim, joint, a, b, mode=mode)
        np.testing.assert_allclose(mp.fetch(sim, out), a * b + 1, atol=1e-3)
    finally:
        sim.close()
    assert elapsed < 15, f"the failure took {elapsed:.1f} s to surface"
    # the failing party, not a peer that timed out waiting for it; the kernel's text
    # stays in the party's log
    at = traced_at(__file__, "joint")
    assert_generic(info.value, "spu.run", at, FAILING_PARTY)
    assert logged_failure(caplog, "spu.run", at, f"node_{FAILING_PARTY}").endswith(
        "failed: RuntimeError: injected SPU failure")


def test_failing_spu_kernel_immediately(mode: str) -> None:
    """The simplest form: party 1 raises as soon as its spu.run starts."""
    original = worker_kernels().get(spu_dialect.run_p)
    assert original is not None

    def fail_on_party_1(call: Call, *args: Any) -> list[Any]:
        if call.interp.party == FAILING_PARTY:
            raise RuntimeError("injected SPU failure")
        assert original is not None
        return original(call.interp, call.op, list(args), call.key)

    sim = mp.Simulator(CLUSTER, timeout=3)
    a = np.array([2.0, -1.0], np.float32)
    SPU_BACKEND.kernel(spu_dialect.run_p, override=True)(fail_on_party_1)
    try:
        start = time.monotonic()
        with pytest.raises(mp.MPRuntimeError) as info:
            mp.evaluate(sim, joint, a, a, mode=mode)
        elapsed = time.monotonic() - start
    finally:
        restore_spu_run(original)
    try:
        out = mp.evaluate(sim, joint, a, a, mode=mode)
        np.testing.assert_allclose(mp.fetch(sim, out), a * a + 1, atol=1e-3)
    finally:
        sim.close()
    assert elapsed < 15
    message = str(info.value)
    assert "spu.run" in message
    assert f"party {FAILING_PARTY}" in message, message[:300]
