"""Schemathesis over a real worker's HTTP API, over mutual TLS.

Cases come from the worker's OpenAPI document
(`mplang.worker.openapi.WORKER_API`) through schemathesis's Python
API (``schema.as_strategy`` in positive and negative generation modes), driven by
hypothesis. Request bodies (``application/octet-stream``) come from a strategy
registered with ``schemathesis.openapi.media_type``: random bytes, MPV1 frames
whose JSON header mixes plausible and hostile values of every field the worker
reads, real programs (graph bundles) and encoded values, byte-mutated copies of
both, malformed frames and bodies over the small endpoints' limits.

Each case is then sent by this harness (httpx; schemathesis's own transport
cannot pin a certificate) to worker ``node_0`` of a 3-worker `LocalCluster`:

- as a listed driver (``driver``, sometimes ``driver2``), for ``/msg`` as a
  node (``node_1``, sometimes ``node_2``), for ``/upload`` as ``node_0`` itself
  (the only node that may upload to it); a few cases use the wrong role (403)
  or ``mallory``, a certificate no spec lists (refused in the handshake);
- with the spec digest (most cases), with none, or with what schemathesis drew
  (a different or malformed digest: 409);
- some bodies are replaced by stateful ones built from the worker's answers:
  runs of real programs (a run of several parties is sent in the background with a
  2-second time limit: it waits for votes that never come), messages into those
  waiting runs (with their program digest), fetches and deletes of objects earlier
  runs made, aborts of known executions; a few are sent chunked (no content-length:
  411).

Checks per case: schemathesis's ``status_code_conformance``,
``content_type_conformance`` and ``response_schema_conformance`` against the
document; no 5xx except a 500 from ``/run`` whose JSON body names an MPLang error
``kind`` (a program that failed to execute); the refusal each forged identity or
spec header must get; no transport error for a listed party (a reset or a hang
would be a crash). After the campaign: every worker process alive, its log free
of tracebacks, ``/health`` answering, and a real program (a pcall and a shuffle
between parties) giving the right value.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import random
import re
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.failures import FailureGroup
from schemathesis.core.media_types import MEDIA_TYPE_STRATEGIES
from schemathesis.core.result import Err, Ok

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster
from mplang.edsl import errors
from mplang.edsl.graph import Graph, communicates
from mplang.edsl.serde import encode_graph_bundle
from mplang.transport.mux_client import SPEC_HEADER
from mplang.transport.wire import encode_value_bytes, split_frame
from mplang.worker.openapi import worker_api
from tests.worker import support

TARGET = 0
"""The fuzzed worker's rank."""
MEDIA = "application/octet-stream"
MPLANG_ERRORS = frozenset(name for name, obj in vars(errors).items()
                          if isinstance(obj, type) and issubclass(obj, errors.MPLangError))
"""Error kinds a failed ``/run`` may name in its 500 answer."""
DRIVER_PATHS = ("/prepare", "/run", "/fetch", "/delete", "/abort", "/close", "/describe")
SCHEMA_CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


def _right_role(who: str, path: str) -> bool:
    """Whether ``who`` may use ``path``: nodes send ``/msg``, the target's own node
    ``/upload``, drivers the rest."""
    if path == "/upload":
        return who == f"node_{TARGET}"
    return who.startswith("node") == (path == "/msg")


# ---------------------------------------------------------------- corpora


@dataclass
class Program:
    """A program the fuzzer may run on the target: its bundle, digest and run header."""

    name: str
    bundle: bytes
    parties: list[int]
    inputs: int
    talkers: tuple[str, ...] = ()
    """Key segments (op indices) of its ops that exchange messages."""

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.bundle).hexdigest()


