"""Labels through tensor programs: StableHLO modules read with the MLIR bindings
(`mplang.analysis.stablehlo`).

Elementwise ops join their operands' labels, comparisons give ``compare``,
sum-like reductions and dot contractions over m elements multiply ``elements``
by m, slicing ops clear ``full``, ``call`` follows the callee, ``while`` runs to
a fixpoint; anything else (custom calls, unknown ops, unmodelled regions) is
raw from every value it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from mplang.analysis.stablehlo import Block, Module, Op, parse
from mplang.edsl.errors import MPLangError
from mplang.policy.labels import Label, compared, join, join_all, raw, reduced, sliced
from mplang.util.lru import LRUCache

ELEMENTWISE = frozenset([
    "abs", "add", "and", "atan2", "bitcast_convert", "broadcast", "broadcast_in_dim",
    "cbrt", "ceil", "clamp", "convert", "copy", "cosine", "count_leading_zeros", "divide",
    "exponential", "exponential_minus_one", "floor", "imag", "is_finite", "log",
    "log_plus_one", "logistic", "maximum", "minimum", "multiply", "negate", "not", "or",
    "popcnt", "power", "real", "remainder", "reshape", "reverse", "round_nearest_afz",
    "round_nearest_even", "rsqrt", "shift_left", "shift_right_arithmetic",
    "shift_right_logical", "sign", "sine", "sqrt", "subtract", "tan", "tanh", "transpose",
    "xor", "select", "optimization_barrier", "concatenate", "pad"
])
"""Ops whose result joins its operands' labels: each keeps every element it reads (a
concatenation or padding still covers whole inputs)."""
COMPARE = frozenset(["compare"])
SLICING = frozenset(["slice", "dynamic_slice", "gather", "dynamic_update_slice"])
"""Ops that may keep only part of their input: the result no longer covers it whole."""
NO_LABEL = frozenset(["constant", "iota"])
_ADDITIVE = frozenset(["add"])
_BOOLEAN = frozenset(["or", "and", "maximum", "minimum"])
_MAX_LOOP_ROUNDS = 8
_MAX_CALL_DEPTH = 32

Env = dict[int, Label]
"""Labels of the values in scope, by value id."""


class _Flows:
    def __init__(self, module: Module):
        self.module = module
        self._calls: dict[tuple[str, tuple[Label, ...]], list[Label]] = {}

    def call(self, name: str, inputs: Sequence[Label], depth: int = 0) -> list[Label] | None:
        """The labels ``name`` returns for arguments labelled ``inputs`` (None: unknown
        function, wrong arity or calls nested too deeply)."""
        func = self.module.functions.get(name)
        if func is None or depth > _MAX_CALL_DEPTH or len(func.args) != len(inputs):
            return None
        key = (name, tuple(inputs))
        if key not in self._calls:
            self._calls[key] = self.block(func, dict(zip(func.args, inputs, strict=True)),
                                          depth)
        return self._calls[key]

    def block(self, block: Block, env: Env, depth: int) -> list[Label]:
        """Run the block's ops in ``env`` (extended in place); its returned labels."""
        for op in block.ops:
            if op.kind == "return":
                return [env.get(v) for v in op.operands]
            env.update(zip(op.results, self.op(op, env, depth), strict=True))
        return []

    def op(self, op: Op, env: Env, depth: int) -> list[Label]:
        n = len(op.results)
        if op.kind in NO_LABEL or n == 0:
            return [None] * n
        ins = [env.get(v) for v in op.operands]
        if op.kind == "call" and not op.regions:
            called = self.call(str(op.attrs.get("callee")), ins, depth + 1)
            if called is not None and len(called) == n:
                return called
        elif op.kind == "while":
            looped = self.loop(op, env, depth)
            if looped is not None and len(looped) == n:
                return looped
        elif not op.regions or op.kind == "reduce":
            label = self.simple(op, ins)
            if not isinstance(label, bool):
                return [label] * n
        return [raw(ins + _region_reads(op.regions, env))] * n

    def simple(self, op: Op, ins: list[Label]) -> Label | bool:
        """The label of a region-free op's results, or of a reduction (False: not
        modelled)."""
        kind = op.kind
        if kind in ELEMENTWISE:
            return join_all(ins)
        if kind in COMPARE:
            return compared(join_all(ins))
        if kind in SLICING:
            return sliced(join_all(ins))
        if kind == "reduce":
            return self.reduction(op, ins)
        lhs = op.operand_types[0] if op.operand_types else None
        if kind == "dot_general" and lhs is not None:
            dims = op.attrs.get("dot_dimension_numbers")
            if not isinstance(dims, dict):
                return False
            axes = dims["lhs_contracting_dimensions"]
            return reduced(join_all(ins), math.prod(lhs.shape[a] for a in axes
                                                    if a < len(lhs.shape)))
        if kind == "dot" and lhs is not None:
            return reduced(join_all(ins), lhs.shape[-1] if lhs.shape else 1)
        return False

    def reduction(self, op: Op, ins: list[Label]) -> Label | bool:
        """A sum (or a count: or/and/max/min of comparisons) over the reduced axes."""
        kinds = {o.kind for region in op.regions for o in region.ops} - {"return"}
        dims = op.attrs.get("dimensions")
        operand = op.operand_types[0] if op.operand_types else None
        if not isinstance(dims, tuple) or operand is None:
            return False
        count = math.prod(operand.shape[a] for a in dims if a < len(operand.shape))
        label = join_all(ins)
        if kinds <= _ADDITIVE:
            return reduced(label, count)
        if kinds <= _BOOLEAN and label is not None and label.form in ("compare", "count"):
            return reduced(label, count)
        return False

    def loop(self, op: Op, env: Env, depth: int) -> list[Label] | None:
        """``while``: iterate the body's labels to a fixpoint; the predicate's label
        joins every result (the trip count depends on it)."""
        if len(op.regions) != 2:
            return None
        cond, body = op.regions
        state = [env.get(v) for v in op.operands]
        if len(cond.args) != len(state) or len(body.args) != len(state):
            return None
        for _ in range(_MAX_LOOP_ROUNDS):
            new = self.block(body, {**env, **dict(zip(body.args, state, strict=True))},
                             depth)
            if len(new) != len(state):
                return None
            joined = [join(a, b) for a, b in zip(state, new, strict=True)]
            if joined == state:
                break
            state = joined
        else:
            state = [raw([s]) for s in state]
        pred = join_all(self.block(cond, {**env, **dict(zip(cond.args, state, strict=True))},
                                   depth))
        return [join(s, pred) for s in state]


