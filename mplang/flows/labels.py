"""Flow labels: what a value reveals of one party's data.

The analysis of party p gives every value a label: None (not derived from any
party's loaded data), ``foreign`` (derived from other parties' loaded data only)
or one of p's forms, from most to least revealing:

- ``raw``: the elements themselves, or anything not modelled;
- ``rowwise``: every row of p's data transformed alike (elementwise with scalars,
  with values uniform along the rows or with other owners' row-aligned values);
  revealed as it is, a row-wise value is raw;
- ``aggregate``: a reduction over the row axis of a row-wise value; it records the
  rows it combines (`Rows`), so that overlapping aggregates can be told apart;
- ``compare``: a comparison between p's data and another owner's data;
- ``dp``: a differentially private release of p's data (noise drawn inside a secure
  device, `mplang.flows.dp_flows`), of privacy loss at most ``epsilon`` per release;
- ``approved``: the outputs of library functions that each member derived itself
  (`mplang.flows.vouched`), released only to whom p's ``approve`` entries name.

A row-wise value knows where p's rows sit on its row axis (``axis``, ``at``) and
which rows of the source they are (``window``); an aggregate knows which sets of
rows it combines (``rowsets``). A value whose rows were weighted by a mask (a
comparison result: a group-by over another owner's keys, or p's values selected by
a band of their own) is ``gated``: how many of p's rows it combines depends on data.
"""

from __future__ import annotations

import bisect
import itertools
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

FORMS = ("raw", "rowwise", "aggregate", "compare", "dp", "approved")
"""p's forms, most revealing first."""


@dataclass(frozen=True)
class Rows:
    """Rows ``[lo, hi)`` of ``sources`` (``step`` 0), or one aligned block of ``step``
    rows among them, not known which (``step`` > 0)."""

    sources: frozenset[str]
    lo: int
    hi: int
    step: int = 0
    gate: int = 0
    """Nonzero: only those of the rows that data chose (a PSI join, a group), the same
    rows wherever the gate is the same."""
    partition: bool = False
    """With a gate: the gate's groups cover every row of the set, none suppressed (the
    leaves of a tree), so their sums add up to the whole set's."""

    @property
    def size(self) -> int:
        """How many rows the set has (0 if not known: a table of unknown size)."""
        return self.step or max(0, self.hi - self.lo)

    def bounds(self) -> list[int]:
        """The row indices where the set (or a block of it) starts or ends."""
        if self.hi < 0:
            return []
        if not self.step:
            return [self.lo, self.hi]
        return [*range(self.lo, self.hi, self.step), self.hi]

    def __str__(self) -> str:
        if self.gate:
            return "rows that data chose"
        if self.step:
            return f"a block of {self.step} of rows {self.lo}..{self.hi - 1}"
        return f"rows {self.lo}..{self.hi - 1}"


