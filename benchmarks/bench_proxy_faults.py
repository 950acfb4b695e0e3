"""A TCP proxy in front of node_1 (issue 26): every connection to it, from the driver and
its peers, passes through ``tests/worker/tcp_proxy.py`` (mutual TLS end to end).

- latency: median seconds of SPU, PSI and PHE runs on 3 worker processes without the
  proxy, through it, and through it with 50 ms added each way;
- stall / cut: ``--runs`` runs of an SPU op with ``mp.evaluate(..., timeout=T)`` where
  the proxy stalls (holds every byte until the run ended) or cuts (resets every open
  connection) at a random moment (seeded) of the op: seconds from the fault to the
  error, how many errors blame party 1, how many runs survived a cut, and how many next
  runs (the proxy forwarding again) succeeded.

    nice -n 10 .venv/bin/python benchmarks/bench_proxy_faults.py [--runs 20] [--timeout 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mplang as mp  # noqa: E402
from tests.worker import chaos, support, tcp_proxy  # noqa: E402

WORKLOADS = (chaos.spu_workload(rounds=20, size=100), chaos.psi_workload(rows=20_000),
             chaos.phe_workload(size=500))
SLOW_SPU = chaos.spu_workload(rounds=120, size=100)


def medians(driver: mp.Driver, repeat: int) -> dict[str, float]:
    out = {}
    for workload in WORKLOADS:
        chaos.timed(driver, workload, None)
        out[workload.device] = statistics.median(chaos.timed(driver, workload, 60.0)
                                                 for _ in range(repeat))
    return out


def faults(driver: mp.Driver, strike: Callable[[], None], heal: Callable[[], None],
           runs: int, timeout: float, rng: random.Random, span: float) -> str:
    times: list[float] = []
    named = survived = recovered = 0
    while len(times) + survived < runs:
        ended = chaos.struck(driver, SLOW_SPU, rng.uniform(0.0, span), timeout, strike, heal)
        if ended is None:
            continue
        error, to_error = ended
        if error is None:
            survived += 1
        else:
            times.append(to_error)
            named += chaos.names(error, 1)
            if not chaos.names(error, 1):
                print(f"  MISS {to_error:.2f} s {type(error).__name__}: {error}", flush=True)
        chaos.timed(driver, SLOW_SPU, None)
        recovered += 1
    within = sum(t <= timeout + chaos.GRACE_S for t in times)
    spread = (f"fault to error median {statistics.median(times):.2f} s, max "
              f"{max(times):.2f} s; " if times else "")
    return (f"{len(times)} failed ({within} within T+{chaos.GRACE_S:g} s, {named} naming "
            f"party 1), {survived} completed; {spread}next run succeeded: {recovered}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=26)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with support.running_cluster(support.make_spec(support.free_ports(3))) as cluster, \
            support.connected_driver(cluster) as driver:
        direct = medians(driver, args.repeat)
    with tcp_proxy.proxied_cluster(rank=1) as (cluster, proxy), \
            support.connected_driver(cluster) as driver:
        proxied = medians(driver, args.repeat)
        proxy.latency_s = 0.05
        delayed = medians(driver, args.repeat)
        proxy.latency_s = 0.0
        for device in direct:
            print(f"{device}: direct {direct[device]:.2f} s, through the proxy "
                  f"{proxied[device]:.2f} s, +50 ms each way {delayed[device]:.2f} s "
                  f"(median of {args.repeat})", flush=True)
        chaos.timed(driver, SLOW_SPU, None)
        span = statistics.median(chaos.timed(driver, SLOW_SPU, None) for _ in range(3))
        print(f"SPU op of {span:.2f} s, T = {args.timeout:g} s", flush=True)
        print("stall, then resume: " + faults(driver, proxy.stall, proxy.resume, args.runs,
                                              args.timeout, rng, span), flush=True)

        def reset() -> None:
            proxy.cut()
            proxy.resume()

        print("stall, then reset: " + faults(driver, proxy.stall, reset, args.runs,
                                             args.timeout, rng, span), flush=True)
        print("cut: " + faults(driver, proxy.cut, lambda: None, args.runs, args.timeout, rng,
                               span), flush=True)


if __name__ == "__main__":
    main()