def real_programs(driver: mp.Driver) -> tuple[list[Program], list[str], Any]:
    """Programs party 0 can run without waiting for anyone (alone, or sending only), the
    URIs of a few objects ``driver`` made on party 0 (inputs for them), and their handle
    (the objects live while it does: the driver deletes an object its handle forgets)."""
    def compiled(fn: Callable[..., Any], *args: Any) -> Graph:
        return mp.compile(fn, *args, world_size=3).graph

    seed = mp.evaluate(driver, lambda: simp.constant((0,), np.arange(6, dtype=np.int32)))
    uri = seed.var.uris[TARGET]
    assert uri is not None
    graphs = [
        ("local", compiled(lambda: simp.pcall((0,), lambda v: v + 1, simp.constant((0,), 5))),
         [0], 0),
        ("constant", compiled(lambda: simp.constant((0,), np.ones((4, 4), np.float32))), [0], 0),
        ("to_party_1", compiled(lambda: simp.shuffle_static(simp.constant((0,), 7), {1: 0})),
         [0, 1], 0),
        ("to_all", compiled(lambda: simp.shuffle_static(
            simp.constant((0,), np.arange(3.0)), {1: 0, 2: 0})), [0, 1, 2], 0),
        ("large", compiled(lambda: simp.pcall((0,), lambda v: v * 2.0,
                                              simp.constant((0,), np.ones(1000, np.float32)))),
         [0], 0),
        ("with_input", compiled(lambda x: simp.pcall((0,), lambda v: v * 3, x), seed), [0], 1),
    ]
    programs = [Program(name, encode_graph_bundle(g, {}), parties, n,
                        tuple(str(i) for i, op in enumerate(g.operations) if communicates(op)))
                for name, g, parties, n in graphs]
    assert programs[-1].inputs == len(compiled(lambda x: x, seed).inputs)
    return programs, [uri], seed


def encoded_values() -> list[bytes]:
    """Encoded values (``/msg`` bodies, value payloads)."""
    values: list[Any] = [None, 0, -1, 2**63 - 1, 1.5, float("nan"), b"", b"\x00" * 40,
                         np.arange(5, dtype=np.int64), np.zeros((2, 3), np.float32),
                         np.array(True), np.float32(2.5), np.zeros(0, np.int8),
                         np.ones((64, 64), np.float64), [1, np.arange(3)]]
    return [encode_value_bytes(v) for v in values]


# ---------------------------------------------------------------- body strategies


def mpv1(header: Any, payload: bytes = b"") -> bytes:
    """An MPV1 frame of any JSON-able header (even a non-object), like `pack_message`."""
    text = json.dumps(header, allow_nan=True).encode()
    return b"MPV1" + len(text).to_bytes(4, "little") + text + payload


_WEIRD_VALUES = (st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                 st.text(max_size=12), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
_WEIRD = st.one_of(*_WEIRD_VALUES)
"""Any JSON value (each field also gets values of the wrong type)."""
_EXEC = st.one_of(st.uuids().map(lambda u: u.hex),
                  st.from_regex(r"[A-Za-z0-9_.:-]{1,8}", fullmatch=True),
                  st.text(max_size=20), st.just("x" * 129), *_WEIRD_VALUES)
_SCOPE = st.one_of(st.just(""), st.just("/s1"), st.just("s1"), st.text(max_size=10),
                   st.just("/" * 2000), *_WEIRD_VALUES)
_URI = st.one_of(st.just("mem://node_0/" + "0" * 32), st.text(max_size=40),
                 st.just("x" * 300), *_WEIRD_VALUES)
_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "exec": _EXEC,
    "scope": _SCOPE,
    "inputs": st.one_of(st.just([]), st.lists(st.one_of(st.none(), _URI), max_size=3),
                        st.lists(st.text(min_size=257, max_size=260), max_size=1), _WEIRD),
    "parties": st.one_of(st.just([0]), st.just([0, 1]), st.just([0, 1, 2]),
                         st.lists(st.integers(-3, 5), max_size=4), st.just([True]),
                         st.just([0.0]), _WEIRD),
    "timeout": st.one_of(st.just(0.5), st.just(5), st.just(0), st.just(-1), st.just(86401),
                         st.just(float("inf")), st.just(True), _WEIRD),
    "parallel": _WEIRD,
    "progress": _WEIRD,
    "uri": _URI,
    "uris": st.one_of(st.lists(st.one_of(st.none(), _URI), max_size=4), _WEIRD),
    "reason": st.one_of(st.text(max_size=30), st.just("r" * 5000), _WEIRD),
    "kind": st.one_of(st.sampled_from(["none", "scalar", "bytes", "list", "ndarray",
                                       "share"]), _WEIRD),
}


