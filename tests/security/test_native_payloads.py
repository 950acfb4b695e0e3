"""Native payloads of received programs: run_jax modules never crash or corrupt a worker.

- the run_jax module format: metadata validated field by field in Python
  (`mplang.dialects.tensor.module_info`), refusals name the field;
- the payload check workers run on received programs (`check_payloads`): the
  StableHLO is parsed, vetted and compiled in a helper process first; unsafe
  custom calls, unparsable bytecode and payloads that crash the helper are
  refused with `MPSerializationError` naming the op;
- `NativePayloadChecker` itself: verdicts, crashes, hangs, restarts, caching;
- a seeded fuzz campaign (``benchmarks/fuzz_run_jax.py``) run to execution with
  no crash.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.dialects.tensor import (
    MAX_ARITY,
    MAX_DIM,
    MAX_METADATA_BYTES,
    MAX_RANK,
    MODULE_MAGIC,
    module_info,
)
from mplang.edsl.errors import MPSerializationError, MPVerifyError
from mplang.edsl.graph import Graph
from mplang.edsl.primitive import check_types
from mplang.runtime.backend import check_payloads
from mplang.runtime.sandbox import NativePayloadChecker

ROOT = Path(__file__).resolve().parents[2]
HEADER = struct.Struct("<8sI")
A = np.array([[1.5, -2.25, 3.0], [0.5, 4.0, -1.0], [2.0, 0.25, 1.0]], dtype=np.float32)


def one_party_graph(fn: Callable[..., Any], *arrays: np.ndarray) -> Graph:
    """A one-party program: ``fn`` as a run_jax op on constants of party 0."""
    def prog() -> Any:
        xs = [simp.constant((0,), a) for a in arrays]
        return simp.pcall((0,), lambda *ps: tensor.run_jax(fn, *ps), *xs)

    return mp.compile(prog, world_size=1).graph


def run_jax_module(graph: Graph) -> bytes:
    module: bytes = next(op.attrs["module"] for op in graph.walk()
                         if op.opcode == "tensor.run_jax")
    return module


def with_module(graph: Graph, module: bytes) -> Graph:
    """``graph`` with the module of every run_jax op (regions included) replaced."""
    ops = [op.replace(attrs={**op.attrs, "module": module} if op.opcode == "tensor.run_jax"
                      else op.attrs,
                      regions=tuple(with_module(r, module) for r in op.regions))
           for op in graph.operations]
    return Graph(graph.inputs, ops, graph.outputs)


@pytest.fixture(scope="module")
def add_graph() -> Graph:
    return one_party_graph(lambda x, y: x + y * 2, A, A)


@pytest.fixture(scope="module")
def module(add_graph: Graph) -> bytes:
    return run_jax_module(add_graph)


def split(module: bytes) -> tuple[dict[str, Any], bytes]:
    _, size = HEADER.unpack_from(module)
    return json.loads(module[HEADER.size:HEADER.size + size]), module[HEADER.size + size:]


def rebuilt(meta: Any, bytecode: bytes, *, text: bytes | None = None) -> bytes:
    body = json.dumps(meta).encode() if text is None else text
    return HEADER.pack(MODULE_MAGIC, len(body)) + body + bytecode


def refused(module: bytes, field: str) -> str:
    with pytest.raises(MPSerializationError) as info:
        module_info(module)
    message = str(info.value)
    assert message.startswith(f"malformed run_jax module: {field}: "), message
    return message


# ---------------------------------------------------------------- the metadata


def test_a_real_module_has_its_declared_types(module: bytes) -> None:
    info = module_info(module)
    assert [(t.dtype, t.shape) for t in info.in_types] == [("float32", (3, 3))] * 2
    assert [(t.dtype, t.shape) for t in info.out_types] == [("float32", (3, 3))]
    assert info.kept == (0, 1) and info.platform == "cpu"
    assert module.endswith(info.bytecode) and info.bytecode.startswith(b"ML\xefR")


def test_pytree_results_keep_their_structure() -> None:
    """The wire format is flat; the traced side still gets the function's own pytree."""
    def prog() -> Any:
        x = simp.constant((0,), A)
        return simp.pcall((0,), lambda p: tensor.run_jax(
            lambda s: {"sum": jnp.sum(s), "pair": (s[0], None)}, p), x)

    sim = mp.Simulator(1)
    try:
        out = mp.fetch(sim, mp.evaluate(sim, prog))
    finally:
        sim.close()
    assert out["pair"][1] is None
    np.testing.assert_allclose(out["sum"][0], A.sum(), rtol=1e-6)
    np.testing.assert_array_equal(out["pair"][0][0], A[0])


