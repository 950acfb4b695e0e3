"""Labels through the tensor program an op runs, given its payload or its StableHLO
text: raw from every input, and observing them, when it cannot be followed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from mplang.edsl.errors import MPLangError
from mplang.flows.labels import Label, raw
from mplang.flows.tensor_flows import Result, transfer
from mplang.util.lru import LRUCache

_TEXTS = LRUCache(256)
"""(reader, payload bytes) -> module text."""


def module_text(read: Callable[[bytes], str], payload: bytes) -> str | None:
    """The text ``read`` gives of a tensor program's payload (None if it cannot be read)."""
    text: str | None = _TEXTS.lookup((read, payload))
    if text is None:
        try:
            text = read(payload)
        except (MPLangError, ValueError, RuntimeError):
            return None
        _TEXTS.store((read, payload), text)
    return text


def labels_through(text: str | None, ins: list[Label], n: int, where: str = "") -> Result:
    """Labels through the ``n``-result StableHLO module ``text`` (of the function traced
    at ``where``, which raw outputs name); raw from every input if it cannot be followed
    (or ``text`` is None), its run time then observing them too."""
    if all(lab is None for lab in ins):
        return Result([None] * n)
    got = transfer(text, ins) if text is not None else None
    if got is not None and len(got.outputs) == n:
        at = f" in the function traced at {where}" if where else ""
        return Result([lab if lab is None or not lab.cause else replace(
            lab, cause=lab.cause + at) for lab in got.outputs], got.observed)
    everything = raw(ins)
    return Result([everything] * n, everything if everything is not None and everything.mine
                  else None)


def through(read: Callable[[bytes], str], payload: Any, ins: list[Label], n: int,
            where: str = "") -> Result:
    """Labels through a tensor program whose StableHLO text ``read`` gives (traced at
    ``where``); raw from every input if it cannot be followed."""
    if all(lab is None for lab in ins):
        return Result([None] * n)
    return labels_through(module_text(read, bytes(payload)), ins, n, where)
