"""What the two ``psi`` kernels share: the messages of one run, the check of a party's
table, and the encoding of key columns.

Every message of a psi op is a frame: one status byte, then the payload. A party that
cannot go on (bad input, a failure, a failed peer) sends an error frame in place of
every message it still owed (`Session.fail`), so no peer waits for a message that
will not come, and each peer learns why the other stopped, never more.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.edsl.errors import MPCommunicationError, MPRuntimeError
from mplang.runtime.backend import Communicator, WorkerEnv
from mplang.runtime.interpreter import Call

if TYPE_CHECKING:
    import pyarrow as pa

OK, BAD_INPUT, NULL_KEYS, FAILED, DUPLICATE_KEYS, NO_STATE = 0, 1, 2, 3, 4, 5
"""Status codes of a message frame: a peer learns why another party stopped, never more."""
_REASONS = {BAD_INPUT: "its input is not a table with the key column",
            NULL_KEYS: "its key column has null values",
            FAILED: "it stopped (see its own error)",
            DUPLICATE_KEYS: "its key column has duplicate values",
            NO_STATE: "it has no usable prepared set of that name (run psi.ub_prepare on it "
                      "again)"}
U64 = struct.Struct("<Q")
"""A count in a message: an unsigned 64-bit little-endian integer."""

# ---------------------------------------------------------------- keys


def _hex_strings(arr: pa.Array) -> pa.Array:
    """``"x" + hex(utf8(s))`` for every string: CSV-safe, never empty, injective."""
    import pyarrow as pa

    arr = arr.cast(pa.large_string())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset: arr.offset + n + 1]
    data_buf = arr.buffers()[2]
    data = np.frombuffer(data_buf, np.uint8)[offsets[0]: offsets[-1]] if data_buf is not None \
        else np.zeros(0, np.uint8)
    out_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(2 * np.diff(offsets) + 1, out=out_offsets[1:])
    out = np.empty(int(out_offsets[-1]), np.uint8)
    is_prefix = np.zeros(len(out), bool)
    is_prefix[out_offsets[:-1]] = True
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    hexed = np.empty(2 * len(data), np.uint8)
    hexed[0::2], hexed[1::2] = digits[data >> 4], digits[data & 15]
    out[is_prefix], out[~is_prefix] = ord("x"), hexed
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(out_offsets), pa.py_buffer(out))


def encode_keys(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The form both parties give libpsi (and hash) for a key column: equal keys of
    equal dtypes encode equally, and encoded keys sort like the keys. Integers as
    themselves; booleans as 0/1; floats with -0.0 as 0.0 (NaN matches NaN); strings as
    ``x`` + hex of their UTF-8 bytes. Raises ValueError for other types."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _hex_strings(arr)
    if pa.types.is_integer(t):
        return arr
    if pa.types.is_boolean(t):
        return arr.cast(pa.int8())
    if pa.types.is_floating(t):
        return pc.add(arr.cast(pa.float64()), pa.scalar(0.0))
    raise ValueError(f"key columns of type {t} are not supported")


def check_table(table: Any, key: str, rank: int) -> tuple[int, str] | None:
    """Why this party's table cannot enter a PSI, as (status code, message); None if
    it can."""
    import pyarrow as pa

    if not isinstance(table, pa.Table):
        return BAD_INPUT, f"party {rank} holds {type(table).__name__}, not a table"
    if key not in table.column_names:
        return BAD_INPUT, f"party {rank}'s table has no column {key!r} (columns: " \
                          f"{', '.join(table.column_names)})"
    nulls = table.column(key).null_count
    if nulls:
        return NULL_KEYS, f"key column {key!r} of party {rank}'s table has {nulls} null " \
                          "value(s); drop or fill them before the PSI"
    try:
        encode_keys(table.column(key).slice(0, 0))
    except ValueError as e:
        return BAD_INPUT, f"key column {key!r} of party {rank}'s table: {e}"
    return None


def check_distinct(table: pa.Table, key: str, rank: int, op: str) -> tuple[int, str] | None:
    """Why ``op`` cannot take this party's table, whose key column must hold distinct
    values (checked by `check_table` first), as (status code, message); None if it can."""
    import pyarrow.compute as pc

    keys = encode_keys(table.column(key))
    repeated = len(keys) - len(pc.unique(keys))  # 5x faster than count_distinct here
    if repeated:
        return DUPLICATE_KEYS, f"key column {key!r} of party {rank}'s table has {repeated} " \
                               f"repeated value(s); {op} needs distinct keys (keep one row " \
                               "per key, e.g. with table.sql and GROUP BY)"
    return None


# ---------------------------------------------------------------- messages


class PeerFailed(Exception):
    """A peer sent an error frame instead of its message."""

    def __init__(self, src: int, code: int):
        super().__init__(f"party {src} could not take part: "
                         f"{_REASONS.get(code, f'error code {code}')}")


class Session:
    """The messages of one run of a psi op: framed bytes (link traffic), one status byte
    then the payload. ``fail`` sends an error frame in place of every planned message
    not sent yet, so no party waits for one that will not come."""

    def __init__(self, comm: Communicator, exec_id: str, key: str, timeout: float,
                 planned: Sequence[tuple[int, str]]):
        self.comm, self.exec_id, self.key, self.timeout = comm, exec_id, key, timeout
        self.pending = list(planned)

    @classmethod
    def of(cls, call: Call, env: WorkerEnv, planned: Sequence[tuple[int, str]]) -> Session:
        """The session of ``call`` over ``env``'s communicator; its timeout the run's, else
        the worker's."""
        timeout = call.interp.options.timeout or env.timeout
        return cls(env.communicator, call.interp.exec_id, call.key, timeout, planned)

    def _tag(self, name: str) -> tuple[str, str]:
        return (self.exec_id, f"{self.key}/psi#{name}")

    def send(self, dst: int, name: str, payload: bytes) -> None:
        self.pending.remove((dst, name))
        self.comm.send(dst, self._tag(name), bytes([OK]) + payload)

    def recv(self, src: int, name: str) -> bytes:
        data = self.comm.recv(src, self._tag(name), self.timeout)
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) < 1:
            raise MPRuntimeError(f"party {src} sent a malformed {name!r} message")
        data = bytes(data)
        if data[0] != OK:
            raise PeerFailed(src, data[0])
        return data[1:]

    def skip(self, dst: int, name: str) -> None:
        """A planned message turned out not to be needed (by both sides)."""
        self.pending.remove((dst, name))

    def fail(self, code: int) -> None:
        for dst, name in list(self.pending):
            self.pending.remove((dst, name))
            self.comm.send(dst, self._tag(name), bytes([code]))

    def refuse(self, call: Call, problem: tuple[int, str] | None) -> None:
        """If this party's input has a ``problem`` (`check_table`), fail with its code and
        raise its message as an error of ``call``."""
        if problem is not None:
            self.fail(problem[0])
            raise call.error(problem[1])


def u64(data: bytes, what: str) -> int:
    """The count in message ``data`` (`U64`); `MPRuntimeError` naming ``what`` if malformed."""
    if len(data) != U64.size:
        raise MPRuntimeError(f"{what}: expected {U64.size} bytes, got {len(data)}")
    value: int = U64.unpack(data)[0]
    return value


@contextlib.contextmanager
def stopping(call: Call, session: Session) -> Iterator[None]:
    """On any failure, tell the peers waiting for this party, then raise an error that
    names the party and the op. A failure caused by another party's is a communication
    error, so the driver reports the other party's own error as the cause."""
    try:
        yield
    except PeerFailed as e:
        session.fail(FAILED)
        raise call.error(str(e), MPCommunicationError) from None
    except MPCommunicationError:
        session.fail(FAILED)
        raise
    except MPRuntimeError as e:
        session.fail(FAILED)
        raise call.error(str(e)) from None
    except RuntimeError as e:
        session.fail(FAILED)
        raise call.error(f"{type(e).__name__}: {e}") from None
