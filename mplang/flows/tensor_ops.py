"""The label rule of each StableHLO op of the tensor analysis (`mplang.flows.tensor_flows`
runs them over a module): what an op makes of its operands' labels, of the axes they are
uniform along, and of the selections they carry.

Row-wise values keep their row axis through elementwise ops, broadcasts, transposes,
reshapes that keep or split it, slices (which narrow the rows), concatenation with
values p does not own, and contractions of other axes. Elementwise combination with a
value p does not own is row-wise only if that value is the same for every row (a
scalar, a broadcast) or another owner's 0/1 selection (a mask, which gates the rows);
another owner's real values weight rows unequally, so the result is raw. Sums (a
``reduce`` whose body adds) and contractions over the row axis make aggregates;
maxima, minima, sorts, gathers, reversals and anything not modelled along the rows
give raw results; a choice between rows by a predicate on p's data, other than a
rounding, is a selection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

from mplang.flows.labels import (
    Flow,
    Label,
    aggregated,
    aligned_windows,
    combine,
    compared,
    impure,
    join_all,
    masked,
    narrowed,
    raw,
    weighs,
)
from mplang.flows.stablehlo import Op, Tensor

ELEMENTWISE = frozenset([
    "abs", "add", "and", "atan2", "cbrt", "ceil", "clamp", "cosine", "count_leading_zeros",
    "divide", "exponential", "exponential_minus_one", "floor", "imag", "is_finite", "log",
    "log_plus_one", "logistic", "maximum", "minimum", "multiply", "negate", "not", "or",
    "popcnt", "power", "real", "remainder", "round_nearest_afz", "round_nearest_even",
    "rsqrt", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "sine",
    "sqrt", "subtract", "tan", "tanh", "xor", "select", "reduce_precision",
])
"""Ops combining their operands element by element."""
PRESERVING = frozenset(["convert", "copy", "bitcast_convert", "optimization_barrier"])
"""Elementwise ops that keep the data as it is (a comparison may still use it)."""
NO_LABEL = frozenset(["constant", "iota", "rng", "rng_bit_generator", "after_all",
                      "partition_id", "replica_id", "get_dimension_size"])
STRUCTURAL = frozenset(["broadcast_in_dim", "transpose", "reshape", "reduce", "concatenate",
                         "pad", "dot_general", "dot"])
"""Ops that move axes: alike axes do not carry over by position."""
_MASK_KEEPING = frozenset([
    "and", "or", "not", "multiply", "select", "convert", "copy", "broadcast_in_dim", "reshape",
    "transpose", "slice", "dynamic_slice", "concatenate", "gather", "reverse"])
"""Ops whose result is 0/1 where their operands are (the predicate of a select aside)."""
_CHOOSING = frozenset(["maximum", "minimum"])
"""Elementwise ops that choose an operand by comparing them: ``maximum(x, t)`` keeps the
rows above ``t``, as ``where(x > t, x, t)`` does."""
ALL = frozenset(range(64))
"""Uniform along every axis."""


@dataclass(frozen=True)
class Val:
    """What the analysis knows of one value: its label, the axes it is uniform along and,
    for a scalar constant, its value."""

    label: Label = None
    uniform: frozenset[int] = frozenset()
    const: float | None = None
    alike: frozenset[int] | None = None
    """Axes along which the value varies at most with other owners' row-aligned data
    (None: only along its uniform axes)."""
    ident: int = 0
    """A row-wise value of p's: its number in the analysis (0: none)."""
    base: int = 0
    """A row-wise value of p's that is another (``ident``) plus or minus a constant."""

    def alike_axes(self) -> frozenset[int]:
        return self.uniform if self.alike is None else self.alike | self.uniform


UNKNOWN = Val()


def _sums(op: Op) -> bool:
    """Whether ``reduce`` ``op`` adds up its operands: its body returns, for each operand
    ``j``, ``add`` of the accumulator ``j`` and the element ``j`` (in either order) and
    does nothing else (``lambda a, b: b`` keeps one element, ``b + b`` doubles one)."""
    if len(op.regions) != 1:
        return False
    body = op.regions[0]
    half = len(body.args) // 2
    adds = {o.results[0]: set(o.operands) for o in body.ops if o.kind == "add"}
    return len(body.ops) == half + 1 and len(body.returned()) == half and all(
        adds.get(r) == {body.args[j], body.args[j + half]}
        for j, r in enumerate(body.returned()))


