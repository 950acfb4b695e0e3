"""StableHLO text, read through the MLIR Python bindings that JAX ships.

`parse` turns a module's text into plain Python objects that analyses walk
without holding MLIR objects (which live only as long as their context):
functions, blocks with their arguments, ops with the ids of the values they
read and define, tensor types, decoded attributes and regions. Value ids are
unique within one module, so a block can read values its enclosing blocks
define.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jax.extend.mlir import ir as _ir
from jax.extend.mlir.dialects import stablehlo as _stablehlo
from jax.interpreters.mlir import make_ir_context

ir: Any = _ir  # the MLIR bindings ship no type stubs
hlo: Any = _stablehlo


@dataclass(frozen=True)
class Tensor:
    """A ranked tensor type: its shape and element type (``f32``, ``i32``, ``i1``, ``ui8``)."""

    shape: tuple[int, ...]
    element: str

    @property
    def size(self) -> int:
        """The element count."""
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        """Whether the elements are floating point."""
        return self.element.startswith(("f", "bf"))

    @property
    def dtype(self) -> str:
        """The element type's numpy name (``float32``, ``int32``, ``uint8``, ``bool``)."""
        if self.element == "i1":
            return "bool"
        for short, name in (("ui", "uint"), ("bf", "bfloat"), ("i", "int"), ("f", "float")):
            if self.element.startswith(short):
                return name + self.element[len(short):]
        return self.element


@dataclass(frozen=True)
class Op:
    """One op: its name (``stablehlo.add``, ``func.call``), the ids of its operands and
    results with their types (None: not a ranked tensor), its attributes and regions."""

    name: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    operand_types: tuple[Tensor | None, ...]
    result_types: tuple[Tensor | None, ...]
    attrs: Mapping[str, Any]
    regions: tuple[Block, ...]

    @property
    def kind(self) -> str:
        """The name without its dialect (``add``, ``call``, ``return``)."""
        return self.name.rpartition(".")[2]


@dataclass(frozen=True)
class Block:
    """A block: the ids and types of its arguments and its ops, terminator last."""

    args: tuple[int, ...]
    arg_types: tuple[Tensor | None, ...]
    ops: tuple[Op, ...]

    def returned(self) -> tuple[int, ...]:
        """The values the block's terminator returns."""
        return self.terminator().operands

    def returned_types(self) -> tuple[Tensor | None, ...]:
        """The types of the values the block's terminator returns."""
        return self.terminator().operand_types

    def terminator(self) -> Op:
        """The block's ``return`` (an empty one if it ends otherwise)."""
        last = self.ops[-1] if self.ops else None
        return last if last is not None and last.kind == "return" else _NO_RETURN

    def walk(self) -> Iterator[Op]:
        """The block's ops, each followed by the ops of its regions."""
        for op in self.ops:
            yield op
            for region in op.regions:
                yield from region.walk()


_NO_RETURN = Op("func.return", (), (), (), (), {}, ())


@dataclass(frozen=True)
class Module:
    """A module's functions (their bodies), by symbol name."""

    functions: Mapping[str, Block]

    def walk(self) -> Iterator[Op]:
        """Every op of every function, regions included."""
        for body in self.functions.values():
            yield from body.walk()


def tensor_type(t: Any) -> Tensor | None:
    """A bindings type as a `Tensor` (None if it is no ranked tensor)."""
    if not isinstance(t, ir.RankedTensorType):
        return None
    return Tensor(tuple(t.shape), str(t.element_type))


