"""MPLang on SPU against raw libspu (``spu.utils.simulation``), in one run.

For each protocol and size, two secret float32 vectors (one from party 0, one
from party 1) are multiplied and compared. Both sides do the same work per
run: secret-share both inputs, run the compiled executable, reconstruct the
result for the caller. Compilation is excluded from both (MPLang: a compiled
program whose SPU executable is cached; raw: ``spu_frontend.compile`` once).
Every figure names its protocol and, for SEMI2K, its Beaver source
(TrustedFirstParty: party 0 makes the triples and must be trusted; see
``docs/security.md``). CHEETAH is the 2-party default of ``ClusterSpec.simple``.

    .venv/bin/python benchmarks/bench_spu.py [--sizes 10000 100000 1000000] [--repeats 3]
                                             [--protocols ABY3 SEMI2K CHEETAH]
    .venv/bin/python benchmarks/bench_spu.py --memory      # peak RSS of the 10^6 multiply
    .venv/bin/python benchmarks/bench_spu.py --millionaire  # end-to-end latency
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import spu
import spu.libspu as libspu
import spu.utils.frontend as spu_frontend
import spu.utils.simulation as spu_sim

import mplang as mp

PROTOCOLS = {"ABY3": 3, "SEMI2K": 2, "CHEETAH": 2}
BEAVER = {"SEMI2K": "TrustedFirstParty"}
"""The Beaver source of each protocol that has one (libspu's default for SEMI2K)."""
OPS: dict[str, Callable[[Any, Any], Any]] = {"mul": jnp.multiply, "less": jnp.less}


def label(protocol: str) -> str:
    """The protocol as the figures name it: with its Beaver source where it has one."""
    return f"{protocol} (beaver {BEAVER[protocol]})" if protocol in BEAVER else protocol


def spec(protocol: str) -> mp.ClusterSpec:
    n = PROTOCOLS[protocol]
    config = {"protocol": protocol, "field": "FM64"}
    if protocol in BEAVER:
        config["beaver"] = BEAVER[protocol]
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{62000 + i}"} for i in range(n)],
        "devices": {
            "P0": {"kind": "PPU", "members": ["node_0"]},
            "P1": {"kind": "PPU", "members": ["node_1"]},
            "SP0": {"kind": "SPU", "members": [f"node_{i}" for i in range(n)],
                    "config": config},
        },
    })


