"""Fuzz the native payloads of received programs all the way to execution.

Real programs with ``tensor.run_jax`` ops are encoded as graph bundles; each
mutant changes the bytes of one run_jax module (then re-encodes the bundle) or
of the whole bundle, by one of: a random byte, a bit flip, an "interesting"
byte (0x00, 0x01, 0x7f, 0x80, 0xff), a truncation, a splice of bytes from
another payload. Each mutant goes through exactly what an HTTP worker does with
a ``/run`` body: decode, verify, type check and kernel check (as
`WorkerServer.program`), the registered payload checks, then a run on a
`SimpWorker` with the program's constants as concrete inputs.

Mutants run in batches in child processes, so a crash (an exit by signal) is
observed and counted, not fatal to the campaign; a child silent for
``--timeout`` seconds is killed and its mutant counted as a hang.

    .venv/bin/python benchmarks/fuzz_run_jax.py --count 10000 [--seed 0] [--jobs 2] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pickle
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

OUTCOMES = ("ran", "rejected", "other", "crash", "hang")
"""Accepted and ran; refused with an MPLangError (at any stage, running included); another
exception; the process died by a signal; no answer within the timeout."""
VERIFIER_CRASH = "crashed its verifier"
"""In a payload check's refusal: the payload crashed the checker's helper process."""
LATE = "late crash"
"""A child that died between two mutants (an earlier mutant's heap damage showing up
late): counted on its own, since that mutant already has an outcome."""
KINDS = ("byte", "bitflip", "interesting", "truncate", "splice")
TARGETS = ("module", "bundle")
INTERESTING = (0x00, 0x01, 0x7F, 0x80, 0xFF)


# ---------------------------------------------------------------- programs


def _programs() -> dict[str, Callable[[], Any]]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from mplang import simp, tensor

    a = np.array([[1.5, -2.25, 3.0], [0.5, 4.0, -1.0], [2.0, 0.25, 1.0]], dtype=np.float32)
    v = np.array([7, -3, 12, 0, 5, 9], dtype=np.int32)

    def arith() -> Any:
        x, y = simp.constant((0,), a), simp.constant((0,), a.T.copy())
        return simp.pcall((0,), lambda p, q: tensor.run_jax(
            lambda s, t: (jnp.sum(s * 2.0 + t, axis=0), jnp.max(s - t)), p, q), x, y)

    def linalg() -> Any:
        x = simp.constant((0,), a)
        return simp.pcall((0,), lambda p: tensor.run_jax(
            lambda s: jnp.tanh(jnp.linalg.inv(s) @ s.T), p), x)

    def sorting() -> Any:
        x = simp.constant((0,), v)

        def body(p: Any) -> Any:
            s = tensor.run_jax(jnp.sort, p)
            c = tensor.run_jax(jnp.cumsum, s)
            return tensor.run_jax(lambda q, r: jnp.where(q > 2, q, r)[1:4], c, s)

        return simp.pcall((0,), body, x)

    def indexing() -> Any:
        x, i = simp.constant((0,), a), simp.constant((0,), np.int32(1))
        return simp.pcall((0,), lambda p, k: tensor.run_jax(
            lambda s, j: jax.lax.dynamic_slice(s, (j, 0), (2, 3))[:, ::-1], p, k), x, i)

    def loop() -> Any:
        x = simp.constant((0,), v)
        return simp.pcall((0,), lambda p: tensor.run_jax(
            lambda s: jax.lax.fori_loop(0, 4, lambda _, t: t * 2 - 1, s), p), x)

    def fft() -> Any:
        x = simp.constant((0,), a)
        return simp.pcall((0,), lambda p: tensor.run_jax(
            lambda s: jnp.abs(jnp.fft.fft(s)).astype(jnp.float32), p), x)

    def topk() -> Any:
        x = simp.constant((0,), a.ravel())
        return simp.pcall((0,), lambda p: tensor.run_jax(lambda s: jax.lax.top_k(s, 3), p), x)

    return {"arith": arith, "linalg": linalg, "sorting": sorting, "indexing": indexing,
            "loop": loop, "fft": fft, "topk": topk}


@dataclass(frozen=True)
class Case:
    name: str
    bundle: bytes
    modules: tuple[bytes, ...]
    """The distinct run_jax modules of the program."""


def build_cases() -> list[Case]:
    """The programs, compiled for one party and encoded as a worker receives them."""
    import mplang as mp
    from mplang.edsl.serde import encode_graph_bundle

    cases = []
    for name, prog in _programs().items():
        graph = mp.compile(prog, world_size=1).graph
        modules = tuple(dict.fromkeys(op.attrs["module"] for op in graph.walk()
                                      if op.opcode == "tensor.run_jax"))
        cases.append(Case(name, encode_graph_bundle(graph, {}), modules))
    return cases


# ---------------------------------------------------------------- mutations


def mutate(data: bytes, kind: str, rng: random.Random, donors: list[bytes]) -> bytes:
    """``data`` changed by one mutation of ``kind`` (never the same bytes, except a splice
    of equal bytes)."""
    buf = bytearray(data)
    pos = rng.randrange(len(buf))
    if kind == "byte":
        buf[pos] = (buf[pos] + rng.randrange(1, 256)) % 256
    elif kind == "bitflip":
        buf[pos] ^= 1 << rng.randrange(8)
    elif kind == "interesting":
        buf[pos] = rng.choice([b for b in INTERESTING if b != buf[pos]] or [0x42])
    elif kind == "truncate":
        del buf[pos:]
    elif kind == "splice":
        donor = rng.choice(donors)
        start = rng.randrange(len(donor))
        chunk = donor[start:start + rng.randrange(1, 65)]
        buf[pos:pos + rng.choice((0, len(chunk), rng.randrange(1, 65)))] = chunk
    else:
        raise ValueError(kind)
    return bytes(buf)


def _replace_module(graph: Any, old: bytes, new: bytes) -> Any:
    from mplang.edsl.graph import Graph

    ops = [op.replace(attrs={**op.attrs, "module": new}
                      if op.opcode == "tensor.run_jax" and op.attrs["module"] == old else op.attrs,
                      regions=tuple(_replace_module(r, old, new) for r in op.regions))
           for op in graph.operations]
    return Graph(graph.inputs, ops, graph.outputs)


def make_mutant(cases: list[Case], seed: int, index: int) -> tuple[str, bytes]:
    """Mutant ``index`` of campaign ``seed``: (description, bundle bytes)."""
    from mplang.edsl.serde import decode_graph_bundle, encode_graph_bundle

    rng = random.Random(f"{seed}:{index}")
    case = rng.choice(cases)
    kind = rng.choice(KINDS)
    target = "module" if rng.random() < 0.7 else "bundle"
    donors = [m for c in cases for m in c.modules] + [c.bundle for c in cases]
    if target == "bundle":
        return f"{case.name}/{target}/{kind}", mutate(case.bundle, kind, rng, donors)
    which = rng.randrange(len(case.modules))
    old = case.modules[which]
    graph, meta = decode_graph_bundle(case.bundle)
    new = mutate(old, kind, rng, donors)
    return (f"{case.name}/{target}/{kind}",
            encode_graph_bundle(_replace_module(graph, old, new), meta))


# ---------------------------------------------------------------- one mutant, as a worker


class _NoPeers:
    """The communicator of a one-party world: nothing to send to or receive from."""

    def send(self, dst: int, tag: Any, value: Any) -> None:
        raise RuntimeError("a one-party program sent a message")

    def recv(self, src: int, tag: Any, timeout: float | None = None) -> Any:
        raise RuntimeError("a one-party program waited for a message")


def _worker() -> Any:
    import jax

    import mplang  # noqa: F401 - registers the dialects' kernels
    from mplang.runtime.object_store import ObjectStore
    from mplang.worker.state import SimpWorker

    # run each computation before returning, so a crash is charged to its own mutant
    jax.config.update("jax_cpu_enable_async_dispatch", False)
    return SimpWorker(0, 1, _NoPeers(), ObjectStore("node_0"), timeout=5.0, in_process=False)


def run_as_worker(worker: Any, bundle: bytes,
                  at: Callable[[str], None] = lambda stage: None) -> tuple[str, str]:
    """(outcome, detail) of ``bundle`` received and run by ``worker`` the way the HTTP
    worker does it (`WorkerServer.program`, then the payload checks, then the run);
    ``at(stage)`` is called as each stage starts."""
    from mplang.edsl.errors import MPLangError, MPSerializationError
    from mplang.edsl.primitive import check_types
    from mplang.edsl.serde import decode_graph_bundle
    from mplang.runtime import backend
    from mplang.runtime.options import RunOptions

    stage = "decode"
    at(stage)
    try:
        graph, _ = decode_graph_bundle(bundle)
        stage = "type check"
        at(stage)
        graph.verify()
        check_types(graph, 1)
        for op in graph.walk():
            if worker.kernels.get(op.prim) is None:
                raise MPSerializationError(f"op {op.opcode} has no kernel on this worker")
        check_payloads = getattr(backend, "check_payloads", None)  # absent before the fix
        if check_payloads is not None:
            stage = "payload check"
            at(stage)
            check_payloads(graph)
        stage = "run"
        at(stage)
        worker.run(graph, [], uuid.uuid4().hex, "", RunOptions(parallel=False, timeout=5.0))
    except MPLangError as e:
        return "rejected", f"{stage}: {type(e).__name__}: {str(e)[:300]}"
    except Exception as e:
        return "other", f"{stage}: {type(e).__name__}: {str(e)[:300]}"
    return "ran", stage


def child_main(cases_path: str, seed: int, start: int, stop: int) -> None:
    """Run mutants [start, stop); print ``S i what`` before each, ``T i stage`` as each
    stage starts and ``R i json`` after each."""
    with open(cases_path, "rb") as f:
        cases: list[Case] = pickle.load(f)
    worker = _worker()
    out = sys.stdout
    for index in range(start, stop):
        what, bundle = make_mutant(cases, seed, index)
        print(f"S {index} {what}", file=out, flush=True)

        def at(stage: str, index: int = index) -> None:
            print(f"T {index} {stage}", file=out, flush=True)

        outcome, detail = run_as_worker(worker, bundle, at)
        print(f"R {index} " + json.dumps({"outcome": outcome, "detail": detail}),
              file=out, flush=True)
    print("DONE", file=out, flush=True)
    # skip native teardown (it sometimes aborts after Python finalization)
    os._exit(0)


# ---------------------------------------------------------------- the campaign


@dataclass
class Result:
    index: int
    what: str
    outcome: str
    detail: str


@dataclass
class _Progress:
    """Where a child is: the mutant under way (None between mutants) and its stage."""

    running: int | None = None
    what: str = "?"
    stage: str = "?"
    done: int = 0


def _lines(proc: subprocess.Popen[bytes], first: float, timeout: float,
           at: _Progress) -> Iterator[str | None]:
    """The child's output lines; None when it was silent too long (``first`` seconds at
    start-up and between mutants, ``timeout`` while a mutant is under way)."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pending = b""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                yield line.decode()
            if not sel.select(first if at.running is None else timeout):
                yield None
                return
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            pending += chunk