# -- values p does not own: constants and their uniform axes

def constant(op: Op) -> Val:
    t = op.result_types[0] if op.result_types else None
    if op.kind == "iota":
        dim = int(op.attrs.get("iota_dimension", 0))
        return Val(None, ALL - {dim})
    if op.kind == "constant":
        value = op.attrs.get("value")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return Val(None, ALL, float(value) if t is not None and t.size == 1 else None)
        if isinstance(value, bool):
            return Val(None, ALL)
        return Val(None, frozenset(i for i, s in enumerate(t.shape) if s == 1)
                   if t is not None else frozenset())
    return Val()


def _fold(kind: str, ins: list[Val]) -> float | None:
    """The value of a scalar op on constants (offsets of slices are often computed)."""
    values = [v.const for v in ins]
    if any(v is None for v in values) or not values:
        return None
    try:
        if kind in ("convert", "copy"):
            return values[0]
        if kind == "add":
            return values[0] + values[1]  # type: ignore[operator]
        if kind == "multiply":
            return values[0] * values[1]  # type: ignore[operator]
        if kind == "subtract":
            return values[0] - values[1]  # type: ignore[operator]
        if kind == "select":
            return values[1] if values[0] else values[2]
    except (TypeError, IndexError):
        return None
    return None


def _alike(ins: list[Val], label: Flow) -> bool:
    """Whether every operand that is not ``label``'s row-wise value is the same for each
    of its rows, and no comparison of p's data (which may hold one of its rows): uniform
    along the row axis, or other owners' mask (which gates the rows:
    `combine` marks that). Where p's rows enter only as a mask, other owners' values may
    vary along them: p's data then selects their rows (a group-by over p's keys), which
    `_elementwise` judges."""
    by_mask = all(v.label.mask for v in ins if is_rowwise(v.label))
    for v in ins:
        lab = v.label
        if lab is not None and lab.mine and lab.form == "rowwise":
            continue
        if lab is not None and lab.mine and lab.form == "compare":
            return False  # a bit of some of p's rows (``x[18] <= sum(y)``): unequal rows
        if by_mask and lab is not None and not lab.mine:
            continue
        if label.axis is not None and label.axis not in v.alike_axes():
            return False
        if label.outer is not None and label.outer not in v.alike_axes():
            return False
    return True


def selecting(kind: str, ins: list[Val], out: Val) -> Val:
    """``out`` of an op on other owners' data: a selection of rows (a mask, alike along
    every axis) if it compares, or moves, converts or combines with ``and``, ``or``,
    ``not``, ``multiply`` or ``select`` nothing but masks and uniform constants (``3 *
    mask``); else no selection, varying along every axis but its uniform ones."""
    label = out.label
    if label is None or label.mine or not label.mask:
        return out
    operands = ins[1:] if kind == "select" else ins
    if kind == "compare" or (kind in _MASK_KEEPING and all(
            v.label.mask if v.label is not None else v.uniform == ALL for v in operands)):
        return replace(out, alike=ALL)
    return replace(out, label=replace(label, mask=False), alike=None)


def shifted(kind: str, ins: list[Val]) -> int:
    """The ``ident`` of the row-wise operand of ``kind`` (``add``, ``subtract``) that a
    constant alike for every row shifts (0: the result is no such shift)."""
    if kind not in ("add", "subtract") or len(ins) != 2:
        return 0
    value, shift = ins
    if kind == "add" and value.label is None:
        value, shift = shift, value
    return value.ident if shift.label is None and shift.uniform == ALL else 0