def _header() -> st.SearchStrategy[Any]:
    known = st.fixed_dictionaries({}, optional=_FIELDS)
    extra = st.dictionaries(st.text(max_size=6), _WEIRD, max_size=2)
    merged = st.builds(lambda a, b: {**b, **a}, known, extra)
    return _weighted((merged, 4), (_WEIRD, 1))


def _weighted(*options: tuple[st.SearchStrategy[Any], int]) -> st.SearchStrategy[Any]:
    """One of ``options`` with the given weights (``st.one_of`` flattens nested
    strategies and drops repeated branches, so it cannot weigh)."""
    table = [strategy for strategy, weight in options for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


@st.composite
def _mutated(draw: st.DrawFn, seeds: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "byte", "truncate", "insert", "delete", "len"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if how == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif how == "byte" and data:
            data[pos] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
        elif how == "truncate":
            del data[pos:]
        elif how == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif how == "delete":
            del data[pos:pos + draw(st.integers(1, 16))]
        elif how == "len" and len(data) >= 8:  # the frame's header length
            data[4:8] = draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, len(data)])).to_bytes(
                4, "little")
    return bytes(data)


def frames(programs: list[Program], values: list[bytes]) -> st.SearchStrategy[bytes]:
    """Frames with a drawn header (every field the worker reads) and payload."""
    bundles = [p.bundle for p in programs]
    payload = st.one_of(st.just(b""), st.binary(max_size=64), st.sampled_from(bundles),
                        st.sampled_from(values), _mutated(bundles))
    return st.builds(mpv1, _header(), payload)


def mutate(rnd: random.Random, data: bytes) -> bytes:
    """``data`` with 1 to 4 byte edits (flips, interesting bytes, cuts, insertions)."""
    out = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        pos = rnd.randrange(max(len(out), 1))
        how = rnd.choice(["flip", "byte", "truncate", "insert", "delete"])
        if how == "flip" and out:
            out[pos] ^= 1 << rnd.randrange(8)
        elif how == "byte" and out:
            out[pos] = rnd.choice([0, 1, 0x7F, 0x80, 0xFF, ord("{"), ord('"')])
        elif how == "truncate":
            del out[pos:]
        elif how == "insert":
            out[pos:pos] = rnd.randbytes(rnd.randint(1, 16))
        else:
            del out[pos:pos + rnd.randint(1, 16)]
    return bytes(out)


def bodies(programs: list[Program], values: list[bytes]) -> st.SearchStrategy[bytes]:
    """Request bodies for any path of the worker."""
    bundles = [p.bundle for p in programs]
    frames_ = frames(programs, values)
    return _weighted(
        (st.binary(max_size=256), 1),
        (frames_, 4),
        (st.sampled_from(values), 1), (_mutated(values), 1),
        (_mutated([mpv1({"exec": "e", "scope": "", "inputs": [], "parties": [0]}, b)
                   for b in bundles]), 1),
        (st.sampled_from([b"MPV1", b"MPV1\xff\xff\xff\xff", b"MPV1\x02\x00\x00\x00[]",
                          b"MPV1\x04\x00\x00\x00null", b"MPV1\x01\x00\x00\x00{",
                          b"MPV1\x02\x00\x00\x00{}" + b"\x00" * 100]), 1),
        (st.integers(65 << 10, 80 << 10).map(lambda n: mpv1({"uri": "x" * n})), 1),
    )


# ---------------------------------------------------------------- the campaign


@dataclass
class Finding:
    """A case that broke a rule: what was sent and what came back."""

    rule: str
    detail: str
    method: str
    path: str
    who: str
    headers: dict[str, str]
    body: bytes
    status: int | None = None
    answer: str = ""

    @property
    def known(self) -> str | None:
        """The known issue this finding is an instance of, if any (see `KNOWN_ISSUES`)."""
        for name, matches in KNOWN_ISSUES.items():
            if matches(self):
                return name
        return None

    def describe(self) -> str:
        body = self.body[:200].hex() + ("..." if len(self.body) > 200 else "")
        known = f" (known: {self.known})" if self.known else ""
        return (f"[{self.rule}{known}] {self.method} {self.path} as {self.who}: {self.detail}\n"
                f"  status {self.status}, answer {self.answer[:300]!r}\n"
                f"  headers {self.headers}\n  body ({len(self.body)} bytes) {body}")