def _exit(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"


def _batch(cases_path: str, seed: int, start: int, stop: int, timeout: float,
           log: Callable[[str], None]) -> Iterator[Result]:
    """Results of mutants [start, stop), restarting the child after a crash or hang."""
    while start < stop:
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child", cases_path, str(seed),
             str(start), str(stop)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
        at = _Progress()
        hung = False
        for line in _lines(proc, max(timeout, 300.0), timeout, at):
            if line is None:
                hung = True
                proc.kill()
                break
            if line == "DONE":
                break
            tag, index, rest = line.split(" ", 2)
            if tag == "S":
                at.running, at.what, at.stage = int(index), rest, "?"
            elif tag == "T":
                at.stage = rest
            else:
                record = json.loads(rest)
                yield Result(int(index), at.what, record["outcome"], record["detail"])
                at.running = None
                at.done += 1
                start = int(index) + 1
        code = proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
        if at.running is None:
            if start >= stop:
                break
            if at.done == 0:
                raise RuntimeError(f"fuzz child exited ({_exit(code)}) before its first mutant")
            # died between mutants: heap damage done by an earlier mutant showing up late
            yield Result(start - 1, at.what, LATE, _exit(code))
            log(f"after mutant {start - 1} {at.what}: late crash ({_exit(code)})")
            continue
        outcome = "hang" if hung else "crash"
        detail = f"{f'no answer in {timeout:g} s' if hung else _exit(code)} at {at.stage}"
        yield Result(at.running, at.what, outcome, detail)
        log(f"mutant {at.running} {at.what}: {outcome} ({detail})")
        start = at.running + 1


def campaign(count: int, seed: int, jobs: int, batch: int, timeout: float,
             log: Callable[[str], None]) -> tuple[dict[str, Any], list[Result]]:
    """Run ``count`` mutants; returns (summary, the crashes and hangs)."""
    from concurrent.futures import ThreadPoolExecutor

    started = time.perf_counter()
    cases = build_cases()
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump(cases, f)
        cases_path = f.name
    totals: collections.Counter[str] = collections.Counter()
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    by_program: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter)
    stages: collections.Counter[str] = collections.Counter()
    verifier_crashes = 0
    bad: list[Result] = []

    def run(bounds: tuple[int, int]) -> list[Result]:
        return list(_batch(cases_path, seed, bounds[0], bounds[1], timeout, log))

    try:
        chunks = [(s, min(s + batch, count)) for s in range(0, count, batch)]
        with ThreadPoolExecutor(jobs) as pool:
            for results in pool.map(run, chunks):
                for r in results:
                    totals[r.outcome] += 1
                    program, mutation = r.what.split("/", 1)
                    by_program[program][r.outcome] += 1
                    if r.outcome != LATE:
                        by_kind[mutation][r.outcome] += 1
                    if r.outcome == "rejected":
                        stages[r.detail.split(":", 1)[0]] += 1
                        verifier_crashes += VERIFIER_CRASH in r.detail
                    if r.outcome in ("crash", LATE, "hang", "other"):
                        bad.append(r)
    finally:
        os.unlink(cases_path)
    summary = {"mutants": sum(totals[o] for o in OUTCOMES), **{o: totals[o] for o in OUTCOMES},
               "late_crashes": totals[LATE], "verifier_crashes": verifier_crashes,
               "rejected_at": dict(stages), "seed": seed,
               "seconds": round(time.perf_counter() - started, 1),
               "by_mutation": {k: dict(v) for k, v in sorted(by_kind.items())},
               "by_program": {k: dict(v) for k, v in sorted(by_program.items())}}
    return summary, bad


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch", type=int, default=250, help="mutants per child process")
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds a mutant may take before it counts as a hang")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args()
    summary, bad = campaign(args.count, args.seed, args.jobs, args.batch, args.timeout,
                            lambda m: print(m, file=sys.stderr, flush=True))
    for r in bad:
        if r.outcome != "other":
            continue
        print(f"mutant {r.index} {r.what}: {r.outcome}: {r.detail}", file=sys.stderr)
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{summary['mutants']} mutants (seed {args.seed}) in {summary['seconds']} s: "
          + ", ".join(f"{o} {summary[o]}" for o in OUTCOMES)
          + f"; late crashes {summary['late_crashes']}")
    print("rejected at:", summary["rejected_at"], "; rejected because the payload crashed "
          f"the payload checker's helper: {summary['verifier_crashes']}")
    for group in ("by_mutation", "by_program"):
        for key, counts in summary[group].items():
            print(f"  {key:20} " + ", ".join(f"{o} {counts.get(o, 0)}"
                                             for o in (*OUTCOMES, LATE)))


if __name__ == "__main__":
    main()
