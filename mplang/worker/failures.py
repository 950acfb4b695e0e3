"""What of an op's failure leaves its party.

Kernels (DuckDB, JAX, libpsi, numpy...) quote the values they choke on in their
messages, so an op failure leaves a party (the ``/run`` answer to the driver, the
simulator's exception, an abort reason passed on to the peers) only as a generic
error naming the op, its source line and the node. The full text stays in this
party's log (the ``mplang.worker`` logger, and its audit log on a worker). Errors
about the program or the protocol, which hold no data, leave as they are (`PASSES`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from mplang.edsl.errors import (
    MPCommunicationError,
    MPPublicError,
    MPRefusedError,
    MPRuntimeError,
)
from mplang.edsl.graph import Operation
from mplang.storage.data_root import BadPath, MissingData

log = logging.getLogger("mplang.worker")

PASSES: tuple[type[Exception], ...] = (MPRefusedError, MPCommunicationError, MPPublicError,
                                       MissingData, BadPath)
"""Errors whose text is about the program or the protocol, never the party's data: a
refusal (a policy, a limit), a message that did not come in time, a kernel's own check
of the program, types, keys or attestation (`MPPublicError`), a file or object the
program names that is not there, a path it may not use."""


class Containment:
    """The `mplang.runtime.interpreter.Contain` of one run on party ``rank`` (node
    ``node``): ``on_failure`` hears the full text of each failure it makes generic."""

    def __init__(self, rank: int, node: str, exec_id: str,
                 on_failure: Callable[[str], None] | None = None):
        self.rank = rank
        self.node = node
        self.exec_id = exec_id
        self.on_failure = on_failure

    def __call__(self, op: Operation, key: str, error: Exception) -> Exception:
        """``error`` itself if it is one of `PASSES`; else, once its full text is logged,
        a new `MPRuntimeError` naming the op, its source line and the node, and nothing
        of ``error``."""
        if isinstance(error, PASSES):
            return error
        at = f" at {op.loc}" if op.loc else ""
        text = f"{type(error).__name__}: {error}"
        log.error("execution %s: op %s%s (run %s) failed on %s: %s", self.exec_id,
                  op.opcode, at, key, self.node, text)
        if self.on_failure is not None:
            self.on_failure(text)
        return MPRuntimeError(f"op {op.opcode}{at} failed on {self.node} (party {self.rank}; "
                              "its log has the details)", party=self.rank, op=op.opcode, key=key,
                              loc=op.loc)