KNOWN_ISSUES: dict[str, Callable[[Finding], bool]] = {}
"""Findings already reported, by name (none open): the campaign counts them apart and
the CI test tolerates them; give each a strict-xfail regression test in
``test_worker_api_fuzz.py`` that flips when it is fixed (as ``exec-not-a-string``
had until 3a2cbaf)."""
KNOWN_TRACEBACKS: dict[str, str] = {}
"""Worker-log tracebacks of the known issues, by a line they contain."""


@dataclass
class Stats:
    cases: int = 0
    by_status: collections.Counter[str] = field(default_factory=collections.Counter)
    by_kind: collections.Counter[str] = field(default_factory=collections.Counter)
    by_reason: collections.Counter[str] = field(default_factory=collections.Counter)
    """Answers by path, status and the error's first words (ids and numbers dropped)."""
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def new_findings(self) -> list[Finding]:
        return [f for f in self.findings if f.known is None]

    def summary(self) -> dict[str, Any]:
        known = collections.Counter(f.known for f in self.findings if f.known)
        return {"cases": self.cases, "seconds": round(self.seconds, 1),
                "findings": len(self.new_findings), "known": dict(known),
                "by_status": dict(sorted(self.by_status.items())),
                "by_kind": dict(sorted(self.by_kind.items()))}


@dataclass
class Waiting:
    """A run of several parties sent to the worker, waiting there for votes."""

    exec_id: str
    scope: str
    program: Program


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _waits(body: bytes) -> bool:
    """Whether a ``/run`` body names several parties (its run waits for their votes)."""
    with contextlib.suppress(Exception):
        parties = split_frame(body)[0].get("parties")
        return isinstance(parties, list) and len(parties) > 1
    return False