def _piecewise(pred: Val, a: Val, b: Val) -> Val:
    """The predicate of a choice between two row-wise values of p's. Where one is the
    other shifted by a constant (a floor division's rounding), each row's value is the
    other plus that constant times the predicate: a row-wise function, so the predicate
    selects no rows. Otherwise a predicate on p's data selects rows (``where(x > t, x,
    x * 0)`` keeps the rows above ``t``): a mask, which gates them."""
    lab = pred.label
    if lab is None or not lab.mine:
        return pred
    rounding = bool(a.ident) and (a.base == b.ident or b.base == a.ident)
    masks = a.label is not None and a.label.mask and b.label is not None and b.label.mask
    return replace(pred, label=replace(lab, mask=masks or not rounding))


def _elementwise(ins: list[Val], preserving: bool, const: float | None = None) -> Val:
    uniform = ALL
    for v in ins:
        uniform &= v.uniform
    if preserving and len(ins) == 1:
        return Val(ins[0].label, uniform, const)
    label: Label = None
    for v in ins:
        label = combine(label, v.label)
    if label is not None and label.form == "rowwise":
        if not _alike(ins, label):
            label = raw([label])
        elif label.mask and any(v.label is not None and not v.label.mine and not v.label.mask
                                for v in ins):
            label = raw([label])  # p's mask weighting another owner's values shows the mask
    return Val(label, uniform, const)


def _compare(ins: list[Val]) -> Val:
    """A comparison: between p's single value or aggregate and another owner's data, a
    ``compare``; a row-wise vector of p's is never a comparison's side (each row would be
    compared), so it is combined row by row."""
    if any(is_rowwise(v.label) and v.label.axis is not None
           and v.label.window.size != 1 for v in ins):  # type: ignore[union-attr]
        ins = [replace(v, label=impure(v.label)) for v in ins]
    label = compared(ins[0].label, ins[1].label)
    if label is not None and label.form == "rowwise":
        if not _alike(ins, label):
            label = raw([label])
        elif any(v.label is not None and not v.label.mine and label.axis not in v.uniform
                 for v in ins):  # p's rows against another owner's mask, row by row
            label = masked(label)
    return Val(label, ins[0].uniform & ins[1].uniform)


def _drop_axes(uniform: frozenset[int], dims: Sequence[int]) -> frozenset[int]:
    """Uniform axes after removing ``dims`` (renumbered)."""
    if uniform == ALL:
        return ALL
    out = set()
    for a in uniform:
        if a in dims:
            continue
        out.add(a - sum(1 for d in dims if d < a))
    return frozenset(out)


def _renumber(label: Flow, dims: Sequence[int]) -> Flow:
    if label.axis is None:
        return label
    return replace(label, axis=label.axis - sum(1 for d in dims if d < label.axis), pure=False)


def _broadcast(v: Val, src: Tensor | None, out: Tensor | None, dims: tuple[int, ...]) -> Val:
    if src is None or out is None:
        return Val(raw([v.label]))
    uniform = frozenset(i for i in range(len(out.shape)) if i not in dims)
    for a, d in enumerate(dims):
        if (src.shape[a] == 1 and out.shape[d] != 1) or a in v.uniform:
            uniform |= {d}
    label = v.label
    axis = label.axis if label is not None else None
    if label is not None and label.mine and label.form == "rowwise" and axis is not None:
        outer = label.outer
        if outer is not None:
            label = replace(label, axis=dims[axis], outer=dims[outer])
        elif src.shape[axis] == out.shape[dims[axis]]:
            label = replace(label, axis=dims[axis])
        else:  # one row copied along the axis: still one row
            label = replace(label, axis=None, at=0)
    alike = frozenset(i for i in range(len(out.shape)) if i not in dims) | frozenset(
        d for a, d in enumerate(dims) if a in v.alike_axes())
    return Val(label, uniform if v.uniform != ALL else ALL,
               alike=ALL if v.alike_axes() == ALL else alike)


def _transpose(v: Val, perm: tuple[int, ...]) -> Val:
    uniform = ALL if v.uniform == ALL else frozenset(perm.index(a) for a in v.uniform
                                                    if a in perm)
    label = v.label
    if label is not None and label.mine and label.form == "rowwise" and label.axis is not None:
        label = replace(label, axis=perm.index(label.axis))
    alike = v.alike_axes()
    return Val(label, uniform, alike=ALL if alike == ALL else frozenset(
        perm.index(a) for a in alike if a in perm))


