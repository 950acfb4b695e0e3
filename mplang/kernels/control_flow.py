"""Loop structure shared by the driver's and the workers' ``simp.while_loop`` kernels."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mplang.runtime.interpreter import Call


def run_while(call: Call, args: Sequence[Any], holds: Callable[[Any, str], bool]) -> list[Any]:
    """Run ``call.op``'s cond and body regions until ``holds(predicate, scope)`` is false.

    Each iteration has its own key scope, so messages of different iterations
    never mix.
    """
    cond_g, body_g = call.op.regions
    num_state = len(body_g.outputs)
    state, captured = list(args[:num_state]), list(args[num_state:])
    iteration = 0
    while True:
        scope = f"{call.key}/i{iteration}"
        (pred,) = call.interp.run(cond_g, state + captured, scope + "/c")
        if not holds(pred, scope):
            return state
        state = call.interp.run(body_g, state + captured, scope + "/b")
        iteration += 1