class Campaign:
    """Fuzz worker ``node_0`` of ``cluster`` (a `LocalCluster` of a dev cluster ``dev``)."""

    def __init__(self, dev: support.DevCluster, cluster: LocalCluster, driver: mp.Driver,
                 *, request_timeout: float = 30.0):
        self.dev = dev
        self.cluster = cluster
        self.spec = dev.spec
        self.digest = self.spec.digest()
        self.url = self.spec.base_urls()[TARGET]
        self.request_timeout = request_timeout
        self.clients = {name: self._client(name) for name in (
            "driver", "driver2", "node_0", "node_1", "node_2", support.STRANGER)}
        self.ranks = {"node_0": 0, "node_1": 1, "node_2": 2}
        self.programs, self.uris, self.seed = real_programs(driver)
        self.values = encoded_values()
        self.waiting: list[Waiting] = []
        self.background = ThreadPoolExecutor(8, thread_name_prefix="fuzz-waiting-run")
        """Sends the runs of several parties, which wait for votes until their time limit."""
        self.execs: list[str] = []
        self.stats = Stats()
        self.schema = schemathesis.openapi.from_dict(worker_api())
        self._previous_media = MEDIA_TYPE_STRATEGIES.get(MEDIA)
        schemathesis.openapi.media_type(MEDIA, bodies(self.programs, self.values))
        self.frames = frames(self.programs, self.values)
        self.operations = operations(self.schema)
        self.rnd = random.Random(0)

    def _client(self, name: str) -> httpx.Client:
        pinned = self.spec.nodes[TARGET].certificate
        assert pinned is not None
        return httpx.Client(verify=self.dev.identity(name).client_context(pinned),
                            timeout=self.request_timeout)

    def close(self) -> None:
        self.background.shutdown(wait=True)
        for client in self.clients.values():
            client.close()
        if self._previous_media is None:
            MEDIA_TYPE_STRATEGIES.pop(MEDIA, None)
        else:
            MEDIA_TYPE_STRATEGIES[MEDIA] = self._previous_media

    # -- one case
    def _who(self, rnd: random.Random, path: str) -> str:
        roll = rnd.randrange(100)
        if path == "/health":
            return ["driver", "node_1", "node_2", support.STRANGER][roll % 4]
        if roll < 3:
            return support.STRANGER
        if roll < 8:  # the wrong role
            return "driver" if path in ("/msg", "/upload") else "node_1"
        if path == "/upload":
            return f"node_{TARGET}" if roll < 90 else "node_1"
        if path == "/msg":
            return "node_2" if roll < 20 else "node_1"
        return "driver2" if roll < 15 else "driver"

    def _stateful_body(self, rnd: random.Random, path: str,
                       headers: dict[str, str]) -> bytes | None:
        """A body (and for /msg headers) built from what the worker answered before."""
        if path == "/run":
            # a run of several parties waits for the others' votes (none come): its time
            # limit ends it; one on this party alone runs
            program = rnd.choice(self.programs)
            waits = program.parties != [TARGET]
            inputs: list[Any] = [rnd.choice([*self.uris, "mem://node_0/none"])
                                 for _ in range(program.inputs)]
            header: dict[str, Any] = {
                "exec": uuid.uuid4().hex, "scope": rnd.choice(["", "/s1"]),
                "inputs": inputs, "parties": program.parties, "progress": False,
                **({"timeout": 2.0} if waits else {"timeout": 5.0} if rnd.random() < 0.5
                   else {})}
            intact = rnd.random() < 0.7
            if waits and intact:
                self.waiting = [*self.waiting[-63:],
                                Waiting(header["exec"], header["scope"], program)]
                self.execs = [*self.execs[-63:], header["exec"]]
            return mpv1(header, program.bundle if intact else mutate(rnd, program.bundle))
        if path in ("/fetch", "/delete") and self.uris:
            uri = rnd.choice(self.uris)
            if path == "/fetch":
                return mpv1({"uri": uri})
            return mpv1({"uris": [uri, None]})
        if path == "/upload":
            return mpv1({"name": rnd.choice(["v", "w.1", "x" * 128, "../v"])},
                          rnd.choice(self.values))
        if path == "/describe":
            return mpv1(rnd.choice([{"what": "object", "name": "v"},
                                      {"what": "file", "path": "x.npy", "key": None},
                                      {"what": "file", "path": "../x.npy"}]))
        if path == "/abort" and self.execs:
            return mpv1({"exec": rnd.choice(self.execs), "reason": "fuzz"})
        if path == "/msg" and self.waiting:
            waiting = rnd.choice(self.waiting)
            headers["x-mplang-exec"] = waiting.exec_id
            talkers = [f"/{t}" for t in waiting.program.talkers]
            headers["x-mplang-key"] = waiting.scope + rnd.choice(
                [*talkers, *talkers, *(f"{t}/x" for t in talkers), "/0", "/" + "k" * 100])
            digest = waiting.program.digest
            headers["x-mplang-program"] = rnd.choice([digest, digest, digest[:-1] + "0", ""])
            headers["x-mplang-link"] = rnd.choice(["0", "1"])
            return rnd.choice(self.values)
        return None

    def one(self, data: st.DataObject) -> None:
        # The operation and mode come from one drawn seed (hypothesis needs what it draws
        # to depend on its draws alone); identity, spec header and stateful bodies from the
        # campaign's own seeded source: uniform, where hypothesis favours boundary values
        # and repeats itself.
        pick = random.Random(data.draw(st.integers(0, 2**32 - 1), label="operation"))
        operation = pick.choice(self.operations)
        negative = pick.random() < 0.25
        rnd = self.rnd
        # a frame drawn first, on hypothesis's whole budget: drawn inside the case (after
        # schemathesis's own draws) bodies come out much simpler
        frame = data.draw(self.frames, label="frame")
        case = data.draw(operation.as_strategy(
            generation_mode=GenerationMode.NEGATIVE if negative else GenerationMode.POSITIVE),
            label="case")
        path, method = case.operation.path, case.operation.method.upper()
        kwargs = case.as_transport_kwargs(base_url=self.url)
        headers = {k: v for k, v in kwargs.get("headers", {}).items()
                   if k.lower() != SPEC_HEADER}
        sent_digest = {k.lower(): v for k, v in kwargs.get("headers", {}).items()}.get(
            SPEC_HEADER)
        body = _as_bytes(kwargs.get("data"))
        if method == "POST" and pick.random() < 0.4:
            body = frame
        who = self._who(rnd, path)
        spec_mode = rnd.choice(["ok"] * 8 + ["drawn", "none"])
        if spec_mode == "ok":
            headers[SPEC_HEADER] = self.digest
        elif spec_mode == "drawn" and sent_digest is not None:
            headers[SPEC_HEADER] = sent_digest
        # /run mostly stateful: a run needs a well-formed program to get past the
        # refusals to the kernels
        if method == "POST" and rnd.random() < (0.8 if path == "/run" else 0.35):
            stateful = self._stateful_body(rnd, path, headers)
            body = body if stateful is None else stateful
        chunked = method == "POST" and rnd.random() < 0.025
        send = self.background.submit if path == "/run" and _waits(body) else _call
        send(self.send, case, method, path, who, headers, body, chunked,
             digest_ok=headers.get(SPEC_HEADER) == self.digest)

    def send(self, case: Any, method: str, path: str, who: str, headers: dict[str, str],
             body: bytes, chunked: bool, digest_ok: bool) -> None:
        stats = self.stats
        stats.cases += 1
        content: Any = iter([body]) if chunked else body

        def finding(rule: str, detail: str, status: int | None = None,
                    answer: str = "") -> None:
            stats.findings.append(Finding(rule, detail, method, path, who, dict(headers), body,
                                          status, answer))

        try:
            response = self.clients[who].request(method, self.url + path, headers=headers,
                                                 content=content)
        except (httpx.InvalidURL, httpx.LocalProtocolError, UnicodeEncodeError, ValueError):
            stats.by_status["unsendable"] += 1  # httpx refused the drawn header itself
            return
        except httpx.HTTPError as e:
            if who == support.STRANGER:
                stats.by_status["handshake refused"] += 1
                return
            stats.by_status["transport error"] += 1
            finding("transport", f"{type(e).__name__}: {e}")
            return
        status = response.status_code
        stats.by_status[f"{path} {status}"] += 1
        error = _json(response).get("error")
        if isinstance(error, str):
            words = re.sub(r"[0-9a-f]{8,}\S*|\d+|'[^']*'", "#", error).split()[:7]
            stats.by_reason[f"{path} {status} {' '.join(words)}"] += 1
        text = response.text if response.headers.get("content-type", "").startswith(
            "application/json") else response.content[:100].hex()
        if status >= 500:
            kind = _json(response).get("kind")
            stats.by_kind[str(kind)] += 1
            if not (path == "/run" and status == 500 and kind in MPLANG_ERRORS):
                finding("5xx", f"{status} outside a failed /run", status, text)
            if kind is None:  # an unhandled exception: uvicorn closed the connection
                self.clients[who].close()
                self.clients[who] = self._client(who)
        if who == support.STRANGER and status < 400:
            finding("identity", "an unlisted certificate was served", status, text)
        elif who != support.STRANGER and path != "/health" and not digest_ok and status != 409:
            finding("spec", "a missing or different spec digest was not refused with 409",
                    status, text)
        elif digest_ok and path != "/health" and not _right_role(who, path) and status != 403:
            finding("role", "the wrong role was not refused with 403", status, text)
        elif path == "/health" and who != support.STRANGER and status != 200:
            finding("health", "a listed party's /health failed", status, text)
        if chunked and status < 400:
            finding("length", "a body without content-length was accepted", status, text)
        if not chunked:  # schemathesis reads the request's body back, a stream has none
            try:
                case.validate_response(response, checks=SCHEMA_CHECKS)
            except FailureGroup as e:
                finding("schema", "; ".join(f"{f.title}: {f.message[:300]}"
                                            for f in e.exceptions), status, text)
        if status == 200:
            self._learn(path, body, response)

    def _learn(self, path: str, body: bytes, response: httpx.Response) -> None:
        with contextlib.suppress(Exception):
            exec_id = split_frame(body)[0].get("exec")
            if path == "/run" and isinstance(exec_id, str):
                self.execs = [*self.execs[-63:], exec_id]
        if path == "/run":
            outputs = _json(response).get("outputs") or []
            self.uris = [*self.uris, *(u for u in outputs if isinstance(u, str))][-64:]

    def run(self, cases: int, seed: int = 0) -> Stats:
        """Send ``cases`` generated cases."""
        start = time.monotonic()
        self.rnd.seed(seed)
        target = self.stats.cases + cases
        round_ = 0
        while self.stats.cases < target:
            remaining = target - self.stats.cases

            @hypothesis_seed(seed * 1000 + round_)
            @settings(max_examples=remaining, database=None, deadline=None, derandomize=False,
                      suppress_health_check=list(HealthCheck), phases=[_generate_phase()],
                      report_multiple_bugs=False, print_blob=False)
            @given(data=st.data())
            def fuzz(data: st.DataObject) -> None:
                if self.stats.cases < target:
                    self.one(data)

            fuzz()
            round_ += 1
        self.background.shutdown(wait=True)  # the waiting runs' answers are checked too
        self.background = ThreadPoolExecutor(8, thread_name_prefix="fuzz-waiting-run")
        self.stats.seconds += time.monotonic() - start
        return self.stats

    # -- after the campaign
    def aftermath(self, driver: mp.Driver) -> list[str]:
        """What is wrong with the cluster after the campaign (empty: nothing); tracebacks
        of known issues are counted in ``self.known_tracebacks``."""
        self.known_tracebacks: collections.Counter[str] = collections.Counter()
        return cluster_problems(self.cluster, self.dev, driver, self.known_tracebacks)