def _reshape(v: Val, src: Tensor | None, out: Tensor | None) -> Val:
    label = v.label
    uniform = ALL if v.uniform == ALL else frozenset()
    if label is None or not label.mine or label.form != "rowwise" or label.axis is None:
        return Val(label, uniform, alike=ALL if v.alike_axes() == ALL else None)
    if src is None or out is None:
        return Val(raw([label]))
    if label.outer is not None:
        return _unblock(label, src, out, uniform)
    n = src.shape[label.axis]
    before = math.prod(src.shape[: label.axis])
    window = label.window
    assert window is not None
    for j in range(len(out.shape) - 1):
        if math.prod(out.shape[:j]) == before and out.shape[j] * out.shape[j + 1] == n \
                and n not in out.shape and not window.step and label.at == 0 \
                and window.size == n and out.shape[j + 1] > 1:
            step = out.shape[j + 1]
            rows = replace(window, step=step)
            return Val(replace(label, window=rows, axis=j + 1, outer=j), uniform)
    for j in range(len(out.shape) + 1):
        if math.prod(out.shape[:j]) != before:
            continue
        if j < len(out.shape) and out.shape[j] == n:
            return Val(replace(label, axis=j), uniform)
        if n == 1 and (j == len(out.shape) or out.shape[j] != 1):
            return Val(replace(label, axis=None, at=0), uniform)
    return Val(raw([label]))


def _unblock(label: Flow, src: Tensor, out: Tensor, uniform: frozenset[int]) -> Val:
    """Reshaping rows split into blocks: once one block is left (its axis of size 1),
    dropping that axis."""
    assert label.outer is not None and label.axis is not None
    if src.shape[label.outer] != 1 or label.outer + 1 != label.axis:
        return Val(raw([label]))
    n = src.shape[label.axis]
    before = math.prod(src.shape[: label.outer])
    for j in range(len(out.shape)):
        if math.prod(out.shape[:j]) == before and out.shape[j] == n:
            return Val(replace(label, axis=j, outer=None), uniform)
    return Val(raw([label]))


def _slice(v: Val, src: Tensor | None, start: Sequence[int], limit: Sequence[int],
           strides: Sequence[int] | None) -> Val:
    label = v.label
    uniform = v.uniform
    if label is None or not label.mine or label.form != "rowwise" or label.axis is None:
        return Val(label, uniform)
    a = label.axis
    if strides is not None and strides[a] != 1:
        return Val(raw([label]))
    return Val(narrowed(label, int(start[a]), int(limit[a]), src is not None), uniform)


def _dynamic_slice(ins: list[Val], src: Tensor | None, sizes: tuple[int, ...]) -> Val:
    value, offsets = ins[0], ins[1:]
    label = value.label
    moved = [o.label for o in offsets if o.label is not None and o.label.mine]
    if moved:
        return Val(raw([label, *moved]))
    if label is None or not label.mine or label.form != "rowwise" or label.axis is None \
            or src is None:
        return Val(label, value.uniform)
    a = label.axis
    if label.outer is not None:
        o = label.outer
        if sizes[a] != src.shape[a] or sizes[o] != 1:
            return Val(raw([label]))
        return Val(replace(label, outer=None), value.uniform)  # one block, not known which
    if sizes[a] == src.shape[a]:
        return Val(label, value.uniform)
    start = offsets[a].const if a < len(offsets) else None
    if start is None:
        return Val(raw([label]))
    lo = int(min(max(start, 0), src.shape[a] - sizes[a]))
    return Val(narrowed(label, lo, lo + sizes[a], src is not None), value.uniform)


