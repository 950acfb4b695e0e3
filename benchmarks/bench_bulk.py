"""64 MiB between parties: the transports measured for bulk transfer, and the workers'
own move and fetch, an older main against this tree, in one run.

Transports (two bare processes on loopback, each loading its own identity, pinned
certificates, TLS 1.3), each sending 64 MiB one way ``--copies`` times into a buffer
reused from copy to copy, with the CPU seconds (user + system) each side spends per
64 MiB:

- ``tcp``: a plain TCP copy (one ``sendall`` of 64 MiB, ``recv_into`` the reused buffer):
  the wire's limit;
- ``mplang/1``: the framing the workers speak (`mplang.transport.mux.MuxProtocol`) on
  uvloop's TLS transport: one event-loop thread per process does TLS and framing;
- ``blocking TLS``: one blocking `ssl.SSLSocket` per side (OpenSSL reads and writes the
  socket itself), 256 KiB ``sendall`` / ``recv_into`` calls;
- ``TLS on its own thread``: TLS record work off the socket thread: on each side one
  thread encrypts (or decrypts) through memory BIOs and another does the socket calls,
  handing 256 KiB (1 MiB) chunks over a queue.

Workers: per tree, one child starts 3 workers (mutual TLS) and measures 64 MiB float32
moved from worker 0 to worker 1 (``simp.shuffle_static``) and fetched by the driver
(``mp.fetch``), median MiB/s of ``--runs``. Trees alternate every round.

    git worktree add --detach /work/wt-s40 f25f649
    .venv/bin/python benchmarks/bench_bulk.py --old /work/wt-s40 [--rounds 2] [--runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import resource
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from timing import median_ms, run_in_tree

NEW = Path(__file__).resolve().parents[1]
NBYTES = 64 << 20
CHUNK = 256 << 10
TRANSPORTS = ("tcp", "mplang/1", "blocking TLS", "TLS on its own thread")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------- transports


def _identities(folder: Path) -> tuple[Any, Any]:
    from mplang.cluster.identity import keygen, load_identity

    if not (folder / "receiver.key").exists():
        keygen("receiver", folder)
        keygen("sender", folder)
    return load_identity(folder / "receiver.key"), load_identity(folder / "sender.key")


def _memory_handshake(sock: socket.socket, context: ssl.SSLContext, server_side: bool
                      ) -> tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=server_side)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            sock.sendall(outgoing.read())
            incoming.write(sock.recv(1 << 16))
    sock.sendall(outgoing.read())
    return tls, incoming, outgoing


def _receive(kind: str, folder: Path, copies: int) -> None:
    """The receiving process: prints its port, then per copy answers the CPU seconds
    it spent receiving it."""
    receiver, sender = _identities(folder)
    context = receiver.server_context([sender.certificate])
    context.num_tickets = 0
    sink = memoryview(bytearray(NBYTES))
    if kind == "mplang/1":
        _receive_mux(context, sink, copies)
        return
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    raw, _ = listener.accept()
    if kind in ("tcp", "blocking TLS"):
        conn = raw if kind == "tcp" else context.wrap_socket(raw, server_side=True)
        limit = NBYTES if kind == "tcp" else CHUNK
        for _ in range(copies):
            start, got = _cpu(), 0
            while got < NBYTES:
                got += conn.recv_into(sink[got:], min(limit, NBYTES - got))
            conn.sendall(f"{_cpu() - start:<32}".encode())
        return
    obj, incoming, _ = _memory_handshake(raw, context, True)
    chunks: queue.SimpleQueue[bytes] = queue.SimpleQueue()

    def read_socket() -> None:
        while data := raw.recv(1 << 20):
            chunks.put(data)

    threading.Thread(target=read_socket, daemon=True).start()
    for _ in range(copies):
        start, got = _cpu(), 0
        while got < NBYTES:
            try:
                got += int(obj.read(NBYTES - got, sink[got:]))  # typeshed: bytes
            except ssl.SSLWantReadError:
                incoming.write(chunks.get())
        raw.sendall(f"{_cpu() - start:<32}".encode())


def _receive_mux(context: ssl.SSLContext, sink: memoryview, copies: int) -> None:
    import uvloop

    from mplang.transport.mux import MuxProtocol

    class Sink:
        protocol: MuxProtocol
        start = 0.0

        def on_head(self, stream: int, head: dict[str, Any], size: int) -> memoryview:
            self.start = _cpu()
            return sink[:size]

        def on_body(self, stream: int, head: dict[str, Any], body: memoryview) -> None:
            self.protocol.send(stream, {"cpu": _cpu() - self.start})

        def on_lost(self, error: BaseException | None) -> None:
            pass

    def protocol() -> MuxProtocol:
        handler = Sink()
        handler.protocol = MuxProtocol(handler)
        return handler.protocol

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(
            protocol, "127.0.0.1", 0, ssl=context)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.sleep(3600)

    uvloop.run(serve())


def _send(kind: str, folder: Path, port: int, copies: int) -> dict[str, float]:
    """Send 64 MiB ``copies`` times; median MiB/s and CPU seconds of both sides."""
    receiver, sender = _identities(folder)
    context = sender.client_context(receiver.certificate)
    data = memoryview(os.urandom(1 << 20) * 64)
    times: list[float] = []
    cpu: list[float] = []
    remote: list[float] = []
    if kind == "mplang/1":
        times, cpu, remote = _send_mux(context, port, data, copies)
    else:
        raw = socket.create_connection(("127.0.0.1", port))
        if kind in ("tcp", "blocking TLS"):
            conn = raw if kind == "tcp" else context.wrap_socket(raw)
            chunk = NBYTES if kind == "tcp" else CHUNK
            for _ in range(copies):
                start, used = time.perf_counter(), _cpu()
                for offset in range(0, NBYTES, chunk):
                    conn.sendall(data[offset:offset + chunk])
                remote.append(float(_recv_exactly(conn, 32)))
                times.append(time.perf_counter() - start)
                cpu.append(_cpu() - used)
        else:
            obj, _, outgoing = _memory_handshake(raw, context, False)
            chunks: queue.SimpleQueue[bytes] = queue.SimpleQueue()

            def write_socket() -> None:
                for chunk_ in iter(chunks.get, b""):
                    raw.sendall(chunk_)

            threading.Thread(target=write_socket, daemon=True).start()
            for _ in range(copies):
                start, used = time.perf_counter(), _cpu()
                for offset in range(0, NBYTES, CHUNK):
                    obj.write(data[offset:offset + CHUNK])
                    chunks.put(outgoing.read())
                remote.append(float(_recv_exactly(raw, 32)))
                times.append(time.perf_counter() - start)
                cpu.append(_cpu() - used)
            chunks.put(b"")
    return {"mib_s": 64 / statistics.median(times), "sender_cpu_ms": statistics.median(cpu) * 1e3,
            "receiver_cpu_ms": statistics.median(remote) * 1e3}


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        data += sock.recv(n - len(data))
    return data


def _send_mux(context: ssl.SSLContext, port: int, data: memoryview, copies: int
              ) -> tuple[list[float], list[float], list[float]]:
    import uvloop

    from mplang.transport.mux import MuxProtocol

    class Answers:
        future: asyncio.Future[float]

        def on_head(self, stream: int, head: dict[str, Any], size: int) -> memoryview:
            return memoryview(bytearray(size))

        def on_body(self, stream: int, head: dict[str, Any], body: memoryview) -> None:
            self.future.set_result(head["cpu"])

        def on_lost(self, error: BaseException | None) -> None:
            pass

    async def send() -> tuple[list[float], list[float], list[float]]:
        loop = asyncio.get_running_loop()
        answers = Answers()
        _, protocol = await loop.create_connection(lambda: MuxProtocol(answers), "127.0.0.1",
                                                   port, ssl=context)
        times, cpu, remote = [], [], []
        for i in range(copies):
            answers.future = loop.create_future()
            start, used = time.perf_counter(), _cpu()
            protocol.send(2 * i + 1, {}, [data])
            remote.append(await answers.future)
            times.append(time.perf_counter() - start)
            cpu.append(_cpu() - used)
        return times, cpu, remote

    return uvloop.run(send())


def transport_figures(copies: int) -> dict[str, dict[str, float]]:
    """Each transport's 64 MiB rate and CPU per side."""
    out = {}
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as folder:
        for kind in TRANSPORTS:
            receiver = subprocess.Popen(
                [sys.executable, __file__, "--receive", kind, "--folder", folder,
                 "--copies", str(copies)], stdout=subprocess.PIPE, text=True)
            assert receiver.stdout is not None
            try:
                port = int(receiver.stdout.readline())
                out[kind] = _send(kind, Path(folder), port, copies)
            finally:
                receiver.kill()
                receiver.wait()
    return out


