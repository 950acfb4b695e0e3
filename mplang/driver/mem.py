"""The in-memory simulator: a driver and a `LocalMesh` of workers on threads."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from mplang.cluster.commitments import commit
from mplang.device.cluster import ClusterSpec
from mplang.driver.base import SimpDriver, to_host_value
from mplang.edsl.errors import MPLangError
from mplang.edsl.graph import Graph
from mplang.edsl.object import MPObject
from mplang.edsl.program import Program
from mplang.edsl.typing import BaseType, TensorType
from mplang.policy.enforce import install_guards
from mplang.runtime import native_logs
from mplang.runtime.backend import vet_program
from mplang.runtime.options import DEFAULT_OPTIONS, Mode, RunOptions
from mplang.storage import data_root
from mplang.worker.mem import LocalMesh
from mplang.worker.network import NetworkModel


class SimpMemDriver(SimpDriver):
    """A driver whose parties are threads of this process (in-memory IPC)."""

    kind = "simulator"

    def __init__(self, cluster: ClusterSpec, *, timeout: float = 60.0,
                 default_mode: Mode = "launch", network: NetworkModel | None = None,
                 data_roots: Mapping[str, str | os.PathLike[str]] | None = None):
        names = [n.name for n in cluster.nodes]
        unknown = sorted(set(data_roots or {}) - set(names))
        if unknown:
            raise MPLangError(f"data_roots names nodes {unknown} that the cluster does not "
                              f"have (its nodes: {', '.join(names)})")
        super().__init__(cluster, default_mode=default_mode,
                         pool_size=max(32, 4 * cluster.world_size), pool_name="mplang-party")
        self.mesh = LocalMesh(self.world_size, timeout, network, names, data_roots)
        self._accepted: dict[tuple[str, str, int], Graph] = {}
        """Graphs the parties accepted in `prepare`, by (execution, scope, rank)."""
        self._accepted_lock = threading.Lock()

    def run_program(self, program: Program, inputs: list[MPObject],
                    options: RunOptions = DEFAULT_OPTIONS) -> list[MPObject]:
        """As `SimpDriver.run_program`; the parties run in this process, so a received
        program's native payloads are vetted first, as workers vet theirs (`vet_program`)."""
        vet_program(program)
        return super().run_program(program, inputs, options)

    def describe_data(self, rank: int, path: str, key: str | None) -> TensorType:
        """The type of array ``path`` (member ``key``) in party ``rank``'s data root."""
        worker = self.mesh.workers[rank]
        return data_root.describe(worker.data_root, path, key, worker.node)

    def describe_object(self, rank: int, name: str) -> TensorType:
        """The type of the object uploaded to party ``rank`` as ``name``."""
        return self.mesh.workers[rank].named.describe(name)

    def describe_input(self, rank: int, fields: Mapping[str, Any]) -> BaseType:
        """The type of the input ``fields`` name (e.g. ``{"what": "table", "path": "a.csv",
        "format": "csv"}``) in party ``rank``'s data root."""
        worker = self.mesh.workers[rank]
        return data_root.describe_input(worker.data_root, fields, worker.node)

    def upload(self, node: str, name: str, value: Any) -> TensorType:
        """Store tensor ``value`` on ``node`` as ``name``, as its owner's ``mplang put``
        does, for programs to read with ``simp.load``; returns its type."""
        return self.mesh.workers[self.cluster.rank_of(node)].named.put(name, value)

    def _accept(self, rank: int, graph: Graph, options: RunOptions) -> Graph:
        """Party ``rank``'s acceptance of ``graph`` as a worker gets it: committed, with
        only its own openings; the graph it runs."""
        committed = commit(graph, self.world_size)
        return self.mesh.workers[rank].accept(committed.graph, committed.openings[rank],
                                              whole=options.whole)

    def prepare(self, ranks: list[int], graph: Graph, input_uris: list[list[str | None]],
                exec_id: str, scope: str, options: RunOptions) -> None:
        self._check_open()
        accepted: dict[tuple[str, str, int], Graph] = {}
        try:
            for r in ranks:
                accepted[(exec_id, scope, r)] = self._accept(r, graph, options)
        except Exception:  # a party refused: the others' runs never start
            for (_, _, r), opened in accepted.items():
                self.mesh.workers[r].refund(opened)
            raise
        with self._accepted_lock:
            self._accepted.update(accepted)

    def _run_accepted(self, rank: int, graph: Graph, input_uris: Sequence[str | None],
                      exec_id: str, scope: str, options: RunOptions) -> list[str | None]:
        with self._accepted_lock:
            opened = self._accepted.pop((exec_id, scope, rank), None)
        if opened is None:
            opened = self._accept(rank, graph, options)
        return self.mesh.workers[rank].run(opened, input_uris, exec_id, scope, options)

    def submit(self, rank: int, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
               scope: str, parties: Sequence[int], options: RunOptions
               ) -> Future[list[str | None]]:
        self._check_open()
        return self._pool.submit(self._run_accepted, rank, graph, input_uris, exec_id, scope,
                                 options)

    def fetch(self, rank: int, uri: str) -> Future[Any]:
        self._check_open()
        future: Future[Any] = Future()
        try:
            future.set_result(self.mesh.workers[rank].fetch(uri))
        except Exception as e:
            future.set_exception(e)
        return future

    def held(self, obj: MPObject) -> list[Any]:
        """What each party's store holds for ``obj`` (None where it holds nothing), secret
        shares included, bypassing the parties' policies: a view for tests and debugging
        that exists only because the simulator runs every party in this process. A
        driver of real workers gets plaintext only, and only as each party allows."""
        return [None if uri is None else to_host_value(worker.store.get(uri))
                for worker, uri in zip(self.mesh.workers, self._own(obj).var.uris,
                                       strict=True)]

    def delete(self, uris: Sequence[str | None]) -> None:
        for worker, uri in zip(self.mesh.workers, uris, strict=True):
            if uri is not None:
                worker.delete(uri)

    def abort(self, exec_id: str, reason: str) -> None:
        with self._accepted_lock:
            for key in [k for k in self._accepted if k[0] == exec_id]:
                del self._accepted[key]
        self.mesh.abort(exec_id, reason)

    def _close_transport(self) -> None:
        self.mesh.close()


