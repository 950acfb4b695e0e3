"""A small reader of pphlo MLIR text (the ``code`` of a libspu executable).

Just enough structure for estimates: one `PphloOp` per op line, with the ops
of its regions, its operand names and its tensor types. Types are the text
inside ``tensor<...>``, e.g. ``4x!pphlo.secret<f32>``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_OP = re.compile(r'^(?:(?:%[\w#:]+(?:,\s*)?)+\s*=\s*)?"?((?:pphlo|func|stablehlo)\.\w+|return)\b')
_TENSOR = re.compile(r"tensor<((?:[^<>]|<[^<>]*>)*)>")
_FUNC = re.compile(r"func\.func\s+(?:\w+\s+)?@([\w.$-]+)")
_CALLEE = re.compile(r"@([\w.$-]+)")


@dataclass
class PphloOp:
    """One op line: ``name`` without dialect (``less``, ``while``), the stripped line, regions."""

    name: str
    text: str
    regions: list[list[PphloOp]] = field(default_factory=list)


def parse_module(code: str) -> list[PphloOp]:
    """The ops of a pphlo module's text, as a tree: each op with its regions' ops.

    A line ending in ``{`` opens a region of the last op of the current block
    (``cond {`` after a ``pphlo.while`` line, ``reducer(...) {`` after a
    ``pphlo.reduce`` line); a line starting with ``}`` closes it.
    """
    root: list[PphloOp] = []
    stack: list[list[PphloOp]] = [root]
    for raw in code.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("}"):
            if len(stack) > 1:
                stack.pop()
            line = line[1:].strip()
            if not line.endswith("{"):
                continue
        match = _OP.match(line)
        if match:
            stack[-1].append(PphloOp(match.group(1).split(".")[-1], line))
        elif line.endswith("{") and (line.startswith("module") or not stack[-1]):
            stack[-1].append(PphloOp("module" if line.startswith("module") else "block", line))
        if line.endswith("{"):
            region: list[PphloOp] = []
            stack[-1][-1].regions.append(region)
            stack.append(region)
    return root


def signature(text: str) -> tuple[list[str], list[str]]:
    """The operand and result tensor types of an op line (``: (A, B) -> C`` or ``: T``)."""
    head, sep, sig = text.rpartition(" : ")
    if not sep:
        return [], []
    if "->" in sig:
        ins, _, outs = sig.partition("->")
        return _TENSOR.findall(ins), _TENSOR.findall(outs)
    types = _TENSOR.findall(sig)
    operands = re.findall(r"%[\w#]+", head.partition("=")[2] if "=" in head else head)
    return types[:1] * max(1, len(operands)), types


def is_secret(t: str) -> bool:
    """Whether tensor type ``t`` holds secret shares."""
    return "secret<" in t


_DIMS = re.compile(r"(?:\d+x)*")


def _dims(t: str) -> str:
    """The ``4x4x`` prefix of a tensor type's body (empty for scalars)."""
    match = _DIMS.match(t)
    return match.group(0) if match else ""


def is_fixed_point(t: str) -> bool:
    """Whether tensor type ``t`` has a floating (fixed-point in SPU) element type."""
    return re.search(r"\bb?f(?:16|32|64)\b", t[len(_dims(t)):]) is not None


def elements(t: str) -> int:
    """The element count of tensor type ``t``."""
    return math.prod(int(d) for d in _dims(t).split("x")[:-1])


_INT_CONSTANT = re.compile(r"^(%[\w#]+) = pphlo\.constant dense<(-?\d+)> : tensor<u?i\d+>$")
_ALIAS = re.compile(r"^(%[\w#]+) = pphlo\.broadcast_as (%[\w#]+),")


def int_constants(ops: list[PphloOp]) -> dict[str, int | str]:
    """Scalar integer constants defined in a block, and aliases of values (``broadcast_as``)."""
    found: dict[str, int | str] = {}
    for op in ops:
        match = _INT_CONSTANT.match(op.text)
        if match:
            found[match.group(1)] = int(match.group(2))
            continue
        alias = _ALIAS.match(op.text)
        if alias:
            found[alias.group(1)] = alias.group(2)
    return found


def operand_names(text: str) -> list[str]:
    """The SSA operands of an op line (the names after the op, before its type signature)."""
    head = text.rpartition(" : ")[0] or text
    after = re.split(r"\bpphlo\.\w+", head, maxsplit=1)
    return re.findall(r"%[\w#]+", after[1] if len(after) > 1 else "")


def returned_def(ops: list[PphloOp], index: int) -> PphloOp | None:
    """The op of block ``ops`` defining the ``index``-th value its ``return`` returns."""
    ret = next((op for op in reversed(ops) if op.name == "return"), None)
    returned = operand_names(ret.text) if ret is not None else []
    if index >= len(returned):
        return None
    return next((op for op in ops if op.text.startswith(returned[index] + " = ")), None)


def collect_functions(ops: list[PphloOp], into: dict[str, PphloOp]) -> None:
    """Add every ``func.func @name`` under ``ops`` to ``into`` by name."""
    for op in ops:
        match = _FUNC.match(op.text)
        if op.name == "func" and match:
            into[match.group(1)] = op
        for region in op.regions:
            collect_functions(region, into)


def callee(text: str) -> str | None:
    """The function a ``func.call @name(...)`` line calls."""
    match = _CALLEE.search(text)
    return match.group(1) if match else None
