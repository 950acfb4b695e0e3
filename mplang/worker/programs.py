"""The programs a worker accepts to run: decoded by the schema-checked graph decoder,
verified, type-checked, every op with a kernel here and every native payload vetted
(`check_payloads`), then cached by the SHA-256 digest of their bytes."""

from __future__ import annotations

import hashlib

from mplang.edsl.errors import MPLangError, MPSerializationError
from mplang.edsl.graph import Graph
from mplang.edsl.primitive import check_types
from mplang.edsl.serde import decode_graph_bundle
from mplang.runtime.backend import check_payloads
from mplang.runtime.interpreter import KernelTable
from mplang.util.lru import LRUCache


def program_digest(payload: memoryview | bytes) -> str:
    """The digest a program is known by: SHA-256 of its bytes, in hex."""
    return hashlib.sha256(payload).hexdigest()


class Programs:
    """Decoded and checked programs, by digest (the most recent ``capacity``)."""

    def __init__(self, world_size: int, kernels: KernelTable, max_bytes: int,
                 capacity: int = 64):
        self.world_size = world_size
        self.kernels = kernels
        self.max_bytes = max_bytes
        self._cache = LRUCache(capacity)

    def __len__(self) -> int:
        return len(self._cache)

    def get(self, payload: memoryview) -> tuple[Graph, str]:
        """The checked graph of the program ``payload`` and its digest; raises
        `MPSerializationError` for a program this worker refuses to run."""
        digest = program_digest(payload)
        graph: Graph | None = self._cache.lookup(digest)
        if graph is None:
            graph, _ = decode_graph_bundle(payload, max_bytes=self.max_bytes)
            try:
                graph.verify()
                check_types(graph, self.world_size)
            except MPSerializationError:
                raise
            except MPLangError as e:  # a verifier or a type rule refused it
                raise MPSerializationError(f"invalid program: {e}") from None
            for op in graph.walk():
                if self.kernels.get(op.prim) is None:
                    raise MPSerializationError(f"op {op.opcode} has no kernel on this worker")
            check_payloads(graph)  # native payloads are vetted before C++ parses them here
            self._cache.store(digest, graph)
        return graph, digest
