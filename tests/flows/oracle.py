"""A differential oracle for `mplang.flows.tensor_flows`: random device programs over a
grammar of JAX ops, the label the analysis gives each, and numeric checks that a program
labelled ``aggregate`` or ``compare`` meets the definition of that form.

A program is its source text, one expression over ``x`` (party p's data, 20 rows, of
shape (20,) or (20, 3)), ``y`` (another owner's row-aligned column, label `FOREIGN`) and
``z`` (another owner's aggregate, a scalar). The callable is ``eval`` of that text, so a
violation prints exactly the program that was run.

The checks run the program in float64 (``jax.enable_x64``) on integer-valued data, so
sums are exact up to float64 rounding. They report only what a counterexample shows:

- aggregate (claimed r rows, `claimed_rows`): for each output element, the rows of x it
  depends on (perturbing the row changes it); for each such row i, the rows k that may be
  exchanged with i leaving the element unchanged on every data draw. If the element is a
  function of sums over a set R of at least r rows, every row of R can be exchanged with
  i, so fewer than r such rows is a violation (``few rows``). Random permutations among
  those rows must leave the element unchanged (``not symmetric``).
- compare: every element that depends on x must depend on y or z (``constant side``); p's
  side must be one value or aggregates: at most one row of x, over all elements, can be
  exchanged with no other row leaving the element unchanged, and permuting x among rows
  that can be exchanged pairwise leaves it unchanged (``row-wise side``); a comparison is
  piecewise constant, so an element that changes under a perturbation of 0.01 of a row on
  every draw reveals a value (``not a comparison``).
- free (the label is None or ``foreign``): no element depends on x (``unlabelled``).
- `selected` (a heuristic, not part of the definition's letter): an aggregate of which
  only some of the rows it combines move it locally (x_i +- 0.01), on every draw, is a
  selection of rows by their own values, e.g. ``jnp.where(x >= t, x, x * 0)``; it also
  fires on ``jnp.maximum(x, 0.)``, which computes the same function.
"""

from __future__ import annotations

import functools
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mplang.flows.labels import FOREIGN, Flow, Label, smallest_part, source
from mplang.flows.tensor_flows import transfer

T = TypeVar("T")
N = 20
"""Rows of p's data."""
SHAPES = {20: [(20,), (2, 10), (4, 5), (10, 2), (5, 4)], 60: [(20, 3), (60,), (3, 20)],
          10: [(10,), (2, 5), (5, 2)], 6: [(6,), (2, 3), (3, 2)]}
"""Shapes of equal size a reshape moves between."""
LABELS: list[Label] = [source("x", N), FOREIGN, Flow("foreign")]
NAMESPACE = {"jnp": jnp, "lax": lax, "np": np}
BODIES = ["lambda a, b: a + b", "lambda a, b: b", "lambda a, b: b + b", "lax.max",
          "lambda a, b: a * b"]


class Chooser(Protocol):
    """Where the generator's choices come from (hypothesis draws or a seeded RNG); the
    first option is the simplest, so shrinking goes there."""

    def choice(self, options: Sequence[T]) -> T: ...

    def integer(self, lo: int, hi: int) -> int: ...


class RandomChooser:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)


# ---------------------------------------------------------------- the grammar

@dataclass(frozen=True)
class Program:
    src: str
    xshape: tuple[int, ...]

    def __str__(self) -> str:
        return f"lambda x, y, z: {self.src}    # x: {self.xshape}, y: ({N},), z: ()"

    def fn(self) -> Callable[..., Any]:
        return _compiled(self.src)


@functools.lru_cache(maxsize=4096)
def _compiled(src: str) -> Callable[..., Any]:
    return eval(f"lambda x, y, z: {src}", dict(NAMESPACE))


def _size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=int))


