"""Flow rules of the PHE ops (`mplang.dialects.phe` registers them on its primitives).

A ciphertext carries its plaintext's label, ``sealed``: holding or receiving it
reveals nothing, as only the key's maker can decrypt it, and decrypting it is a flow
of the label to the party that decrypts. In between, rows combine as in a tensor
program, where an aggregate of p's rows sums one row-local function of each row,
weighted by 0/1 selections only: elementwise with scalars or with p's own aligned
rows, p's rows stay row-wise, and a sum over the row axis is an aggregate; weighted
(or shifted) by another owner's mask, or as p's mask selecting another owner's
values, they are gated (how many rows count depends on data); weighted by anything
else that differs by row (another owner's real values, p's aggregates, weights the
driver chose) they are raw. Sums per bin (histograms) are gated by the bins.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeGuard

from mplang.edsl.graph import Operation
from mplang.flows.engine import Analysis
from mplang.flows.labels import (
    Flow,
    Label,
    aggregated,
    aligned_windows,
    combine,
    impure,
    join,
    masked,
    raw,
    weighs,
)


def _opened(label: Label) -> Label:
    return replace(label, sealed=False) if label is not None and label.sealed else label


def _sealed(label: Label) -> Label:
    return replace(label, sealed=True) if label is not None and label.mine else label


def _shape(op: Operation, i: int) -> tuple[Any, ...]:
    return tuple(getattr(op.inputs[i].type, "shape", ()))


def _rowwise(label: Label) -> TypeGuard[Flow]:
    return label is not None and label.mine and label.form == "rowwise"


def _selects(lab: Flow, other: Label) -> bool:
    """Whether ``other`` (not p's rows) weights p's rows ``lab`` by a 0/1 selection, which
    gates them: it is another owner's mask (p's mask weighting another owner's values
    shows the mask)."""
    return other is not None and not other.mine and other.mask


def _elementwise(a: Label, b: Label, scalar: bool, constants: bool) -> Label:
    """``a`` and ``b`` (``b`` a scalar if ``scalar``) combined element by element: p's
    rows with values that differ by row and are not p's rows are gated if those select
    them (`_selects`), raw otherwise, unless they are the driver's and ``constants``."""
    for lab, other in ((a, b), (b, a)):
        if _rowwise(lab) and not _rowwise(other) and not scalar and \
                (other is not None or not constants):
            return masked(replace(lab, pure=False)) if _selects(lab, other) else raw([a, b])
    return combine(a, b)


def keygen_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """A fresh key pair carries no party's data."""
    return [None, None]


def encrypt_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """The ciphertext carries the plaintext's label, sealed."""
    return [_sealed(ins[0])]


def decrypt_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """The plaintext reaches the party that decrypts (the key pair's maker)."""
    label = _opened(ins[0])
    if not own and a.runner is not None:
        a.send(op, a.runner, label, "the plaintext it decrypts")
    return [label]


def additive_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Elementwise (`_elementwise`): adding the driver's constants to p's rows keeps them
    row by row (a sum of the result adds only what the driver knows)."""
    return [_sealed(_elementwise(_opened(ins[0]), _opened(ins[1]), _shape(op, 1) == (), True))]


def mul_plain_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Elementwise (`_elementwise`); per-element weights that are nobody's data make p's
    values of any form raw."""
    c, x = _opened(ins[0]), _opened(ins[1])
    scalar = _shape(op, 1) == ()
    if not scalar and x is None and c is not None and c.mine:
        return [_sealed(raw([c]))]
    return [_sealed(_elementwise(c, x, scalar, False))]


def sum_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Over the row axis: an aggregate; over another axis: still row by row."""
    c = _opened(ins[0])
    if not _rowwise(c):
        return [_sealed(c)]
    axis, ndim = op.attrs.get("axis"), len(_shape(op, 0))
    if c.axis is None or c.outer is not None or c.at != 0:
        return [_sealed(raw([c]))]
    if axis is None or axis % ndim == c.axis:
        return [_sealed(aggregated(c, whole=True))]
    return [_sealed(replace(c, pure=False, axis=c.axis - (axis % ndim < c.axis)))]


def dot_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """``c @ x`` contracting c's last axis with x's first: over p's rows, an aggregate if
    the other side is p's own aligned rows, gated if it selects them (`_selects`), raw
    otherwise (another owner's real values, weights the driver chose); over another
    axis, p's rows stay row by row."""
    c, x = _opened(ins[0]), _opened(ins[1])
    c_last, x_ndim = len(_shape(op, 0)) - 1, len(_shape(op, 1))
    return [_sealed(_contracted(c, x, c_last, x_ndim))]


def _contracted(c: Label, x: Label, c_last: int, x_ndim: int) -> Label:
    for lab, other, row_axis in ((c, x, c_last), (x, c, 0)):
        if not _rowwise(lab):
            continue
        if lab.axis is None or lab.outer is not None or lab.at != 0:
            return raw([c, x])
        if lab.axis == row_axis:  # a sum over p's rows, weighted by the other side
            if _rowwise(other) and weighs(lab, other):
                return raw([c, x])
            if _rowwise(other) and _contracted_alike(lab, other, 0 if lab is c else c_last):
                return combine(aggregated(masked(lab) if other.mask != lab.mask else lab),
                               aggregated(other))
            if _rowwise(other) or not _selects(lab, other):
                return raw([c, x])
            return combine(aggregated(masked(lab)), impure(other))
        if _rowwise(other):
            return raw([c, x])
        axis = lab.axis if lab is c else c_last + lab.axis - 1
        return replace(combine(lab, other) or lab, axis=axis)
    return combine(c, x)


def _contracted_alike(lab: Flow, other: Flow, other_axis: int) -> bool:
    """Whether row-wise ``other``'s contracted axis holds the same rows of p as ``lab``'s
    (the same rows of one source, or the same positions of sources of equal length)."""
    return other.axis == other_axis and other.at == 0 and other.outer is None and \
        aligned_windows(lab.window, other.window) is not None


def bucket_sum_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Sums of c's rows per (group, feature, bin): the bins and groups select rows, so a
    histogram over p's rows is gated (a bin's size depends on data); p's bins or groups
    selecting another owner's values (c) are weighted by them, which shows the bins: raw."""
    out: Label = None
    values = _opened(ins[0])
    for i, label in enumerate(_opened(lab) for lab in ins):
        if label is None or not label.mine:
            out = join(out, label)
            continue
        if not _rowwise(label) or label.axis != 0 or label.outer is not None or label.at or \
                (i and (values is None or not values.mine)):
            return [_sealed(raw(_opened(lab) for lab in ins))]
        out = join(out, aggregated(masked(label)))
    return [_sealed(out)]
