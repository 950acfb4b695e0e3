"""Kernels of the ``psi`` dialect: libpsi joins and an ECDH intersection count.

``psi.join`` runs libpsi (``spu.psi.psi_execute``, shipped in the spu wheel)
between the two holders, over their own link: libspu's in-memory link when every
party lives in this process (the simulator), otherwise a link whose messages go
through the worker's communicator (authenticated, tagged by execution). libpsi
reads and writes CSV files only: each holder writes two columns, its encoded
keys and its row numbers, into a private temporary directory (mode 0700, removed
afterwards), and rebuilds its result from its own table with the row numbers
libpsi returns, so every column keeps its exact dtype and values.

Before libpsi starts, the two holders exchange a hello (their row count, or why
they cannot take part), so a party with bad input fails both sides at once
instead of leaving its peer waiting for libpsi's timeout. An empty table on
either side skips libpsi: the result follows from the row counts.

``psi.intersection_size`` is the Diffie-Hellman PSI-cardinality protocol over
X25519 (``cryptography``): each holder hashes its distinct keys to curve
points, raises them to its secret scalar, and the other holder raises them
again; doubly-blinded sets are sorted (so no order links them to the keys) and
only their overlap is counted, by one party that shares the count with the
others named in ``reveal_to``.
"""

from __future__ import annotations

import contextlib
import hashlib
import struct
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from spu import psi as libpsi

from mplang.backends.spu_channel import ChannelLinkFactory, MemLinkFactory
from mplang.dialects import psi
from mplang.dialects.table import TableType
from mplang.edsl.graph import Operation
from mplang.edsl.typing import MPType
from mplang.edsl.errors import MPCommunicationError, MPRuntimeError
from mplang.policy.flows import Analysis, PartyLabels
from mplang.policy.labels import Label, compared, join, reduced
from mplang.runtime.backend import Communicator, WorkerEnv, register_backend
from mplang.runtime.interpreter import Interpreter
from mplang.dialects import psi as _psi

backend = register_backend("psi")

_PROTOCOLS = {"rr22": libpsi.PsiProtocol.PROTOCOL_RR22, "kkrt": libpsi.PsiProtocol.PROTOCOL_KKRT,
              "ecdh": libpsi.PsiProtocol.PROTOCOL_ECDH}
_JOINS = {"inner": libpsi.ResultJoinType.JOIN_TYPE_INNER_JOIN,
          "left": libpsi.ResultJoinType.JOIN_TYPE_LEFT_JOIN,
          "full": libpsi.ResultJoinType.JOIN_TYPE_FULL_JOIN}
_NULL = "NULL"
"""libpsi's text for a missing row in its output (only the row-number column is read)."""


@dataclass(frozen=True)
class PsiState:
    """What the ``psi`` kernels of one worker know: its rank, links and communicator."""

    env: WorkerEnv
    links: MemLinkFactory | ChannelLinkFactory


LIBPSI_TRACES = Path("/tmp")
"""Where libpsi writes a Perfetto trace (timings) of every run, ``psi_*.trace``: a fixed
folder, whatever TMPDIR says."""


def _remove_traces(since: float) -> None:
    """Delete the libpsi traces written since ``since`` (this run's, and maybe another
    concurrent run's: they hold timings only, and nobody reads them)."""
    for trace in LIBPSI_TRACES.glob("psi_*.trace"):
        with contextlib.suppress(OSError):
            if trace.is_file() and not trace.is_symlink() and trace.stat().st_mtime >= since - 1:
                trace.unlink()


@backend.state
def _state(env: WorkerEnv) -> PsiState:
    links = MemLinkFactory(env.timeout) if env.in_process else \
        ChannelLinkFactory(env.communicator, env.timeout)
    return PsiState(env, links)


# ---------------------------------------------------------------- keys


def _hex_strings(arr: pa.Array) -> pa.Array:
    """``"x" + hex(utf8(s))`` for every string: CSV-safe, never empty, injective."""
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


