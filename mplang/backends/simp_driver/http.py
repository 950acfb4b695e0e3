"""The HTTP driver: runs programs on party workers over signed HTTP requests."""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import httpx

from mplang.backends.http_client import post
from mplang.backends.simp_driver.base import SimpDriver
from mplang.backends.wire import decode_value, pack_message
from mplang.device.cluster import ClusterSpec
from mplang.edsl.graph import Graph
from mplang.edsl.serde import encode_graph_bundle
from mplang.frontend.errors import MPCommunicationError, MPRuntimeError
from mplang.runtime.auth import Signer, load_secret
from mplang.runtime.options import Mode, RunOptions

DRIVER_NAME = "driver"


class SimpHttpDriver(SimpDriver):
    """A driver for workers started with ``mplang worker`` / ``mplang up``.

    ``run_timeout`` bounds one party's run of one graph; ``timeout`` every other request.
    """

    def __init__(self, cluster: ClusterSpec, *, secret: bytes | None = None,
                 timeout: float = 30.0, run_timeout: float = 600.0,
                 default_mode: Mode = "launch"):
        super().__init__(cluster, default_mode=default_mode,
                         pool_size=max(32, 8 * cluster.world_size), pool_name="mplang-driver")
        self._signer = Signer(secret if secret is not None else load_secret(), DRIVER_NAME)
        self._urls = cluster.base_urls()
        self._client = httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0),
                                    verify=cluster.client_verify(),
                                    limits=httpx.Limits(max_connections=256,
                                                        max_keepalive_connections=64))
        self._timeout = timeout
        self._run_timeout = run_timeout
        self._encoded: weakref.WeakKeyDictionary[Graph, bytes] = weakref.WeakKeyDictionary()

    def _graph_bytes(self, graph: Graph) -> bytes:
        data = self._encoded.get(graph)
        if data is None:
            data = encode_graph_bundle(graph, {})
            self._encoded[graph] = data
        return data

    def _where(self, rank: int) -> str:
        return f"party {rank} ({self.cluster.nodes[rank].name} at {self._urls[rank]})"

    def _run(self, rank: int, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
             scope: str, options: RunOptions) -> list[str | None]:
        parts = pack_message({"exec": exec_id, "scope": scope, "inputs": list(input_uris),
                              **options.wire_fields()}, [self._graph_bytes(graph)])
        what = (f"op {graph.operations[0].opcode}" if len(graph.operations) == 1
                else f"a program of {len(graph.operations)} ops")
        try:
            response = post(self._client, self._signer, self._urls[rank], "/run", parts,
                            timeout=self._run_timeout)
        except httpx.HTTPStatusError as e:
            status = e.response.status_code
            hint = " (check the cluster secret)" if status in (401, 403) else ""
            raise MPRuntimeError(f"{self._where(rank)} refused to run {what}: {status} "
                                 f"{e.response.text[:300]}{hint}", party=rank) from e
        except httpx.HTTPError as e:
            raise MPRuntimeError(f"{self._where(rank)} failed while running {what}: the "
                                 f"connection was lost or refused ({type(e).__name__}: {e})",
                                 party=rank, op=graph.operations[0].opcode
                                 if len(graph.operations) == 1 else None) from e
        body = response.json()
        if response.status_code != 200:
            cls = MPCommunicationError if body.get("kind") == "MPCommunicationError" \
                else MPRuntimeError
            raise cls(body.get("error", response.text), party=rank, op=body.get("op"),
                      key=body.get("key"), loc=body.get("loc"))
        outputs: list[str | None] = body["outputs"]
        if options.progress is not None:
            options.progress(f"party {rank}: finished {what}")
        return outputs

    def submit(self, rank: int, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
               scope: str, options: RunOptions) -> Future[list[str | None]]:
        self._check_open()
        return self._pool.submit(self._run, rank, graph, input_uris, exec_id, scope, options)

    def submit_here(self, rank: int, graph: Graph, input_uris: Sequence[str | None],
                    exec_id: str, scope: str, options: RunOptions) -> Future[list[str | None]]:
        self._check_open()
        future: Future[list[str | None]] = Future()
        try:
            future.set_result(self._run(rank, graph, input_uris, exec_id, scope, options))
        except Exception as e:  # delivered through the future, like a pooled run
            future.set_exception(e)
        return future

    def _fetch(self, rank: int, uri: str) -> Any:
        try:
            response = post(self._client, self._signer, self._urls[rank], "/fetch",
                            pack_message({"uri": uri}, []))
        except httpx.HTTPError as e:
            raise MPRuntimeError(f"fetching {uri} from {self._where(rank)} failed: {e}",
                                 party=rank) from e
        return decode_value(response.content)

    def fetch(self, rank: int, uri: str) -> Future[Any]:
        self._check_open()
        return self._pool.submit(self._fetch, rank, uri)

    def _best_effort(self, rank: int, path: str, fields: dict[str, Any]) -> None:
        # a party that cannot be reached took its objects and messages with it
        with contextlib.suppress(httpx.HTTPError):
            post(self._client, self._signer, self._urls[rank], path, pack_message(fields, []),
                 timeout=min(self._timeout, 5.0))

    def delete(self, uris: Sequence[str | None]) -> None:
        for rank, uri in enumerate(uris):
            if uri is not None and not self._closed:
                try:
                    self._pool.submit(self._best_effort, rank, "/delete", {"uris": [uri]})
                except RuntimeError:  # the interpreter is shutting down its thread pools
                    return

    def abort(self, exec_id: str, reason: str) -> None:
        futures = [self._pool.submit(self._best_effort, rank, "/abort",
                                     {"exec": exec_id, "reason": reason[:1000]})
                   for rank in range(self.world_size)]
        for f in futures:
            f.result()

    def _close_transport(self) -> None:
        self._client.close()  # the workers keep running

    def __repr__(self) -> str:
        return f"Driver({', '.join(self._urls)})"


class Driver(SimpHttpDriver):
    """``mp.Driver(cluster)``: a driver for the workers of a `ClusterSpec` or its YAML path."""

    def __init__(self, cluster: ClusterSpec | str | os.PathLike[str], **options: Any):
        if not isinstance(cluster, ClusterSpec):
            cluster = ClusterSpec.from_yaml(cluster)
        super().__init__(cluster, **options)


def make_driver(endpoints: Sequence[str], **options: Any) -> Driver:
    """A driver for workers at ``endpoints`` (rank order), with `ClusterSpec.simple`'s devices."""
    return Driver(ClusterSpec.from_endpoints(list(endpoints)), **options)
