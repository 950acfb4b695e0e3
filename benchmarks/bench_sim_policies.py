"""What judging by the init policies costs a small simulator job: the millionaire on a
3-party simulator whose nodes judge every program (the default) and on one that judges
nothing (``policies="open"``), run alternately in one process.

    .venv/bin/python benchmarks/bench_sim_policies.py [--runs 15]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import mplang as mp
from mplang import tensor


def millionaire() -> Any:
    x = mp.device("P0")(lambda: tensor.load("wealth.npy"))()
    y = mp.device("P1")(lambda: tensor.load("wealth.npy"))()
    return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(x, y))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as folder:
        roots = {}
        for i, wealth in enumerate((1_000_000, 2_000_000, 5)):
            roots[f"node_{i}"] = Path(folder, f"node_{i}")
            roots[f"node_{i}"].mkdir()
            np.save(roots[f"node_{i}"] / "wealth.npy", np.int32(wealth))
        with contextlib.redirect_stderr(io.StringIO()):  # the "open" note
            sims = {"init policies": mp.Simulator(3, data_roots=roots),
                    "open": mp.Simulator(3, data_roots=roots, policies="open")}
        times: dict[str, list[float]] = {name: [] for name in sims}
        for sim in sims.values():
            assert mp.fetch(sim, mp.evaluate(sim, millionaire))  # warm; P0 is poorer
        for _ in range(runs):
            for name, sim in sims.items():
                start = time.perf_counter()
                mp.fetch(sim, mp.evaluate(sim, millionaire))
                times[name].append(time.perf_counter() - start)
        for sim in sims.values():
            sim.close()
    for name, ts in times.items():
        print(f"{name}: median {statistics.median(ts) * 1e3:.1f} ms, min "
              f"{min(ts) * 1e3:.1f} ms over {runs} runs")


if __name__ == "__main__":
    main()