@pytest.mark.parametrize("change, field", [
    ({"version": 2}, "version"),
    ({"version": "1"}, "version"),
    ({"version": True}, "version"),
    ({"platform": "gpu"}, "platform"),
    ({"calling_convention": 8}, "calling_convention"),
    ({"calling_convention": 11}, "calling_convention"),
    ({"calling_convention": True}, "calling_convention"),
    ({"in": [["object", [3, 3]], ["float32", [3, 3]]]}, "in[0].dtype"),
    ({"in": [["float32", [3, 3]], ["float0", [3, 3]]]}, "in[1].dtype"),
    ({"out": [[7, [3, 3]]]}, "out[0].dtype"),
    ({"out": [[["float32"], [3, 3]]]}, "out[0].dtype"),
    ({"in": [["float32", [3, -1]], ["float32", [3, 3]]]}, "in[0].shape[1]"),
    ({"in": [["float32", [3, 3.0]], ["float32", [3, 3]]]}, "in[0].shape[1]"),
    ({"in": [["float32", [True, 3]], ["float32", [3, 3]]]}, "in[0].shape[0]"),
    ({"out": [["float32", [MAX_DIM + 1]]]}, "out[0].shape[0]"),
    ({"out": [["float32", [1] * (MAX_RANK + 1)]]}, "out[0].shape"),
    ({"out": [["float32", "3x3"]]}, "out[0].shape"),
    ({"out": [["float32"]]}, "out[0]"),
    ({"out": {"0": ["float32", [3]]}}, "out"),
    ({"out": [["bool", []]] * (MAX_ARITY + 1)}, "out"),
    ({"kept": [0, 2]}, "kept[1]"),
    ({"kept": [1, 0]}, "kept"),
    ({"kept": [0, 0]}, "kept"),
    ({"kept": [0, 1, 1]}, "kept"),
    ({"extra": 1}, "metadata"),
])
def test_bad_metadata_is_refused_naming_the_field(module: bytes, change: dict[str, Any],
                                                  field: str) -> None:
    meta, bytecode = split(module)
    refused(rebuilt({**meta, **change}, bytecode), field)


def test_missing_field_is_refused(module: bytes) -> None:
    meta, bytecode = split(module)
    del meta["kept"]
    assert "kept" in refused(rebuilt(meta, bytecode), "metadata")


@pytest.mark.parametrize("text, what", [
    (b"{not json", "invalid JSON"),
    (b'{"version": 1, "version": 1}', "duplicate key"),
    (b"[1, 2]", "expected the fields"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),
])
def test_malformed_metadata_text_is_refused(module: bytes, text: bytes, what: str) -> None:
    _, bytecode = split(module)
    assert what in refused(rebuilt(None, bytecode, text=text), "metadata")


def test_bad_framing_is_refused(module: bytes) -> None:
    _, bytecode = split(module)
    refused(b"MPJAX", "header")
    refused(b"NOTJAXMD" + module[8:], "header")
    refused(HEADER.pack(MODULE_MAGIC, len(module)) + module[HEADER.size:], "header")
    refused(HEADER.pack(MODULE_MAGIC, MAX_METADATA_BYTES + 1) + b"\0" * (MAX_METADATA_BYTES + 2),
            "header")
    meta, _ = split(module)
    refused(rebuilt(meta, b""), "bytecode")
    refused(rebuilt(meta, b"\x00" + bytecode[1:]), "bytecode")
    with pytest.raises(MPSerializationError, match="module: expected bytes"):
        module_info(bytearray(module))  # type: ignore[arg-type]


