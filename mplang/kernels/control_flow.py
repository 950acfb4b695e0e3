"""Loop structure shared by the driver's and the workers' ``simp.while_loop`` kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mplang.edsl.graph import Operation
from mplang.runtime.interpreter import Interpreter


def run_while(interp: Interpreter, op: Operation, args: list[Any], key: str,
              holds: Callable[[Any, str], bool]) -> list[Any]:
    """Run ``op``'s cond and body regions until ``holds(predicate, scope)`` is false.

    Each iteration has its own key scope, so messages of different iterations
    never mix.
    """
    cond_g, body_g = op.regions
    num_state = len(body_g.outputs)
    state, captured = list(args[:num_state]), list(args[num_state:])
    iteration = 0
    while True:
        scope = f"{key}/i{iteration}"
        (pred,) = interp.run(cond_g, state + captured, scope + "/c")
        if not holds(pred, scope):
            return state
        state = interp.run(body_g, state + captured, scope + "/b")
        iteration += 1