@dataclass(frozen=True)
class Flow:
    """A value's label in the analysis of one party (see the module docstring)."""

    form: str
    sources: frozenset[str] = frozenset()
    window: Rows | None = None
    """rowwise: the source rows the value's rows are."""
    axis: int | None = None
    """rowwise: the row axis (None: a single row, its axis gone)."""
    at: int = 0
    """rowwise: where p's rows start on the row axis (others' rows may surround them)."""
    outer: int | None = None
    """rowwise: the axis of blocks when the rows were split into blocks of
    ``window.step`` rows (the row axis then holds the rows of one block)."""
    rowsets: frozenset[Rows] = frozenset()
    """The sets of p's rows aggregated into the value."""
    pure: bool = False
    """The data as loaded (reshaped or converted at most): ready for a comparison."""
    gated: bool = False
    """p's rows were weighted by a mask: the aggregated row count is not known
    statically."""
    mask: bool = False
    """foreign or rowwise: a comparison result (a mask over the rows); p's values
    weighted by a mask are ``gated``."""
    enforced: int | None = None
    """aggregate: groups smaller than this many rows are suppressed at run time."""
    sealed: bool = False
    """Encrypted under a key pair whose private key never leaves its maker (a PHE
    ciphertext): holding it reveals nothing; decrypting it does."""
    enclave: str = ""
    """p's data inside a TEE enclave that p checked runs only the computation of this
    digest (sealed: encrypted to such an enclave); ``foreign``: a key so attested."""
    epsilon: float = 0.0
    """dp: the largest epsilon of the releases the value derives from."""
    approved: frozenset[str] = frozenset()
    """approved: the library functions (by public name) whose outputs the value derives
    from; p must approve each."""
    membership: bool = False
    """compare: which of another holder's keys p's table holds, as a PSI join shows
    (judged by ``intersection`` rules)."""
    borrowed: bool = False
    """rowwise: another holder's values on the rows of p's that a PSI join kept: p's
    data for which rows they are, another owner's values for how they weight p's rows."""
    cause: str = field(default="", compare=False)
    """raw: the op that made p's data raw, and where (refusals name it)."""

    @property
    def mine(self) -> bool:
        """Whether the label is of p's data (not ``foreign``)."""
        return self.form != "foreign"

    @property
    def rows(self) -> int | None:
        """aggregate: the fewest rows any element combines (None: depends on data)."""
        if self.gated:
            return self.enforced
        sizes = [r.size for r in self.rowsets]
        return min(sizes) if sizes else None

    @property
    def declassified_as(self) -> str:
        """The form a policy judges: row-wise values revealed as they are are raw."""
        return "raw" if self.form == "rowwise" else \
            "intersection" if self.membership else self.form

    def __str__(self) -> str:
        of = ", ".join(sorted(self.sources)) or "its data"
        if self.form == "aggregate":
            rows = self.rows
            what = "aggregate over a data-dependent number of rows" if rows is None else \
                "aggregate over the rows a join kept (at least min_rows, checked at run " \
                "time)" if rows == ENFORCED else f"aggregate over groups of at least {rows} " \
                "rows (smaller ones suppressed at run time)" if self.gated else \
                f"aggregate over {rows} rows"
            return f"{what} of {of}"
        if self.form == "rowwise":
            return f"row-wise (raw) values of {of}"
        if self.form == "dp":
            return f"a noisy release (epsilon {self.epsilon:g}) of {of}"
        if self.form == "approved":
            return f"the output of {', '.join(sorted(self.approved))} on {of}"
        if self.membership:
            return f"which keys the join matched of {of}"
        return f"{self.form} of {of}"


Label = Flow | None

FOREIGN = Flow("foreign", pure=True)
"""Another owner's data as loaded."""


UNKNOWN = -1
"""``Rows.hi`` of a table whose row count is known only at run time."""


def source_path(path: str) -> str:
    """The name a file of the data root goes by as a source: ``./x.npy``, ``a//x.npy``
    and ``a/../x.npy`` are the same file as ``x.npy``, so they are one source."""
    return posixpath.normpath(path)


def source(name: str, rows: int | None, table: bool = False) -> Flow:
    """The label of p's data loaded from source ``name``: ``rows`` rows (None: a scalar,
    or a ``table`` whose row count is known only at run time)."""
    if (rows is None and not table) or (rows is not None and rows < 1):
        return Flow("raw", frozenset([name]), pure=True)
    window = Rows(frozenset([name]), 0, UNKNOWN if rows is None else rows)
    return Flow("rowwise", frozenset([name]), window, 0, 0, pure=True)


def raw(labels: Iterable[Label]) -> Label:
    """The label of anything not modelled: raw from every one of p's inputs; ``foreign``
    (not pure) if only other owners' data goes in."""
    sources: frozenset[str] = frozenset()
    mine = foreign = False
    cause = ""
    for label in labels:
        if label is None:
            continue
        if label.mine:
            mine = True
            sources |= label.sources
            cause = cause or label.cause
        else:
            foreign = True
    if mine:
        return Flow("raw", sources, cause=cause)
    return Flow("foreign") if foreign else None


def caused(label: Label, cause: str) -> Label:
    """``label`` naming ``cause`` as what made it raw, unless it is no raw value of p's or
    names a cause already."""
    if label is None or label.form != "raw" or not label.mine or label.cause:
        return label
    return replace(label, cause=cause)


def approved(name: str, inputs: Iterable[Label]) -> Label:
    """The label of an output of vouched library function ``name`` (its public name) on
    inputs labelled ``inputs``: of p's data, released only as p approves ``name`` and the
    functions its inputs came from."""
    labels = list(inputs)
    mine = [lab for lab in labels if lab is not None and lab.mine]
    if not mine:
        return raw(labels)
    return Flow("approved", frozenset().union(*(lab.sources for lab in mine)),
                approved=frozenset([name]).union(*(lab.approved for lab in mine)))