def _gathered(ins: list[Val], src: Tensor | None, op: Op) -> Val:
    """A gather of one slice (what JAX makes of ``x[:, 0]`` when the rows are a symbol)
    keeps the rows if it keeps them all in one axis; other gathers are indexing."""
    numbers, starts = op.attrs.get("dimension_numbers"), op.operand_types[1]
    label = ins[0].label
    if not isinstance(numbers, dict) or starts is None or len(starts.shape) != 1 or \
            numbers["index_vector_dim"] != 0 or numbers["operand_batching_dims"] or \
            numbers["offset_dims"] != tuple(range(len(numbers["offset_dims"]))) or \
            label is None or not label.mine or (ins[1].label is not None and ins[1].label.mine):
        return _indexing(ins)
    collapsed, a, sizes = numbers["collapsed_slice_dims"], label.axis, op.attrs["slice_sizes"]
    if label.form != "rowwise" or a is None or src is None or label.outer is not None \
            or a in collapsed or sizes[a] != src.shape[a]:
        return Val(raw([label]))
    return Val(replace(label, axis=[d for d in range(len(sizes)) if d not in collapsed].index(a)))


def _concatenate(ins: list[Val], types: Sequence[Tensor | None], dim: int) -> Val:
    mine = [i for i, v in enumerate(ins) if v.label is not None and v.label.mine]
    rowwise = [i for i in mine if ins[i].label.form == "rowwise"]  # type: ignore[union-attr]
    uniform = ALL
    for v in ins:
        uniform &= v.uniform
    uniform -= {dim}
    if len(rowwise) == 1 and ins[rowwise[0]].label.axis == dim:  # type: ignore[union-attr]
        i = rowwise[0]
        label = ins[i].label
        assert label is not None
        if len(mine) != 1 or any(t is None for t in types[:i]):
            return Val(raw([v.label for v in ins]))
        offset = sum(t.shape[dim] for t in types[:i] if t is not None)
        return Val(replace(label, at=label.at + offset, pure=False), uniform)
    if any(ins[i].label.axis == dim for i in rowwise):  # type: ignore[union-attr]
        return Val(raw([v.label for v in ins]))
    return Val(_elementwise(ins, False).label, uniform)


def _pad(ins: list[Val], op: Op) -> Val:
    value = ins[0]
    label = value.label
    if ins[1].label is not None and ins[1].label.mine:
        return Val(raw([label, ins[1].label]))
    if label is None or not label.mine or label.form != "rowwise" or label.axis is None:
        return Val(label)
    a = label.axis
    low = tuple(op.attrs["edge_padding_low"])
    interior = tuple(op.attrs["interior_padding"])
    if interior[a] != 0 or low[a] < 0:
        return Val(raw([label]))
    return Val(replace(label, at=label.at + int(low[a]), pure=False))


def _along(ins: list[Val], dims: tuple[int, ...]) -> Val:
    """Reversal or sorting along ``dims``: raw along the rows, row-wise elsewhere."""
    label = join_all(v.label for v in ins)
    rowwise = [v.label for v in ins if v.label is not None and v.label.mine
               and v.label.form == "rowwise"]
    if any(lab.axis in dims for lab in rowwise):
        return Val(raw([v.label for v in ins]))
    return Val(impure(label))


def _indexing(ins: list[Val]) -> Val:
    """Gathers, scatters and other ops not modelled: raw, unless no input is row-wise or
    raw data of p (parts of aggregates are aggregates)."""
    labels = [v.label for v in ins]
    if any(lab is not None and lab.mine and lab.form in ("rowwise", "raw") for lab in labels):
        return Val(raw(labels))
    return Val(impure(join_all(labels)))