_OK, _BAD_INPUT, _NULL_KEYS, _FAILED = 0, 1, 2, 3
"""Status codes of a message frame: a peer learns why another party stopped, never more."""
_REASONS = {_BAD_INPUT: "its input is not a table with the key column",
            _NULL_KEYS: "its key column has null values",
            _FAILED: "it stopped (see its own error)"}
_U64 = struct.Struct("<Q")


def check_table(table: Any, key: str, rank: int) -> tuple[int, str] | None:
    """Why this party's table cannot enter a PSI, as (status code, message); None if
    it can."""
    if not isinstance(table, pa.Table):
        return _BAD_INPUT, f"party {rank} holds {type(table).__name__}, not a table"
    if key not in table.column_names:
        return _BAD_INPUT, f"party {rank}'s table has no column {key!r} (columns: " \
                           f"{', '.join(table.column_names)})"
    nulls = table.column(key).null_count
    if nulls:
        return _NULL_KEYS, f"key column {key!r} of party {rank}'s table has {nulls} null " \
                           "value(s); drop or fill them before the PSI"
    try:
        encode_keys(table.column(key).slice(0, 0))
    except ValueError as e:
        return _BAD_INPUT, f"key column {key!r} of party {rank}'s table: {e}"
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

    def _tag(self, name: str) -> tuple[str, str]:
        return (self.exec_id, f"{self.key}/psi#{name}")

    def send(self, dst: int, name: str, payload: bytes) -> None:
        self.pending.remove((dst, name))
        self.comm.send(dst, self._tag(name), bytes([_OK]) + payload)

    def recv(self, src: int, name: str) -> bytes:
        data = self.comm.recv(src, self._tag(name), self.timeout)
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) < 1:
            raise MPRuntimeError(f"party {src} sent a malformed {name!r} message")
        data = bytes(data)
        if data[0] != _OK:
            raise PeerFailed(src, data[0])
        return data[1:]

    def skip(self, dst: int, name: str) -> None:
        """A planned message turned out not to be needed (by both sides)."""
        self.pending.remove((dst, name))

    def fail(self, code: int) -> None:
        for dst, name in list(self.pending):
            self.pending.remove((dst, name))
            self.comm.send(dst, self._tag(name), bytes([code]))


def _u64(data: bytes, what: str) -> int:
    if len(data) != _U64.size:
        raise MPRuntimeError(f"{what}: expected {_U64.size} bytes, got {len(data)}")
    value: int = _U64.unpack(data)[0]
    return value


# ---------------------------------------------------------------- libpsi join


@dataclass(frozen=True)
class JoinRun:
    """One holder's part of a ``psi.join``: ``side`` 0 is A (the left side), 1 is B."""

    key: str
    how: str
    protocol: str
    side: int
    members: tuple[int, int]
    """The ranks of A and B."""


def run_libpsi(run: JoinRun, keys: pa.Array, link: Any, folder: Path) -> np.ndarray:
    """libpsi's output for this party, given its encoded ``keys``: for each result row,
    the number of this party's row it shows, or -1 where libpsi puts an empty row (this
    party has no match there)."""
    source, result = folder / "keys.csv", folder / "result.csv"
    rows = pa.array(np.arange(len(keys), dtype=np.int64))
    pcsv.write_csv(pa.table({"k": keys, "i": rows}), source,
                   pcsv.WriteOptions(quoting_style="none"))
    config = libpsi.PsiExecuteConfig(
        protocol_conf=libpsi.PsiProtocolConfig(
            protocol=_PROTOCOLS[run.protocol], receiver_rank=0, broadcast_result=True,
            ecdh_params=libpsi.EcdhParams(curve=libpsi.EllipticCurveType.CURVE_25519)),
        input_params=libpsi.InputParams(path=str(source), selected_keys=["k"],
                                        keys_unique=False),
        output_params=libpsi.OutputParams(path=str(result), csv_null_rep=_NULL),
        join_conf=libpsi.ResultJoinConfig(type=_JOINS[run.how], left_side_rank=0))
    started = time.time()
    try:
        libpsi.psi_execute(config, link)
    finally:
        _remove_traces(started)
    out = pcsv.read_csv(result, convert_options=pcsv.ConvertOptions(
        column_types={"i": pa.int64()}, include_columns=["i"], null_values=[_NULL],
        strings_can_be_null=False))
    index = out.column("i").combine_chunks()
    found: np.ndarray = index.fill_null(-1).to_numpy(zero_copy_only=False)
    if found.size and (found.max() >= len(keys) or found.min() < -1):
        raise MPRuntimeError(f"libpsi returned row numbers outside 0..{len(keys) - 1}")
    return found


