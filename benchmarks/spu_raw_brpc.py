"""Raw libspu over its own brpc links, one process per party: the baseline for MPLang's SPU.

`raw_brpc_seconds` times one serialized libspu executable (for example the
``executable`` attribute of an ``spu.run`` op MPLang traced) on inputs that are
already secret-shared, without MPLang in the loop:

* the parent makes the shares of every input with MPLang's own share maker
  (``io_for(config).make_shares(x, VIS_SECRET)``, as the ``spu.seal`` kernel
  does) and writes each party's shares, libspu's runtime config
  (``runtime_config_for(config)``) and the executable as raw bytes plus a JSON
  manifest into a temporary directory;
* one child process per member (``sys.executable`` running this file) opens
  libspu's brpc link to the others on loopback ports, builds an ``spu.Runtime``
  with that config, sets its shares under MPLang's variable names
  (``input_name(i)``) and runs the executable ``warmup`` times untimed, then
  ``runs`` times timed, each timed run preceded by a link barrier so that all
  parties start it together;
* each figure returned is, for one run, the slowest party's wall time of
  ``Runtime.run``. Outputs stay secret shares inside each runtime (only their
  presence is checked, after the timed runs).

Link set-up, share generation and process start-up are not timed. With ``tls=True``
the links run brpc's mutual TLS: each party has its own key and self-signed certificate
(MPLang's kind of identity), and trusts its peers' certificates.

    .venv/bin/python benchmarks/spu_raw_brpc.py [--size 10000] [--op less|mul]
                                                [--runs 5] [--warmup 2] [--tls]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import spu
import spu.libspu as libspu

if TYPE_CHECKING:
    import mplang.dialects.spu

RECV_TIMEOUT_MS = 120_000
"""How long a party waits for one protocol message before libspu gives up."""
HTTP_TIMEOUT_MS = 120_000
"""brpc's timeout of one request (one message, or one chunk of a large one)."""
CONNECT_RETRY_TIMES = 120
CONNECT_RETRY_INTERVAL_MS = 250
"""Parties start at different times: each retries connecting to its peers for up to 30 s."""
LAUNCH_ATTEMPTS = 3
"""Attempts with fresh ports when a party cannot listen on its port (taken meanwhile), or,
over TLS, when one aborts (brpc's ``Check failed ... error_code is 0`` in
``Controller::SetFailed``, when a TLS peer's socket fails)."""
_BIND_ERRORS = ("Fail to listen", "brpc server failed start", "Address already in use")
"""What a party whose brpc server could not listen on its port logs."""


def _write_party_inputs(folder: Path, rank: int, shares: list[Any]) -> list[dict[str, Any]]:
    """Write party ``rank``'s share of each input (libspu meta and chunks, raw bytes)."""
    entries = []
    for i, share in enumerate(shares):
        meta = f"p{rank}_in{i}.meta"
        (folder / meta).write_bytes(bytes(share.meta))
        chunks = []
        for j, chunk in enumerate(share.share_chunks):
            name = f"p{rank}_in{i}.chunk{j}"
            (folder / name).write_bytes(bytes(chunk))
            chunks.append(name)
        entries.append({"meta": meta, "chunks": chunks})
    return entries


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no stderr)"
    return text if len(text) <= limit else "..." + text[-limit:]


def _kill_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        with suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


class _LaunchError(RuntimeError):
    def __init__(self, message: str, bind_failure: bool):
        super().__init__(message)
        self.bind_failure = bind_failure


def _launch(folder: Path, world: int, ports: list[int], attempt: int,
            route: Callable[[int], int] | None = None) -> list[list[float]]:
    """Run one child per party with links on ``ports``; each party's timed runs. With
    ``route``, a party reaches another's port ``p`` at ``route(p)`` (a proxy's port)."""
    views = [[f"127.0.0.1:{port if route is None or j == i else route(port)}"
              for j, port in enumerate(ports)] for i in range(world)]
    desc = {"id": f"raw-brpc-{uuid.uuid4().hex[:12]}", "views": views}
    (folder / f"link{attempt}.json").write_text(json.dumps(desc))
    procs: list[subprocess.Popen[bytes]] = []
    errs = [folder / f"p{rank}.a{attempt}.stderr" for rank in range(world)]
    results = [folder / f"p{rank}.a{attempt}.json" for rank in range(world)]
    try:
        for rank in range(world):
            with open(errs[rank], "wb") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--child", str(folder),
                     str(rank), f"link{attempt}.json", results[rank].name],
                    stdin=subprocess.DEVNULL, stdout=err, stderr=subprocess.STDOUT))
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                _kill_all(procs)
                order = failed + [r for r in range(world) if r not in failed]
                logs = "\n".join(f"--- party {r} (exit {procs[r].returncode}):\n"
                                 f"{_tail(errs[r], 4000 if r in failed else 1000)}"
                                 for r in order)
                bind = any(any(e in _tail(errs[r]) for e in _BIND_ERRORS) for r in failed)
                raise _LaunchError(f"raw libspu party {failed[0]} failed\n{logs}", bind)
            if all(c == 0 for c in codes):
                break
            time.sleep(0.05)
    finally:
        _kill_all(procs)
    return [json.loads(path.read_text())["seconds"] for path in results]