def _attr(attr: Any) -> Any:
    """An attribute as plain data: numbers, strings, tuples of ints, the scalar of a splat
    constant, a comparison direction (``LT``), dot and gather dimension numbers as dicts;
    others as their text (None for a non-splat dense constant)."""
    if isinstance(attr, ir.BoolAttr | ir.IntegerAttr | ir.FloatAttr | ir.StringAttr
                  | ir.FlatSymbolRefAttr):
        return attr.value
    if isinstance(attr, ir.DenseI64ArrayAttr | ir.DenseI32ArrayAttr | ir.DenseBoolArrayAttr):
        return tuple(attr)
    if isinstance(attr, ir.DenseElementsAttr):
        return _attr(attr.get_splat_value()) if attr.is_splat else None
    if hlo.ComparisonDirectionAttr.isinstance(attr):
        return hlo.ComparisonDirectionAttr(attr).value
    if hlo.DotDimensionNumbers.isinstance(attr):
        dims = hlo.DotDimensionNumbers(attr)
        return {name: tuple(getattr(dims, name)) for name in (
            "lhs_batching_dimensions", "rhs_batching_dimensions",
            "lhs_contracting_dimensions", "rhs_contracting_dimensions")}
    if hlo.GatherDimensionNumbers.isinstance(attr):
        gather = hlo.GatherDimensionNumbers(attr)
        numbers: dict[str, Any] = {name: tuple(getattr(gather, name)) for name in (
            "offset_dims", "collapsed_slice_dims", "operand_batching_dims",
            "start_indices_batching_dims", "start_index_map")}
        return {**numbers, "index_vector_dim": int(gather.index_vector_dim)}
    return str(attr)


class _Reader:
    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}

    def value(self, v: Any) -> int:
        return self.ids.setdefault(v, len(self.ids))

    def block(self, region: Any) -> Block:
        blocks = list(region.blocks)
        if len(blocks) != 1:
            raise ValueError(f"a region with {len(blocks)} blocks (one expected)")
        (block,) = blocks
        args = tuple(block.arguments)
        return Block(tuple(self.value(a) for a in args),
                     tuple(tensor_type(a.type) for a in args),
                     tuple(self.op(op.operation) for op in block.operations))

    def op(self, op: Any) -> Op:
        operands, results = list(op.operands), list(op.results)
        return Op(op.name, tuple(self.value(v) for v in operands),
                  tuple(self.value(v) for v in results),
                  tuple(tensor_type(v.type) for v in operands),
                  tuple(tensor_type(v.type) for v in results),
                  {a.name: _attr(a.attr) for a in op.attributes},
                  tuple(self.block(r) for r in op.regions))


@functools.lru_cache(maxsize=256)
def parse(text: str) -> Module:
    """The functions of the StableHLO module ``text`` (ValueError if it cannot be parsed
    or has a region of several blocks)."""
    reader = _Reader()
    functions: dict[str, Block] = {}
    with make_ir_context():
        try:
            module = ir.Module.parse(text)
        except Exception as e:  # the bindings' MLIRError
            raise ValueError(f"unparsable StableHLO: {e}") from None
        for op in module.body.operations:
            op = op.operation
            if op.name == "func.func" and op.regions and list(op.regions[0].blocks):
                functions[ir.StringAttr(op.attributes["sym_name"]).value] = \
                    reader.block(op.regions[0])
    return Module(functions)


_FILE_LINE = re.compile(r'"([^"]+)":(\d+):')


def traced_line(text: str, name: str, number: int) -> str | None:
    """``file.py:LINE``, from its debug location, of the ``number``-th op named ``name`` (in
    `Module.walk` order) of the StableHLO module ``text``: the innermost source line that
    traced it. None if there is no such op or it has no source location."""
    def ops(region: Any) -> Iterator[Any]:
        for block in region.blocks:
            for op in block.operations:
                yield op.operation
                for inner in op.operation.regions:
                    yield from ops(inner)

    with make_ir_context():
        module = ir.Module.parse(text)
        found = [op for func in module.body.operations if func.operation.name == "func.func"
                 and func.operation.regions for op in ops(func.operation.regions[0])
                 if op.name == name]
        if not 0 < number <= len(found):
            return None
        at = _FILE_LINE.search(str(found[number - 1].location))
    return f"{os.path.basename(at[1])}:{at[2]}" if at else None

