"""The HTTP driver: runs programs on party workers over mutual TLS.

The driver is a party like the others: it has its own key and certificate,
which the spec lists under ``drivers``, and it accepts each worker only by the
certificate the spec gives for it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

from mplang.cluster.commitments import commit, encode_openings
from mplang.cluster.identity import LocalIdentity, load_identity
from mplang.device.cluster import ClusterSpec, ClusterSpecError
from mplang.driver.base import SimpDriver
from mplang.driver.describe import describe_remote, describe_remote_input
from mplang.edsl.errors import (
    MPCommunicationError,
    MPLangError,
    MPPublicError,
    MPRefusedError,
    MPRuntimeError,
    MPTimeoutError,
)
from mplang.edsl.graph import Graph
from mplang.edsl.serde import encode_graph_bundle
from mplang.edsl.typing import BaseType, TensorType
from mplang.records.trace_file import events_from_wire
from mplang.runtime.options import Mode, RunOptions
from mplang.runtime.timeline import RunMonitor, now_ns
from mplang.transport.errors import (
    NoAnswerError,
    StatusError,
    TransportError,
    UnreachableError,
    error_message,
    refused_by_policy,
    unreachable_message,
)
from mplang.transport.wire import decode_value, pack_message
from mplang.worker.consent import PROGRAM_BYTES

DEFAULT_DRIVER_KEY = Path("keys") / "driver.key"
"""Where `Driver` looks for its key, next to the spec file, when none is given."""


def driver_identity(cluster: ClusterSpec, key: str | os.PathLike[str] | LocalIdentity | None,
                    spec_dir: Path | None) -> LocalIdentity:
    """The driver's identity from ``key`` (default ``keys/driver.key`` next to the spec);
    it must be one of the spec's drivers."""
    if isinstance(key, LocalIdentity):
        identity = key
    else:
        if key is None:
            if spec_dir is None or not (spec_dir / DEFAULT_DRIVER_KEY).exists():
                raise MPLangError("a driver needs its key: mp.Driver(spec, key='PATH/driver.key'"
                                  ") (by default keys/driver.key next to the spec file)")
            key = spec_dir / DEFAULT_DRIVER_KEY
        identity = load_identity(key)
    listed = {d.certificate.fingerprint: d.name for d in cluster.drivers}
    if identity.fingerprint not in listed:
        raise ClusterSpecError(f"this key's certificate ({identity.certificate.short}...) is not "
                               "listed under 'drivers' in the cluster spec: only a listed "
                               "driver may run programs")
    return identity


