"""One-byte mutants of the native payloads of a saved program, loaded and run on the
simulator (the child process of `test_loaded_payloads.py`).

    python loaded_mutants.py KIND SEED START COUNT

KIND is a payload: ``module`` (tensor.run_jax), ``executable`` or ``stablehlo``
(spu.run). Mutant ``i`` sets one byte of that payload, at an offset and to a value
drawn from ``random.Random(f"{SEED}/{KIND}/{i}")``, in the program's saved bytes;
the mutated bytes are read with `mp.Program.from_bytes` and run on an
`mp.Simulator`. Prints ``S i`` before each mutant, ``R i OUTCOME DETAIL`` after it
(OUTCOME: ``ran``, the program's own result; ``differs``, another result;
``refused``, an `MPLangError`; ``other``, another exception), then ``DONE``. A
crash shows as a child that died before ``DONE``.
"""

from __future__ import annotations

import os
import random
import sys
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp

KINDS = {"module": ("tensor.run_jax", "module"), "executable": ("spu.run", "executable"),
         "stablehlo": ("spu.run", "stablehlo")}
"""Each payload kind: the op and attribute that hold it."""
CLUSTER = mp.ClusterSpec.simple(2)
EXPECTED = [1, 5, 14, 30]
"""What the program computes: ``cumsum(sort(([3, 0, 2, 1] + 1) ** 2))``."""


def add(a: Any, b: Any) -> Any:
    return a + b


def program() -> mp.Program:
    """A small program with each payload kind: an SPU sum, revealed, then squared, sorted
    and summed up by JAX on P0 (the StableHLO deserializer is known to crash on some
    one-byte mutants of a sort)."""
    def prog() -> Any:
        x = mp.put("P0", np.array([3, 0, 2, 1], dtype=np.int32))
        y = mp.put("P1", np.ones(4, dtype=np.int32))
        z = mp.put("P0", mp.device("SP0")(add)(x, y))
        return mp.device("P0")(lambda v: jnp.cumsum(jnp.sort(v * v)))(z)

    return mp.compile(prog, cluster=CLUSTER)


def payload_span(data: bytes, p: mp.Program, kind: str) -> tuple[int, int]:
    """Where the payload ``kind`` lies in the program's bytes ``data``: (start, stop)."""
    opcode, attr = KINDS[kind]
    (payload,) = [op.attrs[attr] for op in p.graph.walk() if op.opcode == opcode]
    start = data.find(payload)
    assert start >= 0 and data.count(payload) == 1, "the payload is stored once, raw"
    return start, start + len(payload)


def mutant(data: bytes, span: tuple[int, int], kind: str, seed: int, index: int) -> bytes:
    rng = random.Random(f"{seed}/{kind}/{index}")
    at = rng.randrange(*span)
    value = rng.choice([b for b in range(256) if b != data[at]])
    return data[:at] + bytes([value]) + data[at + 1:]


def outcome(sim: mp.Simulator, data: bytes) -> tuple[str, str]:
    try:
        out = mp.fetch(sim, mp.evaluate(sim, mp.Program.from_bytes(data), timeout=30))
    except mp.MPLangError as e:
        return "refused", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    except Exception as e:
        return "other", f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    return ("ran", "") if np.array_equal(out, EXPECTED) else ("differs", repr(out))


def main(kind: str, seed: int, start: int, count: int) -> None:
    p = program()
    data = p.to_bytes()
    span = payload_span(data, p, kind)
    sim = mp.Simulator(CLUSTER)
    for index in range(start, start + count):
        print(f"S {index}", flush=True)
        what, detail = outcome(sim, mutant(data, span, kind, seed, index))
        print(f"R {index} {what} {detail}", flush=True)
    print("DONE", flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip native teardown: only the mutants are under test


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