class Grammar:
    """Expressions of a given shape, float of x's dtype (conditions: bool)."""

    def __init__(self, c: Chooser, xshape: tuple[int, ...]):
        self.c, self.xshape = c, xshape
        self.need_x = True
        """No leaf has been x yet."""
        self.force_x = False
        """The next leaf derives from x if none has yet."""

    def xleaf(self, s: tuple[int, ...]) -> str:
        """An expression of x of shape ``s``."""
        self.need_x = False
        two = len(self.xshape) == 2
        col = f", {self.c.integer(0, 2)}" if two else ""
        if s == self.xshape:
            return "x"
        if _size(s) == _size(self.xshape):
            return f"x.reshape({s})"
        if s == ():
            row = self.c.integer(0, N - 1)
            return self.c.choice(["jnp.sum(x)", "jnp.mean(x)", f"x[{row}{col}]"])
        if len(s) == 1 and s[0] <= N:
            lo = self.c.integer(0, N - s[0])
            return f"x[{lo}:{lo + s[0]}{col}]"
        if _size(s) <= N and not two:
            return f"x[:{_size(s)}].reshape({s})"
        return f"jnp.broadcast_to(jnp.sum(x), {s})"

    def const(self) -> str:
        return self.c.choice(["2.", "0.", "1.", "-1.", "0.5", "5.", "3."])

    def leaf(self, s: tuple[int, ...]) -> str:
        if self.need_x and (self.force_x or self.c.choice([False, False, True])):
            return self.xleaf(s)
        options: list[str] = []
        if s == self.xshape:
            options += ["x"] * 8
        elif _size(s) == _size(self.xshape):
            options += [f"x.reshape({s})"] * 4
        if s == (N,) and self.xshape != (N,):
            options += ["x[:, 1]", "x[:, 0]"] * 2
        if s == (N,):
            options += ["y", "(y * 0 + 1)", "jnp.eye(20)[3]", "jnp.arange(20.)",
                        "(jnp.eye(20)[3] * (jnp.sum(y) * 0 + 1))", "jnp.ones(20)"]
        if s == ():
            options += ["z", "jnp.sum(y)", "(jnp.sum(y) * 0 + 1)", self.const()]
        if s == (N, N):
            options.append("jnp.eye(20)")
        if s == (N, 3) and self.xshape != s:
            options.append("jnp.stack([x, y, y * 0 + 1], axis=1)")
        options += [f"jnp.full({s}, {self.const()})",
                    f"jnp.arange({_size(s)}.).reshape({s})"]
        got = self.c.choice(options)
        if "x" in got.replace("x.dtype", ""):
            self.need_x = False
        return got

    def cond(self, s: tuple[int, ...], d: int) -> str:
        op = self.c.choice(["<", ">=", ">", "<=", "=="])
        rhs = self.expr(self.c.choice([(), s]), d - 1)
        lhs = self.expr(s, d - 1)
        if not any(name in lhs for name in ("jnp", "lax", "x", "y", "z")):  # a Python number
            lhs = f"jnp.asarray({lhs})"
        return f"({lhs} {op} {rhs})"

    def expr(self, s: tuple[int, ...], d: int, root: bool = False) -> str:
        if d <= 0:
            return self.leaf(s)
        kind = self.c.choice(["reduce", "dot", "reduce", "any"]) if root else "any"
        if kind == "any":
            kind = self.c.choice(["leaf", "unary", "binary", "reduce", "where", "mask",
                                  "cmp", "dot", "reshape", "slice", "binary", "reduce", "gather",
                                  "scatter", "sort", "broadcast", "transpose", "concat"])
        got = getattr(self, "_" + kind)(s, d)
        return got if got is not None else self.leaf(s)

    def _leaf(self, s: tuple[int, ...], d: int) -> str:
        return self.leaf(s)

    def _unary(self, s: tuple[int, ...], d: int) -> str:
        a, k = self.expr(s, d - 1), self.const()
        return self.c.choice([f"(-{a})", f"jnp.abs({a})", f"({a} * {a})", f"({a} * {k})",
                              f"({a} + {k})", f"jnp.maximum({a}, {k})", f"jnp.floor({a} / 4.)",
                              f"{a}.astype(jnp.int32).astype(x.dtype)"])

    def _binary(self, s: tuple[int, ...], d: int) -> str:
        a = self.expr(s, d - 1)
        shapes = [s, ()] + ([s[1:]] if len(s) == 2 else [])
        b = self.expr(self.c.choice(shapes), d - 1)
        op = self.c.choice(["*", "+", "-"])
        return self.c.choice([f"({a} {op} {b})", f"jnp.maximum({a}, {b})"])

    def _where(self, s: tuple[int, ...], d: int) -> str:
        if self.c.choice([True, False]):
            return f"jnp.where({self.cond(s, d)}, {self.expr(s, d - 1)}, " \
                   f"{self.expr(self.c.choice([s, ()]), d - 1)})"
        return f"lax.select({self.cond(s, d)}, {self.expr(s, d - 1)}, {self.expr(s, d - 1)})"

    def _mask(self, s: tuple[int, ...], d: int) -> str:
        return f"({self.expr(s, d - 1)} * {self.cond(s, d)})"

    def _cmp(self, s: tuple[int, ...], d: int) -> str:
        return f"{self.cond(s, d)}.astype(x.dtype)"

    def _reduce(self, s: tuple[int, ...], d: int) -> str | None:
        if len(s) >= 2:
            return None
        n = self.c.choice([N, N, N, 3, 2, 5, 10])
        k = self.c.integer(0, len(s))
        child = (*s[:k], n, *s[k:])
        if not s and self.c.choice([False, True]):
            child = self.c.choice([(N,), self.xshape, (2, 10), (4, 5)])
        a = self.expr(child, d - 1)
        axis = "" if len(child) == 1 or not s else f", axis={k}"
        which = self.c.choice(["jnp.sum", "jnp.mean", "jnp.max", "jnp.min", "lax.reduce"])
        if which == "lax.reduce":
            dims = tuple(range(len(child))) if not s else (k,)
            return f"lax.reduce({a}, 0., {self.c.choice(BODIES)}, {dims})"
        return f"{which}({a}{axis})"

    def _dot(self, s: tuple[int, ...], d: int) -> str | None:
        n = self.c.choice([N, N, 3])
        if s == ():
            a, b = self.expr((n,), d - 1), self.expr((n,), d - 1)
            return self.c.choice([f"jnp.dot({a}, {b})", f"jnp.einsum('i,i->', {a}, {b})"])
        if len(s) == 1:
            if self.c.choice([True, False]):
                return f"({self.expr((n,), d - 1)} @ {self.expr((n, s[0]), d - 1)})"
            return f"({self.expr((s[0], n), d - 1)} @ {self.expr((n,), d - 1)})"
        if len(s) == 2:
            return f"({self.expr((n, s[0]), d - 1)}.T @ {self.expr((n, s[1]), d - 1)})"
        return None

    def _reshape(self, s: tuple[int, ...], d: int) -> str | None:
        options = [t for t in SHAPES.get(_size(s), []) if t != s]
        if not options:
            return None
        return f"{self.expr(self.c.choice(options), d - 1)}.reshape({s})"

    def _transpose(self, s: tuple[int, ...], d: int) -> str | None:
        return f"{self.expr(s[::-1], d - 1)}.T" if len(s) == 2 else None

    def _slice(self, s: tuple[int, ...], d: int) -> str | None:
        if not s:
            return f"{self.expr((N,), d - 1)}[{self.c.integer(0, N - 1)}]"
        m = s[0]
        if m > N:
            return None
        if m * 2 == N and self.c.choice([False, True]):
            return f"{self.expr((N, *s[1:]), d - 1)}[::2]"
        lo = self.c.integer(0, N - m)
        return f"{self.expr((N, *s[1:]), d - 1)}[{lo}:{lo + m}]"

    def _gather(self, s: tuple[int, ...], d: int) -> str | None:
        if not s:
            return None
        idx = [self.c.integer(0, N - 1) for _ in range(s[0])]
        return f"{self.expr((N, *s[1:]), d - 1)}[jnp.array({idx})]"

    def _scatter(self, s: tuple[int, ...], d: int) -> str | None:
        if not s:
            return None
        a = self.expr(s, d - 1)
        i = self.c.integer(0, s[0] - 1)
        how = self.c.choice(["set", "clear", "add"])
        if how == "clear":
            return f"{a}.at[{i}:].set(0.)"
        return f"{a}.at[{i}].{how}({self.expr(s[1:], d - 1)})"

    def _sort(self, s: tuple[int, ...], d: int) -> str | None:
        if not s:
            return None
        a = self.expr(s, d - 1)
        return self.c.choice([f"jnp.sort({a}, axis=0)", f"jnp.cumsum({a}, axis=0)",
                              f"jnp.roll({a}, 1, axis=0)"])

    def _broadcast(self, s: tuple[int, ...], d: int) -> str | None:
        if not s:
            return None
        how = self.c.choice(["scalar", "column", "row"] if len(s) == 2 else ["scalar"])
        if how == "column":
            return f"jnp.broadcast_to({self.expr(s[:1], d - 1)}[:, None], {s})"
        return f"jnp.broadcast_to({self.expr(() if how == 'scalar' else s[1:], d - 1)}, {s})"

    def _concat(self, s: tuple[int, ...], d: int) -> str | None:
        if not s or s[0] < 2:
            return None
        m = self.c.integer(1, s[0] - 1)
        a, b = self.expr((m, *s[1:]), d - 1), self.expr((s[0] - m, *s[1:]), d - 1)
        return f"jnp.concatenate([{a}, {b}])"