def sections(how: str, total: int, mine_missing: int, peer_missing: int, side: int
             ) -> list[tuple[int, int]]:
    """The row ranges of libpsi's result: shared keys, then (left, full) A's unmatched
    rows, then (full) B's. ``*_missing``: rows where that party has no match (-1)."""
    a_only = peer_missing if side == 0 else mine_missing
    b_only = mine_missing if side == 0 else peer_missing
    shared = total - a_only - b_only
    if shared < 0:
        raise MPRuntimeError(f"libpsi's result has {total} rows, fewer than the "
                             f"{a_only + b_only} unmatched ones")
    return [(0, shared), (shared, shared + a_only), (shared + a_only, total)]


def _sorted_rows(index: np.ndarray, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``index`` (row numbers, repeats allowed) sorted by (encoded key, row), and where
    each run of equal keys starts."""
    part_keys = keys.take(pa.array(index))
    order = pc.sort_indices(pa.table({"k": part_keys, "i": index}),
                            sort_keys=[("k", "ascending"), ("i", "ascending")]).to_numpy()
    rows, ordered_keys = index[order], part_keys.take(pa.array(order))
    starts = np.ones(len(rows), bool)
    if len(rows) > 1:
        after, before = ordered_keys[1:], ordered_keys[:-1]
        differ = pc.not_equal(after, before)
        if pa.types.is_floating(ordered_keys.type):  # NaN keys match (libpsi: "nan")
            differ = pc.and_(differ, pc.invert(pc.and_(pc.is_nan(after), pc.is_nan(before))))
        starts[1:] = differ.to_numpy(zero_copy_only=False)
    return rows, starts


def pair_shared(index: np.ndarray, keys: pa.Array, side: int) -> np.ndarray:
    """The shared-key rows of libpsi's result as a per-key cartesian product, in key
    order: A's rows (the outer loop) and B's rows (the inner loop) in row order.

    libpsi gives each party its own rows for a key, each repeated as many times as
    the peer has rows with that key, but does not pair them into a product when both
    sides repeat a key; both parties rebuild the pairing from that shape alone, so
    they agree on it without another message."""
    rows, starts = _sorted_rows(index, keys)
    if side == 0 or len(rows) == 0:
        return rows
    first = np.flatnonzero(starts)
    sizes = np.diff(np.append(first, len(rows)))
    fresh = starts.copy()
    fresh[1:] |= rows[1:] != rows[:-1]
    mine = np.add.reduceat(fresh.astype(np.int64), first)
    if np.any(sizes % mine):
        raise MPRuntimeError("libpsi's result does not repeat this party's rows evenly")
    group = np.cumsum(starts) - 1
    at = np.arange(len(rows)) - first[group]
    n_mine, n_peer = mine[group], (sizes // mine)[group]
    # sorted: each of my rows n_peer times in a row; wanted: my rows cycling n_peer times
    return rows[first[group] + (at % n_mine) * n_peer + at // n_mine]


def order_result(index: np.ndarray, keys: pa.Array, ranges: Sequence[tuple[int, int]],
                 side: int) -> np.ndarray:
    """libpsi's result in the documented order: shared keys (a cartesian product per
    key, by key), then each party's unmatched rows by (key, row); rows of nulls (no
    match on this side) stay where they are."""
    out = index.copy()
    for n, (lo, hi) in enumerate(ranges):
        part = out[lo:hi]
        if part.size == 0 or part[0] < 0:
            continue
        out[lo:hi] = pair_shared(part, keys, side) if n == 0 else _sorted_rows(part, keys)[0]
    return out


def trivial_index(run: JoinRun, rows: int, peer_rows: int) -> np.ndarray:
    """The result when one table is empty (no shared keys): who keeps what, from the
    row counts alone."""
    mine, empty = np.arange(rows, dtype=np.int64), np.full(peer_rows, -1, np.int64)
    if run.how == "inner":
        return np.zeros(0, np.int64)
    if run.how == "left":
        return mine if run.side == 0 else np.full(peer_rows, -1, np.int64)
    return np.concatenate([mine, empty] if run.side == 0 else [empty, mine])


def take_rows(table: pa.Table, index: np.ndarray) -> pa.Table:
    """The rows ``index`` of ``table``; -1 gives a row of nulls."""
    missing = index < 0
    picked = pa.array(np.where(missing, 0, index), mask=missing if missing.any() else None)
    return table.take(picked)


def join_table(run: JoinRun, table: pa.Table, session: Session, link: Any) -> pa.Table:
    """This party's result of a ``psi.join`` (after the hello exchange succeeded)."""
    peer = run.members[1 - run.side]
    peer_rows = _u64(session.recv(peer, "hello"), "hello")
    keys = encode_keys(table.column(run.key))
    if table.num_rows == 0 or peer_rows == 0:
        index = trivial_index(run, table.num_rows, peer_rows)
        if run.how != "inner":
            session.skip(peer, "missing")
        # no shared keys: the peer has empty rows exactly where this party has rows
        ranges = sections(run.how, len(index), int((index < 0).sum()),
                          int((index >= 0).sum()), run.side)
    else:
        with tempfile.TemporaryDirectory(prefix="mplang-psi-") as folder:
            index = run_libpsi(run, keys, link(), Path(folder))
        ranges = [(0, len(index))]
        if run.how != "inner":
            missing = int((index < 0).sum())
            session.send(peer, "missing", _U64.pack(missing))
            peer_missing = _u64(session.recv(peer, "missing"), "missing")
            ranges = sections(run.how, len(index), missing, peer_missing, run.side)
    return take_rows(table, order_result(index, keys, ranges, run.side))


