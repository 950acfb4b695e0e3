"""The HTTP runtime on 3 local worker processes, against a plain TCP copy, in one run.

- latency: a trivial compiled ``pcall`` on party 0 (median and p99 of many runs);
- throughput: a 64 MiB float32 tensor moved from worker 0 to worker 1 with
  ``shuffle_static``, and fetched to the driver, each as a ratio to a plain TCP
  socket copy of the same bytes between two local processes;
- concurrency: 20 evaluations from 4 driver threads, all checked.

    .venv/bin/python benchmarks/bench_http.py
"""

from __future__ import annotations

import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax.numpy as jnp
import numpy as np
from timing import best_of

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster

NBYTES = 64 << 20

_TCP_RECEIVER = r"""
import socket, sys, time
n = int(sys.argv[1])
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
buf = bytearray(n); view = memoryview(buf); got = 0
start = None
while got < n:
    k = conn.recv_into(view[got:], n - got)
    if start is None: start = time.perf_counter()
    got += k
conn.sendall(b"k")
"""

_TCP_SENDER = r"""
import socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
data = bytes(n)
sock = socket.create_connection(("127.0.0.1", port))
start = time.perf_counter()
sock.sendall(data)
assert sock.recv(1) == b"k"
print(time.perf_counter() - start, flush=True)
"""


def tcp_copy_seconds(nbytes: int) -> float:
    """Seconds to copy ``nbytes`` between two fresh local processes over one TCP socket."""
    receiver = subprocess.Popen([sys.executable, "-c", _TCP_RECEIVER, str(nbytes)],
                                stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    port = receiver.stdout.readline().strip()
    sender = subprocess.run([sys.executable, "-c", _TCP_SENDER, port, str(nbytes)],
                            capture_output=True, text=True, check=True)
    receiver.wait(timeout=60)
    return float(sender.stdout.strip())


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def cluster_spec() -> mp.ClusterSpec:
    ports = free_ports(3)
    names = [f"node_{i}" for i in range(3)]
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": n, "endpoint": f"127.0.0.1:{p}"} for n, p in zip(names, ports,
                                                                           strict=True)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [n]} for i, n in enumerate(names)},
                    "SP0": {"kind": "SPU", "members": names,
                            "config": {"protocol": "ABY3", "field": "FM64"}}},
    })


def latency(drv: mp.Driver, runs: int = 300) -> tuple[float, float]:
    with drv:
        x = simp.constant((0,), np.float32(1))
    program = mp.compile(lambda v: simp.pcall((0,), lambda a: a + 1, v), x, world_size=3)
    for _ in range(20):
        mp.evaluate(drv, program, x)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        mp.evaluate(drv, program, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times), float(np.percentile(times, 99))


def throughput(drv: mp.Driver, repeats: int = 3) -> tuple[float, float]:
    n = NBYTES // 4
    with drv:
        big = simp.pcall((0,), lambda: jnp.arange(n, dtype=jnp.float32))
    move = mp.compile(lambda v: simp.shuffle_static(v, {1: 0}), big, world_size=3)
    moved = mp.evaluate(drv, move, big)
    got = mp.fetch(drv, moved)[1]
    assert got.shape == (n,) and got[-1] == n - 1
    shuffle_s = best_of(repeats, lambda: mp.evaluate(drv, move, big))
    fetch_s = best_of(repeats, lambda: drv.fetch_object(moved))
    return shuffle_s, fetch_s


def concurrency(drv: mp.Driver, evaluations: int = 20, threads: int = 4) -> float:
    def one(i: int) -> bool:
        def prog() -> Any:
            x = simp.constant((i % 3,), np.full(1000, i, np.float32))
            y = simp.shuffle_static(x, {(i + 1) % 3: i % 3})
            return simp.pcall(None, lambda v: v * 2, y)

        out = mp.fetch(drv, mp.evaluate(drv, prog))[(i + 1) % 3]
        return bool(np.all(out == 2 * i))

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(one, range(evaluations)))
    elapsed = time.perf_counter() - start
    assert all(results), results
    return elapsed


def main() -> None:
    spec = cluster_spec()
    with LocalCluster(spec) as cluster:  # development keys, mutual TLS
        drv = cluster.driver()
        median, p99 = latency(drv)
        print(f"trivial pcall round trip on 3 workers: median {median * 1e3:.2f} ms, "
              f"p99 {p99 * 1e3:.2f} ms")
        tcp = min(tcp_copy_seconds(NBYTES) for _ in range(3))
        shuffle_s, fetch_s = throughput(drv)
        mib = NBYTES / (1 << 20)
        print(f"64 MiB: raw TCP copy {tcp * 1e3:.1f} ms ({mib / tcp:.0f} MiB/s); "
              f"worker-to-worker shuffle_static {shuffle_s * 1e3:.1f} ms "
              f"({mib / shuffle_s:.0f} MiB/s, {tcp / shuffle_s:.2f} of raw TCP); "
              f"fetch to driver {fetch_s * 1e3:.1f} ms ({mib / fetch_s:.0f} MiB/s, "
              f"{tcp / fetch_s:.2f} of raw TCP)")
        print(f"20 concurrent evaluations from 4 threads: all correct in "
              f"{concurrency(drv):.2f} s")
        drv.close()


if __name__ == "__main__":
    main()