def _dot(op: Op, ins: list[Val]) -> Val | None:
    """``dot_general``: contracting the rows of a row-wise value aggregates them; keeping
    them (as a batch or free axis) keeps it row-wise."""
    dims = op.attrs.get("dot_dimension_numbers")
    if None in op.operand_types[:2]:
        return None
    if op.kind == "dot":  # a matrix or vector product: lhs's last axis with rhs's first
        lhs_rank = len(op.operand_types[0].shape)  # type: ignore[union-attr]
        dims = {"lhs_batching_dimensions": [], "rhs_batching_dimensions": [],
                "lhs_contracting_dimensions": [lhs_rank - 1], "rhs_contracting_dimensions": [0]}
    if not isinstance(dims, dict):
        return None
    batch = (list(dims["lhs_batching_dimensions"]), list(dims["rhs_batching_dimensions"]))
    contract = (list(dims["lhs_contracting_dimensions"]),
                list(dims["rhs_contracting_dimensions"]))
    ranks = [len(t.shape) for t in op.operand_types[:2]]  # type: ignore[union-attr]
    free = [[d for d in range(ranks[i]) if d not in batch[i] and d not in contract[i]]
            for i in (0, 1)]
    rowwise = [i for i in (0, 1) if is_rowwise(ins[i].label)]
    if not rowwise:
        return Val(combine(ins[0].label, ins[1].label), alike=_dot_alike(ins, batch, free))
    if len(rowwise) == 2:
        a, b = ins[0].label, ins[1].label
        assert a is not None and b is not None
        for group in (contract, batch):
            if a.axis in group[0] and b.axis in group[1] and \
                    group[0].index(a.axis) == group[1].index(b.axis) and \
                    aligned_windows(a.window, b.window) is not None and a.at == b.at and \
                    a.outer is None is b.outer:
                if weighs(a, b):
                    return Val(raw([a, b]))
                if group is contract:
                    weighted = masked(a) if a.mask != b.mask else a
                    return Val(combine(aggregated(weighted), aggregated(b)))
                return Val(_kept(a, b, axis=group[0].index(a.axis)))
        return Val(raw([a, b]))
    i = rowwise[0]
    lab, other = ins[i].label, ins[1 - i]
    assert lab is not None
    if lab.axis is None:
        return Val(combine(lab, other.label))
    if lab.outer is not None:
        return Val(raw([lab, other.label]))
    olab = other.label
    row_axis = lab.axis
    if olab is not None and not olab.mine and lab.mask and not olab.mask:
        return Val(raw([lab, olab]))  # p's mask weighting another owner's values shows it
    if olab is not None and olab.mask:
        lab = masked(lab)  # p's rows selected by another owner's mask
    for group in (contract, batch):
        if row_axis in group[i]:
            pos = group[1 - i][group[i].index(row_axis)]
            if not _aligned(lab, other, pos):
                return Val(raw([lab, olab]))
            if group is contract:
                return Val(combine(aggregated(lab), impure(olab)))
            return Val(_kept(lab, olab, axis=group[i].index(row_axis)))
    axis = len(batch[0]) + (0 if i == 0 else len(free[0])) + free[i].index(row_axis)
    return Val(_kept(lab, olab, axis=axis))


def _dot_alike(ins: list[Val], batch: tuple[list[int], list[int]], free: list[list[int]]
               ) -> frozenset[int] | None:
    """The result axes of a ``dot_general`` along which it varies at most with other
    owners' row-aligned data: a batch axis alike in both operands, a free axis alike in
    its operand (the other does not vary along it)."""
    alike = [claimed(v) for v in ins]
    if all(a == ALL for a in alike):
        return ALL
    axes = [d for d, (a, b) in enumerate(zip(*batch, strict=True))
            if a in alike[0] and b in alike[1]]
    axes += [len(batch[0]) + k for k, d in enumerate(free[0]) if d in alike[0]]
    axes += [len(batch[0]) + len(free[0]) + k for k, d in enumerate(free[1]) if d in alike[1]]
    return frozenset(axes) if axes else None


def claimed(v: Val) -> frozenset[int]:
    """The axes along which ``v``, as an operand, leaves a result alike: another owner's
    mask weighs rows alike only while the result is a mask (`selecting` says so)."""
    masked_rows = v.label is not None and not v.label.mine and v.label.mask
    return v.uniform if masked_rows else v.alike_axes()


def _kept(lab: Flow, other: Label, **changes: Any) -> Flow:
    """Row-wise ``lab`` combined with ``other``, its row axis moved by ``changes``."""
    out = combine(lab, other)
    assert out is not None
    return replace(out, **changes)


def is_rowwise(label: Label) -> TypeGuard[Flow]:
    return label is not None and label.mine and label.form == "rowwise"


def _aligned(lab: Flow, other: Val, pos: int) -> bool:
    """Whether ``other``'s axis ``pos`` weights ``lab``'s rows alike: other owners'
    row-aligned mask, or a value uniform along that axis; where ``lab`` is p's mask, any
    value of other owners (p's data selects their rows)."""
    return pos in other.alike_axes() or (lab.mask and other.label is not None and
                                         not other.label.mine)


