"""Parallel execution against sequential execution, in one run, on the simulator.

1. 8 independent shuffles across disjoint party pairs, 16 parties, 50 ms links:
   wall time with the dataflow scheduler and with ``parallel=False``, and the
   analysis' critical-path estimate.
2. 8 independent 200 ms host calls (``tensor.pyfunc``) on 8 parties.
3. The secure logistic regression example on 20 ms links (2 parties, SEMI2K with
   Beaver source TrustedFirstParty): with and without the scheduler and the graph
   passes; communication rounds before/after the passes.

    .venv/bin/python benchmarks/bench_parallel.py
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

import mplang as mp
from mplang import simp, tensor
from mplang.analysis import CostModel

ROOT = Path(__file__).resolve().parent.parent


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def independent_shuffles() -> list[Any]:
    return [simp.shuffle_static(simp.constant((2 * i,), np.float32(i)), {2 * i + 1: 2 * i})
            for i in range(8)]


def bench_shuffles() -> None:
    sim = mp.Simulator(16, latency_ms=50)
    program = mp.compile(independent_shuffles, world_size=16)
    mp.evaluate(sim, program)  # warm-up
    parallel = min(timed(lambda: mp.fetch(sim, mp.evaluate(sim, program))) for _ in range(3))
    sequential = timed(lambda: mp.fetch(sim, mp.evaluate(sim, program, parallel=False)))
    estimate = mp.analyze(program, cost_model=CostModel(latency_s=0.050)).critical_path
    print(f"8 independent shuffles, 16 parties, 50 ms links: parallel {parallel * 1e3:.1f} ms, "
          f"sequential {sequential * 1e3:.1f} ms, speedup {sequential / parallel:.1f}x; "
          f"critical-path estimate {estimate * 1e3:.1f} ms, measured / estimate "
          f"{parallel / estimate:.2f}")
    sim.close()


def sleepy(v: np.ndarray) -> np.ndarray:
    time.sleep(0.2)
    return v + 1


def independent_pyfuncs() -> list[Any]:
    out = jax.ShapeDtypeStruct((), np.float32)
    return [simp.pcall((i,), lambda v: tensor.pyfunc(sleepy, v, out=out),
                       simp.constant((i,), np.float32(i))) for i in range(8)]


def bench_pyfuncs() -> None:
    sim = mp.Simulator(8)
    program = mp.compile(independent_pyfuncs, world_size=8)
    parallel = timed(lambda: mp.fetch(sim, mp.evaluate(sim, program)))
    sequential = timed(lambda: mp.fetch(sim, mp.evaluate(sim, program, parallel=False)))
    print(f"8 independent 200 ms host calls on 8 parties: parallel {parallel:.3f} s, "
          f"sequential {sequential:.3f} s, speedup {sequential / parallel:.1f}x")
    sim.close()


def _example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def semi2k_pair() -> mp.ClusterSpec:
    """2 parties with a SEMI2K SPU whose Beaver triples party 0 makes (it must be trusted):
    the protocol these figures were first recorded with; the subject is the scheduler."""
    spec = mp.ClusterSpec.simple(2).to_dict()
    spec["devices"]["SP0"]["config"] = {"protocol": "SEMI2K", "beaver": "TrustedFirstParty",
                                        "field": "FM64"}
    return mp.ClusterSpec.from_dict(spec)


def bench_logistic_regression(iterations: int = 3) -> None:
    example = _example("logistic_regression")
    cluster = semi2k_pair()
    folder = tempfile.TemporaryDirectory(prefix="bench-parallel-")
    roots = {node.name: Path(folder.name) / node.name for node in cluster.nodes}
    example.save_party_data(roots, example.load_data())  # each party's own files
    sim = mp.Simulator(cluster, latency_ms=20, data_roots=roots, policies="open")
    with sim:  # the parties tell the driver their files' types
        program = mp.compile(lambda: example.vertical_logistic_regression(iterations),
                             cluster=cluster)
    optimized = mp.optimize(program)
    cost = CostModel(latency_s=0.020)
    before, after = mp.analyze(program, cost_model=cost), mp.analyze(optimized, cost_model=cost)
    print(f"secure logistic regression ({iterations} SPU training iterations; 2 parties, "
          "SEMI2K, beaver TrustedFirstParty), 20 ms links:")
    data, results = example.load_data(), {}
    for label, prog, parallel in (("sequential, no passes", program, False),
                                  ("scheduler, no passes", program, True),
                                  ("scheduler + passes", optimized, True)):
        start = time.perf_counter()
        model = mp.fetch(sim, mp.evaluate(sim, prog, parallel=parallel))
        results[label] = example.accuracy(data, model["w0"], model["w1"], model["b"])
        print(f"  {label}: {time.perf_counter() - start:.2f} s, "
              f"accuracy {results[label]:.4f}")
    print(f"  ops {before.num_ops} -> {after.num_ops}, rounds {before.rounds} -> {after.rounds}, "
          f"critical-path estimate {before.critical_path:.2f} s -> {after.critical_path:.2f} s")
    sim.close()
    folder.cleanup()


def main() -> None:
    bench_shuffles()
    bench_pyfuncs()
    bench_logistic_regression()


if __name__ == "__main__":
    main()
