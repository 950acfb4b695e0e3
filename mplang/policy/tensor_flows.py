"""Labels through tensor programs: StableHLO (``tensor.run_jax`` modules) and pphlo
(``spu.run`` executables) text.

Elementwise ops join their operands' labels, comparisons give ``compare``,
sum-like reductions and dot contractions over m elements multiply ``elements``
by m, slicing ops clear ``full``, ``call`` follows the callee, ``while`` runs to
a fixpoint; anything else (custom calls, unknown ops, unmodelled regions) is
raw from every value it reads.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mplang.util.lru import LRUCache
from mplang.edsl.errors import MPLangError
from mplang.policy.labels import Label, compared, join, join_all, raw, reduced, sliced

_OP = re.compile(r'^(?:((?:%[\w#:]+(?:,\s*)?)+)\s*=\s*)?"?((?:[a-z_]+\.)?[a-z_0-9]+)\b')
_VALUE = re.compile(r"%[\w#]+")
_TENSOR = re.compile(r"tensor<((?:[^<>]|<[^<>]*>)*)>")
_FUNC_NAME = re.compile(r"@([\w.$-]+)")
_ARG = re.compile(r"(%[\w]+)\s*:")
_ITER = re.compile(r"(%[\w]+)\s*=\s*(%[\w#]+)")
_DIMS = re.compile(r"^((?:\d+x)*)")

ELEMENTWISE = frozenset([
    "abs", "add", "and", "atan2", "bitcast_convert", "broadcast", "broadcast_as",
    "broadcast_in_dim", "cbrt", "ceil", "clamp", "convert", "copy", "cosine",
    "count_leading_zeros", "divide", "exponential", "exponential_minus_one", "floor",
    "imag", "is_finite", "log", "log_plus_one", "logistic", "maximum", "minimum",
    "multiply", "negate", "not", "or", "popcnt", "power", "real", "remainder", "reshape",
    "reverse", "round_nearest_afz", "round_nearest_even", "rsqrt", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "sign", "sine", "sqrt", "subtract",
    "tan", "tanh", "transpose", "xor", "select", "optimization_barrier", "reciprocal",
    "prefer_a", "concatenate", "pad"
])
"""Ops whose result joins its operands' labels: each keeps every element it reads (a
concatenation or padding still covers whole inputs)."""
COMPARE = frozenset([
    "compare", "less", "less_equal", "greater", "greater_equal", "equal", "not_equal"
])
SLICING = frozenset(["slice", "dynamic_slice", "gather", "dynamic_update_slice"])
"""Ops that may keep only part of their input: the result no longer covers it whole."""
NO_LABEL = frozenset(["constant", "iota", "free"])
_ADDITIVE = frozenset(["add"])
_BOOLEAN = frozenset(["or", "and", "maximum", "minimum", "max", "min"])
_MAX_LOOP_ROUNDS = 8


@dataclass
class Line:
    """One op line of the module text: results, op name (no dialect), text, regions."""

    results: list[str]
    name: str
    text: str
    regions: list[list[Line]] = field(default_factory=list)

    def operands(self) -> list[str]:
        head = self.text.rpartition(" : ")[0] or self.text
        head = head.partition("=")[2] if self.results else head
        return _VALUE.findall(head)

    def types(self) -> tuple[list[str], list[str]]:
        sig = self.text.rpartition(" : ")[2]
        if "->" in sig:
            ins, _, outs = sig.partition("->")
            return _TENSOR.findall(ins), _TENSOR.findall(outs)
        found = _TENSOR.findall(sig)
        return found, found


def parse(text: str) -> list[Line]:
    """The module's op lines as a tree; a line ending in ``{`` opens a region of its op
    (or, for ``cond {`` / ``} do {`` / ``reducer(...) {``, of the previous op)."""
    root: list[Line] = []
    stack: list[list[Line]] = [root]
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("}"):
            if len(stack) > 1:
                stack.pop()
            line = line[1:].strip()
            if not line.endswith("{"):
                continue
        match = _OP.match(line)
        is_op = match is not None and (match.group(1) is not None or "." in match.group(2)
                                       or match.group(2) in ("return", "call", "module"))
        if is_op and match is not None:
            results = [r.strip().split(":")[0] for r in (match.group(1) or "").split(",")
                       if r.strip()]
            stack[-1].append(Line(results, match.group(2).split(".")[-1], line))
        if line.endswith("{"):
            if not stack[-1]:
                stack[-1].append(Line([], "block", line))
            region: list[Line] = []
            stack[-1][-1].regions.append(region)
            stack.append(region)
    return root


def _dims(t: str) -> list[int]:
    match = _DIMS.match(t)
    return [int(d) for d in match.group(1).split("x")[:-1]] if match else []


class _Module:
    def __init__(self, lines: list[Line]):
        self.functions: dict[str, Line] = {}
        self._collect(lines)
        self._calls: dict[tuple[str, tuple[Label, ...]], list[Label]] = {}

    def _collect(self, lines: list[Line]) -> None:
        for line in lines:
            if line.name == "func":
                match = _FUNC_NAME.search(line.text)
                if match:
                    self.functions[match.group(1)] = line
            for region in line.regions:
                self._collect(region)

    def call(self, name: str, inputs: Sequence[Label], depth: int = 0) -> list[Label] | None:
        func = self.functions.get(name)
        if func is None or not func.regions or depth > 32:
            return None
        key = (name, tuple(inputs))
        if key in self._calls:
            return self._calls[key]
        header = func.text.partition("(")[2]
        args = _ARG.findall(header.partition("->")[0])
        if len(args) != len(inputs):
            return None
        env = dict(zip(args, inputs, strict=True))
        out = self.block(func.regions[0], env, depth)
        self._calls[key] = out
        return out

    def block(self, lines: list[Line], env: dict[str, Label], depth: int) -> list[Label]:
        """Run the block's ops in ``env`` (extended in place); its returned labels."""
        for line in lines:
            if line.name == "return":
                return [_get(env, v) for v in line.operands()]
            outs = self.op(line, env, depth)
            for name, label in zip(_result_names(line, len(outs)), outs, strict=True):
                env[name] = label
        return []

    def op(self, line: Line, env: dict[str, Label], depth: int) -> list[Label]:
        name = line.name
        n = max(1, _count_results(line))
        if name in NO_LABEL or not line.results:
            return [None] * n if line.results else []
        ins = [_get(env, v) for v in line.operands()]
        if name in ("call",) and not line.regions:
            match = _FUNC_NAME.search(line.text)
            called = self.call(match.group(1), ins, depth + 1) if match else None
            if called is not None and len(called) == n:
                return called
        elif name == "while":
            looped = self.loop(line, env, depth)
            if looped is not None and len(looped) == n:
                return looped
        elif not line.regions or name == "reduce":
            label = self.simple(line, ins)
            if not isinstance(label, bool):
                return [label] * n
        return [raw(ins + _region_reads(line, env))] * n

    def simple(self, line: Line, ins: list[Label]) -> Label | bool:
        """The label of a region-free op's results (False: not modelled)."""
        name = line.name
        if name in ELEMENTWISE:
            return join_all(ins)
        if name in COMPARE:
            return compared(join_all(ins))
        if name in SLICING:
            return sliced(join_all(ins))
        if name == "reduce":
            return self.reduction(line, ins)
        if name in ("dot", "dot_general"):
            types = line.types()[0]
            if not types:
                return False
            lhs = _dims(types[0])
            if name == "dot":
                contracted = lhs[-1] if lhs else 1
            else:
                match = re.search(r"contracting_dims\s*=\s*\[([\d,\s]*)\]", line.text)
                if match is None:
                    return False
                axes = [int(a) for a in match.group(1).split(",") if a.strip()]
                contracted = math.prod(lhs[a] for a in axes if a < len(lhs))
            return reduced(join_all(ins), contracted)
        return False

    def reduction(self, line: Line, ins: list[Label]) -> Label | bool:
        match = re.search(r"applies\s+(?:[a-z_]+\.)?(\w+)", line.text)
        if match:
            kinds = {match.group(1)}
        else:
            kinds = {op.name for region in line.regions for op in region} - {"return"}
        dims = re.search(r"dimensions\s*=\s*\[([\d,\s]*)\]", line.text)
        types = line.types()[0]
        if dims is None or not types:
            return False
        shape = _dims(types[0])
        count = math.prod(shape[int(a)] for a in dims.group(1).split(",") if a.strip()
                          and int(a) < len(shape))
        operand = join_all(ins)
        if kinds <= _ADDITIVE:
            return reduced(operand, count)
        if kinds <= _BOOLEAN and operand is not None and operand.form in ("compare", "count"):
            return reduced(operand, count)
        return False

    def loop(self, line: Line, env: dict[str, Label], depth: int) -> list[Label] | None:
        """``while``: iterate the body's labels to a fixpoint; the predicate's label
        joins every result (the trip count depends on it)."""
        if len(line.regions) != 2:
            return None
        pairs = _ITER.findall(line.text.partition("(")[2].partition(")")[0])
        if not pairs:
            return None
        names = [p[0] for p in pairs]
        state = [_get(env, p[1]) for p in pairs]
        cond, body = line.regions
        for _ in range(_MAX_LOOP_ROUNDS):
            scope = {**env, **dict(zip(names, state, strict=True))}
            new = self.block(body, scope, depth)
            if len(new) != len(state):
                return None
            joined = [join(a, b) for a, b in zip(state, new, strict=True)]
            if joined == state:
                break
            state = joined
        else:
            state = [raw([s]) for s in state]
        scope = {**env, **dict(zip(names, state, strict=True))}
        pred = join_all(self.block(cond, scope, depth))
        return [join(s, pred) for s in state]


def _get(env: dict[str, Label], name: str) -> Label:
    if name in env:
        return env[name]
    return env.get(name.split("#")[0])


def _count_results(line: Line) -> int:
    if not line.results:
        return 0
    match = re.match(r"^%[\w]+:(\d+)\s*=", line.text)
    return int(match.group(1)) if match else len(line.results)


def _result_names(line: Line, n: int) -> list[str]:
    if len(line.results) == 1 and n > 1:
        return [f"{line.results[0]}#{i}" for i in range(n)]
    return line.results[:n]


def _region_reads(line: Line, env: dict[str, Label]) -> list[Label]:
    return [_get(env, v) for region in line.regions for op in region
            for v in _VALUE.findall(op.text)]


_CACHE = LRUCache(256)


def transfer(text: str, inputs: Sequence[Label]) -> list[Label] | None:
    """The labels of the results of ``main`` of module ``text`` given its arguments'
    labels (None if the module has no ``main`` of that arity)."""
    key = (text, tuple(inputs))
    cached = _CACHE.lookup(key)
    if cached is not None:
        return list(cached)
    result = _Module(parse(text)).call("main", inputs)
    if result is not None:
        _CACHE.store(key, tuple(result))
    return result


_TEXTS = LRUCache(256)
"""(reader, payload bytes) -> module text (StableHLO or pphlo)."""


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


def through(read: Callable[[bytes], str], payload: Any, ins: list[Label], n: int
            ) -> list[Label]:
    """Labels through a tensor program whose text ``read`` gives; raw from every input if
    it cannot be followed."""
    if all(lab is None for lab in ins):
        return [None] * n
    text = module_text(read, bytes(payload))
    outs = transfer(text, ins) if text is not None else None
    return outs if outs is not None and len(outs) == n else [raw(ins)] * n
