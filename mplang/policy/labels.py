"""Flow labels: what a value reveals of one party's data.

A label is None (the value is not derived from the party's data) or a `Flow`.
Forms, from most to least revealing: ``raw`` (elements themselves, or anything
not modelled), ``aggregate`` (each element combines ``elements`` of the party's
elements by a reduction), ``compare`` (a comparison result) and ``count`` (a
reduction of comparison results).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

FORMS = ("raw", "aggregate", "compare", "count")


@dataclass(frozen=True)
class Flow:
    """A value derived from one party's data: its ``form``, how many of the party's
    elements each of its elements combines, whether it aggregates whole un-sliced
    inputs (``full``) and the names of the sources it derives from."""

    form: str
    elements: int = 1
    full: bool = True
    sources: frozenset[str] = frozenset()

    def __str__(self) -> str:
        what = self.form if self.form in ("raw", "compare") else \
            f"{self.form} of {self.elements} elements"
        return f"{what} of {', '.join(sorted(self.sources)) or 'its data'}"


Label = Flow | None


def source(name: str) -> Flow:
    """The label of data loaded from source ``name``."""
    return Flow("raw", 1, True, frozenset([name]))


def join(a: Label, b: Label) -> Label:
    """The label of an elementwise combination of ``a`` and ``b``.

    Raw dominates; two aggregates (or counts) stay one only if both cover whole
    inputs (``sum(x) - sum(x[1:])`` is ``x[0]``); other mixed forms are raw.
    """
    if a is None:
        return b
    if b is None or a == b:
        return a
    full = a.full and b.full
    sources = a.sources | b.sources
    elements = min(a.elements, b.elements)
    form = a.form if a.form == b.form else "raw"
    if form in ("aggregate", "count") and not full:
        form = "raw"
    if form == "raw":
        elements = 1
    return Flow(form, elements, full, sources)


def join_all(labels: Iterable[Label]) -> Label:
    out: Label = None
    for label in labels:
        out = join(out, label)
    return out


def raw(labels: Iterable[Label]) -> Label:
    """The conservative label of anything not modelled: raw, from every labelled input."""
    sources: frozenset[str] = frozenset()
    found = False
    for label in labels:
        if label is not None:
            found = True
            sources |= label.sources
    return Flow("raw", 1, False, sources) if found else None


def reduced(label: Label, count: int) -> Label:
    """The label of a sum-like reduction combining ``count`` elements of ``label``."""
    if label is None:
        return None
    form = {"raw": "aggregate", "compare": "count"}.get(label.form, label.form)
    return Flow(form, label.elements * max(1, count), label.full, label.sources)


def compared(label: Label) -> Label:
    """The label of a comparison of ``label`` (elements kept)."""
    if label is None:
        return None
    return Flow("compare", label.elements, label.full, label.sources)


def sliced(label: Label) -> Label:
    """The label of a part of ``label``'s value: no longer over whole inputs."""
    if label is None or not label.full:
        return label
    return Flow(label.form, label.elements, False, label.sources)