def _write_certificates(folder: Path, world: int) -> None:
    """Each party's key and self-signed certificate, made as MPLang makes its parties'
    (`keygen`), and its trust file (the other parties' certificates)."""
    from mplang.cluster.identity import keygen

    for rank in range(world):
        keygen(f"p{rank}", folder)
    certificates = [(folder / f"p{rank}.crt").read_bytes() for rank in range(world)]
    for rank in range(world):
        (folder / f"p{rank}.trust").write_bytes(b"".join(
            c for i, c in enumerate(certificates) if i != rank))


def raw_brpc_seconds(executable: bytes, config: mplang.dialects.spu.SpuConfig,
                     inputs: list[np.ndarray], runs: int, warmup: int = 2,
                     route: Callable[[int], int] | None = None,
                     tls: bool = False) -> list[float]:
    """Wall seconds of each of `runs` timed runs of `executable` on 3 local processes linked
    by libspu's brpc links (one per member of ``config``), on secret shares of ``inputs``
    made as MPLang makes them; each figure is the slowest party's time of that run.

    ``executable`` is a serialized ``libspu.Executable`` whose inputs are named
    ``input_name(i)`` and outputs ``output_name(i)`` (what ``spu.run`` compiles).
    ``route(port)`` gives the port (a proxy's) at which the other parties reach a
    party listening on ``port`` (default: that port).
    """
    from bench_http import free_ports  # this folder (the script's, or the caller's)

    from mplang.dialects.spu import input_name, io_for, output_name, runtime_config_for

    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got {runs}, {warmup}")
    exe = libspu.Executable()
    if not exe.ParseFromString(executable):
        raise ValueError("malformed SPU executable")
    in_names = [input_name(i) for i in range(len(inputs))]
    out_names = [output_name(i) for i in range(len(exe.output_names))]
    if list(exe.input_names) != in_names:
        raise ValueError(f"the executable takes {list(exe.input_names)}; "
                         f"{len(inputs)} inputs give {in_names}")
    if list(exe.output_names) != out_names:
        raise ValueError(f"the executable's outputs {list(exe.output_names)} are not "
                         f"MPLang's {out_names}")
    world = len(config.members)
    io = io_for(config)
    # as the spu.seal kernel: one make_shares per input, VIS_SECRET; shares[i][rank]
    shares = [io.make_shares(np.asarray(x), libspu.Visibility.VIS_SECRET) for x in inputs]
    with tempfile.TemporaryDirectory(prefix="spu_raw_brpc_") as tmp:
        folder = Path(tmp)
        (folder / "executable.bin").write_bytes(executable)
        (folder / "runtime_config.bin").write_bytes(
            runtime_config_for(config).SerializeToString())
        for rank in range(world):
            manifest = {
                "rank": rank, "world": world, "runs": runs, "warmup": warmup,
                "inputs": [{"name": name, **entry} for name, entry in zip(
                    in_names, _write_party_inputs(folder, rank, [s[rank] for s in shares]),
                    strict=True)],
                "outputs": out_names,
            }
            (folder / f"p{rank}.json").write_text(json.dumps({**manifest, "tls": tls}))
        if tls:
            _write_certificates(folder, world)
        del shares
        for attempt in range(LAUNCH_ATTEMPTS):
            try:
                per_party = _launch(folder, world, free_ports(world), attempt, route)
                break
            except _LaunchError as e:
                if not (e.bind_failure or tls) or attempt == LAUNCH_ATTEMPTS - 1:
                    raise RuntimeError(str(e)) from None
                if not e.bind_failure:  # brpc's TLS sockets abort a party now and then
                    print(f"raw libspu over TLS: {str(e).splitlines()[0]}; launching again",
                          file=sys.stderr)
    return [max(times) for times in zip(*per_party, strict=True)]