def _region_reads(regions: Sequence[Block], env: Env) -> list[Label]:
    """The labels of the enclosing blocks' values that ``regions`` read (at any depth)."""
    reads: list[Label] = []
    for region in regions:
        for op in region.ops:
            reads.extend(env.get(v) for v in op.operands)
            reads.extend(_region_reads(op.regions, env))
    return reads


_CACHE = LRUCache(256)


def transfer(text: str, inputs: Sequence[Label]) -> list[Label] | None:
    """The labels of the results of ``main`` of StableHLO module ``text`` given its
    arguments' labels (None if it cannot be parsed or has no ``main`` of that arity)."""
    key = (text, tuple(inputs))
    cached = _CACHE.lookup(key)
    if cached is not None:
        return list(cached)
    try:
        module = parse(text)
    except ValueError:
        return None
    result = _Flows(module).call("main", inputs)
    if result is not None:
        _CACHE.store(key, tuple(result))
    return result


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


def labels_through(text: str | None, ins: list[Label], n: int) -> list[Label]:
    """Labels through the ``n``-result StableHLO module ``text``; raw from every input if
    it cannot be followed (or ``text`` is None)."""
    if all(lab is None for lab in ins):
        return [None] * n
    outs = transfer(text, ins) if text is not None else None
    return outs if outs is not None and len(outs) == n else [raw(ins)] * n


def through(read: Callable[[bytes], str], payload: Any, ins: list[Label], n: int
            ) -> list[Label]:
    """Labels through a tensor program whose StableHLO text ``read`` gives; raw from every
    input if it cannot be followed."""
    if all(lab is None for lab in ins):
        return [None] * n
    return labels_through(module_text(read, bytes(payload)), ins, n)