def impure(label: Label) -> Label:
    """``label`` of a value computed from it (no longer the data as loaded)."""
    return replace(label, pure=False) if label is not None and label.pure else label


def aggregated(label: Flow, whole: bool = False) -> Flow:
    """A row-wise value reduced over its row axis (``whole``: and over its blocks): an
    aggregate over its window."""
    window = label.window
    assert window is not None
    if whole and window.step:
        window = replace(window, step=0)
    return Flow("aggregate", label.sources, rowsets=label.rowsets | {window},
                gated=label.gated, enforced=label.enforced)


def row_count(label: Flow) -> Label:
    """What the number of rows of a value labelled ``label`` tells: of rows a PSI join
    kept, a count of comparisons between the holders' keys (what the join tells each
    holder already); of rows p's own data selected (a SQL ``WHERE``), a count of a mask,
    over a data-dependent number of rows; of other row-wise values, an aggregate over
    their rows; a value already aggregated or compared tells no more than itself; raw
    values stay raw."""
    if label.form == "rowwise" and label.window is not None:
        if label.window.gate and label.enforced == ENFORCED:
            return Flow("compare", label.sources, rowsets=label.rowsets)
        if label.window.gate:
            return aggregated(masked(label), whole=True)
        return aggregated(label, whole=True)
    return label if label.form in ("aggregate", "compare", "dp", "approved") else raw([label])


def combine(a: Label, b: Label) -> Label:
    """The label of an elementwise combination of p's ``a`` and ``b`` (each may be None
    or foreign; the caller checks row alignment with values p does not own)."""
    if a is None or not a.mine:
        return _with_other(b, a)
    if b is None or not b.mine:
        return _with_other(a, b)
    if "raw" in (a.form, b.form):
        return raw([a, b])
    if "approved" in (a.form, b.form):  # with p's rows: still rows (raw if revealed)
        if "rowwise" in (a.form, b.form):
            rows, other = (a, b) if a.form == "rowwise" else (b, a)
            return replace(_merged(rows, other), approved=a.approved | b.approved)
        return Flow("approved", a.sources | b.sources, approved=a.approved | b.approved)
    if "dp" in (a.form, b.form):  # noisy releases together stay one; with exact data, raw
        return Flow("dp", a.sources | b.sources, epsilon=max(a.epsilon, b.epsilon)) \
            if a.form == b.form else raw([a, b])
    if a.form == "compare" or b.form == "compare":
        other = b if a.form == "compare" else a
        if other.form == "compare":
            return Flow("compare", a.sources | b.sources, rowsets=a.rowsets | b.rowsets)
        compare = a if other is b else b
        if other.form == "aggregate" and not compare.rowsets:  # an aggregate times a bit
            return raw([a, b])  # of one row's comparison shows the bit: no aggregate
        return _merged(other, compare)
    if a.form == "rowwise" and b.form == "rowwise":
        window = aligned_windows(a.window, b.window)
        if window is None or (a.axis, a.at, a.outer) != (b.axis, b.at, b.outer) or \
                weighs(a, b):
            return raw([a, b])
        out = replace(_merged(a, b), window=window, mask=a.mask and b.mask,
                      borrowed=a.borrowed and b.borrowed)
        return masked(out) if a.mask != b.mask else out
    if a.form == "aggregate" and b.form == "aggregate":
        return _merged(a, b)
    return _merged(a, b) if a.form == "rowwise" else _merged(b, a)


def weighs(a: Flow, b: Flow) -> bool:
    """Whether one of p's row-wise ``a`` and ``b`` is another holder's real values on p's
    joined rows (`Flow.borrowed`) and the other p's own rows: another owner's values
    would weight p's rows (a mask of theirs only selects them)."""
    return a.borrowed != b.borrowed and not (b if b.borrowed else a).mask


def aligned_windows(a: Rows | None, b: Rows | None) -> Rows | None:
    """The window of p's rows combined row by row from windows ``a`` and ``b``: the same
    rows of one source, or the same positions of two sources of equal, known length
    (two files of p's with a row each per record); None if they do not line up."""
    if a is None or b is None:
        return None
    if a == b:
        return a
    if (a.lo, a.hi, a.step, a.gate) != (b.lo, b.hi, b.step, b.gate) or a.hi == UNKNOWN:
        return None
    return replace(a, sources=a.sources | b.sources)


