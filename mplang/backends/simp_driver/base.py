"""`SimpDriver`: the driver (host) side of a world of parties.

It runs a program by interpreting a one-op launcher graph, ``func.call`` of
the program, with driver kernels. Launch mode's ``func.call`` kernel ships the
whole graph to every worker; standard mode interprets it on the driver and
dispatches each simp op to the workers (seed 001).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any, Literal

import numpy as np

from mplang.backends.simp_driver.ops import DRIVER_KERNELS
from mplang.backends.simp_driver.values import DriverObject, HostVar
from mplang.device.cluster import ClusterSpec
from mplang.edsl.context import ExecutionContext
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.object import MPObject
from mplang.edsl.program import Program
from mplang.frontend.errors import MPCommunicationError, MPLangError, MPRuntimeError
from mplang.runtime.interpreter import Interpreter

Mode = Literal["launch", "standard"]


def to_host_value(value: Any) -> Any:
    """A fetched value as numpy: arrays as ``np.ndarray``, rank-0 as numpy scalars."""
    arr = np.asarray(value)
    return arr[()] if arr.ndim == 0 else arr


class SimpDriver(ExecutionContext, ABC):
    """Abstract driver: subclasses move graphs and values to and from the parties."""

    dialect_name = "simp"

    def __init__(self, cluster: ClusterSpec, *, default_mode: Mode = "launch"):
        self.cluster = cluster
        self.world_size = cluster.world_size
        self.default_mode: Mode = default_mode

    # -- transport, provided by subclasses
    @abstractmethod
    def submit(self, rank: int, graph: Graph, input_uris: Sequence[str | None], exec_id: str,
               scope: str) -> Future[list[str | None]]:
        """Run ``graph`` on party ``rank``; the future gives the URIs of its outputs."""

    @abstractmethod
    def fetch(self, rank: int, uri: str) -> Future[Any]:
        """Get the value at ``uri`` from party ``rank``."""

    @abstractmethod
    def release(self, uris: Sequence[str | None]) -> None:
        """Tell each party to drop its object (``uris[rank]``); best effort."""

    @abstractmethod
    def abort(self, exec_id: str, reason: str) -> None:
        """Make every party abandon execution ``exec_id`` and free its messages."""

    # -- shared logic
    def collect(self, futures: Sequence[Future[Any]], exec_id: str) -> list[Any]:
        """Wait for all futures; on the first failure abort the execution and raise its cause."""
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        errors = [f.exception() for f in done if f.exception() is not None]
        if not errors:
            return [f.result() for f in futures]
        self.abort(exec_id, f"{errors[0]}")
        wait(pending)
        errors = [e for f in futures if (e := f.exception()) is not None]
        root = next((e for e in errors if not isinstance(e, MPCommunicationError)), errors[0])
        assert root is not None
        raise root

    def run_on_parties(self, graph: Graph, args: Sequence[HostVar], exec_id: str, scope: str,
                       parties: Sequence[int] | None = None) -> list[HostVar]:
        """Run ``graph`` on ``parties`` (default: all); one HostVar per graph output."""
        ranks = range(self.world_size) if parties is None else parties
        futures = [self.submit(r, graph, [a.uris[r] for a in args], exec_id, scope) for r in ranks]
        results = self.collect(futures, exec_id)
        per_party: list[list[str | None]] = [[None] * len(graph.outputs)
                                             for _ in range(self.world_size)]
        for r, uris in zip(ranks, results, strict=True):
            per_party[r] = uris
        return [HostVar(tuple(per_party[r][i] for r in range(self.world_size)))
                for i in range(len(graph.outputs))]

    def fetch_var(self, var: HostVar) -> list[Any]:
        """Each party's value of ``var`` (``None`` where it holds nothing)."""
        futures = {r: self.fetch(r, u) for r, u in enumerate(var.uris) if u is not None}
        values = dict(zip(futures, self.collect(list(futures.values()), "fetch"), strict=True))
        return [to_host_value(values[r]) if r in values else None
                for r in range(self.world_size)]

    def fetch_object(self, obj: MPObject) -> Any:
        return self.fetch_var(self._own(obj).var)

    def _own(self, obj: MPObject) -> DriverObject:
        if not isinstance(obj, DriverObject) or obj.owner is not self:
            raise MPRuntimeError(f"{obj!r} does not belong to this context")
        return obj

    def run_program(self, program: Program, inputs: list[MPObject], *, mode: Mode | None = None,
                    **options: Any) -> list[MPObject]:
        if options:
            raise TypeError(f"unknown options: {sorted(options)}")
        if program.world_size != self.world_size:
            raise MPLangError(f"program {program.name!r} was compiled for {program.world_size} "
                              f"parties; this context has {self.world_size}")
        expected = program.input_types
        if len(inputs) != len(expected):
            raise MPLangError(f"program {program.name!r} takes {len(expected)} runtime inputs, "
                              f"got {len(inputs)}")
        for i, (obj, t) in enumerate(zip(inputs, expected, strict=True)):
            if obj.mptype != t:
                raise MPLangError(f"program {program.name!r}: runtime input {i} must be {t}, "
                                  f"got {obj.mptype}")
        args = [self._own(obj).var for obj in inputs]
        launcher_inputs = [Value(f"arg{i}", t) for i, t in enumerate(expected)]
        launcher_outputs = tuple(Value(f"out{i}", v.type)
                                 for i, v in enumerate(program.graph.outputs))
        call = Operation("func.call", tuple(launcher_inputs), launcher_outputs,
                         {"callee": program.name}, (program.graph,))
        launcher = Graph(launcher_inputs, [call], list(launcher_outputs))
        interp = Interpreter(DRIVER_KERNELS[mode or self.default_mode], {"simp": self},
                             party=None, exec_id=uuid.uuid4().hex)
        results: list[HostVar] = interp.run(launcher, args)
        return [DriverObject(self, var, v.type, self.release, device)
                for var, v, device in zip(results, program.graph.outputs, program.out_devices,
                                          strict=True)]