ROOTS: list[tuple[int, ...]] = [(), (), (), (2,), (3,), (4,), (5,), (20,), (2, 10)]


def program(c: Chooser, max_depth: int = 4) -> Program:
    """A random program that reads x (the last of a few tries forces the first leaf)."""
    xshape = c.choice([(N,), (N, 3)])
    shape = c.choice(ROOTS)
    depth = c.integer(1, max_depth)
    for attempt in range(3):
        grammar = Grammar(c, xshape)
        grammar.force_x = attempt == 2
        src = grammar.expr(shape, depth, root=True)
        if not grammar.need_x:
            break
    return Program(src, xshape)


# ---------------------------------------------------------------- the analysis

@functools.lru_cache(maxsize=8192)
def analyse(p: Program) -> Label | str:
    """The label the analysis gives ``p``'s result, or why ``p`` is not valid JAX."""
    args = (np.zeros(p.xshape, np.float32), np.zeros(N, np.float32), np.float32(0))
    try:
        text = jax.jit(p.fn(), keep_unused=True).lower(*args).as_text()
    except Exception as e:  # an ill-typed program is discarded
        return f"invalid: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    got = transfer(text, LABELS)
    return None if got is None or len(got.outputs) != 1 else got.outputs[0]


def claimed_rows(label: Flow) -> int | None:
    """The fewest rows an aggregate rule sees in ``label`` released alone: its ``rows``,
    or the smallest piece its own row sets isolate (what `check` refuses on overlap);
    None if no rule accepts it (gated, or not known)."""
    if label.form != "aggregate" or label.gated or label.rows is None:
        return None
    part = smallest_part(label.rowsets, label.rowsets)
    return label.rows if part is None else min(label.rows, part[1])