class SimpHttpDriver(SimpDriver):
    """A driver for workers started with ``mplang worker`` / ``mplang up``.

    ``run_timeout`` bounds one party's run of one graph; ``timeout`` every other request.
    A party answers a run with the outputs this driver may fetch, up to ``inline_bytes``
    in all (0: none), so fetching them right away costs no second round trip.
    """

    def __init__(self, cluster: ClusterSpec, *, key: str | os.PathLike[str] | LocalIdentity |
                 None = None, timeout: float = 30.0, run_timeout: float = 600.0,
                 default_mode: Mode = "launch", spec_dir: Path | None = None,
                 inline_bytes: int = 64 << 10):
        from mplang.transport.mux_client import MuxClients

        super().__init__(cluster, default_mode=default_mode,
                         pool_size=max(32, 8 * cluster.world_size), pool_name="mplang-driver")
        cluster.require_certificates()
        self.identity = driver_identity(cluster, key, spec_dir)
        self._clients = MuxClients(cluster, self.identity, timeout)
        self._urls = cluster.base_urls()
        self._timeout = timeout
        self._run_timeout = run_timeout
        self._encoded: weakref.WeakKeyDictionary[Graph, bytes] = weakref.WeakKeyDictionary()
        self._inline_bytes = inline_bytes
        self._inline: dict[str, Any] = {}
        """Outputs the parties sent with their run's answer, by URI, until deleted."""
        self._silent: dict[str, set[int]] = {}
        """Parties whose answer did not come in time, by execution, until it is aborted:
        the abort does not wait for them to confirm."""
        self._silent_lock = threading.Lock()

    def _program(self, graph: Graph, rank: int) -> tuple[dict[str, Any], list[bytes]]:
        """What party ``rank`` receives of ``graph``: the committed program (the same for
        every party) followed by its own openings, and the header field that splits them."""
        committed = commit(graph, self.world_size)
        data = self._encoded.get(graph)
        if data is None:
            data = encode_graph_bundle(committed.graph, {})
            self._encoded[graph] = data
        openings = committed.openings[rank]
        return {PROGRAM_BYTES: len(data)}, [data, encode_openings(openings)] if openings \
            else [data]

    def _where(self, rank: int) -> str:
        return f"party {rank} ({self.cluster.nodes[rank].name} at {self._urls[rank]})"

    def _run(self, rank: int, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
             scope: str, parties: Sequence[int], options: RunOptions) -> list[str | None]:
        split, body = self._program(graph, rank)
        parts = pack_message({"exec": exec_id, "scope": scope, "inputs": list(input_uris),
                              "parties": list(parties), "inline": self._inline_bytes, **split,
                              **options.wire_fields()}, body)
        what = _what(graph)
        sent_ns = now_ns()
        try:
            response = self._clients.post(rank, "/run", parts, timeout=self._bounded(
                self._run_timeout, options, RUN_ANSWER_GRACE_S))
        except StatusError as e:
            raise self._refused(rank, what, e, exec_id) from e
        except UnreachableError as e:
            raise self._unreachable(rank, f"run {what}", e) from e
        except NoAnswerError as e:
            self._went_silent(exec_id, rank)
            raise MPTimeoutError(f"{self._where(rank)} did not answer within the time limit "
                                 f"while running {what} ({e})", party=rank,
                                 op=graph.operations[0].opcode
                                 if len(graph.operations) == 1 else None) from e
        except TransportError as e:
            raise MPCommunicationError(f"{self._where(rank)} failed while running {what}: the "
                                       f"connection was lost or refused ({type(e).__name__}: "
                                       f"{e})", party=rank,
                                       op=graph.operations[0].opcode
                                       if len(graph.operations) == 1 else None) from e
        body = response.json()
        if response.status_code != 200:
            raise _run_failure(rank, body, response.text)
        if options.monitor is not None and "trace" in body:
            self._merge_trace(options.monitor, rank, body["trace"], sent_ns, now_ns())
        outputs: list[str | None] = body["outputs"]
        inline = body.get("inline") or {}
        for uri in outputs:
            if uri is not None and isinstance(inline.get(uri), str):
                with contextlib.suppress(ValueError, MPLangError):  # else fetched as usual
                    self._inline[uri] = decode_value(base64.b64decode(inline[uri]))
        if options.progress is not None:
            options.progress(f"party {rank}: finished {what}")
        return outputs

    @staticmethod
    def _merge_trace(monitor: RunMonitor, rank: int, trace: Any, sent_ns: int,
                     answered_ns: int) -> None:
        """Add party ``rank``'s events to ``monitor`` on the driver's clock. The party's
        offset is estimated from the request's round trip: its receipt and answer times,
        against the driver's send and receipt times, bracket the same instants."""
        if not isinstance(trace, dict):
            raise MPRuntimeError(f"party {rank} answered with a malformed trace", party=rank)
        received: Any = trace.get("received_ns")
        answered: Any = trace.get("answered_ns")
        if not all(type(t) is int for t in (received, answered)):
            raise MPRuntimeError(f"party {rank}'s trace lacks its receipt and answer times",
                                 party=rank)
        offset = ((received - sent_ns) + (answered - answered_ns)) // 2
        monitor.add_events(events_from_wire(trace.get("events"), rank), offset)

    def _unreachable(self, rank: int, doing: str, e: UnreachableError
                     ) -> MPCommunicationError:
        """The error for party ``rank``, whose worker accepted no connection to ``doing``:
        which node, at which address, and how to start its worker."""
        return MPCommunicationError(unreachable_message(
            self._where(rank), doing, e, self.cluster.nodes[rank].name), party=rank)

    def _refused(self, rank: int, what: str, e: StatusError, exec_id: str | None = None
                 ) -> MPLangError:
        """The error for party ``rank``'s 4xx answer. A refusal is an `MPRefusedError`
        naming the party: its policy's (a 403 not about certificates, or an answer of
        kind ``PolicyRefusedError``) carries the party's whole message, which names the
        op, its source line and the rule to add; a certificate or spec the party does not
        know (403, 409) says what to check; a limit (413, 429) gives its status. A request
        the party cannot make sense of (400, 404: an ill-formed program, a missing file)
        is an `MPRuntimeError` naming the party, as on the simulator. A request of
        execution ``exec_id`` that reached the party after this driver aborted it is an
        `MPCommunicationError`: the abort's echo, not a cause."""
        status = e.response.status_code
        error = error_message(e.response) or e.response.text[:500]
        if status == 409 and error == f"execution {exec_id} was aborted":
            return MPCommunicationError(f"{self._where(rank)} dropped {what}: the execution "
                                        "was aborted", party=rank)
        if status in (400, 404) and not refused_by_policy(e.response):
            return MPRuntimeError(f"{self._where(rank)} refused to run {what}: {status} "
                                  f"{error}", party=rank)
        if refused_by_policy(e.response) or (status == 403 and "certificate" not in error):
            refused = MPRefusedError(f"{self._where(rank)} refused {what}: {error}", status)
        else:
            hint = (" (is this driver's certificate listed in that party's spec?)"
                    if status == 403 else "")  # a 409 says which specs differ and why
            refused = MPRefusedError(f"{self._where(rank)} refused {what}: {status} {error}"
                                     f"{hint}", status)
        refused.party = rank
        return refused

    def submit(self, rank: int, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
               scope: str, parties: Sequence[int], options: RunOptions
               ) -> Future[list[str | None]]:
        """Party ``rank`` accepts and runs ``graph``: in a run of several ``parties``, it
        starts once it has the others' votes, which they send each other."""
        self._check_open()
        return self._pool.submit(self._run, rank, graph, input_uris, exec_id, scope, parties,
                                 options)

    def submit_here(self, rank: int, graph: Graph, input_uris: Sequence[str | None],
                    exec_id: str, scope: str, parties: Sequence[int], options: RunOptions
                    ) -> Future[list[str | None]]:
        self._check_open()
        future: Future[list[str | None]] = Future()
        try:
            future.set_result(self._run(rank, graph, input_uris, exec_id, scope, parties,
                                        options))
        except Exception as e:  # delivered through the future, like a pooled run
            future.set_exception(e)
        return future

    def _fetch(self, rank: int, uri: str) -> Any:
        try:
            response = self._clients.post(rank, "/fetch", pack_message({"uri": uri}, []))
        except (StatusError, TransportError) as e:
            if isinstance(e, StatusError) and (e.response.status_code not in (400, 404)
                                               or refused_by_policy(e.response)):
                raise self._refused(rank, "a fetch", e) from None  # refusals: the party's
            raise MPRuntimeError(f"fetching {uri} from {self._where(rank)} failed: {e}",
                                 party=rank) from e
        return decode_value(response.content)

    def fetch(self, rank: int, uri: str) -> Future[Any]:
        self._check_open()
        if uri in self._inline:
            done: Future[Any] = Future()
            done.set_result(self._inline[uri])
            return done
        return self._pool.submit(self._fetch, rank, uri)

    def _best_effort(self, rank: int, path: str, fields: dict[str, Any]) -> None:
        # a party that cannot be reached took its objects and messages with it
        with contextlib.suppress(TransportError, StatusError):
            self._clients.post(rank, path, pack_message(fields, []),
                               timeout=min(self._timeout, 5.0))

    def delete(self, uris: Sequence[str | None]) -> None:
        for uri in uris:
            if uri is not None:
                self._inline.pop(uri, None)
        for rank, uri in enumerate(uris):
            if uri is not None and not self._closed:
                try:
                    self._pool.submit(self._best_effort, rank, "/delete", {"uris": [uri]})
                except RuntimeError:  # the interpreter is shutting down its thread pools
                    return

    def _went_silent(self, exec_id: str, rank: int) -> None:
        with self._silent_lock:
            self._silent.setdefault(exec_id, set()).add(rank)

    def abort(self, exec_id: str, reason: str) -> None:
        """Tell every party to abandon ``exec_id``; waits at most `ABORT_WAIT_S` for the
        answers (a frozen party answers late or never), and not at all for a party that
        already left a request of the execution unanswered."""
        with self._silent_lock:
            silent = self._silent.pop(exec_id, set())
        futures = [self._pool.submit(self._best_effort, rank, "/abort",
                                     {"exec": exec_id, "reason": reason[:1000]})
                   for rank in range(self.world_size)]
        wait([f for rank, f in enumerate(futures) if rank not in silent], timeout=ABORT_WAIT_S)

    def describe_data(self, rank: int, path: str, key: str | None) -> TensorType:
        """The type of array ``path`` (member ``key``) in party ``rank``'s data root, as
        its worker reports it."""
        return describe_remote(self._clients, rank, self._where(rank),
                               {"what": "file", "path": path, "key": key})

    def describe_object(self, rank: int, name: str) -> TensorType:
        """The type of the object uploaded to party ``rank`` as ``name``."""
        return describe_remote(self._clients, rank, self._where(rank),
                               {"what": "object", "name": name})

    def describe_input(self, rank: int, fields: Mapping[str, Any]) -> BaseType:
        """The type of the input ``fields`` name (e.g. ``{"what": "table", "path": "a.csv",
        "format": "csv"}``) on party ``rank``, as its worker reports it."""
        return describe_remote_input(self._clients, rank, self._where(rank), dict(fields))

    @staticmethod
    def _bounded(default: float, options: RunOptions, grace: float = 0.0) -> float:
        """A request's timeout: ``default``, or the evaluation's ``timeout`` (plus
        ``grace`` for the party to report its own timeout) when that is shorter."""
        return default if options.timeout is None else min(default, options.timeout + grace)

    def close(self) -> None:
        """Tell the workers this driver closed (each drops what it keeps for it, such as
        secure sessions; at most `ABORT_WAIT_S`), then close the connections before the
        rest: a request still waiting (a party's run of a failed execution, busy in a
        long op) ends at once instead of at its timeout."""
        if not self._closed:  # the workers drop what they keep for this driver
            wait([self._pool.submit(self._best_effort, rank, "/close", {})
                  for rank in range(self.world_size)], timeout=ABORT_WAIT_S)
            self._clients.close()  # the workers keep running
        super().close()

    def __repr__(self) -> str:
        return f"Driver({', '.join(self._urls)})"


