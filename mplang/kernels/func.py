"""Kernels of the `func` dialect: a call interprets its body region in place,
on the workers and on the driver alike."""

from __future__ import annotations

from typing import Any

from mplang.dialects import func as _func
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call

BACKEND = register_backend("func")


@BACKEND.kernel(_func.call_p)
@BACKEND.kernel(_func.call_p, runtime="driver")
def call_region(call: Call, *args: Any) -> list[Any]:
    return call.interp.run(call.op.regions[0], args, call.key)
