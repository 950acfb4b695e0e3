"""The backend of the ``psi`` dialect: its per-worker state, the libpsi join and both
kernels.

``psi.join`` runs libpsi (``spu.psi.psi_execute``, shipped in the spu wheel)
between the two holders, over their own link: libspu's in-memory link when every
party lives in this process (the simulator), otherwise a link whose messages go
through the worker's communicator (authenticated, tagged by execution). libpsi
reads and writes CSV files only: each holder writes its distinct encoded keys and
their numbers into a private temporary directory (mode 0700, removed afterwards).
libpsi intersects the two sets; the holders then exchange their row count for each
shared key (what the joined rows show anyway) and each rebuilds its result from
its own table, so every column keeps its exact dtype and values. (libpsi's own
duplicate-key join, ``keys_unique=False``, costs about a fifth more time at 10^6
rows for the same result.)

Before libpsi starts, the two holders exchange a hello (their row count, or why
they cannot take part), so a party with bad input fails both sides at once
instead of leaving its peer waiting for libpsi's timeout (`mplang.kernels.psi.session`).
An empty table on either side skips libpsi: the result follows from the row counts.

``psi.intersection_size`` runs the ECDH protocol of `mplang.kernels.psi.count`.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.dialects import psi
from mplang.edsl.errors import MPLangError, MPRuntimeError
from mplang.kernels.psi.count import count_shared, size_plan
from mplang.kernels.psi.session import (
    U64,
    Session,
    check_table,
    encode_keys,
    stopping,
    u64,
)
from mplang.runtime.backend import WorkerEnv, register_backend
from mplang.runtime.interpreter import Call

if TYPE_CHECKING:
    import pyarrow as pa

    from mplang.kernels.spu.channel import ChannelLinkFactory, MemLinkFactory

backend = register_backend("psi")

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
    from mplang.kernels.spu.channel import ChannelLinkFactory, MemLinkFactory

    links = MemLinkFactory() if env.in_process else ChannelLinkFactory(env.communicator)
    return PsiState(env, links)


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


def write_keys(path: Path, keys: pa.Array) -> None:
    """libpsi's input: encoded ``keys`` (column ``k``) and their row numbers (``i``),
    under a header without quotes (libpsi's older CSV reader takes them literally)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    rows = pa.array(np.arange(len(keys), dtype=np.int64))
    with open(path, "wb") as f:
        f.write(b"k,i\n")
        pcsv.write_csv(pa.table({"k": keys, "i": rows}), f,
                       pcsv.WriteOptions(quoting_style="none", include_header=False,
                                         batch_size=1 << 14))  # faster than 1024 rows a batch


def read_rows(path: Path, rows: int) -> np.ndarray:
    """The row numbers (column ``i``) of a libpsi result, -1 for its empty rows; each
    checked to be a row of a table of ``rows`` rows."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    out = pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
        column_types={"i": pa.int64()}, include_columns=["i"], null_values=[_NULL],
        strings_can_be_null=False))
    found: np.ndarray = out.column("i").combine_chunks().fill_null(-1).to_numpy(
        zero_copy_only=False)
    if found.size and (found.max() >= rows or found.min() < -1):
        raise MPRuntimeError(f"libpsi returned row numbers outside 0..{rows - 1}")
    return found


def call_libpsi(run: Callable[..., Any], *args: Any) -> Any:
    """``run(*args)`` (a libpsi entry point), its errors as `MPRuntimeError`s of one
    line, the Perfetto traces it wrote removed."""
    started = time.time()
    try:
        return run(*args)
    except MPLangError:
        raise
    except RuntimeError as e:  # libpsi's own errors (its link's too)
        raise MPRuntimeError(f"libpsi failed: {_libpsi_message(e)}") from None
    finally:
        _remove_traces(started)


def run_libpsi(run: JoinRun, keys: pa.Array, link: Any, folder: Path) -> np.ndarray:
    """The positions in ``keys`` (this party's distinct encoded keys) of the keys both
    parties hold, in key order; each checked to be one of them, once."""
    from spu import psi as libpsi

    source, result = folder / "keys.csv", folder / "result.csv"
    write_keys(source, keys)
    output = libpsi.OutputParams(path=str(result), csv_null_rep=_NULL)
    output.disable_alignment = True  # both sides sort the shared keys themselves
    config = libpsi.PsiExecuteConfig(
        protocol_conf=libpsi.PsiProtocolConfig(
            protocol=getattr(libpsi.PsiProtocol, f"PROTOCOL_{run.protocol.upper()}"),
            receiver_rank=0, broadcast_result=True,
            ecdh_params=libpsi.EcdhParams(curve=libpsi.EllipticCurveType.CURVE_25519)),
        input_params=libpsi.InputParams(path=str(source), selected_keys=["k"],
                                        keys_unique=True),
        output_params=output)
    call_libpsi(libpsi.psi_execute, config, link)
    shared = np.sort(read_rows(result, len(keys)))
    if shared.size and (shared[0] < 0 or np.any(shared[1:] == shared[:-1])):
        raise MPRuntimeError("libpsi returned an empty row or a key twice")
    return shared


def _run_starts(ordered: pa.Array) -> np.ndarray:
    """Where each run of equal values of the sorted encoded keys ``ordered`` starts (NaN
    equals NaN, as libpsi's text "nan" does)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    starts = np.ones(len(ordered), bool)
    if len(ordered) > 1:
        after, before = ordered[1:], ordered[:-1]
        differ = pc.not_equal(after, before)
        if pa.types.is_floating(ordered.type):
            differ = pc.and_(differ, pc.invert(pc.and_(pc.is_nan(after), pc.is_nan(before))))
        starts[1:] = differ.to_numpy(zero_copy_only=False)
    return starts


def sorted_rows(index: np.ndarray, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``index`` (row numbers, repeats allowed) sorted by (encoded key, row), and where
    each run of equal keys starts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    part_keys = keys.take(pa.array(index))
    order = pc.sort_indices(pa.table({"k": part_keys, "i": index}),
                            sort_keys=[("k", "ascending"), ("i", "ascending")]).to_numpy()
    return index[order], _run_starts(part_keys.take(pa.array(order)))


@dataclass(frozen=True)
class KeyGroups:
    """A party's rows grouped by encoded key: ``rows`` all its row numbers by (key,
    row); group ``g`` (the ``g``-th distinct key) is ``rows[first[g]:first[g] + count[g]]``."""

    rows: np.ndarray
    first: np.ndarray
    count: np.ndarray
    keys: pa.Array
    """The distinct encoded keys, in key order."""


def group_keys(keys: pa.Array) -> KeyGroups:
    """``keys`` (encoded, no nulls) grouped: sorted once, equal keys by row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    numeric = pa.types.is_integer(keys.type) or pa.types.is_floating(keys.type)
    rows = np.argsort(keys.to_numpy(), kind="quicksort") if numeric else None
    if rows is not None:  # NaNs last, as Arrow sorts them
        starts = _run_starts(keys.take(pa.array(rows)))
    if rows is None or not starts.all():  # a stable sort orders equal keys by row
        rows = pc.sort_indices(keys).to_numpy().astype(np.int64)
        starts = _run_starts(keys.take(pa.array(rows)))
    first = np.flatnonzero(starts)
    count = np.diff(np.append(first, len(rows)))
    return KeyGroups(rows, first, count, keys.take(pa.array(rows[first])))


def shared_product(groups: KeyGroups, shared: np.ndarray, peer_count: np.ndarray,
                   side: int) -> np.ndarray:
    """This party's rows of the shared keys (groups ``shared``, in key order), each key
    as a cartesian product with the peer's ``peer_count`` rows of it: A's rows are the
    outer loop (each repeated), B's the inner one (cycling)."""
    mine = groups.count[shared]
    picked = np.zeros(len(groups.count), bool)
    picked[shared] = True
    rows = groups.rows[np.repeat(picked, groups.count)]
    if np.all(peer_count == 1):
        return rows
    if side == 0:
        return np.repeat(rows, np.repeat(peer_count, mine))
    sizes = mine * peer_count
    out_first = np.cumsum(sizes) - sizes
    in_first = np.cumsum(mine) - mine
    group = np.repeat(np.arange(len(mine)), sizes)
    at = np.arange(int(sizes.sum())) - out_first[group]
    return rows[in_first[group] + at % mine[group]]


def join_index(run: JoinRun, groups: KeyGroups, shared: np.ndarray, peer_count: np.ndarray,
               peer_rows: int) -> np.ndarray:
    """The rows of this party's result (-1: a row of nulls): the shared keys' products,
    then (left, full) A's unmatched rows, then (full) B's, each by (key, row)."""
    matched = shared_product(groups, shared, peer_count, run.side)
    if run.how == "inner":
        return matched
    unmatched = np.ones(len(groups.count), bool)
    unmatched[shared] = False
    mine = groups.rows[np.repeat(unmatched, groups.count)]
    nulls = np.full(peer_rows - int(peer_count.sum()), -1, np.int64)
    if run.side == 0:
        parts = [matched, mine] + ([nulls] if run.how == "full" else [])
    else:
        parts = [matched, nulls] + ([mine] if run.how == "full" else [])
    return np.concatenate(parts)


def encode_counts(counts: np.ndarray) -> bytes:
    """A ``counts`` message: empty when every count is 1, else little-endian u64s."""
    return b"" if np.all(counts == 1) else counts.astype("<u8").tobytes()


def decode_counts(data: bytes, shared: int, peer_rows: int) -> np.ndarray:
    """The peer's row count for each of the ``shared`` keys, checked against its
    ``peer_rows`` rows."""
    if not data:
        counts = np.ones(shared, np.int64)
    elif len(data) != 8 * shared:
        raise MPRuntimeError(f"counts: expected {shared} counts, got {len(data)} bytes")
    else:
        counts = np.frombuffer(data, "<u8").astype(np.int64)
    if shared and (counts.min() < 1 or int(counts.sum()) > peer_rows):
        raise MPRuntimeError(f"counts: the peer's counts do not fit its {peer_rows} rows")
    return counts


def take_rows(table: pa.Table, index: np.ndarray) -> pa.Table:
    """The rows ``index`` of ``table``; -1 gives a row of nulls."""
    import pyarrow as pa

    missing = index < 0
    picked = pa.array(np.where(missing, 0, index), mask=missing if missing.any() else None)
    return table.take(picked)


def check_rows(call: Call, table: pa.Table, key: str, what: str) -> None:
    """This party's guard (if any) on the rows of ``table``, its result of a join: they
    count as its distinct non-null keys, at most as many as the distinct rows of this
    party's it holds (the other party repeating a key repeats this party's row, and a
    left or full join adds rows of nulls)."""
    import pyarrow.compute as pc

    guard = call.state("simp").guard
    if guard is not None:
        rows = int(pc.count_distinct(table.column(key), mode="only_valid").as_py())
        guard.check_rows(call.op, rows, what)


def join_table(run: JoinRun, table: pa.Table, session: Session, link: Any) -> pa.Table:
    """This party's result of a ``psi.join`` (after the hello exchange succeeded).

    libpsi intersects the two sets of distinct keys; then each party sends the other
    its row count for each shared key (in key order, which both sides share), from
    which both build the per-key products and the rows of nulls."""
    peer = run.members[1 - run.side]
    peer_rows = u64(session.recv(peer, "hello"), "hello")
    groups = group_keys(encode_keys(table.column(run.key)))
    if table.num_rows == 0 or peer_rows == 0:  # no shared keys: no libpsi, no counts
        session.skip(peer, "counts")
        shared, peer_count = np.zeros(0, np.int64), np.zeros(0, np.int64)
    else:
        with tempfile.TemporaryDirectory(prefix="mplang-psi-") as folder:
            shared = run_libpsi(run, groups.keys, link(), Path(folder))
        session.send(peer, "counts", encode_counts(groups.count[shared]))
        peer_count = decode_counts(session.recv(peer, "counts"), len(shared), peer_rows)
    return take_rows(table, join_index(run, groups, shared, peer_count, peer_rows))


def _libpsi_message(e: RuntimeError) -> str:
    """libpsi's error without its stack trace, on one line."""
    text = " ".join(str(e).split("Stacktrace")[0].split())
    return text.removeprefix("what: ")[:500]


# ---------------------------------------------------------------- kernels


@backend.kernel(psi.join_p)
def _join(call: Call, a: Any, b: Any, *, key: str, how: str, protocol: str) -> list[Any]:
    state: PsiState = call.state("psi")
    rank = state.env.rank
    members = psi.holders(call.op)
    if rank not in members:
        return [None, None]
    side = members.index(rank)
    run = JoinRun(key, how, protocol, side, members)
    peer = members[1 - side]
    session = Session.of(call, state.env, [(peer, "hello"), (peer, "counts")])
    table = (a, b)[side]
    session.refuse(call, check_table(table, key, rank))
    session.send(peer, "hello", U64.pack(table.num_rows))

    def link() -> Any:
        return state.links.link(members, *call.tag, side, session.timeout)

    with stopping(call, session):
        result = join_table(run, table, session, link)
    check_rows(call, result, key, f"the join of its table ({how})")
    return [result, None] if side == 0 else [None, result]


@backend.kernel(psi.size_p)
def _intersection_size(call: Call, a: Any, b: Any, *, key: str, reveal_to: tuple[int, ...]
                       ) -> list[Any]:
    state: PsiState = call.state("psi")
    rank = state.env.rank
    members = psi.holders(call.op)
    if rank not in members and rank not in reveal_to:
        return [None]
    session = Session.of(call, state.env, size_plan(rank, members, reveal_to))
    keys = None
    if rank in members:
        table = (a, b)[members.index(rank)]
        session.refuse(call, check_table(table, key, rank))
        keys = table.column(key).combine_chunks()
    with stopping(call, session):
        shared = count_shared(rank, members, reveal_to, keys, session)
    return [None if shared is None else np.array(shared, np.int64)]
