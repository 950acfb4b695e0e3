"""An estimate of the protocol rounds of an ``spu.run``, read from the StableHLO its
executable was compiled from (its ``stablehlo`` attribute).

libspu runs the ops one after another, so the rounds of the ops add up. Each op
costs the rounds of `ROUNDS` (a ``(fixed, per_log)`` pair: ``fixed + per_log *
log2(field bits)``), and only if one of its operands is secret: public ops run
locally. Visibility follows libspu's: the function's inputs are secret,
constants public, and an op's results are secret when one of its operands is
(a loop's carried values when their initial or updated values are, a call's
results as its callee computes them). Comparisons are named by their direction
(``less``, ``greater_equal``, ...). Two rewrites of libspu's compiler that change
the rounds are modelled: dividing the constant one is a reciprocal, dividing
by a public value a multiplication by its (public) inverse.

It is an estimate. The table was calibrated against libspu's link statistics
(send actions per op, libspu 0.10) for SEMI2K between 2 parties on FM64, with
FM32/FM128 checks of the field dependence; other protocols and more parties
take more rounds (ABY3 about 1.3x, SEMI2K with 3 parties about 2-4x; CHEETAH,
the 2-party default, is not calibrated: its comparisons run on oblivious
transfer and its multiplications on homomorphic encryption), and a
different libspu version or runtime config (e.g. the exp/sigmoid modes) can
change them. Unknown ops on secrets count `DEFAULT_SECRET_ROUNDS`. Ops with regions:
``while`` costs ``(cond + body) * n + cond``, where ``n`` is the trip count of
a counted loop (``jax.lax.fori_loop`` with constant bounds) and otherwise the
assumed ``loop_iterations``; ``if``/``case`` the costliest branch; ``reduce``
its reducer once per level of a tree over the reduced elements (plus one).
"""

from __future__ import annotations

import functools
import math

from mplang.flows.stablehlo import Block, Module, Op, parse

ROUNDS: dict[str, tuple[int, int]] = {
    # comparisons: a carry chain over the ring's bits
    "less": (1, 1), "less_equal": (1, 1), "greater": (1, 1), "greater_equal": (1, 1),
    "equal": (1, 1), "not_equal": (1, 1),
    "maximum": (2, 1), "minimum": (2, 1), "abs": (3, 1), "sign": (5, 2), "clamp": (4, 2),
    # boolean products
    "and": (1, 0), "or": (1, 0),
    # fixed-point functions (polynomial / Newton iterations)
    "exponential": (17, 0), "exponential_minus_one": (17, 0),
    "log": (26, 0), "log_plus_one": (26, 0),
    "reciprocal": (18, 3), "divide": (20, 3), "remainder": (65, 0),
    "logistic": (35, 3), "tanh": (36, 0), "sqrt": (35, 0), "rsqrt": (26, 0),
    "power": (76, 0), "sine": (22, 0), "cosine": (22, 0), "atan2": (56, 0),
    "erf": (60, 0),
}
"""Rounds of an op on secret operands: ``fixed + per_log * log2(field bits)``."""

DIRECTIONS = {"LT": "less", "LE": "less_equal", "GT": "greater", "GE": "greater_equal",
              "EQ": "equal", "NE": "not_equal"}
"""The `ROUNDS` name of a ``stablehlo.compare`` by its direction."""

PRODUCTS = frozenset(["multiply", "dot", "dot_general", "convolution"])
"""One round for secret x secret, plus one truncation round for fixed-point results."""

SORT_ROUNDS_PER_BIT = 7.75
"""Secret sorts (radix sort over the ring's bits): rounds per field bit (496 on FM64)."""

LOCAL = frozenset([
    "add", "subtract", "negate", "not", "xor", "constant", "iota", "convert", "bitcast_convert",
    "reshape", "broadcast", "broadcast_in_dim", "transpose", "slice", "concatenate", "pad",
    "reverse", "return", "real", "imag", "shift_left", "dynamic_slice", "dynamic_update_slice",
    "gather", "scatter", "popcnt", "optimization_barrier",
])
"""Ops that need no communication (a secret index into a dynamic slice does, but rarely)."""

DEFAULT_SECRET_ROUNDS = 1
"""Rounds of an op on secret operands that is neither in `ROUNDS` nor `LOCAL`."""

