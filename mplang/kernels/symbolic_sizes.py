"""Sizes known only at run time: binding a program's symbolic dimensions to the sizes of
the arrays an op receives.

A symbol (``?n0``) stands for one size wherever it appears in a program: both sides of
one PSI join, every tensor made of those rows. An op whose inputs disagree on a symbol
fails here, naming the op, the symbol and the inputs, and never the sizes themselves
(they are counts of a party's rows, which the error would carry to the driver).
"""

from __future__ import annotations

from collections.abc import Sequence

from mplang.edsl.errors import MPPublicError
from mplang.edsl.typing import TensorType, dim_text


def bind_sizes(op: str, types: Sequence[TensorType], shapes: Sequence[Sequence[int]]
               ) -> dict[str, int]:
    """The size of each bare symbol of ``types`` (``n0``, not ``2*n0``) in ``shapes``,
    after checking every static dimension and that each symbol has one size; raises
    `MPPublicError` naming ``op``, the symbol and the inputs that disagree. JAX's
    symbolic sizes are at least 1: an empty size is refused by name too."""
    opcode = op.split("[")[0]

    def refused(why: str) -> MPPublicError:
        return MPPublicError(f"{op}: {why}", op=opcode)

    sizes: dict[str, tuple[int, int]] = {}
    for i, (t, shape) in enumerate(zip(types, shapes, strict=True)):
        if len(shape) != len(t.shape):
            raise refused(f"input {i} has {len(shape)} dimensions, the program expects {t}")
        for j, (dim, size) in enumerate(zip(t.shape, shape, strict=True)):
            if isinstance(dim, int):
                if dim != size:
                    raise refused(f"input {i} does not have the shape {t} (dimension {j})")
                continue
            if not dim.isidentifier():
                continue  # an expression of symbols: JAX checks it when the op runs
            first = sizes.setdefault(dim, (size, i))
            if first[0] != size:
                raise refused(f"{dim_text(dim)} has one size in input {first[1]} and another "
                              f"in input {i} (dimension {j}): values the program made of the "
                              "same rows must keep the same rows")
    for dim, (size, i) in sizes.items():
        if size < 1:
            raise refused(f"{dim_text(dim)} is empty in input {i}; sizes known only at run "
                          "time must be at least 1 (an empty join or filter result cannot "
                          "flow into tensors)")
    return {dim: size for dim, (size, _) in sizes.items()}