def _child(folder: Path, rank: int, link_file: str, result_file: str) -> None:
    """One party: link, runtime, shares, then the untimed and timed runs."""
    manifest = json.loads((folder / f"p{rank}.json").read_text())
    link_info = json.loads((folder / link_file).read_text())
    desc = libspu.link.Desc()
    desc.id = link_info["id"]
    desc.recv_timeout_ms = RECV_TIMEOUT_MS
    desc.http_timeout_ms = HTTP_TIMEOUT_MS
    desc.connect_retry_times = CONNECT_RETRY_TIMES
    desc.connect_retry_interval_ms = CONNECT_RETRY_INTERVAL_MS
    for i, address in enumerate(link_info["views"][rank]):
        desc.add_party(f"party{i}", address)
    if manifest["tls"]:
        desc.enable_ssl = True
        for options in (desc.client_ssl_opts, desc.server_ssl_opts):
            options.cert.certificate_path = str(folder / f"p{rank}.crt")
            options.cert.private_key_path = str(folder / f"p{rank}.key")
            options.verify.ca_file_path = str(folder / f"p{rank}.trust")
            options.verify.verify_depth = 1
    link = libspu.link.create_brpc(desc, rank)

    config = libspu.RuntimeConfig()
    if not config.ParseFromString((folder / "runtime_config.bin").read_bytes()):
        raise ValueError("malformed runtime config")
    exe = libspu.Executable()
    if not exe.ParseFromString((folder / "executable.bin").read_bytes()):
        raise ValueError("malformed SPU executable")
    runtime = spu.Runtime(link, config)
    for entry in manifest["inputs"]:
        share = libspu.Share()
        share.meta = (folder / entry["meta"]).read_bytes()
        share.share_chunks = [(folder / c).read_bytes() for c in entry["chunks"]]
        runtime.set_var(entry["name"], share)

    for _ in range(manifest["warmup"]):
        link.barrier()
        runtime.run(exe)
    seconds = []
    for _ in range(manifest["runs"]):
        link.barrier()
        start = time.perf_counter()
        runtime.run(exe)
        seconds.append(time.perf_counter() - start)
    for name in manifest["outputs"]:
        runtime.get_var_meta(name)  # the output exists (still secret-shared)
    link.barrier()  # nobody tears its link down while a peer still talks to it
    (folder / result_file).write_text(json.dumps({"seconds": seconds}))
    if manifest["tls"]:  # the barrier's last acknowledgements may still be on their way:
        time.sleep(0.5)  # brpc aborts a party whose TLS peer closes under a request
    link.stop_link()


def _self_check(size: int, op: str, runs: int, warmup: int, tls: bool) -> None:
    """Compile ``op`` on two secret float32 vectors through MPLang (3-party ABY3, FM64)
    and time its executable on raw libspu over brpc."""
    import jax.numpy as jnp

    import mplang as mp
    from mplang.dialects.spu import SpuConfig

    fns = {"less": jnp.less, "mul": jnp.multiply}
    rng = np.random.default_rng(size)
    x, y = (rng.standard_normal(size).astype(np.float32) for _ in range(2))
    spec = mp.ClusterSpec.simple(3).to_dict()
    spec["devices"]["SP0"]["config"] = {"protocol": "ABY3", "field": "FM64"}

    def prog() -> Any:
        a = mp.device("P0")(lambda: x)()
        b = mp.device("P1")(lambda: y)()
        return mp.device("SP0")(fns[op])(a, b)

    program = mp.compile(prog, cluster=mp.ClusterSpec.from_dict(spec))
    (run,) = [o for o in program.graph.walk() if o.opcode == "spu.run"]
    config = SpuConfig.from_attrs(run.attrs)
    seconds = raw_brpc_seconds(bytes(run.attrs["executable"]), config, [x, y], runs, warmup,
                               tls=tls)
    print(f"raw libspu over brpc{' with mutual TLS' if tls else ''}, {config.protocol} "
          f"{config.field}, {len(config.members)} processes, {op} on {size:,} float32: runs "
          f"{[round(s, 4) for s in seconds]}, "
          f"median {statistics.median(seconds):.4f} s")


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _child(Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--op", choices=["less", "mul"], default="less")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--tls", action="store_true", help="brpc's mutual TLS")
    args = parser.parse_args()
    _self_check(args.size, args.op, args.runs, args.warmup, args.tls)


if __name__ == "__main__":
    main()