FIELD_BITS = {"FM32": 32, "FM64": 64, "FM128": 128}

_COUNTED = frozenset(["LT", "LE", "GT", "GE"])
_FLIPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE"}
_SAME_VALUE = frozenset(["broadcast_in_dim", "reshape", "convert"])
"""Ops whose result holds their operand's scalar value (when it is a splat)."""

Env = dict[int, bool]
"""Whether each value in scope is secret, by value id."""


def _definitions(blocks: list[Block], into: dict[int, Op]) -> dict[int, Op]:
    for block in blocks:
        for op in block.ops:
            into.update(dict.fromkeys(op.results, op))
            _definitions(list(op.regions), into)
    return into


class _Estimator:
    def __init__(self, module: Module, field_bits: int, loop_iterations: int):
        self.module = module
        self.log_k = max(1, round(math.log2(field_bits)))
        self.field_bits = field_bits
        self.loops = loop_iterations
        self.defs = _definitions(list(module.functions.values()), {})
        self.calls: dict[tuple[str, tuple[bool, ...]], tuple[int, list[bool]]] = {}
        self.calling: set[str] = set()

    def function(self, name: str, secret: list[bool]) -> tuple[int, list[bool]] | None:
        """Rounds of function ``name`` on arguments of that visibility, and its results'
        (None: unknown, recursive or of another arity)."""
        func = self.module.functions.get(name)
        if func is None or name in self.calling or len(func.args) != len(secret):
            return None
        key = (name, tuple(secret))
        if key not in self.calls:
            self.calling.add(name)
            try:
                self.calls[key] = self.block(func, dict(zip(func.args, secret, strict=True)))
            finally:
                self.calling.discard(name)
        return self.calls[key]

    def block(self, block: Block, env: Env) -> tuple[int, list[bool]]:
        """Rounds of the block's ops in ``env`` (extended in place), and whether the values
        it returns are secret."""
        total = 0
        for op in block.ops:
            if op.kind == "return":
                return total, [env.get(v, False) for v in op.operands]
            rounds, secret = self.op(op, env)
            env.update(zip(op.results, secret, strict=True))
            total += rounds
        return total, []

    def op(self, op: Op, env: Env) -> tuple[int, list[bool]]:
        """Rounds of ``op`` and whether each of its results is secret."""
        ins = [env.get(v, False) for v in op.operands]
        n, kind = len(op.results), op.kind
        if kind in ("constant", "iota"):
            return 0, [False] * n
        if kind == "call":
            called = self.function(str(op.attrs.get("callee")), ins)
            if called is not None and len(called[1]) == n:
                return called
            return 0, [any(ins)] * n  # unknown or recursive
        if kind == "while":
            return self.loop(op, env)
        if kind in ("if", "case"):
            branches = [self.block(r, dict(env)) for r in op.regions]
            secret = [(bool(ins) and ins[0]) or any(len(b) > i and b[i] for _, b in branches)
                      for i in range(n)]
            return max((r for r, _ in branches), default=0), secret
        if kind in ("reduce", "reduce_window"):
            return self.reduction(op, ins)
        secret = [any(ins)] * n
        if not any(ins):
            return 0, secret
        if kind == "sort":
            return round(SORT_ROUNDS_PER_BIT * self.field_bits), secret
        return self.rounds(op, ins), secret

    def rounds(self, op: Op, ins: list[bool]) -> int:
        """Rounds of a region-free op with a secret operand."""
        name = op.kind
        if name == "divide" and ins[1] and self.constant(op.operands[0]) == 1:
            name = "reciprocal"
        elif name == "divide" and not ins[1]:
            name = "multiply"  # by the public inverse
        if name in PRODUCTS:
            both = len(ins) >= 2 and ins[0] and ins[1]
            return int(both) + int(any(t is not None and t.is_float for t in op.result_types))
        if name == "select":
            return 1 if ins[0] else 0
        if name == "compare":
            name = DIRECTIONS.get(str(op.attrs.get("comparison_direction")), name)
        elif name == "custom_call":  # e.g. ``stablehlo.custom_call @mhlo.erf(...)``
            name = str(op.attrs.get("call_target_name", "")).rpartition(".")[2]
        if name in ROUNDS:
            fixed, per_log = ROUNDS[name]
            return fixed + per_log * self.log_k
        return 0 if name in LOCAL else DEFAULT_SECRET_ROUNDS

    def reduction(self, op: Op, ins: list[bool]) -> tuple[int, list[bool]]:
        """The reducer once per level of a tree over the reduced elements (plus one)."""
        k = len(op.operands) // 2
        carried = [ins[i] or ins[i + k] for i in range(k)]
        if not op.regions or not op.operand_types or not op.result_types or len(
                op.regions[0].args) != 2 * k:
            return 0, carried
        region = op.regions[0]
        step, _ = self.block(region, dict(zip(region.args, carried * 2, strict=True)))
        t_in, t_out = op.operand_types[0], op.result_types[0]
        if not step or t_in is None or t_out is None:
            return 0, carried
        reduced = max(1, t_in.size // max(1, t_out.size))
        return step * (math.ceil(math.log2(reduced)) + 1), carried

    def loop(self, op: Op, env: Env) -> tuple[int, list[bool]]:
        """``(cond + body) * trips + cond``; carried values secret to a fixpoint."""
        if len(op.regions) != 2:
            return 0, [True] * len(op.results)
        cond, body = op.regions
        state = [env.get(v, False) for v in op.operands]
        while True:
            body_rounds, new = self.block(body, {**env, **dict(zip(body.args, state,
                                                                    strict=True))})
            joined = [a or (i < len(new) and new[i]) for i, a in enumerate(state)]
            if joined == state:
                break
            state = joined
        cond_rounds, _ = self.block(cond, {**env, **dict(zip(cond.args, state, strict=True))})
        trips = self.trip_count(op)
        return (cond_rounds + body_rounds) * (self.loops if trips is None else trips) \
            + cond_rounds, state

    def constant(self, value: int) -> int | float | None:
        """The scalar a value holds if it is a splat constant (possibly broadcast,
        reshaped or converted), else None."""
        op = self.defs.get(value)
        while op is not None and op.kind in _SAME_VALUE and op.operands:
            op = self.defs.get(op.operands[0])
        if op is None or op.kind != "constant":
            return None
        found = op.attrs.get("value")
        return found if isinstance(found, int | float) and not isinstance(found, bool) \
            else None

    def trip_count(self, op: Op) -> int | None:
        """The iterations of a counted ``while`` (``for i = a; i < b; i += k`` with constant
        ``a``, ``b``, ``k``, as ``jax.lax.fori_loop`` compiles), else None."""
        cond, body = op.regions
        returned = cond.returned()
        test = self.defs.get(returned[0]) if returned else None
        if test is None or test.kind != "compare" or len(test.operands) != 2:
            return None
        relation = str(test.attrs.get("comparison_direction"))
        lhs, rhs = test.operands
        if rhs in cond.args and lhs not in cond.args:
            lhs, rhs, relation = rhs, lhs, _FLIPPED.get(relation, relation)
        if relation not in _COUNTED or lhs not in cond.args:
            return None
        index = cond.args.index(lhs)
        updates = body.returned()
        update = self.defs.get(updates[index]) if index < len(updates) else None
        start, bound = self.constant(op.operands[index]), self.constant(rhs)
        if update is None or update.kind != "add" or body.args[index] not in update.operands:
            return None
        a, b = update.operands
        step = self.constant(b if a == body.args[index] else a)
        if not isinstance(start, int) or not isinstance(bound, int) \
                or not isinstance(step, int) or not step:
            return None
        if relation in ("GT", "GE"):
            start, bound, step = -start, -bound, -step
            relation = "LT" if relation == "GT" else "LE"
        if step < 0:
            return None
        span = bound - start + (1 if relation == "LE" else 0)
        return max(0, -(-span // step))


@functools.lru_cache(maxsize=256)
def estimate_spu_rounds(stablehlo: str, field: str = "FM64", loop_iterations: int = 1) -> int:
    """Estimated protocol rounds of the ``main`` function of StableHLO module ``stablehlo``
    on secret inputs (see the module docstring; ValueError if it cannot be parsed)."""
    module = parse(stablehlo)
    main = module.functions.get("main")
    if main is None:
        return 0
    estimator = _Estimator(module, FIELD_BITS.get(field.upper(), 64), max(0, loop_iterations))
    found = estimator.function("main", [True] * len(main.args))
    return 0 if found is None else found[0]