def accepted(label: Label | str) -> str | None:
    """The rule that releases ``label`` (``aggregate``, ``compare``; ``free``: the label
    says the value derives from no data of p's), or None."""
    if isinstance(label, str):
        return None
    if label is None or not label.mine:
        return "free"
    if label.form == "compare":
        return "compare"
    rows = claimed_rows(label)
    return "aggregate" if rows is not None and rows >= 1 else None


# ---------------------------------------------------------------- the numeric checks

@dataclass(frozen=True)
class Violation:
    program: Program
    label: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.program}\n    labelled: {self.label}\n    {self.kind}: {self.detail}"


DRAWS = 3
SWAP_DRAWS = 9
"""More draws on which only exchanges of two rows are tried: an exchange that leaves
an element unchanged on every draw is then seldom so by chance (a comparison that no
exchange crosses)."""
OFFSET = 0.37
"""Draws 1.. are integers plus this: no sum of them is an integer, few thresholds sit
within 0.01 of a value."""
LOCAL = 0.01
EXTREMES = (0.0, 1000.0, -1000.0)
FOREIGN_TARGETS = (0.0, 1000.0, -1000.0, 1e5, -1e5)


class _Batch:
    """Inputs to evaluate in one vmapped call, each with a key to find its output."""

    def __init__(self) -> None:
        self.xs: list[np.ndarray] = []
        self.ys: list[np.ndarray] = []
        self.zs: list[float] = []
        self.keys: dict[Any, list[int]] = {}

    def add(self, key: Any, x: np.ndarray, y: np.ndarray, z: float) -> None:
        self.keys.setdefault(key, []).append(len(self.xs))
        self.xs.append(x)
        self.ys.append(y)
        self.zs.append(z)

    def run(self, p: Program) -> np.ndarray:
        return _evaluate(p, np.stack(self.xs), np.stack(self.ys), np.array(self.zs))