def data(size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(size)
    return (rng.standard_normal(size).astype(np.float32),
            rng.standard_normal(size).astype(np.float32))


def alternating_best(repeats: int, a: Callable[[], Any], b: Callable[[], Any]
                     ) -> tuple[float, float]:
    """Best time of each, measured alternately so both see the same machine load."""
    times_a, times_b = [], []
    for _ in range(repeats):
        for fn, times in ((a, times_a), (b, times_b)):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return min(times_a), min(times_b)


class MPLangCase:
    def __init__(self, protocol: str, op: str, x: np.ndarray, y: np.ndarray):
        self.sim = mp.Simulator(spec(protocol))
        with self.sim:
            self.x = mp.put("P0", x)
            self.y = mp.put("P1", y)
        fn = OPS[op]
        # revealed to P0 and fetched: the raw side reconstructs for its caller too
        self.program = mp.compile(lambda a, b: mp.put("P0", mp.device("SP0")(fn)(a, b)),
                                  self.x, self.y, cluster=self.sim.cluster)

    def __call__(self) -> np.ndarray:
        return mp.fetch(self.sim, mp.evaluate(self.sim, self.program, self.x, self.y))


class RawCase:
    def __init__(self, protocol: str, op: str, x: np.ndarray, y: np.ndarray):
        config = libspu.RuntimeConfig(protocol=spu.parse_protocol_kind(protocol),
                                      field=spu.parse_field_type("FM64"))
        if protocol in BEAVER:
            config.beaver_type = spu.parse_beaver_type(BEAVER[protocol])
        self.sim = spu_sim.Simulator(PROTOCOLS[protocol], config)
        secret = libspu.Visibility.VIS_SECRET
        self.exe, _ = spu_frontend.compile(spu_frontend.Kind.JAX, OPS[op], [x, y], {},
                                           ["x", "y"], [secret, secret],
                                           lambda outs: ["out"])
        self.x, self.y = x, y

    def __call__(self) -> np.ndarray:
        (out,) = self.sim(self.exe, self.x, self.y)
        return out


def check(op: str, got: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    if op == "mul":
        np.testing.assert_allclose(got, x * y, atol=1e-3)
    else:
        clear = np.abs(x - y) > 1e-3
        assert np.array_equal(np.asarray(got)[clear], (x < y)[clear])


def bench(sizes: list[int], repeats: int, protocols: list[str]) -> None:
    print("| protocol | op | size | MPLang s | raw libspu s | MPLang / raw |")
    print("|---|---|---:|---:|---:|---:|")
    for protocol in protocols:
        for op in OPS:
            for size in sizes:
                x, y = data(size)
                ours, raw = MPLangCase(protocol, op, x, y), RawCase(protocol, op, x, y)
                check(op, ours(), x, y)
                check(op, raw(), x, y)
                t_ours, t_raw = alternating_best(repeats, ours, raw)
                print(f"| {label(protocol)} | {op} | {size:,} | {t_ours:.4f} | {t_raw:.4f} "
                      f"| {t_ours / t_raw:.2f} |", flush=True)
                ours.sim.close()


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def memory_child(kind: str, size: int) -> None:
    """Run in a subprocess: peak RSS growth of one multiply after warm-up."""
    x, y = data(size)
    case = MPLangCase("ABY3", "mul", x, y) if kind == "mplang" else RawCase("ABY3", "mul", x, y)
    case()
    base = _rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS watermark to the current RSS
    case()
    print(json.dumps({"peak_growth_mib": (_rss_kib("VmHWM") - base) / 1024,
                      "peak_mib": _rss_kib("VmHWM") / 1024}))


def memory(size: int) -> None:
    results = {}
    for kind in ("mplang", "raw"):
        out = subprocess.run([sys.executable, __file__, "--memory-child", kind, str(size)],
                             capture_output=True, text=True, check=True)
        results[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    ours, raw = results["mplang"], results["raw"]
    print(f"peak RSS growth of one ABY3 multiply of {size:,} float32 (after warm-up): "
          f"MPLang {ours['peak_growth_mib']:.1f} MiB, raw libspu {raw['peak_growth_mib']:.1f} MiB, "
          f"ratio {ours['peak_growth_mib'] / raw['peak_growth_mib']:.2f}; process peak "
          f"{ours['peak_mib']:.0f} MiB vs {raw['peak_mib']:.0f} MiB "
          f"(ratio {ours['peak_mib'] / raw['peak_mib']:.2f})")


def millionaire(runs: int, protocol: str) -> None:
    sim = mp.Simulator(spec(protocol))

    def program() -> Any:
        x = mp.device("P0")(lambda: jnp.int32(1_000_000))()
        y = mp.device("P1")(lambda: jnp.int32(2_000_000))()
        return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(x, y))

    compiled = mp.compile(program, cluster=sim.cluster)
    assert mp.fetch(sim, mp.evaluate(sim, compiled))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        assert mp.fetch(sim, mp.evaluate(sim, compiled))
        times.append(time.perf_counter() - start)
    print(f"millionaire (2 parties, {label(protocol)}, FM64, compiled, after warm-up): "
          f"median of {runs} = "
          f"{statistics.median(times) * 1e3:.2f} ms (min {min(times) * 1e3:.2f} ms)")
    sim.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--millionaire", action="store_true")
    parser.add_argument("--memory-child", nargs=2, metavar=("KIND", "SIZE"))
    parser.add_argument("--protocols", nargs="+", choices=list(PROTOCOLS),
                        default=list(PROTOCOLS))
    args = parser.parse_args()
    jax.config.update("jax_platforms", "cpu")
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]))
    elif args.memory:
        memory(1_000_000)
    elif args.millionaire:
        for protocol in args.protocols:
            if PROTOCOLS[protocol] == 2:
                millionaire(10, protocol)
    else:
        bench(args.sizes, args.repeats, args.protocols)


if __name__ == "__main__":
    main()
