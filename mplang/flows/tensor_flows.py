"""Labels through tensor programs: StableHLO modules read with the MLIR bindings
(`mplang.flows.stablehlo`), on the lattice of `mplang.flows.labels`.

Each op's rule is in `mplang.flows.tensor_ops`; calls, loops and branches are
followed here. A ``while`` or ``case`` whose predicate depends on p's data is observed by
whoever sees the run time: `Result.observed` is that predicate's label.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from mplang.flows.labels import Label, caused, join, join_all, raw
from mplang.flows.stablehlo import Block, Module, Op, parse
from mplang.flows.tensor_ops import (
    ALL,
    NO_LABEL,
    STRUCTURAL,
    UNKNOWN,
    Val,
    arg,
    carried,
    claimed,
    constant,
    is_rowwise,
    rule,
    selecting,
    shifted,
)
from mplang.util.lru import LRUCache

_MAX_LOOP_ROUNDS = 8
_MAX_CALL_DEPTH = 32
@dataclass
class Result:
    """The labels of a module's results, and the label of what its run time shows."""

    outputs: list[Label]
    observed: Label = None


class _Flows:
    def __init__(self, module: Module):
        self.module = module
        self.observed: Label = None
        self._calls: dict[tuple[str, tuple[Val, ...]], list[Val]] = {}
        self._idents = 0
        self._numbers: dict[int, int] = {}

    # -- functions, blocks, control flow
    def call(self, name: str, inputs: Sequence[Val], depth: int = 0) -> list[Val] | None:
        func = self.module.functions.get(name)
        if func is None or depth > _MAX_CALL_DEPTH or len(func.args) != len(inputs):
            return None
        key = (name, tuple(inputs))
        if key not in self._calls:
            self._calls[key] = self.block(func, dict(zip(func.args, inputs, strict=True)),
                                          depth)
        return self._calls[key]

    def block(self, block: Block, env: dict[int, Val], depth: int) -> list[Val]:
        for op in block.ops:
            if op.kind == "return":
                return [env.get(v, UNKNOWN) for v in op.operands]
            outs = self.op(op, env, depth)
            if any(_raw(v.label) for v in outs) and not any(
                    _raw(env.get(v, UNKNOWN).label) for v in op.operands):
                outs = [replace(v, label=caused(v.label, self.numbered(op))) for v in outs]
            env.update(zip(op.results, outs, strict=True))
        return []

    def numbered(self, op: Op) -> str:
        """``stablehlo.sort #2``: the op's name and which of the module's ops of that name
        it is, in `Module.walk` order (what a driver maps to the line that traced it)."""
        if not self._numbers:
            seen: dict[str, int] = {}
            for each in self.module.walk():
                seen[each.name] = self._numbers[id(each)] = seen.get(each.name, 0) + 1
        return f"{op.name} #{self._numbers.get(id(op), 0)}"

    def op(self, op: Op, env: dict[int, Val], depth: int) -> list[Val]:
        n = len(op.results)
        ins = [env.get(v, UNKNOWN) for v in op.operands]
        if n == 0:
            return []
        if op.kind in NO_LABEL:
            return [constant(op)] * n
        if op.kind == "call" and not op.regions:
            called = self.call(str(op.attrs.get("callee")), ins, depth + 1)
            if called is not None and len(called) == n:
                return called
        elif op.kind == "while":
            looped = self.loop(op, env, ins, depth)
            if looped is not None and len(looped) == n:
                return looped
        elif op.kind in ("case", "if"):
            return self.branches(op, env, ins, depth)
        elif op.kind == "optimization_barrier":
            return list(ins)
        elif not op.regions or op.kind in ("reduce", "sort"):
            try:
                out = rule(op, ins)
            except (KeyError, IndexError, TypeError, ValueError):
                out = None
            if out is not None:
                if out.alike is None and op.kind not in STRUCTURAL:
                    common = ALL
                    for v, t in zip(ins, op.operand_types, strict=False):
                        if t is None or t.shape:  # a scalar (an index) varies along no axis
                            common &= claimed(v)
                    out = replace(out, alike=common if ins else None)
                out = selecting(op.kind, ins, out)
                if is_rowwise(out.label):
                    self._idents += 1
                    out = replace(out, ident=self._idents, base=shifted(op.kind, ins))
                return [out] * n if op.kind != "sort" else [Val(out.label)] * n
        return [Val(raw([v.label for v in ins] + _region_reads(op.regions, env)))] * n

    def loop(self, op: Op, env: dict[int, Val], ins: list[Val], depth: int
             ) -> list[Val] | None:
        """``while``: the body's labels to a fixpoint; the predicate is observed and joins
        every result."""
        if len(op.regions) != 2:
            return None
        cond, body = op.regions
        state = [carried(v.label) for v in ins]
        if len(cond.args) != len(state) or len(body.args) != len(state):
            return None
        for _ in range(_MAX_LOOP_ROUNDS):
            new = self.block(body, {**env, **dict(zip(body.args, state, strict=True))}, depth)
            if len(new) != len(state):
                return None
            joined = [carried(join(a.label, b.label)) for a, b in zip(state, new, strict=True)]
            if joined == state:
                break
            state = joined
        else:
            state = [carried(raw([s.label])) for s in state]
        pred = join_all(v.label for v in self.block(
            cond, {**env, **dict(zip(cond.args, state, strict=True))}, depth))
        return [Val(self.control(s.label, pred)) for s in state]

    def branches(self, op: Op, env: dict[int, Val], ins: list[Val], depth: int) -> list[Val]:
        """``case``/``if``: the branch taken is observed; results join every branch's."""
        pred = join_all(v.label for v in ins)
        outs: list[Label] | None = None
        for region in op.regions:
            got = [v.label for v in self.block(region, dict(env), depth)]
            outs = got if outs is None else [join(a, b) for a, b in zip(outs, got, strict=False)]
        outs = outs or [None] * len(op.results)
        return [Val(self.control(lab, pred)) for lab in outs]

    def control(self, label: Label, pred: Label) -> Label:
        """A value that depends on ``pred`` through control flow; ``pred`` is observed."""
        if pred is None or not pred.mine:
            return label
        self.observed = join(self.observed, pred)
        joined = join(label, pred)
        return joined if joined is not None and joined.form != "rowwise" else raw([label, pred])