# ---------------------------------------------------------------- workers


def child(tree: str, runs: int) -> None:
    import jax.numpy as jnp
    from bench_http import cluster_spec

    import mplang as mp
    from mplang import simp
    from mplang.cluster.local import LocalCluster

    spec = cluster_spec()
    n = NBYTES // 4
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as data, \
            LocalCluster(spec, data_root=data) as cluster:
        drv = cluster.driver(timeout=60.0, run_timeout=600.0)
        try:
            big = mp.evaluate(drv, lambda: simp.pcall(
                (0,), lambda: jnp.arange(n, dtype=jnp.float32)))
            move = mp.compile(lambda v: simp.shuffle_static(v, {1: 0}), big, cluster=spec)
            got = mp.fetch(drv, mp.evaluate(drv, move, big))[1]
            assert got.shape == (n,) and got[-1] == n - 1
            del got
            result = {
                "move_mib_s": 64e3 / median_ms(lambda: mp.evaluate(drv, move, big), runs, 1),
                "fetch_mib_s": 64e3 / median_ms(lambda: mp.fetch(drv, big), runs, 1)}
        finally:
            drv.close()
    print(json.dumps({"tree": tree, "mplang": mp.__file__, **result}), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="worktree of an older main (required but in a child)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=7, help="64 MiB moves and fetches per child")
    parser.add_argument("--copies", type=int, default=9, help="64 MiB copies per transport")
    parser.add_argument("--child", choices=["old", "new"])
    parser.add_argument("--receive", choices=TRANSPORTS)
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.receive:
        _receive(args.receive, Path(args.folder), args.copies)
        return 0
    if args.child:
        child(args.child, args.runs)
        return 0
    if not args.old:
        parser.error("--old is required")
    trees = {"old": Path(args.old), "new": NEW}
    rows: dict[str, list[dict[str, Any]]] = {"old": [], "new": [], "transports": []}
    for r in range(args.rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for tree in order:
            rows[tree].append(run_in_tree(__file__, tree, trees[tree],
                                          ["--child", tree, "--runs", str(args.runs)]))
        rows["transports"].append(transport_figures(args.copies))
        print(f"round {r + 1}: " + json.dumps({k: v[-1] for k, v in rows.items()}), flush=True)
    report(rows)
    return 0


def report(rows: dict[str, list[dict[str, Any]]]) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    tcp = med([t["tcp"]["mib_s"] for t in rows["transports"]])
    print(f"\nmedians over {len(rows['new'])} rounds; TCP copy {tcp:.0f} MiB/s\n")
    print("| transport | 64 MiB (MiB/s) | vs TCP copy | CPU ms per 64 MiB: sender, receiver |")
    print("|---|---:|---:|---:|")
    for kind in TRANSPORTS:
        figures = [t[kind] for t in rows["transports"]]
        rate = med([f["mib_s"] for f in figures])
        print(f"| {kind} | {rate:.0f} | {rate / tcp:.2f}x | "
              f"{med([f['sender_cpu_ms'] for f in figures]):.0f}, "
              f"{med([f['receiver_cpu_ms'] for f in figures]):.0f} |")
    print("\n| workers, 64 MiB | old main (MiB/s) | new (MiB/s) | new vs TCP copy | target |")
    print("|---|---:|---:|---:|---:|")
    for key, label in (("move_mib_s", "worker to worker"), ("fetch_mib_s", "fetch")):
        new = med([row[key] for row in rows["new"]])
        print(f"| {label} | {med([row[key] for row in rows['old']]):.0f} | {new:.0f} | "
              f"{new / tcp:.2f}x | 0.5x |")


if __name__ == "__main__":
    sys.exit(main())
