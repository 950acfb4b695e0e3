"""Secure mean of three parties' values on SPU, PHE and TEE: time and bytes sent.

The programs of ``examples/secure_mean_devices.py`` (each party's vector enters
the device, the device computes the sum, P0 gets the mean), run on four worker
processes over mutual TLS (`LocalCluster`: node_0..2 hold the data, node_3 is
HE0's evaluator and hosts T0). Time is ``mp.evaluate`` plus ``mp.fetch`` at the
driver, first run included (PHE makes its key pair in every run: about 0.7 s
for 2048 bits). Bytes are what the workers' audit logs record as sent between
parties during the run (peer messages and secure-device link traffic), summed
over all workers.

    .venv/bin/python benchmarks/bench_secure_mean.py [--total 100000] [--runs 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from bench_http import free_ports

import mplang as mp
from mplang.cluster.local import LocalCluster
from mplang.records.audit import read_events

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import secure_mean_devices as example


def spec(ports: list[int]) -> mp.ClusterSpec:
    data = example.cluster().to_dict()
    for node, port in zip(data["nodes"], ports, strict=True):
        node["endpoint"] = f"127.0.0.1:{port}"
    return mp.ClusterSpec.from_dict(data)


def sent_bytes(audit: Path) -> int:
    return sum(int(e.get("bytes", 0)) for e in read_events(sorted(audit.glob("*.jsonl")))
               if e.get("event") == "send")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=100_000,
                        help="values in all (split evenly among the three parties)")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    rng = np.random.default_rng(11)
    per = args.total // 3
    sizes = [per, per, args.total - 2 * per]
    vectors = [rng.normal(loc=i, size=n).astype(np.float32) for i, n in enumerate(sizes)]
    want = float(np.concatenate(vectors).astype(np.float64).mean())
    warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit"
        example.save_values({f"node_{i}": Path(tmp) / "data" / f"node_{i}" for i in range(3)},
                            vectors)
        local = LocalCluster(spec(free_ports(4)), audit_dir=audit, data_root=Path(tmp) / "data")
        local.start()
        drv = local.driver()
        try:
            rows = []
            for name, program in example.programs().items():
                with drv:  # the workers report the types of the files the parties load
                    compiled = mp.compile(program, cluster=drv.cluster)
                times, sent, means = [], [], []
                for _ in range(args.runs):
                    before = sent_bytes(audit)
                    start = time.perf_counter()
                    means.append(float(mp.fetch(drv, mp.evaluate(drv, compiled))))
                    times.append(time.perf_counter() - start)
                    time.sleep(0.5)  # the audit lines of the run's end reach the files
                    sent.append(sent_bytes(audit) - before)
                rows.append((name, statistics.median(times), statistics.median(sent),
                             means[-1]))
        finally:
            drv.close()
            local.close()
    print(f"secure mean of {args.total} float32 values on 3 parties ({sizes}), 4 worker "
          f"processes over mutual TLS; medians of {args.runs} runs; plaintext mean {want:.6f}")
    print(f"{'device':<8} {'seconds':>9} {'MB sent':>9} {'mean':>12} {'abs error':>10}")
    for name, seconds, nbytes, mean in rows:
        print(f"{name:<8} {seconds:9.2f} {nbytes / 1e6:9.2f} {mean:12.6f} "
              f"{abs(mean - want):10.2e}")


if __name__ == "__main__":
    main()
