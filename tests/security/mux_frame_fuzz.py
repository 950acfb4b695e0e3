"""Fuzzed ``mplang/1`` frames against a real worker process (issue 26).

A `Campaign` sends fuzzed frames and messages to worker ``node_0`` of a 3-worker
`LocalCluster` (worker processes, mutual TLS on loopback):

- from listed parties, over ``mplang/1`` connections presenting ``node_1``'s or the
  driver's certificate: random bytes; well-framed HEADs whose JSON is hostile in
  every field the worker reads (the path; the headers: spec digest, execution id,
  op key, program digest, link flag; the announced size) or is no JSON object at all
  (deep nesting, huge numbers, bad UTF-8, wrong lengths); truncated frames; DATA of
  unknown or finished streams, DATA without HEAD, HEADs on open streams, bodies
  longer than announced, unknown frame kinds; valid requests with their frames
  interleaved; runs of real programs (graph bundles) and of bit-flipped copies, among
  them runs of two parties that wait 2 s for a vote that never comes; messages (real
  and mutated encoded values) into those waiting runs;
- from outsiders: a certificate no spec lists speaking ``mplang/1``; plain TCP from
  another loopback address (garbage, plaintext HTTP, frames); a TLS ClientHello cut
  short, bit-flipped, or sent whole and followed by silence.

Meanwhile a `Prober` thread has the real driver run a small program across node_0
and node_2 and ask node_0's ``/health`` over HTTP/1.1, in turn, timing each.

Rules (a broken one is a `Finding`): no answer with a 5xx status but a failed
``/run``'s 500 naming an MPLang error kind; a listed party always connects and its
writes never block; an outsider is never answered and its connection is closed within
the handshake timeout; every probe succeeds within `PROBE_LIMIT`; after the campaign
every worker is alive with no traceback in its log and a real program gives the right
value (`worker_api_fuzz.cluster_problems`).

``benchmarks/fuzz_mux_frames.py`` runs the campaign; ``test_mux_frame_fuzz.py`` a CI
subset.
"""

from __future__ import annotations

import collections
import contextlib
import json
import random
import re
import select
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster
from mplang.edsl.graph import communicates
from mplang.edsl.serde import encode_graph_bundle
from mplang.transport.admission import ROUTES
from mplang.transport.mux import ALPN, FRAME, MAX_HEAD
from mplang.transport.mux_client import SPEC_HEADER, host_port
from mplang.transport.wire import encode_value_bytes
from mplang.worker.messages import H_EXEC, H_KEY, H_LINK, H_PROGRAM
from tests.security import worker_api_fuzz as api
from tests.worker import memory_workload, mux_wire, support

TARGET = 0
STALL, HANDSHAKE = 2.0, 1.0
WORKER_ARGS = ["--timeout", "10", "--stall-seconds", str(STALL),
               "--handshake-seconds", str(HANDSHAKE)]
QUIET = 0.03
"""How long to wait for answers a case may not get (seconds)."""
PROBE_LIMIT = 1.0
"""The longest a probe may take (seconds)."""
OUTSIDER_SOURCE = "127.0.0.2"
"""Plain-TCP outsiders connect from here (the listed parties use 127.0.0.1)."""
HEAD, DATA = 1, 2
SIZES = (0, 1, 7, 100, 4096, 1 << 16, 1 << 20, 64 << 20, (1 << 31) - 1, 1 << 31, 1 << 40,
         (1 << 63) - 1, (1 << 64) - 1)
"""Body sizes a HEAD announces."""
WEIRD: tuple[Any, ...] = (None, True, 0, -1, 2**64, -(2**63), 10**40, 1.5, float("nan"),
                          float("inf"), "", "x" * 5000, "é☃\U0001f600", "\x00", "/", [],
                          [1, "a"], {}, {"a": {"b": [None]}})
"""JSON values of every type, sizes and signs (for fields that expect something else)."""
BAD_PATHS: tuple[Any, ...] = ("", "/", "msg", "/msg/", "//run", "/RUN", "/health?x=1",
                              "/" + "a" * 300, "/é", "/run\x00", "/../run", 5, None,
                              ["/run"], {"path": "/run"})


