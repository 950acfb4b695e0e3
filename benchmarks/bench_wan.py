"""MPLang across a WAN, against raw libspu across the same WAN, in one run.

Every party sits behind its own delaying TCP proxy (`tests.worker.tcp_proxy.TcpProxy`):
``--rtt-ms`` of round trip (half each way) and ``--mbps`` each way, shared by all the
connections into and out of that party, as one access link. Everything that reaches a
worker (the driver's requests, its peers' messages) crosses its proxy; so do raw
libspu's brpc links (each party reaches the others at their proxies' ports).

Figures, 2 parties on CHEETAH and 3 on ABY3:

- ``millionaire``: the whole program (load both wealths, compare on the SPU, reveal to
  P0, fetch), median after warm-up; raw libspu: the compare's executable alone, on
  inputs already shared (it has no driver, no loading, no reveal);
- ``lr step``: ``train_vertical_lr`` for one full-batch epoch on ``--rows`` rows (4
  features on P0, 4 on P1, labels on P0), the whole evaluation with the weights
  revealed and fetched; raw libspu: the training executable alone, on inputs already
  shared.

    .venv/bin/python benchmarks/bench_wan.py [--parties 2 3] [--rtt-ms 20] [--mbps 100]
                                             [--runs 5] [--rows 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spu_raw_brpc import raw_brpc_seconds  # noqa: E402
from timing import median_ms  # noqa: E402

import mplang as mp  # noqa: E402
from mplang import tensor  # noqa: E402
from mplang.cluster.local import LocalCluster  # noqa: E402
from mplang.dialects.spu import SpuConfig  # noqa: E402
from mplang.libs.linear import train_vertical_lr  # noqa: E402
from tests.worker import support  # noqa: E402
from tests.worker.tcp_proxy import TcpProxy  # noqa: E402

PROTOCOL = {2: "CHEETAH", 3: "ABY3"}


class Wan:
    """Proxies with the same latency and bandwidth, one per party (closed on exit)."""

    def __init__(self, rtt_ms: float, mbps: float):
        self.latency_s, self.bps = rtt_ms / 2e3, mbps * 1e6
        self.proxies: list[TcpProxy] = []

    def route(self, port: int) -> int:
        proxy = TcpProxy(port, latency_s=self.latency_s, bandwidth_bps=self.bps)
        self.proxies.append(proxy)
        return proxy.port

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()


@contextlib.contextmanager
def wan_cluster(parties: int, wan: Wan, data: Path) -> Iterator[LocalCluster]:
    """Worker processes listening on their own ports, each reached at its proxy's."""
    ports = support.free_ports(parties)
    spec = support.spec_dict(ports)
    spec["devices"]["SP0"]["config"]["protocol"] = PROTOCOL[parties]
    listen = {}
    for rank, port in enumerate(ports):
        spec["nodes"][rank]["endpoint"] = f"127.0.0.1:{wan.route(port)}"
        listen[f"node_{rank}"] = f"127.0.0.1:{port}"
    with support.running_cluster(mp.ClusterSpec.from_dict(spec), listen=listen,
                                 data_root=data) as cluster:
        yield cluster


def _data(folder: Path, parties: int, rows: int) -> None:
    rng = np.random.default_rng(7)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) > 0).astype(np.float32)
    for rank in range(parties):
        node = folder / f"node_{rank}"
        node.mkdir()
        np.save(node / "wealth.npy", np.int32((rank + 1) * 10**6))
        np.save(node / "x.npy", x[:, 4 * rank:4 * rank + 4] if rank < 2 else x[:, :0])
        np.save(node / "y.npy", y)


def _millionaire() -> Any:
    alice = mp.device("P0")(lambda: tensor.load("wealth.npy"))()
    bob = mp.device("P1")(lambda: tensor.load("wealth.npy"))()
    return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(alice, bob))


def _lr_step() -> Any:
    x0 = mp.device("P0")(lambda: tensor.load("x.npy"))()
    x1 = mp.device("P1")(lambda: tensor.load("x.npy"))()
    y = mp.device("P0")(lambda: tensor.load("y.npy"))()
    return train_vertical_lr([x0, x1], y, epochs=1, batch_size=None)


def mplang_ms(parties: int, wan: Wan, runs: int, rows: int) -> tuple[dict[str, float], Any]:
    """MPLang's figures and the compiled programs (their executables are raw's)."""
    with tempfile.TemporaryDirectory(prefix="bench-wan-") as tmp:
        _data(Path(tmp), parties, rows)
        with wan_cluster(parties, wan, Path(tmp)) as cluster:
            driver = cluster.driver(timeout=120.0, run_timeout=600.0)
            try:
                with driver:
                    programs = {name: mp.compile(fn, cluster=cluster.cluster)
                                for name, fn in (("millionaire", _millionaire),
                                                 ("lr step", _lr_step))}
                out = {name: median_ms(lambda p=p: mp.fetch(driver, mp.evaluate(driver, p)),
                                       runs, 2)
                       for name, p in programs.items()}
            finally:
                driver.close()
    return out, programs


def raw_ms(programs: dict[str, Any], parties: int, wan: Wan, runs: int,
           rows: int) -> dict[str, float]:
    """Raw libspu through the same proxies on each program's largest SPU executable."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    y = (x @ rng.normal(size=8) > 0).astype(np.float32)
    inputs = {"millionaire": [np.int32(10**6), np.int32(2 * 10**6)],
              "lr step": [y, x[:, :4], x[:, 4:]]}
    out = {}
    for name, program in programs.items():
        run = max((op for op in program.graph.walk() if op.opcode == "spu.run"),
                  key=lambda op: len(op.attrs["executable"]))
        seconds = raw_brpc_seconds(bytes(run.attrs["executable"]),
                                   SpuConfig.from_attrs(run.attrs), inputs[name], runs=runs,
                                   warmup=2, route=wan.route)
        out[name] = statistics.median(seconds) * 1e3
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, nargs="+", default=[2, 3], choices=[2, 3])
    parser.add_argument("--rtt-ms", type=float, default=20.0)
    parser.add_argument("--mbps", type=float, default=100.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    print(f"WAN: {args.rtt_ms:g} ms round trip, {args.mbps:g} Mbit/s each way per party\n")
    print("| parties | figure | MPLang (ms) | raw libspu (ms) | ratio | target |")
    print("|---|---|---:|---:|---:|---:|")
    for parties in args.parties:
        wan = Wan(args.rtt_ms, args.mbps)
        try:
            mine, programs = mplang_ms(parties, wan, args.runs, args.rows)
            raw = raw_ms(programs, parties, wan, args.runs, args.rows)
        finally:
            wan.close()
        for name in mine:
            print(f"| {parties} ({PROTOCOL[parties]}) | {name} | {mine[name]:.0f} | "
                  f"{raw[name]:.0f} | {mine[name] / raw[name]:.2f}x | 1.2x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
