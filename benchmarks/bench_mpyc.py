"""MPyC against MPLang (3-party ABY3 SPU) on the same secret elementwise work, in one run.

For each size and op, party 0 inputs a float32 vector x, party 1 inputs a float32 vector y
(the same data as ``bench_spu.data(size)``), and the parties compute ``x * y`` or ``x < y``
elementwise and reveal the result to party 0.

MPyC side: 3 parties on localhost, launched the way MPyC itself does it: this script re-runs
itself as ``python bench_mpyc.py --mpyc-party OP SIZE DIR -M3 -B PORT ...``, and MPyC's runtime
(``-M3`` without ``-I``) starts parties 1 and 2 as extra local processes (``-I 1``, ``-I 2``)
while the process we started is party 0; they talk over TCP on 127.0.0.1, ports PORT..PORT+2.
Secure type: ``mpc.SecFxp(32, 16)`` (MPyC's default fixed point, Shamir shares over a prime
field, threshold 1) with secure numpy arrays (``secfxp.array``), using gmpy2 when installed
(the ``bench`` extra pins it; MPyC is about 5x slower without it, see ``--mpyc-no-gmpy2``).
Timed inside party 0 with ``time.perf_counter``, after the parties have connected and
synchronised and after a 100-element warm-up of the same op: encode + secret-share both
inputs, compute, reveal to party 0. Process start-up and connection set-up are excluded.
Each (size, op) runs in its own process group with a timeout; the sweep stops at the first
size where MPyC goes over the budget (120 s for one op by default).

MPLang side: ``bench_spu.MPLangCase("ABY3", op, x, y)`` (secret-share both inputs, run the
compiled SPU executable, reconstruct for the caller; compilation excluded), best of
``--repeats`` after a warm-up, run in this process after the MPyC processes have exited.

Both results are checked against numpy with ``bench_spu.check`` (atol 1e-3 for ``mul``; for
``less``, the elements where ``|x - y| > 1e-3``).

    .venv/bin/pip install -e '.[bench]'                             # mpyc, gmpy2
    .venv/bin/python benchmarks/bench_mpyc.py                       # 10^3 .. 10^6, 120 s budget
    .venv/bin/python benchmarks/bench_mpyc.py --sizes 1000 10000    # quick check
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from timing import best_of

HERE = Path(__file__).resolve().parent
OPS = ("mul", "less")
WARMUP_SIZE = 100
STARTUP_SLACK_S = 60.0  # process start-up, connecting, loading inputs, warm-up


# --------------------------------------------------------------------------- MPyC party


def mpyc_party(op: str, size: int, data_dir: Path, repeats: int, bits: int, frac: int) -> None:
    """Body of one MPyC party (all three run this; MPyC has already parsed its own flags)."""
    from mpyc.runtime import mpc  # importing sets up the runtime from sys.argv

    async def run() -> None:
        await mpc.start()
        secfxp = mpc.SecFxp(bits, frac)
        inputs = {0: data_dir / "x.npy", 1: data_dir / "y.npy"}
        # Each input party reads only its own vector; the others pass a shape-only placeholder.
        own = (np.load(inputs[mpc.pid]).astype(np.float64)
               if mpc.pid in inputs else None)
        warm = None if own is None else own[:WARMUP_SIZE]

        async def once(value: np.ndarray | None, n: int) -> np.ndarray | None:
            def share(sender: int) -> Any:
                # integral=False on every party: MPyC otherwise infers it from the local value
                # (placeholders look integral), and parties disagreeing on it breaks truncation.
                local = (secfxp.array(value, integral=False) if mpc.pid == sender
                         else secfxp.array(shape=(n,), integral=False))
                return mpc.input(local, senders=sender)

            a, b = share(0), share(1)
            c = a * b if op == "mul" else a < b
            return await mpc.output(c, receivers=0)

        await once(warm, min(size, WARMUP_SIZE))
        times = []
        out = None
        for _ in range(repeats):
            await mpc.transfer(mpc.pid)  # all parties start the clock together
            start = time.perf_counter()
            out = await once(own, size)
            times.append(time.perf_counter() - start)
            if mpc.pid == 0:
                print(json.dumps({"partial_seconds": times[-1]}), flush=True)
        if mpc.pid == 0:
            np.save(data_dir / f"out_{op}.npy", np.asarray(out))
            print(json.dumps({
                "op": op, "size": size, "seconds": times, "parties": len(mpc.parties),
                "threshold": mpc.threshold, "secfxp": [bits, frac],
                "field": secfxp.field.__name__, "mpyc": mpc.version,
                "gmpy2": importlib.util.find_spec("gmpy2") is not None,
                "uvloop": importlib.util.find_spec("uvloop") is not None,
            }), flush=True)
        await mpc.shutdown()

    mpc.run(run())


# --------------------------------------------------------------------------- driver


@dataclass
class MPyCResult:
    seconds: float | None  # best timed run; None if it went over the budget
    info: dict[str, Any]


def run_mpyc(op: str, size: int, data_dir: Path, args: argparse.Namespace,
             port: int) -> MPyCResult:
    """Run the 3 MPyC parties for one (op, size) in a fresh process group with a timeout."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--mpyc-party", op, str(size),
           str(data_dir), str(args.mpyc_repeats), str(args.fxp[0]), str(args.fxp[1]),
           "-M3", "-B", str(port), "--no-log", "--output-file"]
    if args.mpyc_no_gmpy2:
        cmd.append("--no-gmpy2")
    timeout = args.budget * args.mpyc_repeats + STARTUP_SLACK_S
    proc = subprocess.Popen(cmd, cwd=data_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return MPyCResult(None, {"timeout_s": timeout, "stdout": stdout})
    finally:
        # Parties 1 and 2 are in the same process group: make sure none is left behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines or "seconds" not in lines[-1]:
        logs = "".join(p.read_text() for p in sorted(data_dir.glob("party3_*.log")))
        raise RuntimeError(f"MPyC run failed ({proc.returncode}):\n{stdout}\n{stderr}\n{logs}")
    info = lines[-1]
    best_s = min(info["seconds"])
    return MPyCResult(None if best_s > args.budget else best_s, info)


def load_bench_spu() -> ModuleType:
    sys.path.insert(0, str(HERE))
    return importlib.import_module("bench_spu")


def fmt(seconds: float | None, budget: float) -> str:
    return f"> {budget:.0f}" if seconds is None else f"{seconds:.4f}"


def bench(args: argparse.Namespace) -> None:
    import jax

    jax.config.update("jax_platforms", "cpu")
    spu_bench = load_bench_spu()
    rows: list[str] = []
    finished: int | None = None
    info: dict[str, Any] = {}
    print("| size | op | MPyC s | MPLang s | MPyC / MPLang |")
    print("|---:|---|---:|---:|---:|", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_mpyc_") as tmp:
        data_dir = Path(tmp)
        port = args.base_port
        over = False
        for size in args.sizes:
            x, y = spu_bench.data(size)
            np.save(data_dir / "x.npy", x)
            np.save(data_dir / "y.npy", y)
            over = False
            for op in args.ops:
                res = run_mpyc(op, size, data_dir, args, port)
                port += 10  # fresh ports per run: no clash with sockets still closing
                if res.info.get("seconds"):
                    info = res.info
                    spu_bench.check(op, np.load(data_dir / f"out_{op}.npy"), x, y)
                case = spu_bench.MPLangCase("ABY3", op, x, y)
                spu_bench.check(op, case(), x, y)
                t_mplang = best_of(args.repeats, case)  # after the warm-up call above
                case.sim.close()
                if res.seconds is None:
                    over = True
                    ratio = f"> {args.budget / t_mplang:.0f}"
                else:
                    ratio = f"{res.seconds / t_mplang:.1f}"
                row = (f"| {size:,} | {op} | {fmt(res.seconds, args.budget)} | "
                       f"{t_mplang:.4f} | {ratio} |")
                rows.append(row)
                print(row, flush=True)
                if over:
                    break
            if over:
                break
            finished = size
    print()
    if finished is None:
        print(f"MPyC finished no size within {args.budget:.0f} s per op.")
    else:
        print(f"Largest size MPyC finished (every op) within {args.budget:.0f} s per op: "
              f"{finished:,}" + ("" if over else " (largest size tried)"))
    if info:
        print(f"MPyC {info['mpyc']}: {info['parties']} local processes, Shamir threshold "
              f"{info['threshold']}, SecFxp{tuple(info['secfxp'])} over {info['field']}, "
              f"gmpy2={'yes' if info['gmpy2'] else 'no'}, "
              f"uvloop={'yes' if info['uvloop'] else 'no'}; best of {args.mpyc_repeats} "
              f"timed run(s). MPLang: ABY3 FM64 (3 parties, no Beaver source) via "
              f"bench_spu.MPLangCase, best of "
              f"{args.repeats} after warm-up.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS))
    parser.add_argument("--budget", type=float, default=120.0,
                        help="seconds one MPyC op may take before the sweep stops")
    parser.add_argument("--repeats", type=int, default=3, help="MPLang timed runs (best of)")
    parser.add_argument("--mpyc-repeats", type=int, default=1, help="MPyC timed runs (best of)")
    parser.add_argument("--fxp", type=int, nargs=2, default=[32, 16], metavar=("L", "F"),
                        help="MPyC SecFxp bit length and fractional bits")
    parser.add_argument("--mpyc-no-gmpy2", action="store_true",
                        help="run MPyC without gmpy2 (pure-Python big-integer stubs)")
    parser.add_argument("--base-port", type=int, default=23000,
                        help="first TCP port for the MPyC parties (10 used per run)")
    parser.add_argument("--mpyc-party", nargs=6,
                        metavar=("OP", "SIZE", "DIR", "REPEATS", "L", "F"),
                        help=argparse.SUPPRESS)
    # MPyC's own flags (-M3, -I1, -B, --no-log, ...) are left to MPyC's parser.
    args, _ = parser.parse_known_args()
    if args.mpyc_party:
        op, size, data_dir, repeats, bits, frac = args.mpyc_party
        mpyc_party(op, int(size), Path(data_dir), int(repeats), int(bits), int(frac))
    else:
        bench(args)


if __name__ == "__main__":
    main()
