"""PSI joins through MPLang against raw libpsi, in one run; and the all-pairs SPU program.

Both sides join the same two CSV files (``id`` int64 and one float64 column;
``--rows`` rows per side, half of them shared) with the same libpsi settings
(inner join, duplicate keys allowed, results for both parties, Curve25519 for ECDH)
over the same kind of link (libspu's in-memory links, one thread per party):

* MPLang: a compiled program on the simulator, ``table.read_csv`` on each party then
  ``mplang.libs.psi.join``; the joined tables stay on the parties (Arrow tables).
* raw: ``spu.psi.psi_execute`` on the two files in two threads, writing the joined
  rows as CSV files.
* raw, keys only: what MPLang hands libpsi, files of just the distinct keys and their
  numbers, intersected with ``keys_unique=True`` and no alignment of the outputs (MPLang
  builds the join, duplicates and all, from the shared keys and the per-key counts the
  parties exchange): libpsi's own cost of what MPLang asks for, so ``MPLang - this`` is
  MPLang's overhead.

Runs alternate (MPLang, raw, MPLang, ...) so both see the same machine load; the
figure is the best of ``--repeats`` each. The all-pairs program
(``benchmarks/psi_all_pairs.py``: every pair compared on the SPU, CHEETAH) runs in a
child process so its peak RSS is its own::

    .venv/bin/python benchmarks/bench_psi.py [--rows 1000000] [--repeats 3]
                                             [--protocols rr22 ecdh] [--all-pairs 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import spu.libspu as libspu
import spu.psi as libpsi

import mplang as mp
from mplang.dialects import table
from mplang.libs import psi

HERE = Path(__file__).resolve().parent
SCHEMAS = {"node_0": {"id": "int64", "x": "float64"}, "node_1": {"id": "int64", "y": "float64"}}
_PROTOCOLS = {"rr22": libpsi.PsiProtocol.PROTOCOL_RR22, "kkrt": libpsi.PsiProtocol.PROTOCOL_KKRT,
              "ecdh": libpsi.PsiProtocol.PROTOCOL_ECDH}


def write_tables(folder: Path, rows: int) -> dict[str, Path]:
    """Each party's CSV in its own data root: ``rows`` distinct ids, half shared; and
    beside it ``keys.csv``, its ids with their row numbers."""
    rng = np.random.default_rng(rows)
    ids = rng.permutation(rows + rows // 2).astype(np.int64) * 7 + 11
    roots = {}
    for node, part, column in (("node_0", ids[:rows], "x"), ("node_1", ids[rows // 2:], "y")):
        root = folder / node
        root.mkdir()
        mine = rng.permutation(part)
        pcsv.write_csv(pa.table({"id": mine, column: rng.random(rows)}), root / "t.csv")
        pcsv.write_csv(pa.table({"id": mine, "i": np.arange(rows)}), folder / f"{node}.keys.csv")
        roots[node] = root
    return roots


class MPLangCase:
    """``psi.join`` of the two files through a compiled MPLang program."""

    def __init__(self, roots: dict[str, Path], protocol: str):
        self.sim = mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots, timeout=900.0)

        def prog() -> Any:
            a = mp.device("P0")(lambda: table.read_csv("t.csv", SCHEMAS["node_0"]))()
            b = mp.device("P1")(lambda: table.read_csv("t.csv", SCHEMAS["node_1"]))()
            return psi.join(a, b, "id", how="inner", protocol=protocol)

        self.program = mp.compile(prog, cluster=self.sim.cluster)
        self.last: Any = None

    def __call__(self) -> None:
        self.last = None  # the previous results leave the parties first
        self.last = mp.evaluate(self.sim, self.program)

    def shared_rows(self) -> int:
        ja, jb = (mp.fetch(self.sim, x) for x in self.last)  # pandas DataFrames
        assert ja["id"].equals(jb["id"]), "the two results are not aligned"
        return len(ja)


class RawCase:
    """``spu.psi.psi_execute`` on the two files, in two threads over in-memory links."""

    def __init__(self, inputs: list[Path], protocol: str, out: Path, distinct: bool = False):
        self.inputs, self.distinct = inputs, distinct
        self.protocol, self.out = protocol, out
        self.counts: list[int] = [0, 0]

    def _party(self, rank: int, link: Any) -> None:
        output = libpsi.OutputParams(path=str(self.out / f"out{rank}.csv"))
        join = {} if self.distinct else {"join_conf": libpsi.ResultJoinConfig(
            type=libpsi.ResultJoinType.JOIN_TYPE_INNER_JOIN, left_side_rank=0)}
        output.disable_alignment = self.distinct
        config = libpsi.PsiExecuteConfig(
            protocol_conf=libpsi.PsiProtocolConfig(
                protocol=_PROTOCOLS[self.protocol], receiver_rank=0, broadcast_result=True,
                ecdh_params=libpsi.EcdhParams(curve=libpsi.EllipticCurveType.CURVE_25519)),
            input_params=libpsi.InputParams(path=str(self.inputs[rank]),
                                            selected_keys=["id"], keys_unique=self.distinct),
            output_params=output, **join)
        self.counts[rank] = libpsi.psi_execute(config, link).intersection_count

    def __call__(self) -> None:
        raw_threads(2, self._party, "raw-psi")


def raw_threads(parties: int, run: Callable[[int, Any], None], name: str) -> None:
    """``run(rank, link)`` in one thread per party over libspu's in-memory links."""
    desc = libspu.link.Desc()
    desc.id = f"{name}-{os.getpid()}-{time.monotonic_ns()}"
    desc.recv_timeout_ms = 3_600_000
    for rank in range(parties):
        desc.add_party(f"party{rank}", f"mem:{rank}")
    errors: list[BaseException] = []

    def party(rank: int) -> None:
        try:
            run(rank, libspu.link.create_mem(desc, rank))
        except BaseException as e:  # reported by the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=party, args=(r,)) for r in range(parties)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def alternating_best(repeats: int, *cases: Callable[[], Any]) -> list[float]:
    """The best time of each case, run in turn ``repeats`` times."""
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(repeats):
        for fn, spent in zip(cases, times, strict=True):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [min(t) for t in times]


