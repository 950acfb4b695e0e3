"""Flow rules of the PHE ops (`mplang.dialects.phe` registers them on its primitives).

A ciphertext carries its plaintext's label, ``sealed``: holding or receiving it
reveals nothing, as only the key's maker can decrypt it, and decrypting it is a flow
of the label to the party that decrypts. In between, rows combine as in a tensor
program: elementwise with scalars or with other owners' row-aligned values stays
row-wise, a sum over the row axis is an aggregate, weights that differ by row and
are nobody's data (the driver's) make the result raw, and sums per bin (histograms)
are gated by the bins, whose groups' sizes depend on data.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mplang.edsl.graph import Operation
from mplang.policy.flows import Analysis
from mplang.policy.labels import (
    Flow,
    Label,
    aggregated,
    aligned_windows,
    combine,
    impure,
    join,
    masked,
    raw,
)


def _opened(label: Label) -> Label:
    return replace(label, sealed=False) if label is not None and label.sealed else label


def _sealed(label: Label) -> Label:
    return replace(label, sealed=True) if label is not None and label.mine else label


def _shape(op: Operation, i: int) -> tuple[Any, ...]:
    return tuple(getattr(op.inputs[i].type, "shape", ()))


def _rowwise(label: Label) -> bool:
    return label is not None and label.mine and label.form == "rowwise"


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
    """Elementwise: adding anything to p's rows keeps them row by row."""
    return [_sealed(combine(_opened(ins[0]), _opened(ins[1])))]


def mul_plain_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Elementwise: times a scalar or another owner's row-aligned values; per-element
    weights that are nobody's data make p's rows raw."""
    c, x = _opened(ins[0]), _opened(ins[1])
    if _shape(op, 1) != () and x is None and c is not None and c.mine:
        return [_sealed(raw([c]))]
    return [_sealed(combine(c, x))]


def sum_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Over the row axis: an aggregate; over another axis: still row by row."""
    c = _opened(ins[0])
    if not _rowwise(c):
        return [_sealed(c)]
    assert c is not None
    axis, ndim = op.attrs.get("axis"), len(_shape(op, 0))
    if c.axis is None or c.outer is not None or c.at != 0:
        return [_sealed(raw([c]))]
    if axis is None or axis % ndim == c.axis:
        return [_sealed(aggregated(c, whole=True))]
    return [_sealed(replace(c, pure=False, axis=c.axis - (axis % ndim < c.axis)))]


def dot_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """``c @ x`` contracting c's last axis with x's first: over p's rows, an aggregate if
    the other side is another owner's row-aligned data (raw if it is nobody's: weights
    the driver chose); over another axis, p's rows stay row by row."""
    c, x = _opened(ins[0]), _opened(ins[1])
    c_last, x_ndim = len(_shape(op, 0)) - 1, len(_shape(op, 1))
    return [_sealed(_contracted(c, x, c_last, x_ndim))]


def _contracted(c: Label, x: Label, c_last: int, x_ndim: int) -> Label:
    for lab, other, row_axis in ((c, x, c_last), (x, c, 0)):
        if not _rowwise(lab):
            continue
        assert lab is not None
        if lab.axis is None or lab.outer is not None or lab.at != 0:
            return raw([c, x])
        if lab.axis == row_axis:  # a sum over p's rows, weighted by the other side
            if other is None or (_rowwise(other) and not _contracted_alike(
                    lab, other, 0 if lab is c else c_last)):
                return raw([c, x])
            mismatch = other.mask != lab.mask if _rowwise(other) else other.mask
            return combine(aggregated(masked(lab) if mismatch else lab),
                           aggregated(other) if _rowwise(other) else impure(other))
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
    """Sums of c's rows per (group, feature, bin): a histogram over p's rows, gated when
    p's values are summed (a bin's size depends on data), a count of p's bins or groups
    weighted by another owner's values otherwise."""
    out: Label = None
    for i, label in enumerate(_opened(lab) for lab in ins):
        if label is None or not label.mine:
            out = join(out, label)
            continue
        if not _rowwise(label) or label.axis != 0 or label.outer is not None or label.at:
            return [_sealed(raw(_opened(lab) for lab in ins))]
        out = join(out, aggregated(masked(label) if i == 0 else label))
    return [_sealed(out)]
