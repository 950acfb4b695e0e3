"""An estimate of the protocol rounds of an ``spu.run``, read from its executable.

The executable's ``code`` is the text of a pphlo MLIR module. libspu runs its
ops one after another, so the rounds of the ops add up. Each op costs the
rounds of `ROUNDS` (a ``(fixed, per_log)`` pair: ``fixed + per_log * log2(field
bits)``), and only if one of its operands is secret: public ops run locally.

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
import re

from mplang.analysis.pphlo import (
    PphloOp,
    callee,
    collect_functions,
    elements,
    int_constants,
    is_fixed_point,
    is_secret,
    operand_names,
    parse_module,
    returned_def,
    signature,
)

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
    "erf": (60, 0),  # a custom_call @mhlo.erf
}
"""Rounds of an op on secret operands: ``fixed + per_log * log2(field bits)``."""

PRODUCTS = frozenset(["multiply", "dot", "dot_general", "convolution"])
"""One round for secret x secret, plus one truncation round for fixed-point results."""

SORT_ROUNDS_PER_BIT = 7.75
"""Secret sorts (radix sort over the ring's bits): rounds per field bit (495 on FM64)."""

LOCAL = frozenset([
    "add", "subtract", "negate", "not", "xor", "constant", "iota", "convert", "bitcast_convert",
    "reshape", "broadcast", "broadcast_as", "transpose", "slice", "concatenate", "pad",
    "reverse", "free", "return", "real", "imag", "shift_left", "dynamic_slice",
    "dynamic_update_slice", "gather", "scatter", "popcnt", "prefer_a", "epsilon",
])
"""Ops that need no communication (a secret index into a dynamic slice does, but rarely)."""

DEFAULT_SECRET_ROUNDS = 1
"""Rounds of an op on secret operands that is neither in `ROUNDS` nor `LOCAL`."""

FIELD_BITS = {"FM32": 32, "FM64": 64, "FM128": 128}

class _Estimator:
    def __init__(self, field_bits: int, loop_iterations: int, functions: dict[str, PphloOp]):
        self.log_k = max(1, round(math.log2(field_bits)))
        self.field_bits = field_bits
        self.loops = loop_iterations
        self.functions = functions
        self.calling: set[str] = set()
        self.scopes: list[dict[str, int | str]] = []
        """Integer constants (or aliases of them) of the blocks being estimated, outermost first."""

    def block(self, ops: list[PphloOp]) -> int:
        self.scopes.append(int_constants(ops))
        try:
            return sum(self.op(op) for op in ops)
        finally:
            self.scopes.pop()

    def resolve(self, name: str, *extra: dict[str, int | str]) -> int | None:
        """The integer constant ``name`` stands for, looked up innermost scope first."""
        scopes = [*self.scopes, *extra]
        for _ in range(8):  # follow a few aliases (broadcast_as of a constant)
            found = next((s[name] for s in reversed(scopes) if name in s), None)
            if found is None or isinstance(found, int):
                return found
            name = found
        return None

    def op(self, op: PphloOp) -> int:
        name = op.name
        if name in ("module", "block", "func"):
            return self.block([o for r in op.regions for o in r])
        if name == "call":
            target = self.functions.get(callee(op.text) or "")
            if target is None or target.text in self.calling:
                return 0  # unknown or recursive
            self.calling.add(target.text)
            try:
                return self.op(target)
            finally:
                self.calling.discard(target.text)
        region_rounds = [self.block(r) for r in op.regions]
        if name == "while":
            cond, body = [*region_rounds, 0, 0][:2]
            trips = self.trip_count(op)
            return (cond + body) * (self.loops if trips is None else trips) + cond
        if name in ("if", "case"):
            return max(region_rounds, default=0)
        ins, outs = signature(op.text)
        secret = [is_secret(t) for t in ins]
        if name == "reduce" or name == "reduce_window":
            per_step = region_rounds[0] if region_rounds else self._applied(op.text, ins)
            if not per_step or not ins or not outs:
                return 0
            reduced = max(1, elements(ins[0]) // max(1, elements(outs[0])))
            return per_step * (math.ceil(math.log2(reduced)) + 1)
        if not any(secret):
            return 0
        if name in PRODUCTS:
            both = len(secret) >= 2 and secret[0] and secret[1]
            fixed_point = any(is_fixed_point(t) for t in outs)
            return int(both) + int(fixed_point)
        if name == "select":
            return 1 if secret[0] else 0
        if name == "custom_call":  # e.g. ``pphlo.custom_call @mhlo.erf(...)``
            name = (callee(op.text) or "").rpartition(".")[2]
        if name in ("sort", "simple_sort"):
            return round(SORT_ROUNDS_PER_BIT * self.field_bits)
        if name in ROUNDS:
            fixed, per_log = ROUNDS[name]
            return fixed + per_log * self.log_k
        return 0 if name in LOCAL else DEFAULT_SECRET_ROUNDS

    def trip_count(self, op: PphloOp) -> int | None:
        """The iterations of a counted ``while`` (``for i = a; i < b; i += k`` with constant
        ``a``, ``b``, ``k``, as ``jax.lax.fori_loop`` compiles), else None."""
        header = re.search(r"pphlo\.while\((.*?)\)\s*:", op.text)
        if header is None or len(op.regions) < 2:
            return None
        pairs = re.findall(r"(%[\w#]+)\s*=\s*(%[\w#]+)", header.group(1))
        loop_vars = [var for var, _ in pairs]
        cond, body = op.regions[:2]
        cond_scope, body_scope = int_constants(cond), int_constants(body)
        test = returned_def(cond, 0)
        if test is None or test.name not in _COUNTED:
            return None
        lhs, rhs = [*operand_names(test.text), "", ""][:2]
        relation = test.name
        if rhs in loop_vars and lhs not in loop_vars:
            lhs, rhs, relation = rhs, lhs, _FLIPPED[relation]
        if lhs not in loop_vars:
            return None
        index = loop_vars.index(lhs)
        start, bound = self.resolve(pairs[index][1]), self.resolve(rhs, cond_scope)
        update = returned_def(body, index)
        if start is None or bound is None or update is None or update.name != "add":
            return None
        operands = operand_names(update.text)[:2]
        if lhs not in operands:
            return None
        step = self.resolve(operands[1] if operands[0] == lhs else operands[0], body_scope)
        if not step:
            return None
        if relation in ("greater", "greater_equal"):
            start, bound, step = -start, -bound, -step
            relation = "less" if relation == "greater" else "less_equal"
        if step < 0:
            return None
        span = bound - start + (1 if relation == "less_equal" else 0)
        return max(0, -(-span // step))

    def _applied(self, text: str, ins: list[str]) -> int:
        """Rounds of the combiner of a ``reduce ... applies pphlo.X`` line."""
        match = re.search(r"applies\s+pphlo\.(\w+)", text)
        if not match:
            return 0
        return self.op(PphloOp(match.group(1), f"x : {ins[0]}" if ins else "x"))


_COUNTED = frozenset(["less", "less_equal", "greater", "greater_equal"])
_FLIPPED = {"less": "greater", "less_equal": "greater_equal",
            "greater": "less", "greater_equal": "less_equal"}
def estimate_rounds_from_code(code: str, field: str = "FM64", loop_iterations: int = 1) -> int:
    """Estimated protocol rounds of the pphlo module ``code`` (see the module docstring)."""
    field_bits = FIELD_BITS.get(field.upper(), 64)
    tree = parse_module(code)
    functions: dict[str, PphloOp] = {}
    collect_functions(tree, functions)
    estimator = _Estimator(field_bits, max(0, loop_iterations), functions)
    main = functions.get("main")
    if main is not None:
        estimator.calling.add(main.text)
        return estimator.op(main)
    return estimator.block(tree)


def executable_code(executable: bytes) -> str:
    """The pphlo text of a serialized libspu ``Executable``."""
    import spu.libspu as libspu

    exe = libspu.Executable()
    try:
        parsed = exe.ParseFromString(executable)
    except Exception as e:
        raise ValueError(f"malformed SPU executable: {e}") from None
    if not parsed:
        raise ValueError("malformed SPU executable")
    code = exe.code
    return code.decode("utf-8") if isinstance(code, bytes) else str(code)


@functools.lru_cache(maxsize=256)
def estimate_spu_rounds(executable: bytes, field: str = "FM64", loop_iterations: int = 1) -> int:
    """Estimated protocol rounds of a serialized libspu executable (cached per bytes)."""
    return estimate_rounds_from_code(executable_code(executable), field, loop_iterations)