def test_an_old_flatbuffer_module_is_refused(module: bytes) -> None:
    exp = jax.export.export(jax.jit(jnp.sin))(jax.ShapeDtypeStruct((3,), np.float32))
    refused(bytes(exp.serialize()), "header")


def test_type_check_names_the_op_and_field(add_graph: Graph, module: bytes) -> None:
    meta, bytecode = split(module)
    bad = with_module(add_graph, rebuilt({**meta, "in": [["int4", [3, 3]]] * 2}, bytecode))
    with pytest.raises(MPVerifyError, match=r"tensor\.run_jax\[<lambda>\]: malformed run_jax "
                                            r"module: in\[0\]\.dtype: unsupported dtype"):
        check_types(bad, 1)
    lying = with_module(add_graph, rebuilt({**meta, "in": [["float32", [2, 3]]] * 2}, bytecode))
    with pytest.raises(MPVerifyError, match="the module expects"):
        check_types(lying, 1)


# ---------------------------------------------------------------- the payload check


def test_a_good_program_passes_and_its_verdict_is_cached(add_graph: Graph) -> None:
    check_payloads(add_graph)
    started = time.perf_counter()
    check_payloads(add_graph)
    assert time.perf_counter() - started < 0.05


def test_declared_types_that_disagree_with_the_bytecode_are_refused(add_graph: Graph,
                                                                    module: bytes) -> None:
    """Consistent metadata (so the type check passes) over StableHLO of other types."""
    meta, bytecode = split(module)
    meta = {**meta, "in": [["int32", [3, 3]]] * 2, "out": [["int32", [3, 3]]]}
    graph = one_party_graph(lambda x, y: x + y * 2, A.astype(np.int32), A.astype(np.int32))
    bad = with_module(graph, rebuilt(meta, bytecode))
    check_types(bad, 1)
    with pytest.raises(MPSerializationError, match=r"^tensor\.run_jax\[<lambda>\]: run_jax "
                                                   r"module rejected: "):
        check_payloads(bad)