@dataclass
class Case:
    """One fuzzed message (or burst of frames) and what answers it should get."""

    kind: str
    who: str
    data: bytes
    paths: dict[int, str] = field(default_factory=dict)
    """The path of each stream it opens."""
    expect: tuple[int, ...] = ()
    """The streams it waits for: complete requests, which all get an answer (but an
    accepted ``/msg``)."""
    wait: float = QUIET
    """How long to wait for its answers (seconds)."""
    keep: bool = True
    """Whether the connection is in step after it (else it is closed after the case)."""


@dataclass
class Finding:
    rule: str
    kind: str
    who: str
    detail: str
    data: bytes = b""

    def describe(self) -> str:
        sent = self.data[:160].hex() + ("..." if len(self.data) > 160 else "")
        return f"[{self.rule}] {self.kind} as {self.who}: {self.detail}\n  sent {sent}"


@dataclass
class Waiting:
    """A run of two parties started on the worker, waiting there for the other's vote."""

    exec_id: str
    scope: str
    digest: str
    talkers: tuple[str, ...]


# ---------------------------------------------------------------- a listed party's connection


class Connection:
    """A raw ``mplang/1`` connection to the target; reads the worker's answers as they
    come (HEAD and body, by stream)."""

    def __init__(self, sock: ssl.SSLSocket):
        self.sock = sock
        self.closed = False
        self.buffer = bytearray()
        self.next_stream = 1
        self.bodies: dict[int, tuple[dict[str, Any], int, bytearray]] = {}
        self.answers: dict[int, tuple[dict[str, Any], bytes]] = {}
        self.opened: dict[int, tuple[str, Case]] = {}
        """The path and case of each stream sent (answers may come during a later case)."""

    def stream(self) -> int:
        self.next_stream += 2
        return self.next_stream

    def send(self, data: bytes) -> bool:
        """Write ``data``; False if the worker closed the connection, raises TimeoutError
        if the write blocks for 10 s."""
        self.sock.settimeout(10)
        try:
            self.sock.sendall(data)
        except TimeoutError:
            raise
        except OSError:
            self.closed = True
        return not self.closed

    def pump(self, done: Callable[[], bool], wait: float) -> None:
        """Read answers until ``done()``, the connection closes or ``wait`` seconds pass."""
        deadline = time.monotonic() + wait
        self.sock.settimeout(0.0)
        while not self.closed and not done():
            left = deadline - time.monotonic()
            if not self.sock.pending():
                readable, _, _ = select.select([self.sock], [], [], max(left, 0.0))
                if not readable:
                    return
            try:
                chunk = self.sock.recv(1 << 16)
            except (ssl.SSLWantReadError, BlockingIOError):
                if left <= 0:
                    return
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self.buffer += chunk
            self._frames()

    def _frames(self) -> None:
        while len(self.buffer) >= 9:
            kind, stream, length = struct.unpack_from("!BII", self.buffer)
            if len(self.buffer) < 9 + length:
                return
            payload = bytes(self.buffer[9:9 + length])
            del self.buffer[:9 + length]
            if kind == HEAD:
                (size,) = struct.unpack_from("!Q", payload)
                head = json.loads(payload[8:])
                if size == 0:
                    self.answers[stream] = (head, b"")
                else:
                    self.bodies[stream] = (head, size, bytearray())
            elif stream in self.bodies:
                head, size, body = self.bodies[stream]
                body += payload
                if len(body) >= size:
                    del self.bodies[stream]
                    self.answers[stream] = (head, bytes(body))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        self.closed = True


# ---------------------------------------------------------------- the prober


def _probe_program() -> Any:
    x = simp.pcall((0,), lambda v: v + 1, simp.constant((0,), np.int32(41)))
    return simp.shuffle_static(x, {2: 0})


