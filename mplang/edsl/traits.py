"""The vocabulary of op declarations: what an op is, where it runs, what passes may assume.

One vocabulary serves primitives and the frontend ops that emit them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OpKind = Literal["source", "compute", "communication", "control_flow", "call", "compiler",
                 "transform"]
"""What an op does: produces data (constants, loads), computes, moves data between parties,
runs regions by a predicate, calls a function body, compiles a user function (``compiler``),
or takes user functions and emits other ops (``transform``, frontend ops only)."""
ExecutionModel = Literal["single_rank", "multi_party", "any", "in_controller"]
"""Where an op may appear: inside one party's local region (``single_rank``, pcall bodies),
at the simp level across parties (``multi_party``), at either level (``any``), or only at
trace time on the driver (``in_controller``, frontend ops that emit no op themselves)."""
RegionUse = Literal["call", "branch", "loop"]
"""How an op runs its regions (see `OpTraits`)."""
Runtime = Literal["worker", "driver", "launch"]
"""A runtime that executes kernels: a party's worker, the driver in standard mode, or the
driver in launch mode (its kernels override the ``driver`` ones there)."""
RUNTIMES: tuple[Runtime, ...] = ("worker", "driver", "launch")


@dataclass(frozen=True)
class OpTraits:
    """What passes, the scheduler and the analysis may assume about an op.

    The defaults are the safe ones, so an op that declares nothing works with
    every pass: it has effects (keeps its program order, is never removed or
    merged), may communicate, is never fused or batched.

    - ``pure``: no side effects (I/O, randomness, host calls); its result depends
      on its inputs and attributes only.
    - ``communicates``: its kernel may exchange messages between parties. For an op
      with ``regions="call"``, False means: local when its regions are.
    - ``regions``: how its regions run: ``call`` (each once, in place), ``branch``
      (one of them, chosen by a uniform predicate), ``loop`` (cond and body repeated).
    - ``fusable``: two adjacent such ops of one name, with one region and the
      attributes ``parties`` (a known mask) and ``fn``, may run as one (their
      regions concatenated), as ``simp.pcall`` does.
    - ``batchable``: several such ops of one name with equal ``routes`` may move as
      one op with several inputs and outputs, as ``simp.shuffle_static`` does.
    - ``runtimes``: the runtimes that must have a kernel for it.
    """

    pure: bool = False
    communicates: bool = True
    regions: RegionUse | None = None
    fusable: bool = False
    batchable: bool = False
    runtimes: tuple[Runtime, ...] = ("worker",)


WORKER_AND_DRIVER: tuple[Runtime, ...] = ("worker", "driver")
"""The runtimes of a multi-party op that the driver runs itself as well as the workers."""
LOCAL_PURE = OpTraits(pure=True, communicates=False)
"""Traits of a party-local computation without side effects."""
LOCAL_EFFECT = OpTraits(pure=False, communicates=False)
"""Traits of a party-local op with effects (I/O, randomness, a host call)."""
