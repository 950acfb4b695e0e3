"""How fast failures end an execution on 3 local worker processes (ABY3), and whether
chained PSI joins hang, in one run.

- frozen: node_1 stopped (SIGSTOP) before ``mp.evaluate(..., timeout=T)`` of a ring of
  messages: seconds until the driver raises (each of ``--runs``);
- frozen in SPU: node_2 stopped 1.5 s into an SPU op of many comparison rounds;
- chained joins: ``--joins`` runs of three chained two-party PSI joins with
  ``timeout=20``: how many fail.

    .venv/bin/python benchmarks/bench_fail_fast.py [--runs 5] [--joins 30] [--timeout 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from bench_http import free_ports

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster
from tests.worker import programs


def _ring() -> Any:
    return simp.shuffle_static(simp.prank() * 7 + 1, {0: 2, 1: 0, 2: 1})


def _rounds(v: Any) -> Any:
    for _ in range(240):  # several seconds: longer than the freeze delay
        v = jnp.where(v > 50.0, v * 0.5, v * 1.5)
    return v


def _failing_after(cluster: LocalCluster, node: str, run: Any, delay: float) -> float:
    """Seconds from stopping ``node`` (``delay`` s after ``run`` started) to ``run``
    raising; ``node`` is continued afterwards."""
    done: dict[str, float] = {}

    def target() -> None:
        try:
            run()
        except mp.MPLangError:
            done["at"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    time.sleep(delay)
    pid = cluster.processes[node].pid
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        thread.join(120)
    finally:
        os.kill(pid, signal.SIGCONT)
    return done.get("at", float("inf")) - stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--joins", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    chained, _ = programs.chained_joins()
    layout = mp.ClusterSpec.simple(3).to_dict()  # ABY3 over the three
    for node, port in zip(layout["nodes"], free_ports(3), strict=True):
        node["endpoint"] = f"127.0.0.1:{port}"
    with LocalCluster(mp.ClusterSpec.from_dict(layout)) as cluster:
        driver = cluster.driver(timeout=30.0, run_timeout=120.0)
        try:
            mp.evaluate(driver, _ring)  # connections made
            frozen = [_failing_after(cluster, "node_1", lambda: mp.evaluate(
                driver, _ring, timeout=args.timeout), 0.0) for _ in range(args.runs)]
            shares = mp.evaluate(driver, lambda: mp.device("SP0")(lambda v: v * 1.0)(
                mp.put("P0", np.linspace(0.0, 100.0, 10_000, dtype=np.float32))))
            in_spu = [_failing_after(cluster, "node_2", lambda: mp.evaluate(
                driver, lambda s: mp.device("SP0")(_rounds)(s), shares,
                timeout=args.timeout + 1), 1.5) for _ in range(args.runs)]
            failed = 0
            for _ in range(args.joins):
                try:
                    mp.evaluate(driver, chained, timeout=20)
                except mp.MPLangError:
                    failed += 1
        finally:
            driver.close()
    print(f"frozen before the run (timeout {args.timeout:g} s): median "
          f"{statistics.median(frozen):.2f} s, max {max(frozen):.2f} s to the error")
    print(f"frozen inside an SPU op (timeout {args.timeout + 1:g} s): median "
          f"{statistics.median(in_spu):.2f} s, max {max(in_spu):.2f} s to the error")
    print(f"three chained PSI joins: {failed} of {args.joins} runs failed")


if __name__ == "__main__":
    main()