def _what(graph: Graph) -> str:
    return (f"op {graph.operations[0].opcode}" if len(graph.operations) == 1
            else f"a program of {len(graph.operations)} ops")


class Driver(SimpHttpDriver):
    """``mp.Driver(cluster, key=K)``: a driver for the workers of a `ClusterSpec` or its
    YAML path, with the key ``K`` of a driver the spec lists (by default
    ``keys/driver.key`` next to the spec file)."""

    def __init__(self, cluster: ClusterSpec | str | os.PathLike[str], **options: Any):
        spec_dir = None
        if not isinstance(cluster, ClusterSpec):
            spec_dir = Path(cluster).resolve().parent
            cluster = ClusterSpec.from_yaml(cluster)
        super().__init__(cluster, spec_dir=spec_dir, **options)


def make_driver(cluster: ClusterSpec | str | os.PathLike[str], **options: Any) -> Driver:
    """``simp.make_driver(spec_path, key=K)``: the same as ``mp.Driver(spec_path, key=K)``."""
    if isinstance(cluster, list | tuple):
        raise MPLangError("make_driver takes a cluster spec (path or ClusterSpec) and key: a "
                          "list of endpoints does not say which certificate each worker has")
    return Driver(cluster, **options)


ABORT_WAIT_S = 1.0
"""How long an abort waits for the parties to confirm it."""
RUN_ANSWER_GRACE_S = 1.5
"""How long past an evaluation's ``timeout`` the driver waits for a party's answer to a
run: a party whose own wait ran out reports it in that time. With the abort, which does
not wait for the silent party, a run ends within ``timeout`` + 2 s of a party's fault."""
_RUN_FAILURES: dict[str, type[MPRuntimeError]] = {
    "MPCommunicationError": MPCommunicationError, "MPTimeoutError": MPTimeoutError,
    "MPPublicError": MPPublicError}
"""The failures of a party's run that keep their class at the driver; others are
`MPRuntimeError`s (refusals: `MPRefusedError`)."""


def _run_failure(rank: int, body: dict[str, Any], text: str) -> MPLangError:
    """The error of party ``rank``'s failed run from its answer ``body``: a refusal (of
    a peer's message its run needed, a limit) is an `MPRefusedError` naming the party;
    a wait that ran out of time an `MPTimeoutError`."""
    error = str(body.get("error", text))
    if body.get("kind") == "MPRefusedError":
        refused = MPRefusedError(error if error.startswith(f"party {rank}") else
                                 f"party {rank}: {error}", 409)
        refused.party, refused.op = rank, body.get("op")
        return refused
    cls = _RUN_FAILURES.get(str(body.get("kind")), MPRuntimeError)
    failure = cls(error, party=rank, op=body.get("op"), key=body.get("key"),
                  loc=body.get("loc"))
    if isinstance(failure, MPCommunicationError) and type(body.get("peer")) is int:
        failure.peer = body["peer"]
    return failure