def bench(rows: int, repeats: int, protocols: list[str]) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-psi-") as folder:
        base = Path(folder)
        roots = write_tables(base, rows)
        (base / "raw").mkdir()
        tables = [roots["node_0"] / "t.csv", roots["node_1"] / "t.csv"]
        keys = [base / "node_0.keys.csv", base / "node_1.keys.csv"]
        for protocol in protocols:
            ours = MPLangCase(roots, protocol)
            raw = RawCase(tables, protocol, base / "raw")
            raw_keys = RawCase(keys, protocol, base / "raw", distinct=True)
            try:
                t_ours, t_raw, t_keys = alternating_best(repeats, ours, raw, raw_keys)
                shared = ours.shared_rows()
                assert shared == rows // 2 == raw.counts[0] == raw_keys.counts[0]
            finally:
                ours.last = None
                ours.sim.close()
            results.append({"protocol": protocol, "rows": rows, "shared": shared,
                            "mplang_s": t_ours, "raw_s": t_raw, "raw_keys_s": t_keys,
                            "ratio": t_ours / t_raw, "ratio_keys": t_ours / t_keys})
    return results


def all_pairs_child(rows: int) -> None:
    """Run the all-pairs program once (CHEETAH, ``rows`` ids each, half shared); print
    its time, result and this process's peak RSS as JSON."""
    sys.path.insert(0, str(HERE))
    import psi_all_pairs

    start = time.perf_counter()
    result = psi_all_pairs.main(0, (rows, rows), rows // 2)
    seconds = time.perf_counter() - start
    print(json.dumps({"rows": rows, "seconds": seconds, "size": result["size_at_p0"],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def all_pairs(rows: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, "--all-pairs-child", str(rows)],
                          capture_output=True, text=True, timeout=3600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"all-pairs child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    assert result["size"] == rows // 2
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--protocols", nargs="+", default=["rr22", "ecdh"],
                        choices=sorted(_PROTOCOLS))
    parser.add_argument("--all-pairs", type=int, default=2000,
                        help="rows per side of the all-pairs run (0: skip it)")
    parser.add_argument("--all-pairs-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.all_pairs_child:
        all_pairs_child(args.all_pairs_child)
        return
    lines = ["| protocol | rows per side | shared | MPLang s | raw libpsi s | MPLang / raw "
             "| raw libpsi, distinct keys only s | MPLang / raw keys only |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in bench(args.rows, args.repeats, args.protocols):
        lines.append(f"| {r['protocol'].upper()} | {r['rows']:,} | {r['shared']:,} | "
                     f"{r['mplang_s']:.2f} | {r['raw_s']:.2f} | {r['ratio']:.2f} | "
                     f"{r['raw_keys_s']:.2f} | {r['ratio_keys']:.2f} |")
    if args.all_pairs:
        small = bench(args.all_pairs, args.repeats, ["rr22"])[0]
        ap = all_pairs(args.all_pairs)
        lines += ["", "| program | rows per side | s | peak RSS MB |", "|---|---:|---:|---:|",
                  f"| all-pairs on SPU (CHEETAH) | {ap['rows']:,} | {ap['seconds']:.1f} | "
                  f"{ap['peak_rss_mb']:,.0f} |",
                  f"| psi.join RR22 (MPLang) | {small['rows']:,} | {small['mplang_s']:.3f} | |"]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
