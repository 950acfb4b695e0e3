"""Groups that a vouched library function forms (`mplang.flows.vouched`): what its
releases may be combined with. A partition (a tree's leaves: every row in one group, no
group suppressed) adds up to the whole of its rows, so a sum over those whole rows
isolates nothing more; suppressed groups (a group-by) and other windows still do."""

from __future__ import annotations

from dataclasses import replace

from mplang.flows.labels import Flow, Rows, combine, masked, source, suppressed
from mplang.policy.check import _other_rows

X = frozenset(["x.npy"])
WHOLE = Rows(X, 0, 100)


def _groups(partition: bool) -> Flow:
    """An aggregate of x over groups that data chose, as a vouched op's flow rule gives."""
    gated = masked(source("x.npy", 100))
    out = suppressed(Flow("aggregate", gated.sources, rowsets=frozenset([WHOLE]), gated=True),
                     20, gate=7, partition=partition)
    assert out is not None
    return out


def test_a_partition_and_the_whole_of_its_rows_do_not_overlap() -> None:
    leaves = _groups(partition=True)
    assert leaves.rows == 20
    assert _other_rows({WHOLE, *leaves.rowsets}, leaves.rowsets) is None


def test_suppressed_groups_and_the_whole_overlap() -> None:
    """The whole minus the groups released is the suppressed ones: as few as one row."""
    groups = _groups(partition=False)
    assert _other_rows({WHOLE, *groups.rowsets}, groups.rowsets) == X


def test_a_partition_and_other_rows_overlap() -> None:
    leaves = _groups(partition=True)
    for other in (Rows(X, 0, 99), Rows(X, 1, 100), Rows(X, 0, 100, step=10),
                  replace(WHOLE, gate=8)):
        assert _other_rows({other, *leaves.rowsets}, leaves.rowsets) == X, other


def test_a_whole_row_aggregate_keeps_the_groups_bound() -> None:
    """Tree thresholds: a split choice (groups of 20 rows) picks an edge computed over all
    rows; the result still combines groups of at least 20 rows."""
    edges = Flow("aggregate", X, rowsets=frozenset([WHOLE]))
    both = combine(edges, _groups(partition=True))
    assert both is not None and both.gated and both.rows == 20
    unbounded = combine(edges, replace(_groups(partition=True), enforced=None))
    assert unbounded is not None and unbounded.rows is None