def _fail(interp: Interpreter, op: Operation, message: str,
          kind: type[MPRuntimeError] = MPRuntimeError) -> MPRuntimeError:
    return kind(f"party {interp.party}: op {op.opcode}: {message}", party=interp.party,
                op=op.opcode, loc=op.loc)


def _libpsi_message(e: RuntimeError) -> str:
    """libpsi's error without its stack trace, on one line."""
    text = " ".join(str(e).split("Stacktrace")[0].split())
    return text.removeprefix("what: ")[:500]


@contextlib.contextmanager
def _stopping(interp: Interpreter, op: Operation, session: Session) -> Iterator[None]:
    """On any failure, tell the peers waiting for this party, then raise an error that
    names the party and the op. A failure caused by another party's is a communication
    error, so the driver reports the other party's own error as the cause."""
    try:
        yield
    except PeerFailed as e:
        session.fail(_FAILED)
        raise _fail(interp, op, str(e), MPCommunicationError) from None
    except MPCommunicationError:
        session.fail(_FAILED)
        raise
    except MPRuntimeError as e:
        session.fail(_FAILED)
        raise _fail(interp, op, str(e)) from None
    except RuntimeError as e:  # libpsi's own errors (its link's too)
        session.fail(_FAILED)
        raise _fail(interp, op, f"libpsi failed: {_libpsi_message(e)}") from None


