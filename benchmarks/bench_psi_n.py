"""n-party and unbalanced PSI through MPLang against raw libpsi, in one run.

n-party: each of ``--parties`` parties holds a CSV of ``--rows`` distinct int64 ids
(and one float64 column); a third of the ids are held by all, the rest by some.
MPLang runs ``psi.join_n`` on the simulator (in-memory links), ``table.read_csv`` on
each party first; raw libpsi runs ``spu.psi.psi_execute`` with the same protocol in
one thread per party over the same link type, on the same table files ("raw") and on
files of just the key and row number ("raw, keys only", what MPLang hands libpsi).
Runs alternate; the figure is the best of ``--repeats``. ``aby3`` (MPLang's own
protocol) is compared with raw libspu running its two secure steps and with raw
libpsi's KKRT_NPC on key files.

Unbalanced: a server with ``--server-rows`` ids, a client with ``--client-rows`` (half
of them in the server's set). MPLang: ``psi.ub_prepare`` (offline), then ``psi.ub_join``
twice: the first copies the server's evaluated set to the client, the second reuses it
(the online phase alone). Raw: ``spu.psi.ub_psi_execute`` with ``MODE_OFFLINE_GEN_CACHE``,
``MODE_OFFLINE_TRANSFER_CACHE`` and ``MODE_ONLINE`` on key files. One run each::

    .venv/bin/python benchmarks/bench_psi_n.py [--rows 300000] [--parties 3]
        [--protocols aby3 ecdh_3pc ecdh_npc kkrt_npc] [--repeats 2]
        [--server-rows 1000000] [--client-rows 1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import spu.psi as libpsi

import mplang as mp
from mplang import simp
from mplang.dialects import table
from mplang.kernels.psi import aby3 as psi_sorted
from mplang.libs import psi

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_psi import alternating_best, raw_threads

_NPC = {"ecdh_3pc": libpsi.PsiProtocol.PROTOCOL_ECDH_3PC,
        "ecdh_npc": libpsi.PsiProtocol.PROTOCOL_ECDH_NPC,
        "kkrt_npc": libpsi.PsiProtocol.PROTOCOL_KKRT_NPC}


def _write(path: Path, columns: dict[str, Any]) -> None:
    """A CSV with an unquoted header (libpsi's older reader takes quotes literally)."""
    with open(path, "wb") as f:
        f.write((",".join(columns) + "\n").encode())
        pcsv.write_csv(pa.table(columns), f, pcsv.WriteOptions(include_header=False,
                                                              quoting_style="none"))


def n_party_files(base: Path, parties: int, rows: int) -> tuple[dict[str, Path], int]:
    """Each party's ``t.csv`` in its data root and ``keys.csv`` beside it; the number of
    ids all of them hold."""
    rng = np.random.default_rng(rows)
    shared = rows // 3
    pool = rng.permutation(shared + parties * (rows - shared)).astype(np.int64) * 7 + 11
    roots = {}
    for p in range(parties):
        own = pool[shared + p * (rows - shared): shared + (p + 1) * (rows - shared)]
        ids = rng.permutation(np.concatenate([pool[:shared], own]))
        root = base / f"node_{p}"
        root.mkdir()
        _write(root / "t.csv", {"id": ids, "x": rng.random(rows)})
        _write(base / f"node_{p}.keys.csv", {"id": ids, "i": np.arange(rows)})
        roots[f"node_{p}"] = root
    return roots, shared


class RawNpc:
    """``spu.psi.psi_execute`` with an n-party protocol on ``inputs``, result broadcast."""

    def __init__(self, inputs: list[Path], protocol: str, out: Path):
        self.inputs, self.protocol, self.out = inputs, protocol, out
        self.counts = [0] * len(inputs)

    def _party(self, rank: int, link: Any) -> None:
        config = libpsi.PsiExecuteConfig(
            protocol_conf=libpsi.PsiProtocolConfig(
                protocol=_NPC[self.protocol], receiver_rank=0, broadcast_result=True,
                ecdh_params=libpsi.EcdhParams(curve=libpsi.EllipticCurveType.CURVE_25519)),
            input_params=libpsi.InputParams(path=str(self.inputs[rank]), selected_keys=["id"],
                                            keys_unique=True),
            output_params=libpsi.OutputParams(path=str(self.out / f"out{rank}.csv")))
        self.counts[rank] = libpsi.psi_execute(config, link).intersection_count

    def __call__(self) -> None:
        raw_threads(len(self.inputs), self._party, "raw-npc")


class MPLangNpc:
    """``psi.join_n`` of the parties' files through a compiled MPLang program."""

    def __init__(self, roots: dict[str, Path], protocol: str):
        self.sim = mp.Simulator(mp.ClusterSpec.simple(len(roots)), data_roots=roots,
                                timeout=3600.0)

        def prog() -> Any:
            ts = [simp.pcall((p,), lambda: table.read_csv("t.csv", {"id": "int64",
                                                                    "x": "float64"}))
                  for p in range(len(roots))]
            return psi.join_n(ts, "id", protocol=protocol)

        self.program = mp.compile(prog, cluster=self.sim.cluster)
        self.last: Any = None

    def __call__(self) -> None:
        self.last = None
        self.last = mp.evaluate(self.sim, self.program)

    def shared_rows(self) -> int:
        got = [mp.fetch(self.sim, x)[p] for p, x in enumerate(self.last)]
        assert all(g["id"].equals(got[0]["id"]) for g in got), "results not aligned"
        return int(got[0].num_rows)


class RawAby3:
    """``aby3``'s two secure steps (`mplang.kernels.psi.aby3`, compiled once) on raw
    libspu: one thread per party over libspu's in-memory links, each making its shares
    and running both steps on a runtime of each sort method; the result opened."""

    def __init__(self, tables: list[Path]):
        from mplang.kernels.psi.session import encode_keys

        ids = [pcsv.read_csv(t).column("id") for t in tables]
        self.hashes = [psi_sorted.tagged_hashes(encode_keys(c), i, len(tables))
                       for i, c in enumerate(ids)]
        self.find, self.compact = psi_sorted.executables(tuple(len(h) for h in self.hashes))
        self.shared = 0

    def __call__(self) -> None:
        import spu
        import spu.libspu as libspu

        io = spu.Io(3, libspu.RuntimeConfig(protocol=libspu.ProtocolKind.ABY3,
                                            field=libspu.FieldType.FM64))
        secret = libspu.Visibility.VIS_SECRET
        shares: list[list[Any]] = [[] for _ in range(3)]
        out: list[Any] = [None] * 3

        def party(rank: int, link: Any) -> None:
            mine = io.make_shares(self.hashes[rank], secret) if rank < len(self.hashes) \
                else None
            shares[rank] = mine
            while any(not s for s in shares):
                time.sleep(0.001)
            inputs = [shares[i][rank] for i in range(len(self.hashes))]
            apart, first = psi_sorted._run(link, "SORT_QUICK", self.find, inputs, 2)
            (out[rank],) = psi_sorted._run(link, "SORT_RADIX", self.compact, [apart, first],
                                           1)

        raw_threads(3, party, "raw-aby3")
        self.shared = int((np.asarray(io.reconstruct(out)) >= 0).sum())


def bench_aby3(rows: int, parties: int, repeats: int, roots: dict[str, Path],
               tables: list[Path], keys: list[Path], shared: int, base: Path) -> str:
    """MPLang's ``aby3`` against raw libspu on the same steps and raw libpsi's KKRT_NPC."""
    ours, raw_spu = MPLangNpc(roots, "aby3"), RawAby3(tables)
    raw_psi = RawNpc(keys, "kkrt_npc", base / "raw")
    try:
        t_ours, t_spu, t_psi = alternating_best(repeats, ours, raw_spu, raw_psi)
        assert ours.shared_rows() == shared == raw_spu.shared == raw_psi.counts[0]
    finally:
        ours.last = None
        ours.sim.close()
    return (f"| ABY3 | {parties} | {rows:,} | {shared:,} | {t_ours:.2f} | raw libspu, same "
            f"steps: {t_spu:.2f} | {t_ours / t_spu:.2f} | raw libpsi KKRT_NPC, keys only: "
            f"{t_psi:.2f} | {t_ours / t_psi:.2f} |")


def bench_n(rows: int, parties: int, repeats: int, protocols: list[str]) -> list[str]:
    lines = ["| protocol | parties | rows each | shared | MPLang s | raw libpsi s | MPLang / raw "
             "| raw, keys only s | MPLang / raw keys only |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory(prefix="bench-psi-n-") as folder:
        base = Path(folder)
        roots, shared = n_party_files(base, parties, rows)
        (base / "raw").mkdir()
        tables = [roots[f"node_{p}"] / "t.csv" for p in range(parties)]
        keys = [base / f"node_{p}.keys.csv" for p in range(parties)]
        for protocol in protocols:
            if protocol == "ecdh_3pc" and parties != 3:
                continue
            if protocol == "aby3":
                lines.append(bench_aby3(rows, parties, repeats, roots, tables, keys, shared,
                                        base))
                print(lines[-1], flush=True)
                continue
            ours = MPLangNpc(roots, protocol)
            raw, raw_keys = (RawNpc(files, protocol, base / "raw") for files in (tables, keys))
            try:
                t_ours, t_raw, t_keys = alternating_best(repeats, ours, raw, raw_keys)
                got = ours.shared_rows()
                assert got == shared == raw.counts[0] == raw_keys.counts[0], \
                    (got, shared, raw.counts, raw_keys.counts)
            finally:
                ours.last = None
                ours.sim.close()
            lines.append(f"| {protocol.upper()} | {parties} | {rows:,} | {shared:,} | "
                         f"{t_ours:.2f} | {t_raw:.2f} | {t_ours / t_raw:.2f} | {t_keys:.2f} | "
                         f"{t_ours / t_keys:.2f} |")
            print(lines[-1], flush=True)
    return lines


def _ub_config(mode: str, role: str, cache: Path, source: Path, out: Path) -> Any:
    return libpsi.UbPsiExecuteConfig(
        mode=getattr(libpsi.UbPsiMode, mode), role=getattr(libpsi.UbPsiRole, role),
        client_receive_result=True, cache_path=str(cache),
        input_params=libpsi.InputParams(path=str(source), selected_keys=["id"]),
        output_params=libpsi.OutputParams(path=str(out)),
        join_conf=libpsi.ResultJoinConfig(type=libpsi.ResultJoinType.JOIN_TYPE_INNER_JOIN))


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_ub(server_rows: int, client_rows: int) -> list[str]:
    rng = np.random.default_rng(server_rows)
    server = rng.permutation(server_rows * 2)[:server_rows].astype(np.int64)
    client = np.concatenate([rng.choice(server, client_rows // 2, replace=False),
                             server_rows * 2 + np.arange(client_rows - client_rows // 2)])
    expected = client_rows // 2
    with tempfile.TemporaryDirectory(prefix="bench-psi-ub-") as folder:
        base = Path(folder)
        roots = {f"node_{p}": base / f"node_{p}" for p in range(2)}
        for root, ids in zip(roots.values(), (server, client), strict=True):
            root.mkdir()
            _write(root / "t.csv", {"id": ids, "x": rng.random(len(ids))})
            _write(root / "keys.csv", {"id": ids, "i": np.arange(len(ids))})
        sim = mp.Simulator(mp.ClusterSpec.simple(2), data_roots=roots, timeout=3600.0)
        schema = {"id": "int64", "x": "float64"}
        try:
            prepare = mp.compile(lambda: psi.ub_prepare(simp.pcall(
                (0,), lambda: table.read_csv("t.csv", schema)), "id", name="big"),
                cluster=sim.cluster)
            query = mp.compile(lambda: psi.ub_join(simp.pcall(
                (1,), lambda: table.read_csv("t.csv", schema)), "id", server=0, name="big"),
                cluster=sim.cluster)
            results: list[Any] = []
            ours = [_timed(lambda: mp.evaluate(sim, prepare)),
                    _timed(lambda: results.append(mp.evaluate(sim, query))),
                    _timed(lambda: results.append(mp.evaluate(sim, query)))]
            assert all(mp.fetch(sim, r)[1].num_rows == expected for r in results)
            results.clear()
        finally:
            sim.close()
        raw_dir = base / "raw"
        (raw_dir / "server").mkdir(parents=True)
        (raw_dir / "client").mkdir()
        keys = [roots["node_0"] / "keys.csv", roots["node_1"] / "keys.csv"]
        counts: list[int] = [0]

        def phase(mode: str) -> None:
            def run(rank: int, link: Any) -> None:
                role = ("ROLE_SERVER", "ROLE_CLIENT")[rank]
                cache = raw_dir / ("server/cache" if rank == 0 else "client/cache")
                report = libpsi.ub_psi_execute(_ub_config(
                    mode, role, cache, keys[rank], raw_dir / f"out{rank}.csv"), link)
                if rank == 1 and mode == "MODE_ONLINE":
                    counts[0] = report.intersection_count
            if mode == "MODE_OFFLINE_GEN_CACHE":
                raw_threads(1, run, "raw-ub")
            else:
                raw_threads(2, run, "raw-ub")

        raw = [_timed(lambda: phase("MODE_OFFLINE_GEN_CACHE")),
               _timed(lambda: phase("MODE_OFFLINE_TRANSFER_CACHE")),
               _timed(lambda: phase("MODE_ONLINE"))]
        assert counts[0] == expected, counts
    return ["| phase | MPLang s | raw libpsi s |", "|---|---:|---:|",
            f"| offline: prepare {server_rows:,} server rows (MPLang: read CSV + "
            f"`psi.ub_prepare`) | {ours[0]:.2f} | {raw[0]:.2f} (gen cache) |",
            f"| first `psi.ub_join` of {client_rows:,} client rows (copies the server's set: "
            f"raw = transfer + online) | {ours[1]:.2f} | {raw[1] + raw[2]:.2f} |",
            f"| later `psi.ub_join` (online phase only) | {ours[2]:.2f} | {raw[2]:.2f} |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--parties", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--protocols", nargs="*",
                        default=["aby3", "ecdh_3pc", "ecdh_npc", "kkrt_npc"],
                        choices=["aby3", *sorted(_NPC)])
    parser.add_argument("--server-rows", type=int, default=1_000_000)
    parser.add_argument("--client-rows", type=int, default=1000)
    args = parser.parse_args()
    lines = bench_n(args.rows, args.parties, args.repeats, args.protocols) \
        if args.protocols else []
    if args.server_rows:
        lines += ["", *bench_ub(args.server_rows, args.client_rows)]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
