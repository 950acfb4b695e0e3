"""A short multi-party demo on the in-memory simulator: each step prints its result.

Each party reads its inputs from its own data root (``tensor.load``); the demo
first writes them into temporary folders, one per party, standing in for each
organisation's own disk.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import simp, tensor
from mplang.device.kinds import get_kind

VECTOR, WEALTH = "vector.npy", "wealth.npy"
"""The files each party keeps in its data root."""


def write_inputs(roots: dict[str, Path]) -> None:
    """What each party does on its own machine: party i keeps the vector [i+1, 2(i+1),
    3(i+1)], and parties 0 and 1 their wealth."""
    for i, root in enumerate(roots.values()):
        root.mkdir(parents=True, exist_ok=True)
        np.save(root / VECTOR, np.arange(1, 4, dtype=np.float32) * (i + 1))
        np.save(root / WEALTH, np.int32((i + 1) * 1_000_000))


def _private_inputs(world_size: int) -> Any:
    """Each party's own vector, read on its own side and known to nobody else."""
    held = [simp.pcall((i,), lambda: tensor.load(VECTOR)) for i in range(world_size)]
    return simp.converge(*held)


def _steps(world_size: int) -> list[tuple[str, Callable[[], Any]]]:
    ring = {i: (i - 1) % world_size for i in range(world_size)}

    def local_square() -> Any:
        return _private_inputs(world_size) ** 2

    def ring_shift() -> Any:
        return simp.shuffle_static(_private_inputs(world_size), ring)

    def gather_to_party0() -> Any:
        x = _private_inputs(world_size)
        total = simp.pcall((0,), jnp.sum, x)
        for src in range(1, world_size):
            part = simp.pcall((src,), jnp.sum, x)
            moved = simp.shuffle_static(part, {0: src})
            total = simp.pcall((0,), lambda a, b: a + b, total, moved)
        return total

    def uniform_branch() -> Any:
        rank = simp.prank()
        big = simp.pcall(None, lambda r: r + 100 > 50, rank)
        return simp.uniform_cond(big, lambda r: r * 2, lambda r: r - 1, rank)

    def loop_until() -> Any:
        start = simp.pcall(None, lambda r: r * 0, simp.prank())
        return simp.while_loop(lambda i: i < 5, lambda i: i + 1, start)

    return [
        ("each party's private vector", lambda: _private_inputs(world_size)),
        ("squared locally on each party", local_square),
        (f"ring shift {ring} (dst: src)", ring_shift),
        ("sum of all vectors gathered on party 0", gather_to_party0),
        ("uniform branch on rank + 100 > 50 (then: 2 * rank)", uniform_branch),
        ("loop in lockstep until i == 5", loop_until),
    ]


def millionaire() -> Any:
    """Who is richer? Party 0 learns only the answer; nobody sees the other's wealth."""
    alice = mp.device("P0")(lambda: tensor.load(WEALTH))()
    bob = mp.device("P1")(lambda: tensor.load(WEALTH))()
    richer = mp.device("SP0")(lambda a, b: a < b)(alice, bob)
    return mp.put("P0", richer)


def secure_mean(world_size: int) -> Any:
    """The mean of all parties' private vectors, computed on secret shares and revealed
    to party 0 only."""
    vectors = [mp.device(f"P{i}")(lambda: tensor.load(VECTOR))() for i in range(world_size)]
    return mp.put("P0", mp.device("SP0")(lambda *vs: jnp.mean(jnp.stack(vs)))(*vectors))


@contextlib.contextmanager
def simulated(cluster: mp.ClusterSpec, write: Callable[[dict[str, Path]], None],
              prefix: str = "mplang-demo-", policies: Any = None) -> Iterator[Any]:
    """A simulator of ``cluster`` whose parties read from temporary data roots, one per
    node, standing in for each organisation's own disk: ``write(roots)`` fills them
    first (``roots``: node name -> folder), and judge programs by ``policies`` (default:
    the policies ``mplang init`` writes). Closed, and the folders removed, on exit."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        roots = {node.name: Path(folder) / node.name for node in cluster.nodes}
        for root in roots.values():
            root.mkdir()
        write(roots)
        sim = mp.Simulator(cluster, data_roots=roots, policies=policies)
        try:
            yield sim
        finally:
            sim.close()


def run_demo(world_size: int = 3, echo: Callable[[str], None] = print) -> list[Any]:
    """Run every demo step on a ``world_size``-party simulator; return the fetched results.
    It shows each party's values: no party judges the programs by a policy."""
    results = []
    with simulated(mp.ClusterSpec.simple(world_size), write_inputs, policies="open") as sim, \
            sim:
        echo(f"MPLang demo on an in-memory simulator of {world_size} parties "
             "(each reads its inputs from its own data root; no policy judges the programs, "
             "so that every party's values show)")
        for title, step in _steps(world_size):
            value = mp.fetch(sim, mp.evaluate(sim, mp.function(step)))
            results.append(value)
            echo(f"- {title}:")
            for rank, v in enumerate(value):
                echo(f"    party {rank}: {v}")
        if world_size >= 2:
            device = sim.cluster.device("SP0")
            echo(f"Secure computation on {device.kind} {device.config} over "
                 f"{', '.join(device.members)}")
            echo(f"  security: {get_kind(device.kind).security_model_of(device)}")
            richer = mp.fetch(sim, mp.evaluate(sim, millionaire))
            echo(f"- millionaire's problem, revealed to P0 only: is P0 poorer than P1? {richer}")
            mean = mp.fetch(sim, mp.evaluate(sim, secure_mean, world_size))
            echo(f"- secure mean of the {world_size} private vectors, revealed to P0: "
                 f"{mean:.4f}")
            results += [richer, mean]
    return results
