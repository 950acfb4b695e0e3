"""Kernels of the `func` dialect: a call interprets its body region in place."""

from __future__ import annotations

from typing import Any

from mplang.edsl.graph import Operation
from mplang.runtime.interpreter import Interpreter, KernelTable

KERNELS = KernelTable()


@KERNELS.register("func.call")
def call_region(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    return interp.run(op.regions[0], args, key)
