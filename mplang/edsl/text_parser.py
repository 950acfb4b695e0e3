"""Read the text IR of `mplang.edsl.text_printer` back into a graph and program metadata.

A recursive-descent parser over the text; ``//`` starts a comment that runs to the
end of the line (outside strings and payload lines). Every error is an
`MPSerializationError` whose message starts with ``line L, column C:``. Nothing is
evaluated: numbers, strings and JSON are read by their grammars, types by
`mplang.edsl.serde.decode_type`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Any, NoReturn

import numpy as np

from mplang.edsl.errors import MPLangError, MPSerializationError
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.primitive import get_primitive
from mplang.edsl.private import DIGEST_BYTES, Commitment
from mplang.edsl.pytree import TreeDef
from mplang.edsl.serde import MAX_DEPTH, decode_type, numpy_can_hold
from mplang.edsl.text_printer import (
    BARE_NAME,
    DTYPE_SHORT,
    IDENTIFIER,
    PayloadError,
    array_of,
    codec_named,
    element_kind,
    literal_value,
)
from mplang.edsl.typing import (
    BaseType,
    Dim,
    Mask,
    MPType,
    TensorType,
    ValueType,
    is_symbolic,
    numpy_dtype,
)

_SPACE = re.compile(r"(?:\s+|//[^\n]*)*")
_NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?")
_SYMBOLIC_DIM = re.compile(r"[A-Za-z0-9_+*()-]+")
_TOKEN = re.compile(r'[A-Za-z0-9_.$-]+|"(?:[^"\\\n]|\\.)*"?|\S')
_LINE_END = re.compile(r"[ \t]*\n")
_PAYLOAD_LINE = re.compile(r"[ \t]*\|([^\n]*)(?:\n|$)")
"""A line of a payload: blanks, ``|``, then the payload's line."""
_DTYPES = {short: name for name, short in DTYPE_SHORT.items()}
_SCALARS = {"none": None, "true": True, "false": False, "nan": math.nan, "inf": math.inf}
_MAX_LOC = 1024


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_JSON = json.JSONDecoder(parse_constant=_refuse_constant)


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    # -- positions and errors

    def fail(self, message: str, pos: int | None = None) -> NoReturn:
        at = self.pos if pos is None else pos
        line = self.text.count("\n", 0, at) + 1
        column = at - (self.text.rfind("\n", 0, at) + 1) + 1
        raise MPSerializationError(f"line {line}, column {column}: {message}")

    def skip(self) -> int:
        match = _SPACE.match(self.text, self.pos)
        assert match is not None
        self.pos = match.end()
        return self.pos

    def found(self) -> str:
        match = _TOKEN.match(self.text, self.skip())
        return "end of text" if match is None else repr(match.group()[:40])

    def expected(self, what: str) -> NoReturn:
        self.fail(f"expected {what}, found {self.found()}")

    def peek(self, token: str) -> bool:
        return self.text.startswith(token, self.skip())

    def accept(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.accept(token):
            self.expected(repr(token))

    def word(self) -> str | None:
        """The identifier at the cursor (not consumed)."""
        match = IDENTIFIER.match(self.text, self.skip())
        return None if match is None else match.group()

    def keyword(self, word: str) -> bool:
        if self.word() == word:
            self.pos += len(word)
            return True
        return False

    def expect_keyword(self, word: str) -> None:
        if not self.keyword(word):
            self.expected(repr(word))

    # -- lexical items

    def string(self) -> str:
        start = self.skip()
        if not self.text.startswith('"', start):
            self.expected("a string")
        try:
            value, self.pos = _JSON.raw_decode(self.text, start)
        except json.JSONDecodeError as e:
            self.fail(f"malformed string: {e.msg}", e.pos)
        return str(value)

    def name(self, pattern: re.Pattern[str] = BARE_NAME, what: str = "a name") -> str:
        if self.peek('"'):
            return self.string()
        match = pattern.match(self.text, self.skip())
        if match is None:
            self.expected(what)
        self.pos = match.end()
        return match.group()

    def integer(self, what: str = "an integer") -> int:
        match = _NUMBER.match(self.text, self.skip())
        if match is None or any(c in match.group() for c in ".eE"):
            self.expected(what)
        self.pos = match.end()
        return int(match.group())

    def json_value(self) -> Any:
        start = self.skip()
        try:
            value, self.pos = _JSON.raw_decode(self.text, start)
        except json.JSONDecodeError as e:
            self.fail(f"malformed JSON: {e.msg}", e.pos)
        except (ValueError, RecursionError) as e:
            self.fail(f"malformed JSON: {e}", start)
        return value

    def b64(self) -> bytes:
        start = self.skip()
        if not self.text.startswith('b64"', start):
            self.expected('base64 bytes b64"..."')
        self.pos += 3
        text = self.string()
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            self.fail("malformed base64", start)

    def separated(self, close: str, item: Any) -> list[Any]:
        """Items up to ``close`` (consumed), separated by commas."""
        items: list[Any] = []
        if self.accept(close):
            return items
        while True:
            items.append(item())
            if self.accept(close):
                return items
            if not self.accept(","):
                self.expected(f"',' or {close!r}")

    # -- types

    def mask(self) -> Mask:
        start = self.skip()
        self.expect("{")
        ranks = self.separated("}", lambda: self.integer("a party rank"))
        try:
            return Mask.of(ranks)
        except MPLangError as e:
            self.fail(str(e), start)

    def base_type(self) -> BaseType:
        start = self.skip()
        if self.accept("!"):
            tag = self.name(IDENTIFIER, "a type tag")
            self.expect("<")
            body = self.json_value()
            self.expect(">")
            try:
                decoded = decode_type({tag: body}, "type")
            except MPSerializationError as e:
                self.fail(str(e).removeprefix("malformed program: "), start)
            if not isinstance(decoded, BaseType):
                self.fail(f"!{tag} is not a base type", start)
            return decoded
        word = self.word()
        if word not in _DTYPES or not self.text.startswith("[", start + len(word)):
            self.expected("a type")
        self.pos += len(word) + 1
        dims = self.separated("]", self.dimension)
        if any(isinstance(d, int) and d < 0 for d in dims):
            self.fail("a dimension is a non-negative integer", start)
        return TensorType(_DTYPES[word], tuple(dims))

    def dimension(self) -> Dim:
        """A size, or ``?`` and a symbolic dimension (``?n0``, ``?2*n0+1``)."""
        start = self.skip()
        if not self.accept("?"):
            return self.integer("a dimension")
        match = _SYMBOLIC_DIM.match(self.text, self.pos)
        if match is None or not is_symbolic(match.group()):
            self.fail("expected a symbolic dimension after '?'", start)
        self.pos = match.end()
        return match.group()

    def type(self) -> ValueType:
        base = self.base_type()
        if not self.accept("@"):
            return base
        return MPType(base, None if self.accept("?") else self.mask())

    # -- attribute values

    def value(self, depth: int = 0) -> Any:
        start = self.skip()
        if depth > MAX_DEPTH:
            self.fail("attribute nested too deeply")
        text, nested = self.text, lambda: self.value(depth + 1)
        char = text[start:start + 1]
        if char == '"':
            return self.string()
        if char == "(":
            self.pos += 1
            items = [] if self.accept(")") else [nested()]
            while items and not self.accept(")"):
                if not self.accept(","):
                    self.expected("',' or ')'")
                if self.accept(")"):
                    break
                items.append(nested())
            return tuple(items)
        if char == "[":
            self.pos += 1
            return self.separated("]", nested)
        if char == "{":
            self.pos += 1
            return self.mapping(depth)
        if char == "@":
            self.pos += 1
            return self.mask()
        if char == "#":
            return self.payload()
        if char == "!":
            return self.type()
        if char == "-" or char.isdigit():
            return self.number()
        word = self.word()
        if word in _SCALARS:
            self.pos += len(word)
            return _SCALARS[word]
        if word == "b64" and text.startswith('"', start + 3):
            return self.b64()
        if word == "array":
            return self.array()
        if word == "commitment":
            return self.commitment()
        if word in _DTYPES:
            return self.type()
        self.expected("an attribute value")

    def number(self) -> int | float:
        start = self.skip()
        if self.text.startswith("-inf", start):
            self.pos += 4
            return -math.inf
        match = _NUMBER.match(self.text, start)
        if match is None:
            self.expected("a number")
        self.pos = match.end()
        value = literal_value(match.group())
        assert not isinstance(value, bool)
        return value

    def mapping(self, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}

        def item() -> None:
            start = self.skip()
            key = self.value(depth + 1)
            self.expect(":")
            try:
                out[key] = self.value(depth + 1)
            except TypeError:
                self.fail("a dict key must be hashable", start)

        self.separated("}", item)
        return out

    def array(self) -> np.ndarray:
        self.expect_keyword("array")
        self.expect("<")
        start = self.skip()
        t = self.base_type()
        if type(t) is not TensorType:
            self.fail("an array's type is a tensor type", start)
        self.expect(":")
        dtype = numpy_dtype(t.dtype)
        if not t.is_static:
            self.fail(f"an array's shape is known: {t} has symbolic sizes", start)
        shape = tuple(d for d in t.shape if isinstance(d, int))
        if not numpy_can_hold(list(shape), dtype.itemsize):
            self.fail(f"array shape {list(shape)}: rank or size beyond numpy's limits", start)
        body = self.skip()
        if self.text.startswith('b64"', body):
            raw = self.b64()
            if len(raw) != dtype.itemsize * math.prod(shape):
                self.fail(f"{len(raw)} bytes do not hold an array of {t}", body)
            value = np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(shape)
        else:
            flat: list[Any] = []
            self.elements(shape, element_kind(t.dtype), flat)
            try:
                value = array_of(flat, t.dtype, shape)
            except (ValueError, OverflowError) as e:
                self.fail(f"elements do not fit {t}: {e}", body)
        self.expect(">")
        return value

    def elements(self, shape: tuple[int, ...], kind: str, out: list[Any]) -> None:
        if shape:
            start = self.skip()
            self.expect("[")
            count = len(self.separated("]", lambda: self.elements(shape[1:], kind, out)))
            if count != shape[0]:
                self.fail(f"expected {shape[0]} elements here, found {count}", start)
            return
        start = self.skip()
        word = self.word()
        if word in ("true", "false", "nan", "inf"):
            self.pos += len(word)
            value: Any = _SCALARS[word]
        else:
            value = self.number() if self.peek("-") or self.text[start:start + 1].isdigit() \
                else None
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = isinstance(value, bool) if kind == "b" else number if kind in "fc" else \
            type(value) is int
        if value is None or not ok:
            self.pos = start
            what = {"b": "true or false", "f": "a number"}.get(kind, "an integer")
            self.expected(what)
        out.append(value)

    def commitment(self) -> Commitment:
        self.expect_keyword("commitment")
        self.expect("<")
        start = self.skip()
        digest = self.b64()
        if len(digest) != DIGEST_BYTES:
            self.fail(f"a commitment's digest is {DIGEST_BYTES} bytes", start)
        vtype = self.base_type() if self.accept(",") else None
        self.expect(">")
        return Commitment(digest, vtype)

    def payload(self) -> Any:
        start = self.skip()
        self.expect("#")
        name = self.name(IDENTIFIER, "a payload kind")
        codec = codec_named(name)
        if codec is None:
            self.fail(f"unknown payload kind #{name} (its dialect is not loaded?)", start)
        self.expect("<")
        rest = _LINE_END.match(self.text, self.pos)
        if rest is None:
            self.fail("a payload starts on the next line")
        self.pos = rest.end()
        lines, starts = [], []
        while (match := _PAYLOAD_LINE.match(self.text, self.pos)) is not None:
            lines.append(match.group(1))
            starts.append(match.start(1))
            self.pos = match.end()
        if not lines:
            self.expected("a payload line starting with '|'")
        self.expect(">")
        try:
            return codec.parse("\n".join(lines))
        except PayloadError as e:
            if e.line is not None and 1 <= e.line <= len(lines):
                self.fail(str(e), starts[e.line - 1] + max(0, (e.column or 1) - 1))
            self.fail(f"#{name}: {e}", start)
        except (ValueError, MPLangError) as e:
            self.fail(f"#{name}: {e}", start)

    # -- graphs

    def ref(self, env: dict[str, Value]) -> Value:
        start = self.skip()
        self.expect("%")
        name = self.name(what="a value name")
        if name not in env:
            self.fail(f"%{name} is not defined", start)
        return env[name]

    def define(self, env: dict[str, Value], name: str, vtype: ValueType, at: int) -> Value:
        if name in env:
            self.fail(f"%{name} is defined twice", at)
        env[name] = Value(name, vtype)
        return env[name]

    def typed_values(self, env: dict[str, Value]) -> list[Value]:
        def one() -> Value:
            start = self.skip()
            self.expect("%")
            name = self.name(what="a value name")
            self.expect(":")
            return self.define(env, name, self.type(), start)

        self.expect("(")
        return self.separated(")", one)

    def body(self, env: dict[str, Value], depth: int) -> tuple[list[Operation], list[Value]]:
        ops = []
        while not self.keyword("return"):
            ops.append(self.op(env, depth))
        outputs = [self.ref(env)] if self.peek("%") else []
        while outputs and self.accept(","):
            outputs.append(self.ref(env))
        return ops, outputs

    def op(self, env: dict[str, Value], depth: int) -> Operation:
        results: list[tuple[str, int]] = []
        if self.peek("%"):
            while True:
                at = self.skip()
                self.expect("%")
                results.append((self.name(what="a value name"), at))
                if not self.accept(","):
                    break
            self.expect("=")
        at = self.skip()
        if not self.peek('"') and self.word() is None:
            self.expected("an op or 'return'")
        opcode = self.name(IDENTIFIER, "an op")
        if get_primitive(opcode) is None:
            self.fail(f"unknown op {opcode!r} (if a plugin defines dialect "
                      f"{opcode.partition('.')[0]!r}, load it here: mplang worker --plugin "
                      "NAME)", at)
        self.expect("(")
        inputs = self.separated(")", lambda: self.ref(env))
        attrs = self.attrs() if self.peek("{") else {}
        self.expect(":")
        self.expect("(")
        types_at = self.skip()
        types = self.separated(")", self.type)
        if len(types) != len(results):
            self.fail(f"{len(results)} result(s) but {len(types)} type(s)", types_at)
        loc = None
        if self.keyword("loc"):
            self.expect("(")
            loc_at = self.skip()
            loc = self.string()
            if len(loc) > _MAX_LOC:
                self.fail(f"a location is at most {_MAX_LOC} characters", loc_at)
            self.expect(")")
        regions: list[Graph] = []
        while self.keyword("region"):
            index_at = self.skip()
            if self.integer("a region index") != len(regions):
                self.fail(f"expected region {len(regions)}", index_at)
            if depth >= MAX_DEPTH:
                self.fail("regions nested too deeply", index_at)
            scope: dict[str, Value] = {}
            region_inputs = self.typed_values(scope)
            self.expect("{")
            ops, outputs = self.body(scope, depth + 1)
            self.expect("}")
            regions.append(Graph(region_inputs, ops, outputs))
        outs = tuple(self.define(env, name, t, pos)
                     for (name, pos), t in zip(results, types, strict=True))
        return Operation(opcode, tuple(inputs), outs, attrs, tuple(regions), loc)

    def attrs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}

        def one() -> None:
            at = self.skip()
            key = self.name(what="an attribute name")
            if key in out:
                self.fail(f"attribute {key!r} is given twice", at)
            self.expect("=")
            out[key] = self.value()

        self.expect("{")
        self.separated("}", one)
        return out

    def program(self) -> tuple[Graph, dict[str, Any]]:
        self.expect_keyword("program")
        self.expect("@")
        name = self.name(what="the program's name")
        self.expect("{")
        self.expect_keyword("world_size")
        self.expect("=")
        world_size = self.integer("the world size")
        self.expect(",")
        self.expect_keyword("out_devices")
        self.expect("=")
        self.expect("[")
        devices = self.separated("]", lambda: None if self.keyword("none") else self.string())
        self.expect(",")
        self.expect_keyword("out_tree")
        self.expect("=")
        tree_at = self.skip()
        out_tree = self.json_value()
        try:
            TreeDef.from_json(out_tree)
        except (ValueError, TypeError) as e:
            self.fail(f"malformed out_tree: {e}", tree_at)
        self.expect("}")
        self.expect_keyword("func")
        env: dict[str, Value] = {}
        inputs = self.typed_values(env)
        self.expect("->")
        self.expect("(")
        types_at = self.skip()
        out_types = self.separated(")", self.type)
        self.expect("{")
        ops, outputs = self.body(env, 0)
        self.expect("}")
        if self.skip() != len(self.text):
            self.expected("end of text")
        if [v.type for v in outputs] != out_types:
            self.fail("the output types do not match the returned values", types_at)
        meta = {"name": name, "world_size": world_size, "out_tree": out_tree,
                "out_devices": devices}
        return Graph(inputs, ops, outputs), meta


def parse_program(text: str) -> tuple[Graph, dict[str, Any]]:
    """The graph and the metadata (``name``, ``world_size``, ``out_tree`` JSON,
    ``out_devices``) of a program's text; raises `MPSerializationError` naming the line
    and column of the first error."""
    if not isinstance(text, str):
        raise MPSerializationError(f"the text IR is a str, got {type(text).__name__}")
    try:
        return _Parser(text).program()
    except RecursionError:
        raise MPSerializationError("the text nests too deeply") from None