def masked(label: Flow) -> Flow:
    """p's rows weighted by a mask (a comparison result, a bin): how many of them count
    depends on data, whatever a run-time check on the rows before the mask bounded."""
    return replace(label, gated=True, enforced=None)


def _merged(main: Flow, other: Flow) -> Flow:
    """``main``'s shape with ``other``'s sources, rowsets and gating added."""
    enforced = main.enforced if other.form != "aggregate" else \
        _gated_bound(main, other) if main.form == "aggregate" else \
        _both(main.enforced, other.rows) if main.gated else None
    return replace(main, sources=main.sources | other.sources,
                   rowsets=main.rowsets | other.rowsets, pure=False,
                   gated=main.gated or other.gated, enforced=enforced)


def _both(a: int | None, b: int | None) -> int | None:
    """The bound that holds for two sets of rows bounded by ``a`` and ``b`` (None: none)."""
    return None if a is None or b is None else min(a, b)


def _gated_bound(a: Flow, b: Flow) -> int | None:
    """The fewest rows a group of aggregates ``a`` and ``b`` combined holds, of those
    gated (an aggregate over a whole window bounds no group)."""
    bounds = [lab.enforced for lab in (a, b) if lab.gated]
    return None if not bounds or None in bounds else min(b for b in bounds if b is not None)


def _with_other(label: Label, other: Label) -> Label:
    """p's ``label`` (or None/foreign) combined with a value p does not own."""
    if label is None:
        return None if other is None else Flow("foreign", mask=other.mask)
    if not label.mine:
        return Flow("foreign", mask=label.mask or (other is not None and other.mask))
    out = replace(label, pure=False)
    return masked(out) if other is not None and other.mask and label.form == "rowwise" else out


def compared(a: Label, b: Label) -> Label:
    """The label of comparing ``a`` with ``b``: a ``compare`` if one side is p's data as
    loaded and the other another owner's data as loaded; a mask if only others' data
    goes in; otherwise an elementwise combination (a comparison with constants is a
    row-wise transformation)."""
    if a is not None and b is not None and a.pure and b.pure and a.mine != b.mine:
        mine = a if a.mine else b
        return Flow("compare", mine.sources, rowsets=mine.rowsets)
    out = combine(_unmasked(a), _unmasked(b))  # a row's comparison selects no rows
    if out is not None and not out.mine:
        return Flow("foreign", mask=True)
    return replace(out, mask=True) if out is not None and out.form == "rowwise" else out


def _unmasked(label: Label) -> Label:
    return replace(label, mask=False) if label is not None and label.mask else label


