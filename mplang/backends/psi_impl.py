"""The backend of the ``psi`` dialect: its per-worker state, the libpsi join and both
kernels.

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
instead of leaving its peer waiting for libpsi's timeout (`mplang.backends.psi_session`).
An empty table on either side skips libpsi: the result follows from the row counts.

``psi.intersection_size`` runs the ECDH protocol of `mplang.backends.psi_count`.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.backends.psi_count import count_shared, size_plan
from mplang.backends.psi_session import (
    U64,
    Session,
    check_table,
    encode_keys,
    stopping,
    u64,
)
from mplang.dialects import psi
from mplang.edsl.errors import MPLangError, MPRuntimeError
from mplang.edsl.graph import Operation
from mplang.runtime.backend import WorkerEnv, register_backend
from mplang.runtime.interpreter import Interpreter, op_error

if TYPE_CHECKING:
    import pyarrow as pa

    from mplang.backends.spu_channel import ChannelLinkFactory, MemLinkFactory

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
    from mplang.backends.spu_channel import ChannelLinkFactory, MemLinkFactory

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
                       pcsv.WriteOptions(quoting_style="none", include_header=False))


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
    """libpsi's output for this party, given its encoded ``keys``: for each result row,
    the number of this party's row it shows, or -1 where libpsi puts an empty row (this
    party has no match there)."""
    from spu import psi as libpsi

    source, result = folder / "keys.csv", folder / "result.csv"
    write_keys(source, keys)
    config = libpsi.PsiExecuteConfig(
        protocol_conf=libpsi.PsiProtocolConfig(
            protocol=getattr(libpsi.PsiProtocol, f"PROTOCOL_{run.protocol.upper()}"),
            receiver_rank=0, broadcast_result=True,
            ecdh_params=libpsi.EcdhParams(curve=libpsi.EllipticCurveType.CURVE_25519)),
        input_params=libpsi.InputParams(path=str(source), selected_keys=["k"],
                                        keys_unique=False),
        output_params=libpsi.OutputParams(path=str(result), csv_null_rep=_NULL),
        join_conf=libpsi.ResultJoinConfig(
            type=getattr(libpsi.ResultJoinType, f"JOIN_TYPE_{run.how.upper()}_JOIN"),
            left_side_rank=0))
    call_libpsi(libpsi.psi_execute, config, link)
    return read_rows(result, len(keys))


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


def sorted_rows(index: np.ndarray, keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``index`` (row numbers, repeats allowed) sorted by (encoded key, row), and where
    each run of equal keys starts."""
    import pyarrow as pa
    import pyarrow.compute as pc

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
    rows, starts = sorted_rows(index, keys)
    if side == 0 or starts.all():  # A's order, or no key repeated: nothing to pair
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
        out[lo:hi] = pair_shared(part, keys, side) if n == 0 else sorted_rows(part, keys)[0]
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
    import pyarrow as pa

    missing = index < 0
    picked = pa.array(np.where(missing, 0, index), mask=missing if missing.any() else None)
    return table.take(picked)


def distinct_keys(table: pa.Table, key: str) -> int:
    """How many distinct non-null keys ``table`` holds: at most as many as the distinct
    rows of this party's that a join's result ``table`` holds (the other party repeating
    a key repeats this party's row, and a left or full join adds rows of nulls)."""
    import pyarrow.compute as pc

    return int(pc.count_distinct(table.column(key), mode="only_valid").as_py())


def join_table(run: JoinRun, table: pa.Table, session: Session, link: Any) -> pa.Table:
    """This party's result of a ``psi.join`` (after the hello exchange succeeded)."""
    peer = run.members[1 - run.side]
    peer_rows = u64(session.recv(peer, "hello"), "hello")
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
            session.send(peer, "missing", U64.pack(missing))
            peer_missing = u64(session.recv(peer, "missing"), "missing")
            ranges = sections(run.how, len(index), missing, peer_missing, run.side)
    return take_rows(table, order_result(index, keys, ranges, run.side))


def _libpsi_message(e: RuntimeError) -> str:
    """libpsi's error without its stack trace, on one line."""
    text = " ".join(str(e).split("Stacktrace")[0].split())
    return text.removeprefix("what: ")[:500]


# ---------------------------------------------------------------- kernels


@backend.kernel(psi.join_p)
def _join(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    state: PsiState = interp.states["psi"]
    rank = state.env.rank
    members = psi.holders(op)
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
        raise op_error(interp, op, problem[1])
    session.send(peer, "hello", U64.pack(table.num_rows))

    def link() -> Any:
        return state.links.link(members, interp.exec_id, key, side, timeout)

    with stopping(interp, op, session):
        result = join_table(run, table, session, link)
    guard = interp.states["simp"].guard
    if guard is not None:  # rows repeated for the other's repeated keys count once
        guard.check_rows(op, distinct_keys(result, run.key), f"the join of its table ({run.how})")
    return [result, None] if side == 0 else [None, result]


@backend.kernel(psi.size_p)
def _intersection_size(interp: Interpreter, op: Operation, args: list[Any], key: str
                       ) -> list[Any]:
    state: PsiState = interp.states["psi"]
    rank = state.env.rank
    members = psi.holders(op)
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
            raise op_error(interp, op, problem[1])
        keys = table.column(op.attrs["key"]).combine_chunks()
    with stopping(interp, op, session):
        shared = count_shared(rank, members, reveal_to, keys, session)
    return [None if shared is None else np.array(shared, np.int64)]
