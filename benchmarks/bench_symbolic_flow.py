"""The users' flow as one program (sizes known at run time) against the two-program
flow it replaces, on the same data, in one run.

Data: the bank's and the retailer's customer tables of ``examples/joint_customers.py``
(``--customers`` rows each, ``--shared`` of them in both), each read by its own party
from its own data root. Both flows join the tables with PSI (RR22), turn the joined
columns into tensors and compute the retailer's average spend of the bank's defaulters
and non-defaulters with a group-by on the SPU (ABY3), revealed to the bank:

* two programs: the intersection size first (fetched by the driver), then the
  join and the group-by with ``rows=`` that count (static shapes);
* one program: the join and the group-by, the row count a symbol; each SPU member
  compiles the group-by for the count of the run (cached: later runs of the same
  count reuse the executable).

Runs alternate (two, one, two, one, ...) on the simulator, or on worker processes over
mutual TLS with ``--http``; each flow's first run is reported apart (it compiles)::

    .venv/bin/python benchmarks/bench_symbolic_flow.py [--customers 10000] [--shared 6000]
                                                       [--runs 3] [--http]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mplang as mp  # noqa: E402
from mplang import table  # noqa: E402
from mplang.libs import groupby, psi  # noqa: E402


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("joint_customers",
                                                  ROOT / "examples" / "joint_customers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()


def two_programs(ctx: Any) -> Any:
    """The count, fetched by the driver, then the join and group-by of that many rows."""
    rows = int(mp.fetch(ctx, mp.evaluate(ctx, EXAMPLE.count_shared))[0])

    @mp.function
    def sized() -> Any:
        jbank, jshop = psi.join(*EXAMPLE.customers(), "id")
        y = mp.device("P0")(lambda t: table.to_tensor(t, ["defaulted"], rows=rows)[:, 0])(jbank)
        spend = mp.device("P1")(lambda t: table.to_tensor(t, ["spend"], rows=rows)[:, 0])(jshop)
        return groupby.groupby_mean(y, spend, 2, device="SP0", to="P0")

    return mp.fetch(ctx, mp.evaluate(ctx, sized))


def one_program(ctx: Any) -> Any:
    """The join and the group-by, the row count a symbol."""
    return mp.fetch(ctx, mp.evaluate(ctx, EXAMPLE.spend_by_default))


@contextlib.contextmanager
def context(http: bool, save: Callable[[dict[str, Path]], None]) -> Iterator[Any]:
    if not http:
        from mplang.libs.demo import simulated

        with simulated(mp.ClusterSpec.simple(3), save) as sim:
            yield sim
        return
    from tests.worker import support

    with tempfile.TemporaryDirectory() as tmp:
        save({f"node_{i}": Path(tmp) / f"node_{i}" for i in range(3)})
        spec = support.make_spec(support.free_ports(3))
        with support.running_cluster(spec, data_root=tmp) as cluster, \
                support.connected_driver(cluster) as driver:
            yield driver


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--customers", type=int, default=10_000)
    parser.add_argument("--shared", type=int, default=6_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--http", action="store_true")
    args = parser.parse_args()
    bank, shop = EXAMPLE.make_data(args.customers, args.shared)
    flows = {"two programs": two_programs, "one program": one_program}
    times: dict[str, list[float]] = {name: [] for name in flows}
    results: dict[str, Any] = {}
    with context(args.http, lambda roots: EXAMPLE.save_tables(roots, bank, shop)) as ctx:
        for _ in range(args.runs + 1):  # the first run of each compiles
            for name, flow in flows.items():
                start = time.perf_counter()
                results[name] = flow(ctx)
                times[name].append(time.perf_counter() - start)
    merged = bank.merge(shop, on="id").groupby("defaulted")["spend"].mean()
    summary = {"customers": args.customers, "shared": args.shared,
               "runtime": "workers (mTLS)" if args.http else "simulator",
               "reference": [round(float(merged[0]), 4), round(float(merged[1]), 4)]}
    for name, runs in times.items():
        summary[name] = {"first_s": round(runs[0], 2),
                         "median_s": round(statistics.median(runs[1:]), 2),
                         "means": [round(float(m), 4) for m in results[name]]}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