def join(a: Label, b: Label) -> Label:
    """The least label covering both ``a`` and ``b`` (a value that may be either, such
    as a loop's state across iterations, or a value chosen by a branch)."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    if not a.mine or not b.mine:
        return combine(a, b) if a.mine or b.mine else Flow("foreign", mask=a.mask or b.mask)
    return combine(a, b)


def join_all(labels: Iterable[Label]) -> Label:
    out: Label = None
    for label in labels:
        out = join(out, label)
    return out


def release_cuts(released: Iterable[Rows]) -> dict[str, list[int]]:
    """Per source, the sorted row indices where a ``released`` row set starts or ends."""
    bounds: dict[str, set[int]] = {}
    for rows in set(released):
        for name in rows.sources:
            bounds.setdefault(name, set()).update(rows.bounds())
    return {name: sorted(b) for name, b in bounds.items()}


def smallest_part(released: Iterable[Rows] | dict[str, list[int]], within: Iterable[Rows]
                  ) -> tuple[Rows, int] | None:
    """The smallest piece of ``within``'s row sets that differences of the ``released``
    row sets (or their `release_cuts`) can isolate, and its size (None if ``within`` has
    no rows).

    Sums over overlapping row sets can be subtracted from each other: the pieces are the
    stretches between consecutive bounds of every released set of the same source.
    """
    cuts = released if isinstance(released, dict) else release_cuts(released)
    best: tuple[Rows, int] | None = None
    for rows in sorted(within, key=lambda r: (sorted(r.sources), r.lo, r.hi, r.step, r.gate)):
        for name in rows.sources:
            points = cuts.get(name, [])
            inside = points[bisect.bisect_left(points, rows.lo):
                            bisect.bisect_right(points, rows.hi)]
            for lo, hi in itertools.pairwise(inside):
                if best is None or hi - lo < best[1]:
                    best = (Rows(frozenset([name]), lo, hi), hi - lo)
    return best


def leading_rows(t: object) -> int | None:
    """The row count of a loaded value's type: its leading dimension (a table's rows);
    None for a scalar or an unknown count."""
    base = getattr(t, "base", t)
    rows = getattr(base, "rows", None)
    if isinstance(rows, int):
        return rows
    shape = getattr(base, "shape", None)
    if isinstance(shape, tuple) and shape and isinstance(shape[0], int) and shape[0] >= 0:
        return shape[0]
    return None


def with_rows(label: Label, rows: int) -> Label:
    """``label`` of a table of unknown size now known to have ``rows`` rows."""
    if label is None or label.window is None or label.window.hi != UNKNOWN:
        return label
    return replace(label, window=replace(label.window, hi=label.window.lo + rows))


ENFORCED = 2**31
"""``Flow.enforced`` of rows a kernel checks at run time against its party's own
``min_rows`` (every rule's bound then holds)."""


def narrowed(label: Flow, lo: int, hi: int, shaped: bool = True) -> Label:
    """Row-wise ``label`` restricted to positions ``[lo, hi)`` of its row axis (``shaped``:
    the value's shape is known). A part of gated rows loses the bound a run-time check
    gave the whole of them."""
    window = label.window
    assert window is not None and label.axis is not None
    if window.hi == UNKNOWN:
        return raw([label])
    count = window.size if not window.step else None
    if count is None:  # one block, not known which: only the whole of it
        full = shaped and lo <= label.at and hi >= label.at + window.step
        return _part(label) if full else raw([label])
    first, last = max(lo, label.at), min(hi, label.at + count)
    if first >= last:  # none of p's rows: what was aggregated into them
        if label.rowsets:
            return Flow("aggregate", label.sources, rowsets=label.rowsets, gated=label.gated,
                        enforced=label.enforced)
        return None
    if (first, last) != (label.at, label.at + count):
        label = _part(label)
    rows = replace(window, lo=window.lo + first - label.at, hi=window.lo + last - label.at)
    return replace(label, window=rows, at=first - lo, pure=label.pure)


def _part(label: Flow) -> Flow:
    return replace(label, enforced=None) if label.gated else label


def membership(label: Label) -> Label:
    """``label`` of which keys a PSI join matched: a comparison between two owners' keys
    is judged as an intersection."""
    return replace(label, membership=True) if label is not None and label.mine and \
        label.form == "compare" else label


def subset(own: Label, seen: Label, gate: int) -> Label:
    """A holder's rows kept where another owner's data says (a PSI join, ``gate``): ``own``'s
    rows, of a count known only at run time and checked there, with what ``seen`` reveals."""
    if own is None or not own.mine:
        if seen is not None and seen.mine and seen.form == "compare":
            # the other holder's rows, one per row p kept (aligned with them): for p, which
            # of its rows the join kept, so row-wise over those rows
            rows = Rows(seen.sources, 0, UNKNOWN, gate=gate)
            return Flow("rowwise", seen.sources, rows, 0, 0, gated=True, enforced=ENFORCED,
                        borrowed=True)
        return seen if seen is not None and seen.mine else own
    if own.window is None:
        return raw([own, seen])
    window = Rows(own.window.sources, 0, UNKNOWN, gate=gate)
    kept = replace(own, window=window, at=0, pure=False, gated=True, enforced=ENFORCED)
    return kept if seen is None or not seen.mine else combine(kept, seen)


def suppressed(label: Label, min_rows: int, gate: int, partition: bool = False) -> Label:
    """``label`` of a release whose groups of fewer than ``min_rows`` rows are set to zero
    at run time (``gate``: the op choosing the groups; ``partition``: no group is small,
    they cover every row): a data-dependent aggregate of p's becomes one over groups of
    at least ``min_rows`` rows."""
    if label is None or not label.mine or label.form != "aggregate" or not label.gated:
        return label
    return replace(label, enforced=min_rows, rowsets=frozenset(
        replace(r, gate=gate, partition=partition) for r in label.rowsets))