class Simulator(SimpMemDriver):
    """An in-memory world (one thread per party), usable as a context: under
    ``with sim:``, MPLang functions and primitives run eagerly.

    ``Simulator(n)`` is ``Simulator(ClusterSpec.simple(n))``. ``latency_ms``,
    ``bandwidth_mbps`` and per-link overrides ``links={(src, dst): (latency_ms,
    bandwidth_mbps)}`` delay every message between parties as a real link would.
    ``data_roots={"node_0": DIR, ...}`` gives nodes their data roots (``tensor.load``;
    default ``./data/<node name>``); `upload` stores a node's objects (``simp.load``).
    Every node checks each program and fetch against its policy (`mplang.policy`), as a
    worker does: by default the one ``mplang init`` writes; ``policies={"node_0":
    "p0.yaml" or Policy, ...}`` or a folder of ``NODE.yaml`` files chooses others, and
    ``policies="open"`` checks nothing (and says so on stderr). `budget` shows a
    node's privacy budget ledger (kept in memory here). The native libraries' logs go to
    one file, not the terminal (`mplang.runtime.native_logs`).
    """

    def __init__(self, cluster: ClusterSpec | int, *, timeout: float = 60.0,
                 default_mode: Mode = "launch", latency_ms: float = 0.0,
                 bandwidth_mbps: float | None = None,
                 links: Mapping[tuple[int, int], tuple[float, float | None]] | None = None,
                 data_roots: Mapping[str, str | os.PathLike[str]] | None = None,
                 policies: Mapping[str, Any] | str | os.PathLike[str] | None = None):
        native_logs.level()  # refuse a wrong MPLANG_LOG now, not in a party's kernel
        if not isinstance(cluster, ClusterSpec):
            cluster = ClusterSpec.simple(cluster)
        network = None
        if latency_ms or bandwidth_mbps is not None or links:
            network = NetworkModel(latency_ms, bandwidth_mbps, links)
        super().__init__(cluster, timeout=timeout, default_mode=default_mode, network=network,
                         data_roots=data_roots)
        install_guards(self.mesh.workers, cluster, policies)

    def budget(self, node: str) -> dict[str, Any]:
        """``node``'s privacy budget ledger, as ``mplang budget`` shows a worker's:
        ``budget`` (per source; None: no limit), ``spent`` and ``left`` per source of its
        data, and the ``charges`` (`mplang.policy.ledger.Ledger.report`)."""
        guard = self.mesh.workers[self.cluster.rank_of(node)].guard
        if guard is None:
            return {"budget": None, "spent": {}, "left": {}, "charges": []}
        return guard.ledger.report(guard.policy.dp_budget())

    def __repr__(self) -> str:
        return f"Simulator(world_size={self.world_size})"


def make_simulator(world_size: int, **options: Any) -> Simulator:
    """An in-memory simulator of ``world_size`` parties (``mp.Simulator`` by its simp name)."""
    return Simulator(world_size, **options)