_CHUNK = 1024


def _evaluate(p: Program, xs: np.ndarray, ys: np.ndarray, zs: np.ndarray) -> np.ndarray:
    """``p`` on each input in float64: one row of elements per input."""
    with jax.enable_x64(True):
        fn = _vmapped(p.src)
        outs = []
        for lo in range(0, len(xs), _CHUNK):
            n = min(_CHUNK, len(xs) - lo)
            pad = [(0, _CHUNK - n)] + [(0, 0)] * (xs.ndim - 1)
            args = (np.pad(xs[lo:lo + n], pad, mode="edge"),
                    np.pad(ys[lo:lo + n], [(0, _CHUNK - n), (0, 0)], mode="edge"),
                    np.pad(zs[lo:lo + n], (0, _CHUNK - n), mode="edge"))
            outs.append(np.asarray(fn(*args), np.float64).reshape(_CHUNK, -1)[:n])
    return np.concatenate(outs)


@functools.lru_cache(maxsize=64)
def _vmapped(src: str) -> Callable[..., Any]:
    return jax.jit(jax.vmap(_compiled(src)))


def _data(xshape: tuple[int, ...], seed: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """Draws of (x, y, z): distinct integers in [-50, 50] (2-D: distinct rows), draws
    1..DRAWS-1 shifted by `OFFSET` (the others integers, so that sums in any order are
    exact: exchanges then change nothing by rounding)."""
    rng = np.random.default_rng(seed)
    out = []
    for d in range(DRAWS + SWAP_DRAWS):
        x = rng.choice(np.arange(-50, 51), size=_size(xshape), replace=False)
        x = x.reshape(xshape).astype(np.float64) + (OFFSET if 0 < d < DRAWS else 0.0)
        y = rng.choice(np.arange(-50, 51), size=N, replace=False).astype(np.float64)
        out.append((x, y, float(rng.integers(-50, 51))))
    return out


def _close(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise equality up to float64 rounding of sums of large terms."""
    scale = np.maximum(np.maximum(np.abs(a), np.abs(b)), 1.0)
    same = np.abs(a - b) <= 1e-7 * scale
    return same | (a == b) | (np.isnan(a) & np.isnan(b))


def _x_targets(x: np.ndarray, i: int) -> list[np.ndarray]:
    others = [x[j] for j in range(N) if j != i]
    return others + [np.full_like(x[i], v) for v in EXTREMES] + [x[i] + 1]


class _Probe:
    """Every evaluation the checks need of one program, and the facts they read off."""

    def __init__(self, p: Program, seed: int):
        self.p = p
        self.data = _data(p.xshape, seed)
        batch = _Batch()
        for d, (x, y, z) in enumerate(self.data):
            batch.add(("base", d), x, y, z)
            for i, k in itertools.combinations(range(N), 2):
                batch.add(("swap", d, i, k), _swapped(x, i, k), y, z)
            if d >= DRAWS:
                continue
            for i in range(N):
                for t in _x_targets(x, i):
                    batch.add(("x", d, i), _set(x, i, t), y, z)
                for sign in (1, -1):
                    batch.add(("local", d, i), _set(x, i, x[i] + sign * LOCAL), y, z)
            for j in range(N):  # x's values too: an equality must be able to hold
                for v in (*FOREIGN_TARGETS, y[j] + 1, *np.ravel(x[j])):
                    batch.add(("foreign", d), x, _set(y, j, v), z)
            for v in (*FOREIGN_TARGETS, z + 1, z + 0.5, *np.ravel(x)[:4]):
                batch.add(("foreign", d), x, y, v)
        self.out = batch.run(p)
        self.keys = batch.keys
        self.elements = self.out.shape[1]

    def changed(self, key: Any, d: int) -> np.ndarray:
        """Per element: whether any input under ``key`` changes it from draw ``d``'s."""
        base = self.out[self.keys[("base", d)][0]]
        rows = self.out[self.keys[key]]
        return ~np.all(_close(rows, base[None, :]), axis=0)

    def influence(self) -> np.ndarray:
        """[row, element]: perturbing the row changes the element (on some draw)."""
        return np.array([np.any([self.changed(("x", d, i), d) for d in range(DRAWS)], axis=0)
                         for i in range(N)])

    def local(self, d: int) -> np.ndarray:
        """[row, element]: a perturbation of 0.01 of the row changes the element."""
        return np.array([self.changed(("local", d, i), d) for i in range(N)])

    def exchangeable(self) -> np.ndarray:
        """[i, k, element]: swapping rows i and k leaves the element unchanged on every
        integer draw (True on the diagonal)."""
        out = np.ones((N, N, self.elements), bool)
        for i, k in itertools.combinations(range(N), 2):
            same = ~np.any([self.changed(("swap", d, i, k), d)
                            for d in range(len(self.data)) if not 0 < d < DRAWS], axis=0)
            out[i, k] = out[k, i] = same
        return out

    def foreign(self) -> np.ndarray:
        """Per element: perturbing y or z changes it (on some draw)."""
        return np.any([self.changed(("foreign", d), d) for d in range(DRAWS)], axis=0)

    def permuted(self, groups: list[tuple[int, list[int]]], seed: int) -> np.ndarray:
        """Per group (element, rows): whether a random permutation of x among the rows
        changes the element on some draw."""
        rng = np.random.default_rng(seed)
        batch = _Batch()
        for g, (_, rows) in enumerate(groups):
            for x, y, z in self.data[:1] + self.data[DRAWS:]:  # integers: exact sums
                for _ in range(3):
                    perm = np.array(rows)[rng.permutation(len(rows))]
                    x2 = x.copy()
                    x2[rows] = x[perm]
                    batch.add(g, x2, y, z)
                    batch.add(("base", g), x, y, z)
        if not groups:
            return np.zeros(0, bool)
        out = batch.run(self.p)
        return np.array([not np.all(_close(out[batch.keys[g]][:, e],
                                           out[batch.keys[("base", g)]][:, e]))
                         for g, (e, _) in enumerate(groups)])


def _clique(rows: Sequence[int], swap: np.ndarray) -> list[int]:
    """The first of ``rows`` and those of the others that can be exchanged with each
    other one pair at a time (``swap[i, k]``), greedily."""
    out: list[int] = []
    for k in map(int, rows):
        if k not in out and all(swap[k, m] for m in out):
            out.append(k)
    return out


def _set(a: np.ndarray, i: int, v: Any) -> np.ndarray:
    out = a.copy()
    out[i] = v
    return out


def _swapped(x: np.ndarray, i: int, k: int) -> np.ndarray:
    out = x.copy()
    out[[i, k]] = x[[k, i]]
    return out


def check_aggregate(p: Program, rows: int, label: str = "", seed: int = 0,
                    selection: bool = False) -> list[Violation]:
    """Violations of the aggregate definition by ``p`` claimed over ``rows`` rows
    (``selection``: also the `selected` heuristic)."""
    probe = _Probe(p, seed)
    found: list[Violation] = []
    influence, swap = probe.influence(), probe.exchangeable()
    local = [probe.local(d) for d in range(1, DRAWS)] if selection else []
    groups: list[tuple[int, list[int]]] = []
    for e in range(probe.elements):
        deps = np.flatnonzero(influence[:, e])
        if not len(deps):
            continue
        sizes = {int(i): int(swap[i, :, e].sum()) for i in deps}
        i = min(sizes, key=lambda r: sizes[r])
        if sizes[i] < rows:
            with_i = [int(k) for k in np.flatnonzero(swap[i, :, e]) if k != i]
            found.append(Violation(p, label, "few rows", (
                f"element {e} depends on {len(deps)} rows of x ({_rows(deps)}); row {i} "
                f"can be exchanged with only {len(with_i)} of them ({_rows(with_i)}) "
                f"leaving it unchanged; claimed {rows}")))
            continue
        clique = _clique([i, *deps], swap[:, :, e])
        if len(clique) > 2:
            groups.append((e, clique))
        if selection:
            moved = [np.flatnonzero(loc[:, e]) for loc in local]
            if all(1 <= len(m) < rows for m in moved):
                found.append(Violation(p, label, "selected", (
                    f"element {e} combines {len(deps)} rows, but on each draw only "
                    f"{[len(m) for m in moved]} of them move it under +-{LOCAL}: rows chosen "
                    f"by their own values; claimed {rows}")))
    for (e, members), bad in zip(groups, probe.permuted(groups, seed + 1), strict=True):
        if bad:
            found.append(Violation(p, label, "not symmetric", (
                f"element {e}: permuting x among rows {_rows(members)} it depends on, each "
                "pair of which can be exchanged leaving it unchanged, changes it")))
    return found


def check_compare(p: Program, label: str = "", seed: int = 0) -> list[Violation]:
    """Violations of the compare definition by ``p``."""
    probe = _Probe(p, seed)
    found: list[Violation] = []
    influence, foreign, swap = probe.influence(), probe.foreign(), probe.exchangeable()
    local = [probe.local(d) for d in range(1, DRAWS)]
    singled: dict[int, int] = {}
    groups: list[tuple[int, list[int]]] = []
    for e in range(probe.elements):
        deps = [int(i) for i in np.flatnonzero(influence[:, e])]
        if not deps:
            continue
        if not foreign[e]:
            found.append(Violation(p, label, "constant side", (
                f"element {e} depends on rows {_rows(deps)} of x but on no change of y or "
                "z: p's data compared with a constant")))
        if all(loc[:, e].any() for loc in local):
            found.append(Violation(p, label, "not a comparison", (
                f"element {e} changes when a row of x moves by {LOCAL} on every draw: it "
                "reveals a value, not the outcome of a comparison")))
        for i in deps:  # rows no other can stand in for
            if swap[i, :, e].sum() == 1:
                singled.setdefault(i, e)
        clique = _clique(deps, swap[:, :, e])
        if len(clique) > 2:
            groups.append((e, clique))
    if len(singled) >= 2:
        found.append(Violation(p, label, "row-wise side", (
            f"elements {sorted(set(singled.values()))[:4]} depend on rows of x that no other "
            f"row can be exchanged with ({_rows(sorted(singled))}): several single values, "
            "a row-wise vector of p's")))
    for (e, deps), bad in zip(groups, probe.permuted(groups, seed + 1), strict=True):
        if bad:
            found.append(Violation(p, label, "row-wise side", (
                f"element {e}: permuting x among rows {_rows(deps)} it depends on, each "
                "pair of which can be exchanged leaving it unchanged, changes it: p's side "
                "is not one value or an aggregate")))
    return found


def check_free(p: Program, label: str = "", seed: int = 0) -> list[Violation]:
    """Violations by ``p``, labelled as derived from no data of p's, of that claim."""
    influence = _Probe(p, seed).influence()
    return [Violation(p, label, "unlabelled", (
        f"element {e} depends on rows {_rows(np.flatnonzero(influence[:, e]))} of x"))
        for e in range(influence.shape[1]) if influence[:, e].any()][:1]


def _rows(rows: Sequence[int] | np.ndarray) -> str:
    rows = [int(r) for r in rows]
    return ", ".join(map(str, rows)) if len(rows) <= 6 else \
        f"{', '.join(map(str, rows[:5]))}, ... ({len(rows)} rows)"


def check(p: Program, seed: int = 0, selection: bool = False
          ) -> tuple[str | None, list[Violation]]:
    """The rule the analysis accepts ``p`` under (None: none, or invalid) and the
    violations of that rule's definition."""
    label = analyse(p)
    rule = accepted(label)
    if rule is None:
        return None, []
    if rule == "free":
        return rule, check_free(p, str(label), seed)
    assert isinstance(label, Flow)
    text = f"{label} (form {label.form}, rows {label.rows}, gated {label.gated})"
    if rule == "aggregate":
        rows = claimed_rows(label)
        assert rows is not None
        return rule, check_aggregate(p, rows, text, seed, selection)
    return rule, check_compare(p, text, seed)


class DrawChooser:
    """Choices drawn by hypothesis (``draw`` of a composite strategy): they shrink to
    the first option."""

    def __init__(self, draw: Callable[[Any], Any]):
        self.draw = draw

    def choice(self, options: Sequence[T]) -> T:
        from hypothesis import strategies as st
        return options[self.draw(st.integers(0, len(options) - 1))]

    def integer(self, lo: int, hi: int) -> int:
        from hypothesis import strategies as st
        return self.draw(st.integers(lo, hi))