def rule(op: Op, ins: list[Val]) -> Val | None:
    """The value of a region-free op (or a ``reduce``, ``sort``) on ``ins`` (None: not
    modelled)."""
    kind = op.kind
    types = op.operand_types
    out_t = op.result_types[0] if op.result_types else None
    if any(v.label is not None and v.label.outer is not None for v in ins) and \
            kind not in ELEMENTWISE | PRESERVING | {"dynamic_slice", "reshape", "reduce",
                                                    "broadcast_in_dim", "compare"}:
        return Val(raw([v.label for v in ins]))
    if kind in ELEMENTWISE or kind in PRESERVING:
        if kind == "select" and all(is_rowwise(v.label) for v in ins[1:]):
            ins = [_piecewise(ins[0], *ins[1:]), *ins[1:]]
        out = _elementwise(ins, kind in PRESERVING, _fold(kind, ins))
        if kind in _CHOOSING and is_rowwise(out.label) and not out.label.mask:
            return replace(out, label=masked(out.label))
        return out
    if kind == "compare":
        return _compare(ins)
    if kind == "broadcast_in_dim":
        return _broadcast(ins[0], types[0], out_t, tuple(op.attrs["broadcast_dimensions"]))
    if kind == "reshape":
        return _reshape(ins[0], types[0], out_t)
    if kind == "transpose":
        return _transpose(ins[0], tuple(op.attrs["permutation"]))
    if kind == "reduce":
        return _reduction(op, ins)
    if kind in ("dot_general", "dot"):
        return _dot(op, ins)
    if kind == "slice":
        return _slice(ins[0], types[0], op.attrs["start_indices"], op.attrs["limit_indices"],
                      op.attrs.get("strides"))
    if kind == "dynamic_slice":
        return _dynamic_slice(ins, types[0], tuple(op.attrs["slice_sizes"]))
    if kind == "gather":
        return _gathered(ins, types[0], op)
    if kind == "concatenate":
        return _concatenate(ins, types, int(op.attrs["dimension"]))
    if kind == "pad":
        return _pad(ins, op)
    if kind in ("reverse", "sort"):
        dims = op.attrs["dimensions"] if kind == "reverse" else (op.attrs["dimension"],)
        return _along(ins, tuple(int(d) for d in dims))
    return _indexing(ins)

def _reduction(op: Op, ins: list[Val]) -> Val | None:
    sums = _sums(op)
    dims = tuple(op.attrs["dimensions"])
    half = len(ins) // 2
    value = ins[0] if half == 1 else Val(join_all(v.label for v in ins[:half]))
    label = value.label
    init = join_all(v.label for v in ins[half:])
    if init is not None and init.mine:
        return None
    uniform = _drop_axes(value.uniform, dims)
    if label is None or not label.mine:
        return Val(label if sums else impure(label), uniform,
                   alike=_drop_axes(value.alike_axes(), dims))
    if label.form != "rowwise" or label.axis is None:
        return Val(impure(label), uniform)
    if label.outer is not None:
        if label.axis not in dims or not sums:
            return Val(raw([label]), uniform)
        return Val(aggregated(label, whole=label.outer in dims), uniform)
    if label.axis not in dims:
        return Val(_renumber(label, dims), uniform)
    return Val(aggregated(label) if sums else raw([label]), uniform)


def _selection(label: Label) -> frozenset[int] | None:
    """The axes along which a value entering a function weights p's rows alike: every
    axis for another owner's mask (a 0/1 selection of rows, which gates them); none known
    for other values (another owner's real values weight rows unequally)."""
    return ALL if label is not None and not label.mine and label.mask else None


def carried(label: Label) -> Val:
    """A loop-carried value: its label (other owners' masks stay selections)."""
    return Val(label, alike=_selection(label))


def arg(label: Label, t: Tensor | None) -> Val:
    """An argument: uniform along its unit axes (a scalar: along every axis)."""
    alike = _selection(label)
    if t is None:
        return Val(label, alike=alike)
    if not t.shape:
        return Val(label, ALL)
    return Val(label, frozenset(i for i, s in enumerate(t.shape) if s == 1), alike=alike)