def cluster_problems(cluster: LocalCluster, dev: support.DevCluster, driver: mp.Driver,
                     known_tracebacks: collections.Counter[str] | None = None) -> list[str]:
    """What is wrong with ``cluster`` after a campaign (empty: nothing): a worker exited,
    logged a traceback (those of `KNOWN_TRACEBACKS` are counted in ``known_tracebacks``
    instead), does not answer ``/health``, or a real program across two parties gives a
    wrong value."""
    problems = []
    for name, proc in cluster.processes.items():
        if proc.poll() is not None:
            problems.append(f"worker {name} exited with code {proc.returncode}")
        log = (cluster.log_dir / f"{name}.log").read_text(errors="replace")
        for trace in tracebacks(log):
            known = next((k for k, line in KNOWN_TRACEBACKS.items() if line in trace), None)
            if known and known_tracebacks is not None:
                known_tracebacks[known] += 1
            else:
                problems.append(f"worker {name} logged a traceback:\n{trace}")
    for rank in range(dev.spec.world_size):
        with dev.client("driver", rank) as client:
            answer = client.get("/health")
            if answer.status_code != 200:
                problems.append(f"/health of worker {rank}: {answer.status_code}")

    def prog() -> Any:
        x = simp.pcall((0,), lambda v: v * 2, simp.constant((0,), np.int32(21)))
        return simp.shuffle_static(x, {1: 0})

    got = mp.fetch(driver, mp.evaluate(driver, prog))
    if got[1] is None or int(got[1]) != 42:
        problems.append(f"a program after the campaign gave {got}")
    return problems