class Prober(threading.Thread):
    """The real driver, in turn: a program across node_0 and node_2 (fetched on node_2),
    and node_0's ``/health`` over HTTP/1.1; each timed."""

    def __init__(self, driver: mp.Driver, dev: support.DevCluster, pause: float = 0.05):
        super().__init__(daemon=True, name="mux-fuzz-prober")
        self.driver, self.dev, self.pause = driver, dev, pause
        self.program = mp.compile(_probe_program, world_size=3)
        self.latencies: dict[str, list[float]] = {"program": [], "health": []}
        self.errors: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with self.dev.client("driver", TARGET) as client:
            turn = 0
            while not self.halt.is_set():
                turn += 1
                what = "program" if turn % 2 else "health"
                start = time.monotonic()
                try:
                    if what == "program":
                        got = mp.fetch(self.driver, mp.evaluate(self.driver, self.program))[2]
                        ok = got is not None and int(got) == 42
                    else:
                        ok = client.get("/health").status_code == 200
                    if not ok:
                        self.errors.append(f"{what} gave a wrong answer")
                except Exception as e:
                    self.errors.append(f"{what}: {type(e).__name__}: {e}")
                self.latencies[what].append(time.monotonic() - start)
                self.halt.wait(self.pause)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for what, values in self.latencies.items():
            ordered = sorted(values) or [0.0]
            out[what] = {"probes": len(values), "max_s": round(ordered[-1], 3),
                         "p50_s": round(ordered[len(ordered) // 2], 3),
                         "p99_s": round(ordered[int(len(ordered) * 0.99)], 3)}
        out["errors"] = len(self.errors)
        return out

    @property
    def worst(self) -> float:
        return max((max(v) for v in self.latencies.values() if v), default=0.0)


# ---------------------------------------------------------------- the campaign


class Campaign:
    """Fuzz worker ``node_0`` of ``cluster`` (a `LocalCluster` of the dev cluster ``dev``)."""

    def __init__(self, dev: support.DevCluster, cluster: LocalCluster, driver: mp.Driver):
        self.dev, self.cluster, self.driver = dev, cluster, driver
        self.digest = dev.spec.digest()
        self.host, self.port = host_port(dev.spec.nodes[TARGET].endpoint)
        self.programs, self.uris, self.seed = api.real_programs(driver)
        self.alone = [p for p in self.programs if p.parties == [TARGET]]
        receiving = mp.compile(lambda: simp.shuffle_static(
            simp.constant((1,), np.arange(4)), {0: 1}), world_size=3).graph
        self.receiving = api.Program("from_party_1", encode_graph_bundle(receiving, {}),
                                     [0, 1], 0, tuple(str(i) for i, op in
                                                      enumerate(receiving.operations)
                                                      if communicates(op)))
        self.values = [*api.encoded_values(), encode_value_bytes(np.arange(4))]
        self.waiting: list[Waiting] = []
        self.hellos = [self._client_hello() for _ in range(4)]
        self.connections: dict[str, Connection | None] = {"node_1": None, "driver": None}
        self.outsiders: list[tuple[socket.socket, str, float]] = []
        self.rnd = random.Random(0)
        self.cases = 0
        self.by_kind: collections.Counter[str] = collections.Counter()
        self.by_outcome: collections.Counter[str] = collections.Counter()
        self.by_answer: collections.Counter[str] = collections.Counter()
        self.by_reason: collections.Counter[str] = collections.Counter()
        """Answers by path, status and the error's first words (ids and numbers dropped)."""
        self.findings: list[Finding] = []
        self.seconds = 0.0
        self.rss_curve: dict[int, float] = {}
        """node_0's RSS (MiB) after every 1,000 cases."""

    # -- connections
    def _connection(self, who: str) -> Connection | None:
        conn = self.connections[who]
        if conn is not None and not conn.closed:
            return conn
        try:
            conn = Connection(mux_wire.connect(self.cluster, who, TARGET))
        except (OSError, AssertionError) as e:
            self.findings.append(Finding("connect", "connect", who, f"{type(e).__name__}: {e}"))
            conn = None
        self.connections[who] = conn
        return conn

    def _client_hello(self) -> bytes:
        """The first flight of a TLS client offering ``mplang/1`` (as the outsider)."""
        cert = self.dev.spec.nodes[TARGET].certificate
        assert cert is not None
        context = self.dev.identity(support.STRANGER).client_context(cert)
        context.set_alpn_protocols([ALPN])
        tls = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(),
                               server_hostname=self.host)
        with contextlib.suppress(ssl.SSLWantReadError):
            tls.do_handshake()
        return outgoing.read()

    # -- drawing cases
    def _path(self, rnd: random.Random) -> Any:
        return rnd.choice(list(ROUTES)) if rnd.random() < 0.75 else rnd.choice(BAD_PATHS)

    def _headers(self, rnd: random.Random) -> Any:
        if rnd.random() < 0.06:
            return rnd.choice(WEIRD)
        headers: dict[str, Any] = {}
        if rnd.random() < 0.85:
            headers[SPEC_HEADER] = self.digest if rnd.random() < 0.8 else rnd.choice(
                [self.digest[:-1] + "0", "", "x" * 5000, *WEIRD])
        waiting = rnd.choice(self.waiting) if self.waiting else None
        choices: dict[str, list[Any]] = {
            H_EXEC: [uuid.uuid4().hex, "x" * 129, "a b", "é", waiting.exec_id if waiting
                     else "e", *WEIRD],
            H_KEY: ["/0", "/1", "/", "", "0", "/" * 2000, "/é", *WEIRD],
            H_PROGRAM: [self.receiving.digest, "0" * 64, "", "x" * 5000, *WEIRD],
            H_LINK: ["0", "1", "2", *WEIRD],
        }
        for name, values in choices.items():
            if rnd.random() < 0.6:
                headers[name] = rnd.choice(values)
        if rnd.random() < 0.05:
            headers.update({f"h{i}": "v" for i in range(rnd.choice([33, 300]))})
        if rnd.random() < 0.05:
            headers[rnd.choice(["é", "k" * 100, "", "X-MPLANG-SPEC"])] = rnd.choice(
                ["v", "é", "v" * 5000])
        return headers

    def _body(self, rnd: random.Random) -> bytes:
        bundles = [p.bundle for p in self.programs]
        header = {k: rnd.choice([*WEIRD, "", "/s", uuid.uuid4().hex, [0], [0, 1]])
                  for k in rnd.sample(["exec", "scope", "inputs", "parties", "timeout", "uri",
                                       "uris", "reason", "name", "what", "inline", "votes",
                                       "trace", "whole"], rnd.randint(0, 5))}
        return rnd.choice([
            lambda: rnd.randbytes(rnd.randint(0, 300)),
            lambda: api.mpv1(header, rnd.choice([b"", rnd.choice(bundles),
                                                 api.mutate(rnd, rnd.choice(bundles)),
                                                 rnd.choice(self.values)])),
            lambda: rnd.choice(self.values),
            lambda: api.mutate(rnd, rnd.choice(self.values)),
        ])()

    def _request(self, conn: Connection, path: str, body: bytes,
                 headers: dict[str, str] | None = None, stream: int | None = None
                 ) -> tuple[int, list[bytes]]:
        """A valid request's frames: its HEAD, then DATA frames of random sizes."""
        stream = conn.stream() if stream is None else stream
        frames = [mux_wire.head(stream, len(body), {
            "path": path, "headers": {SPEC_HEADER: self.digest, **(headers or {})}})]
        offset = 0
        while offset < len(body):
            n = min(len(body) - offset, self.rnd.choice([1, 100, 4096, FRAME]))
            frames.append(mux_wire.data(stream, body[offset:offset + n]))
            offset += n
        return stream, frames

    def _run_body(self, rnd: random.Random, program: api.Program, mutated: bool,
                  **fields: Any) -> bytes:
        header = {"exec": uuid.uuid4().hex, "scope": rnd.choice(["", "/s1"]),
                  "inputs": [rnd.choice(self.uris) for _ in range(program.inputs)],
                  "parties": program.parties, "progress": False, **fields}
        bundle = api.mutate(rnd, program.bundle) if mutated else program.bundle
        return api.mpv1(header, bundle)

    def listed(self, rnd: random.Random, conn: Connection, who: str, kind: str) -> Case:
        """A fuzzed case of ``kind`` for a listed party's connection."""
        s = conn.stream()
        if kind == "garbage":
            return Case(kind, who, rnd.randbytes(rnd.randint(1, 400)), keep=False)
        if kind == "hostile_head":
            size = rnd.choice(SIZES)
            path = self._path(rnd)
            head = {"path": path, "headers": self._headers(rnd)}
            for _ in range(rnd.choice([0, 0, 1, 3])):
                head[rnd.choice(["pad", "path2", "é", "size"])] = rnd.choice(WEIRD)
            body = self._body(rnd)
            if size <= 1 << 16 and rnd.random() < 0.7:
                size = len(body)
            frames = [mux_wire.head(s, size, head)]
            complete = size == len(body)
            sent = body if complete else body[:max(0, min(len(body), size - 1))]
            if sent:
                frames.append(mux_wire.data(s, sent))
            return Case(kind, who, b"".join(frames), {s: str(path)[:20]},
                        (s,) if complete and path != "/msg" else (),
                        wait=0.5 if complete else QUIET, keep=complete)
        if kind == "bad_head":
            text = rnd.choice([
                b"not json", b"[]", b'"a"', b"1", b"null", b"{", b'{"path": "/health"',
                b"\xff\xfe{}", b'{"path": NaN, "headers": {}}',
                b'{"path": "/health", "headers": {}, "n": ' + b"9" * 5000 + b"}",
                b'{"path": "/health", "headers": {}, "d": ' + b"[" * 30000 + b"]" * 30000 + b"}",
                b'{"a": ' * 9000 + b"1" + b"}" * 9000,
                b'{"path": "/health", "path": "/run", "headers": {}}',
                json.dumps({"path": "/health", "headers": {}, "pad": "x" * MAX_HEAD}).encode(),
            ])
            frame = mux_wire.head(s, rnd.choice(SIZES), text)
            if rnd.random() < 0.3:  # a lying length: under 8 bytes, or over the limit
                length = rnd.choice([0, 1, 7, 8, 8 + MAX_HEAD + 1, (1 << 32) - 1])
                frame = struct.pack("!BII", HEAD, s, length) + frame[9:9 + min(length, 64)]
            return Case(kind, who, frame, keep=False)
        if kind == "truncated":
            path = rnd.choice(list(ROUTES))
            _, frames = self._request(conn, path, self._body(rnd), stream=s)
            whole = b"".join(frames)
            return Case(kind, who, whole[:rnd.randrange(len(whole))], {s: path}, keep=False)
        if kind == "wrong_stream":
            _, frames = self._request(conn, "/health", b"x" * 10, stream=s)
            return Case(kind, who, rnd.choice([
                frames[0] + mux_wire.data(s + 2, b"x" * 10),  # DATA of another stream
                frames[0] + frames[0],  # a HEAD on an open stream
                b"".join(frames) + mux_wire.data(s, b"y"),  # DATA after the body ended
                frames[0][:1] + struct.pack("!I", 0) + frames[0][5:],  # stream 0 (valid)
            ]), keep=False)
        if kind == "data_without_head":
            return Case(kind, who, mux_wire.data(s, rnd.randbytes(rnd.randint(0, 100))),
                        keep=False)
        if kind == "overlong":
            n = rnd.randint(1, 100)
            opening = mux_wire.head(s, n, {"path": "/health",
                                           "headers": {SPEC_HEADER: self.digest}})
            return Case(kind, who, rnd.choice([
                opening + mux_wire.data(s, b"z" * (n + rnd.randint(1, 50))),
                opening + mux_wire.data(s, b"z" * n) + mux_wire.data(s, b"z"),
                mux_wire.head(s, 1 << 20, {"path": "/run", "headers": {SPEC_HEADER: self.digest}})
                + mux_wire.data(s, b"z" * (FRAME + 1)),
            ]), keep=False)
        if kind == "unknown_kind":
            return Case(kind, who, mux_wire.frame(rnd.choice([0, 3, 255]), s, b"abc"), keep=False)
        if kind == "interleaved":
            chosen = rnd.sample([
                ("/health", b""), ("/delete", api.mpv1({"uris": []})),
                ("/fetch", api.mpv1({"uri": "mem://node_0/none"})),
                ("/abort", api.mpv1({"exec": uuid.uuid4().hex, "reason": "fuzz"})),
                ("/describe", api.mpv1({"what": "object", "name": "v"})),
                ("/run", self._run_body(rnd, rnd.choice(self.alone), False))],
                rnd.randint(2, 4))
            requests = [self._request(conn, path, body) for path, body in chosen]
            return Case(kind, who, b"".join(_interleave(rnd, [f for _, f in requests])),
                        {stream: path for (stream, _), (path, _) in zip(requests, chosen,
                                                                        strict=True)},
                        tuple(stream for stream, _ in requests), wait=3.0)
        if kind == "program":
            if rnd.random() < 0.3:  # it waits for party 1's vote: its answer comes later
                body = self._run_body(rnd, self.receiving, False, timeout=2.0)
                header = json.loads(body[8:8 + int.from_bytes(body[4:8], "little")])
                self.waiting = [*self.waiting[-31:], Waiting(
                    header["exec"], header["scope"], self.receiving.digest,
                    self.receiving.talkers)]
                stream, frames = self._request(conn, "/run", body, stream=s)
                return Case(kind, who, b"".join(frames), {stream: "/run"})
            program = rnd.choice(self.alone if rnd.random() < 0.5 else self.programs)
            body = self._run_body(rnd, program, rnd.random() < 0.6, timeout=2.0)
            stream, frames = self._request(conn, "/run", body, stream=s)
            return Case(kind, who, b"".join(frames), {stream: "/run"}, (stream,), wait=3.0)
        assert kind == "message"
        headers = {H_EXEC: uuid.uuid4().hex, H_KEY: "/0", H_PROGRAM: "", H_LINK: "0"}
        if self.waiting and rnd.random() < 0.8:
            waiting = rnd.choice(self.waiting)
            headers[H_EXEC] = waiting.exec_id
            headers[H_KEY] = waiting.scope + "/" + rnd.choice(
                [*waiting.talkers, *waiting.talkers, "0", "k" * 100])
            headers[H_PROGRAM] = rnd.choice([waiting.digest] * 3 + ["0" * 64, ""])
            headers[H_LINK] = rnd.choice(["0", "0", "1"])
        body = rnd.choice([self.values[-1], self.values[-1], rnd.choice(self.values),
                           api.mutate(rnd, rnd.choice(self.values))])
        stream, frames = self._request(conn, "/msg", body, headers, stream=s)
        return Case(kind, who, b"".join(frames), {stream: "/msg"}, wait=QUIET)

    # -- sending cases
    def one_listed(self, rnd: random.Random) -> None:
        kind = rnd.choices(LISTED_KINDS, LISTED_WEIGHTS)[0]
        usual = {"message": "node_1", "program": "driver"}.get(kind)
        who = usual if usual and rnd.random() < 0.9 else rnd.choice(["node_1", "driver"])
        conn = self._connection(who)
        if conn is None:
            return
        case = self.listed(rnd, conn, who, kind)
        self.by_kind[kind] += 1
        conn.opened.update((stream, (path, case)) for stream, path in case.paths.items())
        try:
            conn.send(case.data)
        except TimeoutError:
            self.findings.append(Finding("blocked", case.kind, who,
                                         "a write blocked for 10 s", case.data))
            conn.close()
            return
        conn.pump(lambda: bool(case.expect) and all(s in conn.answers for s in case.expect),
                  case.wait)
        for stream, path in case.paths.items():
            if stream not in conn.answers and path == "/msg" and not conn.closed:
                self.by_answer["/msg none (admitted)"] += 1
        statuses = []
        for stream in list(conn.answers):
            head, body = conn.answers.pop(stream)
            path, opener = conn.opened.pop(stream, ("?", case))
            statuses.append(self._answer(opener, path, head, body))
        if statuses:
            self.by_outcome[f"answered {max(statuses) // 100}xx"] += 1
        elif conn.closed:
            self.by_outcome["closed by the worker"] += 1
        else:
            self.by_outcome["no answer"] += 1
        if not case.keep:
            conn.close()

    def _answer(self, case: Case, path: str, head: dict[str, Any], body: bytes) -> int:
        status = head.get("status")
        if not isinstance(status, int):
            self.findings.append(Finding("answer", case.kind, case.who, f"answer {head}",
                                         case.data))
            return 0
        self.by_answer[f"{path} {status}"] += 1
        error = _json(body).get("error")
        if isinstance(error, str):
            words = re.sub(r"[0-9a-f]{8,}\S*|\d+|'[^']*'", "#", error).split()[:8]
            self.by_reason[f"{path} {status} {' '.join(words)}"] += 1
        if status >= 500:
            kind = _json(body).get("kind")
            if not (status == 500 and kind in api.MPLANG_ERRORS and path == "/run"):
                self.findings.append(Finding("5xx", case.kind, case.who,
                                             f"{status} on {path}: {body[:300]!r}", case.data))
        return status

    def one_outsider(self, rnd: random.Random) -> None:
        kind = rnd.choice(["outsider_tls", "tcp_garbage", "partial_tls"])
        self.by_kind[kind] += 1
        if kind == "outsider_tls":
            self._stranger(rnd)
            return
        if kind == "tcp_garbage":
            data = rnd.choice([
                rnd.randbytes(rnd.randint(1, 600)), b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
                mux_wire.head(1, 0, {"path": "/health", "headers": {}}),
                b"\x16\x03\x01\xff\xff" + rnd.randbytes(100),  # a TLS record of 64 KiB announced
            ])
        else:
            hello = rnd.choice(self.hellos)
            data = rnd.choice([hello[:rnd.randrange(1, len(hello))], api.mutate(rnd, hello),
                               hello])
        while len(self.outsiders) >= 24:
            self.poll_outsiders(0.05)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind((OUTSIDER_SOURCE, 0))
            sock.settimeout(5)
            sock.connect((self.host, self.port))
            sock.sendall(data)
        except OSError as e:  # the worker closed it already
            self.by_outcome[f"outsider: {type(e).__name__}"] += 1
            sock.close()
            return
        self.outsiders.append((sock, kind, time.monotonic()))

    def _stranger(self, rnd: random.Random) -> None:
        """A certificate no spec lists, speaking ``mplang/1``: refused."""
        try:
            sock = support.tls_socket(self.dev, support.STRANGER, TARGET, ALPN)
        except OSError:
            self.by_outcome["outsider: refused in the handshake"] += 1
            return
        with sock:
            conn = Connection(sock)
            case = self.listed(rnd, conn, support.STRANGER,
                               rnd.choices(LISTED_KINDS, LISTED_WEIGHTS)[0])
            with contextlib.suppress(OSError):
                conn.send(case.data)
            conn.pump(lambda: False, 1.0)
            if conn.answers:
                self.findings.append(Finding("identity", case.kind, support.STRANGER,
                                             f"answered: {conn.answers}", case.data))
            self.by_outcome["outsider: closed after the handshake" if conn.closed
                            else "outsider: left open"] += 1

    def poll_outsiders(self, wait: float = 0.0) -> None:
        """Count the outsiders' connections the worker closed; one still open after the
        handshake timeout (and a margin) is a finding."""
        if not self.outsiders:
            return
        readable, _, _ = select.select([s for s, _, _ in self.outsiders], [], [], wait)
        still = []
        for sock, kind, start in self.outsiders:
            if sock in readable:
                try:
                    data = sock.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:
                    self.by_outcome["outsider: closed by the worker"] += 1
                    sock.close()
                    continue
                if not data.startswith(b"\x15") and not data.startswith(b"\x16"):
                    self.findings.append(Finding("outsider", kind, "tcp",
                                                 f"got {data[:100]!r}"))
            if time.monotonic() - start > HANDSHAKE + 3:
                self.findings.append(Finding("outsider", kind, "tcp",
                                             f"still open after {HANDSHAKE + 3:g} s"))
                sock.close()
                continue
            still.append((sock, kind, start))
        self.outsiders = still

    def run(self, cases: int, seed: int = 0, outsiders: float = 0.12) -> None:
        """Send ``cases`` cases, a share ``outsiders`` of them from outsiders."""
        rnd = self.rnd
        rnd.seed(seed)
        start = time.monotonic()
        for i in range(cases):
            if rnd.random() < outsiders:
                self.one_outsider(rnd)
            else:
                self.one_listed(rnd)
            self.cases += 1
            if i % 50 == 0:
                self.poll_outsiders()
            if self.cases % 1000 == 0:
                self.rss_curve[self.cases] = rss_mib(self.cluster)[f"node_{TARGET}"]
        deadline = time.monotonic() + HANDSHAKE + 3.5
        while self.outsiders and time.monotonic() < deadline:
            self.poll_outsiders(0.2)
        self.poll_outsiders()
        for conn in self.connections.values():
            if conn is not None:
                conn.close()
        self.seconds += time.monotonic() - start

    def summary(self) -> dict[str, Any]:
        return {"cases": self.cases, "seconds": round(self.seconds, 1),
                "findings": len(self.findings), "by_kind": dict(self.by_kind.most_common()),
                "by_outcome": dict(self.by_outcome.most_common()),
                "by_answer": dict(self.by_answer.most_common()),
                "by_reason": dict(self.by_reason.most_common(40)),
                "node_0_rss_mib_by_cases": self.rss_curve}


LISTED_KINDS, LISTED_WEIGHTS = zip(*[
    ("garbage", 8), ("hostile_head", 30), ("bad_head", 10), ("truncated", 7),
    ("wrong_stream", 7), ("data_without_head", 3), ("overlong", 7), ("unknown_kind", 3),
    ("interleaved", 8), ("program", 12), ("message", 12)], strict=True)


def _interleave(rnd: random.Random, requests: list[list[bytes]]) -> list[bytes]:
    """The frames of ``requests`` in a random order that keeps each request's own."""
    queues = [list(frames) for frames in requests]
    out = []
    while any(queues):
        queue = rnd.choice([q for q in queues if q])
        out.append(queue.pop(0))
    return out


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def rss_mib(cluster: LocalCluster) -> dict[str, float]:
    """Each worker's VmRSS (MiB; 0 if it exited)."""
    return {name: round(memory_workload.rss_kib(proc.pid) / 1024, 1) if proc.poll() is None
            else 0.0 for name, proc in cluster.processes.items()}


@contextlib.contextmanager
def campaign(tmp: Path) -> Iterator[tuple[Campaign, mp.Driver]]:
    """A 3-worker dev cluster (worker processes) under ``tmp`` and a campaign against it."""
    dev = support.dev_cluster(tmp, support.make_spec(support.free_ports(3)))
    with support.running_cluster(dev.spec_path, worker_args=WORKER_ARGS) as cluster, \
            support.connected_driver(cluster) as driver:
        yield Campaign(dev, cluster, driver), driver


def fuzz(tmp: Path, cases: int, seed: int = 0) -> dict[str, Any]:
    """A campaign of ``cases`` cases with the prober running; its summary (``findings``
    and ``problems`` list what broke a rule)."""
    with campaign(tmp) as (attack, driver):
        prober = Prober(driver, attack.dev)
        mp.evaluate(driver, prober.program)  # warm: the driver's connections are open
        before = rss_mib(attack.cluster)
        prober.start()
        try:
            attack.run(cases, seed)
        finally:
            prober.halt.set()
            prober.join(30)
        time.sleep(STALL + 0.5)  # bodies left unfinished are dropped
        after = rss_mib(attack.cluster)
        problems = api.cluster_problems(attack.cluster, attack.dev, driver)
        problems += [f"probe failed: {e}" for e in prober.errors[:10]]
        if prober.worst >= PROBE_LIMIT:
            problems.append(f"a probe took {prober.worst:.3f} s")
        return {**attack.summary(), "seed": seed, "probes": prober.summary(),
                "max_probe_s": round(prober.worst, 3), "rss_mib_before": before,
                "rss_mib_after": after,
                "alive": {n: p.poll() is None for n, p in attack.cluster.processes.items()},
                "problems": problems,
                "finding_details": [f.describe() for f in attack.findings[:20]]}