def _holders(op: Operation) -> tuple[int, int]:
    ta, tb = op.inputs[0].type, op.inputs[1].type
    assert isinstance(ta, MPType) and ta.pmask is not None
    assert isinstance(tb, MPType) and tb.pmask is not None
    return ta.pmask.parties[0], tb.pmask.parties[0]


def _declared(op: Operation, side: int) -> TableType:
    t = op.inputs[side].type
    assert isinstance(t, MPType) and isinstance(t.base, TableType)
    return t.base


@backend.kernel(_psi.join_p)
def _join(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    state: PsiState = interp.states["psi"]
    rank = state.env.rank
    members = _holders(op)
    if rank not in members:
        return [None, None]
    side = members.index(rank)
    run = JoinRun(op.attrs["key"], op.attrs["how"], op.attrs["protocol"], side, members)
    peer = members[1 - side]
    plan = [(peer, "hello")] + ([(peer, "missing")] if run.how != "inner" else [])
    timeout = interp.options.timeout or state.env.timeout
    session = Session(state.env.communicator, interp.exec_id, key, timeout, plan)
    table = args[side]
    problem = check_table(table, run.key, rank)
    if problem is not None:
        session.fail(problem[0])
        raise _fail(interp, op, problem[1])
    session.send(peer, "hello", _U64.pack(table.num_rows))

    def link() -> Any:
        return state.links.link(members, interp.exec_id, key, side)

    with _stopping(interp, op, session):
        result = join_table(run, table, session, link)
    return [result, None] if side == 0 else [None, result]


# ---------------------------------------------------------------- ECDH intersection size

_POINT = 32
_DOMAIN = b"mplang psi.intersection_size v1\x00"


def hash_points(keys: pa.Array) -> list[bytes]:
    """Each distinct key hashed to an X25519 u-coordinate (SHA-256, top bit cleared)."""
    distinct = pc.unique(encode_keys(keys))
    points = []
    for value in distinct.to_pylist():
        digest = bytearray(hashlib.sha256(_DOMAIN + str(value).encode()).digest())
        digest[31] &= 0x7F
        points.append(bytes(digest))
    return points


def blind(secret: X25519PrivateKey, points: Sequence[bytes]) -> bytes:
    """``secret`` times every point, sorted (so the order says nothing), concatenated."""
    try:
        out = sorted(secret.exchange(X25519PublicKey.from_public_bytes(p)) for p in points)
    except ValueError:
        raise MPRuntimeError("a point of small order was received (a peer deviated from "
                             "the protocol)") from None
    return b"".join(out)


def split_points(data: bytes, what: str) -> list[bytes]:
    if len(data) % _POINT:
        raise MPRuntimeError(f"{what}: {len(data)} bytes is not a whole number of points")
    return [data[i: i + _POINT] for i in range(0, len(data), _POINT)]


def counter_of(members: tuple[int, int], reveal_to: Sequence[int]) -> int:
    """The party that counts: A if it may learn the count, else B, else the first named."""
    for holder in members:
        if holder in reveal_to:
            return holder
    return reveal_to[0]


def size_plan(rank: int, members: tuple[int, int], reveal_to: Sequence[int]
              ) -> list[tuple[int, str]]:
    """The messages ``rank`` sends in one ``psi.intersection_size``."""
    counter = counter_of(members, reveal_to)
    plan: list[tuple[int, str]] = []
    if rank in members:
        peer = members[1 - members.index(rank)]
        plan.append((peer, "blinded"))
        if rank != counter:
            plan.append((counter, "twice"))
    if rank == counter:
        plan += [(r, "count") for r in reveal_to if r != counter]
    return plan


def count_shared(rank: int, members: tuple[int, int], reveal_to: Sequence[int],
                 keys: pa.Array | None, session: Session) -> int | None:
    """This party's part of the protocol: the count where ``rank`` is in ``reveal_to``.

    Holder H blinds its distinct keys with its secret and sends them to the other
    holder, which blinds them again: the counter gets both twice-blinded sets (one
    of them computed by itself when it is a holder) and counts their overlap."""
    counter = counter_of(members, reveal_to)

    def other(holder: int) -> int:
        return members[1 - members.index(holder)]

    twice: dict[int, list[bytes]] = {}
    """holder -> its keys, blinded by both holders"""
    if rank in members:
        assert keys is not None
        secret = X25519PrivateKey.generate()
        session.send(other(rank), "blinded", blind(secret, hash_points(keys)))
        theirs = blind(secret, split_points(session.recv(other(rank), "blinded"),
                                            "blinded keys"))
        if rank == counter:
            twice[other(rank)] = split_points(theirs, "twice-blinded keys")
        else:
            session.send(counter, "twice", theirs)
    if rank != counter:
        return _u64(session.recv(counter, "count"), "count") if rank in reveal_to else None
    for holder in members:
        if holder != rank:  # it sends the other holder's keys, blinded by both
            twice[other(holder)] = split_points(session.recv(holder, "twice"),
                                                "twice-blinded keys")
    shared = len(set(twice[members[0]]) & set(twice[members[1]]))
    for r in reveal_to:
        if r != counter:
            session.send(r, "count", _U64.pack(shared))
    return shared


@backend.kernel(_psi.size_p)
def _intersection_size(interp: Interpreter, op: Operation, args: list[Any], key: str
                       ) -> list[Any]:
    state: PsiState = interp.states["psi"]
    rank = state.env.rank
    members = _holders(op)
    reveal_to: tuple[int, ...] = tuple(op.attrs["reveal_to"])
    if rank not in members and rank not in reveal_to:
        return [None]
    timeout = interp.options.timeout or state.env.timeout
    session = Session(state.env.communicator, interp.exec_id, key, timeout,
                      size_plan(rank, members, reveal_to))
    keys = None
    if rank in members:
        side = members.index(rank)
        table = args[side]
        problem = check_table(table, op.attrs["key"], rank)
        if problem is not None:
            session.fail(problem[0])
            raise _fail(interp, op, problem[1])
        keys = table.column(op.attrs["key"]).combine_chunks()
    with _stopping(interp, op, session):
        shared = count_shared(rank, members, reveal_to, keys, session)
    return [None if shared is None else np.array(shared, np.int64)]


# ---------------------------------------------------------------- policy flow rules


@psi.join_p.def_flow
def _join_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Each holder keeps its own rows and learns which of its keys the other holds (a
    comparison of the other's data)."""
    holder_a, holder_b = _holders(op)
    la, lb = ins[0].get(holder_a), ins[1].get(holder_b)
    what = "which of the receiver's keys this party's table holds"
    a.send(op, holder_a, compared(lb), what)
    a.send(op, holder_b, compared(la), what)
    out_a, out_b = join(la, compared(lb)), join(lb, compared(la))
    return [{} if out_a is None else {holder_a: out_a},
            {} if out_b is None else {holder_b: out_b}]


def _rows(op: Operation, side: int) -> int:
    return max(1, _declared(op, side).rows or 1)


@psi.size_p.def_flow
def _size_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """A count of comparisons reaches ``reveal_to``; each holder learns how many distinct
    keys the other has."""
    holder_a, holder_b = _holders(op)
    la: Label = reduced(compared(ins[0].get(holder_a)), _rows(op, 0))
    lb: Label = reduced(compared(ins[1].get(holder_b)), _rows(op, 1))
    a.send(op, holder_b, la, "the number of distinct keys of this party's table")
    a.send(op, holder_a, lb, "the number of distinct keys of this party's table")
    count = join(la, lb)
    reveal_to = tuple(op.attrs["reveal_to"])
    counter = counter_of((holder_a, holder_b), reveal_to)
    if counter not in (holder_a, holder_b):  # it receives both blinded sets
        a.send(op, counter, count, "the numbers of distinct keys of both tables")
    for r in reveal_to:
        a.send(op, r, count, "the intersection size")
    return [{} if count is None else dict.fromkeys(reveal_to, count)]