def test_unparsable_bytecode_is_refused(add_graph: Graph, module: bytes) -> None:
    meta, bytecode = split(module)
    bad = with_module(add_graph, rebuilt(meta, bytecode[:len(bytecode) // 2]))
    check_types(bad, 1)
    with pytest.raises(MPSerializationError, match=r"^tensor\.run_jax\[<lambda>\]: run_jax "
                                                   r"module rejected: .*deserialize"):
        check_payloads(bad)


def test_linalg_custom_calls_are_refused() -> None:
    """LAPACK kernels trust the module's result shapes: received modules may not call them."""
    graph = one_party_graph(jnp.linalg.inv, A)
    with pytest.raises(MPSerializationError, match=r"tensor\.run_jax\[inv\]: run_jax module "
                                                   r"rejected: uses custom call "
                                                   r"'lapack_sgetrf_ffi'"):
        check_payloads(graph)


def test_top_k_custom_call_is_allowed() -> None:
    check_payloads(one_party_graph(lambda x: jax.lax.top_k(x, 2), A.ravel()))


def mutated(module: bytes, offset: int, value: int) -> bytes:
    """``module`` with byte ``offset`` of its StableHLO bytecode set to ``value``."""
    pos = len(module) - len(module_info(module).bytecode) + offset
    return module[:pos] + bytes([value]) + module[pos + 1:]


def test_an_fft_whose_length_does_not_fit_its_shape_is_refused() -> None:
    """XLA compiles it; DUCC would abort the worker on the first run (found by the fuzzer:
    byte 190 of this module's bytecode falls in the FFT length)."""
    graph = one_party_graph(lambda s: jnp.abs(jnp.fft.fft(s)).astype(jnp.float32), A)
    bad = with_module(graph, mutated(run_jax_module(graph), 190, 0x80))
    check_types(bad, 1)
    expected = (r"^tensor\.run_jax\[<lambda>\]: run_jax module rejected: uses stablehlo\.fft "
                r"FFT of length \[\d+\] on shapes \[3, 3\] -> \[3, 3\]")
    with pytest.raises(MPSerializationError, match=expected):
        check_payloads(bad)
    check_payloads(graph)


SORT_CRASH = (597, 0x01)
"""(offset in the bytecode, new byte) of a one-byte mutation of `jnp.sort`'s module on
int32[6] that crashes the StableHLO deserializer (found by the fuzzer)."""


def test_a_payload_that_crashes_the_parser_is_refused() -> None:
    graph = one_party_graph(jnp.sort, np.array([7, -3, 12, 0, 5, 9], dtype=np.int32))
    bad = with_module(graph, mutated(run_jax_module(graph), *SORT_CRASH))
    check_types(bad, 1)
    with pytest.raises(MPSerializationError, match=r"^tensor\.run_jax\[sort\]: run_jax module "
                                                   r"rejected: the native payload crashed its "
                                                   r"verifier \(signal \d+, SIG[A-Z]+\) "
                                                   r"\(graph\.ops\[1\]\.regions\[0\]\.ops\[0\]"
                                                   r"\.attrs\.module, traced at "
                                                   r"test_native_payloads\.py:\d+\)$"):
        check_payloads(bad)
    check_payloads(graph)  # the helper was restarted


# ---------------------------------------------------------------- the checker


def vet_test_payload(payload: bytes) -> None:
    """A payload check for the tests: abort, hang, allocate 3 GiB or refuse on request."""
    if payload == b"abort":
        os.abort()
    if payload == b"big":
        bytearray(3 << 30)
    if payload == b"hang":
        time.sleep(60)
    if payload.startswith(b"bad"):
        raise ValueError("no good: " + payload.decode())


@pytest.fixture
def checker() -> Any:
    checker = NativePayloadChecker(vet_test_payload, "test payload", timeout=5.0)
    yield checker
    checker.close()


def test_checker_verdicts(checker: NativePayloadChecker) -> None:
    checker.check(b"fine", "op")
    with pytest.raises(MPSerializationError,
                       match=r"^op: test payload rejected: ValueError: no good: bad1$"):
        checker.check(b"bad1", "op")
    with pytest.raises(MPSerializationError, match=r"^op2: test payload rejected: the native "
                                                   r"payload crashed its verifier \(signal 6, "
                                                   r"SIGABRT\)$"):
        checker.check(b"abort", "op2")
    checker.check(b"fine again", "op")
    started = time.perf_counter()
    with pytest.raises(MPSerializationError, match="crashed its verifier"):
        checker.check(b"abort", "op2")  # cached: no new helper to crash
    assert time.perf_counter() - started < 0.05


def test_checker_limits_the_helper_memory() -> None:
    checker = NativePayloadChecker(vet_test_payload, "test payload", memory_limit=2 << 30)
    try:
        with pytest.raises(MPSerializationError, match=r"^op: test payload rejected: "
                                                       r"MemoryError"):
            checker.check(b"big", "op")
        checker.check(b"fine", "op")  # in a new helper: one that ran out is not reused
    finally:
        checker.close()


def test_checker_times_out_and_does_not_cache_it(checker: NativePayloadChecker) -> None:
    checker.timeout = 1.0
    with pytest.raises(MPSerializationError, match=r"did not finish within 1 s"):
        checker.check(b"hang", "op")
    checker.timeout = 5.0
    checker.check(b"fine", "op")
    with pytest.raises(MPSerializationError, match="did not finish"):
        checker.check(b"hang", "op")


# ---------------------------------------------------------------- fuzzing


def fuzz(count: int, seed: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fuzz_run_jax.py"), "--count", str(count),
         "--seed", str(seed), "--jobs", "2", "--batch", str(max(count // 2, 1)), "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800, check=True)
    summary: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return summary


def assert_no_crash(summary: dict[str, Any], count: int) -> None:
    assert summary["mutants"] == count
    assert (summary["crash"], summary["late_crashes"], summary["hang"], summary["other"]) \
        == (0, 0, 0, 0), summary
    assert summary["ran"] > 0 and summary["rejected_at"].get("payload check", 0) > 0, summary


def test_seeded_mutants_run_to_execution_without_a_crash() -> None:
    assert_no_crash(fuzz(300, seed=1), 300)


@pytest.mark.slow
def test_a_larger_campaign_has_no_crash() -> None:
    assert_no_crash(fuzz(3000, seed=2), 3000)
