"""Chaos on 3 worker processes over mutual TLS (issue 26): in each of ``--runs`` SPU
(ABY3 over the three), PSI (P0 and P1) and PHE (P0 and P1) runs with
``mp.evaluate(..., timeout=T)``, one party of the run, drawn at random, is killed
(SIGKILL) or frozen (SIGSTOP), drawn at random, at a random moment within the run's
clean duration (seeded). Per device: how many runs ended within T + 2 s of the fault,
the median and largest time from fault to error, how many errors blamed the faulted
party, and how many recovery runs (after a restart, or SIGCONT) gave the right value.

    nice -n 10 .venv/bin/python benchmarks/bench_chaos.py [--runs 50] [--timeout 4] [--seed 26]
        [--log runs.txt] [--devices SPU,PSI,PHE,PSI-ecdh,PSI-ecdh_npc]

``PSI-ecdh`` is the two-party join on libpsi's ECDH protocol, ``PSI-ecdh_npc`` the
three-party ``psi.join_n`` on ECDH_NPC (not in the default set).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.worker import chaos, support  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=26)
    parser.add_argument("--devices", default="SPU,PSI,PHE")
    parser.add_argument("--log", help="a file for one line per faulted run")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workloads = {w.device: w for w in (
        chaos.spu_workload(), chaos.psi_workload(), chaos.phe_workload(),
        chaos.psi_workload(protocol="ecdh"), chaos.psi_workload(protocol="ecdh_npc", parties=3))}
    started = time.monotonic()
    with support.running_cluster(support.make_spec(support.free_ports(3))) as cluster, \
            support.connected_driver(cluster) as driver:
        for device in args.devices.split(","):
            workload = workloads[device]
            chaos.timed(driver, workload, None)  # the workers compile it once
            span = statistics.median(chaos.timed(driver, workload, args.timeout)
                                     for _ in range(3))
            draws = chaos.chaos(cluster, driver, workload, args.runs, args.timeout, rng, span)
            s = chaos.summary(draws.outcomes)
            print(f"{device}: clean run {span:.2f} s; {s['runs']} runs ({s['kills']} killed, "
                  f"{s['runs'] - s['kills']} frozen; drawn again: {draws.late} faults due "
                  f"after the run's end, {draws.finished} runs that ended well, the party's "
                  f"part done); ended within T+{chaos.GRACE_S:g} s: {s['in_time']}; fault to "
                  f"error median {s['median_s']:.2f} s, max {s['max_s']:.2f} s; named the "
                  f"party: {s['named']}; recovered: {s['recovered']}; errors by op: "
                  f"{s['ops']}", flush=True)
            for line in chaos.misses(draws.outcomes):
                print(f"  MISS {line}", flush=True)
            if args.log:
                with open(args.log, "a") as log:
                    log.writelines(chaos.describe(o) + "\n" for o in draws.outcomes)
    print(f"T = {args.timeout:g} s, seed {args.seed}, {time.monotonic() - started:.0f} s in all")


if __name__ == "__main__":
    main()
