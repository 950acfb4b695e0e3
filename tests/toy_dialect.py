"""A throwaway dialect, added from this one module and no edit elsewhere (the proof of
`tests/test_new_dialect.py`):

- the op ``toy.clip``, declared once: its operand and attribute (by the type-only
  function), its cost rule (a local op's) and its flow rule (each row stays that row);
- its worker kernel (numpy), registered on the primitive;
- the device kind ``TOY``: one node that runs functions of the values it holds (a PPU's
  behaviour), and its moves to and from a party's device.

Workers load it as a plugin: ``mplang worker --plugin tests.toy_dialect``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mplang.device.kinds import get_move, register_kind, register_move
from mplang.device.ppu import PPU
from mplang.edsl.errors import MPTypeError
from mplang.edsl.graph import Operation
from mplang.edsl.typing import TensorType
from mplang.flows.engine import Analysis
from mplang.flows.labels import Label, impure
from mplang.frontend.module import FeModule
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call

dialect = FeModule("toy")


def _row_local(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Each element clipped alike: each row stays that row (no longer as loaded)."""
    return [impure(ins[0])]


@dialect.simple_op(flow=_row_local, example="y = toy.clip(x, bound=1.0)")
def clip(x: TensorType, *, bound: float) -> TensorType:
    """Each element of float tensor ``x`` clipped to ``[-bound, bound]``."""
    if not x.dtype.startswith("float"):
        raise MPTypeError(f"toy.clip: x must be a float tensor, got {x}")
    return x


backend = register_backend("toy")


@backend.kernel(dialect.prims.clip)
def _clip(call: Call, x: Any, *, bound: float) -> list[Any]:
    return [np.clip(np.asarray(x), -bound, bound)]


class Toy(PPU):
    """One node that runs functions of the values it holds, as its party's own device does
    (a party's device it is not: a kind of its own, registered here)."""

    name = "TOY"
    security_model = "its node sees every value it holds, in plaintext"


register_kind(Toy())
for _src, _dst in (("PPU", "TOY"), ("TOY", "PPU")):  # its node's values, sent as a PPU's
    register_move(_src, _dst)(get_move("PPU", "PPU"))  # type: ignore[arg-type]