def _raw(label: Label) -> bool:
    return label is not None and label.form == "raw" and label.mine


def _region_reads(regions: Sequence[Block], env: dict[int, Val]) -> list[Label]:
    """The labels of the enclosing blocks' values that ``regions`` read (at any depth)."""
    reads: list[Label] = []
    for region in regions:
        for op in region.ops:
            reads.extend(env.get(v, UNKNOWN).label for v in op.operands)
            reads.extend(_region_reads(op.regions, env))
    return reads


_CACHE = LRUCache(256)


def transfer(text: str, inputs: Sequence[Label]) -> Result | None:
    """The labels of the results of ``main`` of StableHLO module ``text`` given its
    arguments' labels (None if it cannot be parsed or has no ``main`` of that arity)."""
    key = (text, tuple(inputs))
    cached = _CACHE.lookup(key)
    if cached is not None:
        return Result(list(cached[0]), cached[1])
    try:
        module = parse(text)
    except ValueError:
        return None
    main = module.functions.get("main")
    if main is None or len(main.args) != len(inputs):
        return None
    flows = _Flows(module)
    vals = flows.call("main", [arg(lab, t) for lab, t in zip(inputs, main.arg_types,
                                                              strict=True)])
    if vals is None:
        return None
    result = Result([v.label for v in vals], flows.observed)
    _CACHE.store(key, (tuple(result.outputs), result.observed))
    return result