def operations(schema: Any) -> list[Any]:
    """The schema's API operations (raises if one is invalid)."""
    found = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        assert isinstance(result, Ok)
        found.append(result.ok())
    return found


def tracebacks(log: str) -> list[str]:
    """The tracebacks in a worker's log, each up to its exception line."""
    found = []
    for chunk in log.split("Traceback (most recent call last):")[1:]:
        lines = chunk.splitlines()
        end = next((i for i, line in enumerate(lines)
                    if i > 0 and line and not line.startswith(" ")), len(lines) - 1)
        found.append("\n".join(lines[:end + 1]))
    return found


def _generate_phase() -> Any:
    from hypothesis import Phase
    return Phase.generate


def _as_bytes(data: Any) -> bytes:
    if data is None:
        return b""
    if isinstance(data, bytes | bytearray):
        return bytes(data)
    if isinstance(data, str):
        return data.encode()
    return json.dumps(data, default=str).encode()


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@contextlib.contextmanager
def campaign(tmp: Path, worker_timeout: float = 10.0) -> Iterator[tuple[Campaign, mp.Driver]]:
    """A 3-worker dev cluster (worker processes) under ``tmp`` and a campaign against it."""
    dev = support.dev_cluster(tmp, support.make_spec(support.free_ports(3)))
    cluster = LocalCluster(dev.spec_path, worker_args=["--timeout", str(worker_timeout)])
    try:
        cluster.start(timeout=60)
        with support.connected_driver(cluster) as driver:
            fuzz = Campaign(dev, cluster, driver)
            try:
                yield fuzz, driver
            finally:
                fuzz.close()
    finally:
        cluster.close()
