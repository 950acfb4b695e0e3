"""Time of the policy check (`mplang.policy.check`) on a program of about 10,000 ops.

The program: party 0 loads a vector, then a long chain of pcalls (each a run_jax op
inside), static shuffles between the two parties and SPU seal/run/reveal rounds.
Run: ``python benchmarks/bench_check.py``.
"""

from __future__ import annotations

import time

import jax.numpy as jnp

import mplang as mp
from mplang.dialects import simp, tensor
from mplang.policy import Policy, check

ROUNDS = 1165


def program() -> mp.MPObject:
    x = simp.pcall((0,), lambda: tensor.load("x.npy", dtype="float32", shape=(16,)))
    y = simp.pcall((1,), lambda: tensor.load("y.npy", dtype="float32", shape=(16,)))
    for i in range(ROUNDS):
        x = simp.pcall((0,), lambda a: a * 2.0 + 1.0, x)
        z = simp.shuffle_static(simp.pcall((0,), jnp.sum, x), {1: 0})
        y = simp.pcall((1,), lambda a, s: a + s, y, z)
        if i % 10 == 0:
            s = mp.device("SP0")(lambda a, b: jnp.sum(a * b))(x, y)
            y = simp.pcall((1,), lambda a, s: a - s, y, mp.put("P1", s))
    return y


def main() -> None:
    cluster = mp.ClusterSpec.simple(2)
    graph = mp.compile(program, cluster=cluster).graph
    ops = sum(1 for _ in graph.walk())
    rules = Policy.parse("declassify:\n  - to: ['*']\n    when: aggregate\n")
    for rank in (0, 1):
        start = time.perf_counter()
        verdict = check(graph, 2, rank, rules)
        elapsed = time.perf_counter() - start
        print(f"check on party {rank}: {ops} ops in {elapsed:.3f} s "
              f"({'accepted' if verdict.accepted else 'refused'}, {len(verdict.flows)} flows)")


if __name__ == "__main__":
    main()
