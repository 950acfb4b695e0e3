"""Fuzz the decoders of untrusted bytes: programs (graph bundles) and values (wire frames).

A worker decodes what other parties send: a program (`decode_graph_bundle`, then
``graph.verify()`` and ``check_types``), a ``/run`` body around it (`split_frame`),
values (`decode_value`, with the registered value codecs such as ``spu.share``) and
``/msg`` bodies around them. Whatever the bytes, each must give a decoded object or an
`MPLangError`; any other exception, a crash, a hang or a large allocation is a bug.

Inputs start from real encodings: compiled programs (those of ``tests/http/programs.py``:
run_jax pcalls, shuffles and converge, uniform_cond / while_loop / func.func, SPU
programs on ``SP0``; and constants of every dtype) and values (arrays of every dtype
and many shapes, scalars, bytes, lists, SPU shares; share bytes are fresh each run,
from libspu's randomness). Each is mutated by byte edits (a byte, a bit flip, an interesting
byte or length, insertions, deletions, truncation, splicing two inputs), by
structured edits of the JSON header (replace, delete, insert, wrap, splice a node
from another input, with lengths and sizes re-fixed or not) and, for SPU shares, by
rewriting the protobuf chunks; a few inputs are random bytes. Half of the inputs
are drawn by hypothesis (``st.data()`` drives the same generators), half by plain
``random``.

Inputs run in batches in child processes, one JSON line of outcome each, so a crash
(a death by signal) or a hang (no answer within ``--timeout``) is observed, counted
and the batch resumes after it. Children run under an address-space limit, and an
input whose peak RSS (reset before each input) exceeds the RSS before it by more than
``--rss-mib`` counts as a ``memory`` failure, whatever its outcome.

    .venv/bin/python benchmarks/fuzz_decoders.py --count 10000 --seed 0 [--jobs 2]
    .venv/bin/python benchmarks/fuzz_decoders.py --replay input.bin --decoder value
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import math
import os
import random
import re
import resource
import selectors
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

DECODERS = ("program", "value")
OUTCOMES = ("ok", "mplang_error", "other", "memory", "crash", "timeout")
"""Decoded (and verified); refused with an MPLangError; another exception; peak RSS grew
by more than the limit; the child died (signal or exit); no answer within the timeout."""
FAILURES = ("other", "memory", "crash", "timeout")
WORLD = 3
PROGRAM_MAGIC = b"MPLANG\x00\x01"
VALUE_MAGIC = b"MPV1"
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


# ---------------------------------------------------------------- choices


class Chooser(Protocol):
    """The source of every random choice: plain `random` or a hypothesis draw."""

    def int(self, lo: int, hi: int) -> int: ...

    def bytes(self, n: int) -> bytes: ...


class RandomChooser:
    def __init__(self, rng: random.Random):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def bytes(self, n: int) -> bytes:
        return self.rng.randbytes(n)


class DrawChooser:
    """Choices drawn from a hypothesis ``st.data()`` object (shrinkable in tests)."""

    MAX_DRAWN = 64
    """Longer byte strings repeat a drawn prefix (hypothesis bounds one example's data)."""

    def __init__(self, data: Any):
        from hypothesis import strategies as st

        self.data = data
        self.st = st

    def int(self, lo: int, hi: int) -> int:
        return int(self.data.draw(self.st.integers(lo, hi)))

    def bytes(self, n: int) -> bytes:
        drawn = self.data.draw(self.st.binary(min_size=min(n, self.MAX_DRAWN),
                                              max_size=min(n, self.MAX_DRAWN)))
        return (drawn * (n // max(len(drawn), 1) + 1))[:n] if drawn else b""


def pick(ch: Chooser, items: Sequence[Any]) -> Any:
    return items[ch.int(0, len(items) - 1)]


def weighted(ch: Chooser, table: Sequence[tuple[int, Any]]) -> Any:
    """One of ``table``'s items, chosen with the given integer weights."""
    roll = ch.int(0, sum(w for w, _ in table) - 1)
    for weight, item in table:
        if roll < weight:
            return item
        roll -= weight
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- seed inputs


def seed_programs() -> dict[str, bytes]:
    """Encoded programs (graph bundles) of a 3-party cluster with SPU ``SP0``: the programs
    the HTTP and simulator tests share (every simp primitive: pcalls with run_jax,
    shuffles, converge, uniform_cond, while_loop, func.func; SPU programs on ``SP0``),
    and constants of every dtype."""
    import numpy as np

    import mplang as mp
    from mplang import simp
    from tests.http.programs import CASES
    from tests.http.programs import WORLD as CASES_WORLD

    assert CASES_WORLD == WORLD

    def constants() -> Any:
        out = []
        for i, name in enumerate(sorted(_dtype_names() - {"bfloat16"})):  # no bf16 constants
            arr = np.arange(6).reshape(2, 3) if i % 2 else np.arange(3)
            out.append(simp.constant((i % WORLD,), arr.astype(_numpy_dtype(name))))
        out.append(simp.constant((0, 1), np.float64("nan")))
        out.append(simp.constant((2,), np.zeros((0, 4), dtype=np.int8)))
        return out

    makers = {case.name: case.program for case in CASES} | {"constants": constants}
    return {name: mp.compile(fn, world_size=WORLD).to_bytes() for name, fn in makers.items()}


def _dtype_names() -> frozenset[str]:
    from mplang.edsl.typing import DTYPES

    return DTYPES


def _numpy_dtype(name: str) -> Any:
    from mplang.edsl.typing import numpy_dtype

    return numpy_dtype(name)


SHAPES: tuple[tuple[int, ...], ...] = ((), (0,), (1,), (3,), (2, 3), (2, 0, 3), (1, 1, 1, 1, 5),
                                       (4, 4, 4))


def random_array(ch: Chooser) -> Any:
    """An array of any wire dtype and a small shape, with arbitrary bytes as contents."""
    import numpy as np

    dt = _numpy_dtype(pick(ch, sorted(_dtype_names())))
    shape = pick(ch, SHAPES) if ch.int(0, 1) else tuple(ch.int(0, 4)
                                                         for _ in range(ch.int(0, 4)))
    raw = ch.bytes(dt.itemsize * math.prod(shape))
    return np.frombuffer(raw, dtype=dt).reshape(shape)


def spu_shares() -> list[list[Any]]:
    """libspu shares (one list per secret) of several dtypes, protocols and fields."""
    import numpy as np
    import spu.libspu as libspu

    from mplang.backends.spu_impl import SpuShare
    from mplang.dialects.spu import SpuConfig, io_for

    configs = [SpuConfig("SP0", (0, 1), "SEMI2K", "FM64"),
               SpuConfig("SP0", (0, 1, 2), "ABY3", "FM64"),
               SpuConfig("SP0", (0, 1), "SEMI2K", "FM128")]
    secrets = [np.arange(3, dtype=np.int32), np.float32(1.5), np.ones((2, 2), dtype=np.bool_),
               np.array([-1, 2**40], dtype=np.int64)]
    out = []
    for i, secret in enumerate(secrets):
        config = configs[i % len(configs)]
        shares = io_for(config).make_shares(np.asarray(secret), libspu.Visibility.VIS_SECRET)
        out.append([SpuShare(s) for s in shares])
    return out


def seed_values() -> dict[str, bytes]:
    """Encoded values: arrays of every dtype and many shapes, scalars, bytes, lists, shares."""
    import numpy as np

    from mplang.backends.wire import encode_value_bytes

    values: dict[str, Any] = {"none": None, "true": True, "int": -(2**63), "float": 1.5,
                              "nan": float("nan"), "bytes": b"\x00abc", "empty-bytes": b"",
                              "generic": np.float32(2.5), "big": np.zeros((512, 512), np.uint8)}
    for i, name in enumerate(sorted(_dtype_names())):
        dt = _numpy_dtype(name)
        for shape in (SHAPES[i % len(SHAPES)], SHAPES[(i + 3) % len(SHAPES)], ()):
            values[f"{name}{list(shape)}"] = np.arange(math.prod(shape)).astype(dt).reshape(shape)
    values["list"] = [np.arange(4, dtype=np.int32), 7, None, b"xy", np.float64(3.0)]
    values["empty-list"] = []
    for i, shares in enumerate(spu_shares()):
        values[f"share{i}"] = shares[0]
        values[f"shares{i}"] = shares
    return {name: encode_value_bytes(v) for name, v in values.items()}


# ---------------------------------------------------------------- byte mutations


INTERESTING_BYTES = b"\x00\x01\x7f\x80\xff\"[]{}:,-09eE\\"
INTERESTING_INTS = (0, 1, 2, 7, 8, 63, 64, 65, 127, 128, 255, 256, 4095, 65535, 2**20, 2**24,
                    2**28, 2**30, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**33, 2**36, 2**53 + 1,
                    2**60, 2**63 - 1, 2**63, 2**64 - 1)
"""Boundaries, and sizes large enough to hurt when something allocates by them."""


def _write_int(ch: Chooser, data: bytearray, pos: int) -> None:
    width = pick(ch, (1, 2, 4, 8))
    value = pick(ch, INTERESTING_INTS) if ch.int(0, 3) else len(data) + ch.int(-2, 2)
    data[pos:pos + width] = (value % (1 << (8 * width))).to_bytes(width, "little")


def mutate_bytes(ch: Chooser, data: bytes, donors: Sequence[bytes]) -> bytes:
    """One byte-level edit of ``data`` (``donors``: other inputs to splice from)."""
    buf = bytearray(data)
    size = len(buf)
    pos = ch.int(0, max(size - 1, 0))
    kind = pick(ch, ("byte", "bit", "interesting", "int", "insert", "delete", "truncate",
                     "splice", "duplicate", "length"))
    if size == 0 or kind == "insert":
        chunk = ch.bytes(ch.int(1, 16)) if ch.int(0, 1) else bytes(buf[pos:pos + ch.int(1, 64)])
        buf[pos:pos] = chunk or b"\x00"
    elif kind == "byte":
        buf[pos] = ch.int(0, 255)
    elif kind == "bit":
        buf[pos] ^= 1 << ch.int(0, 7)
    elif kind == "interesting":
        buf[pos] = pick(ch, INTERESTING_BYTES)
    elif kind == "int":
        _write_int(ch, buf, pos)
    elif kind == "delete":
        del buf[pos:pos + ch.int(1, 64)]
    elif kind == "truncate":
        del buf[pos:]
    elif kind == "splice":
        other = pick(ch, donors) if donors else data
        buf = buf[:pos] + bytearray(other[ch.int(0, max(len(other) - 1, 0)):])
    elif kind == "duplicate":
        end = min(size, pos + ch.int(1, 256))
        buf[end:end] = buf[pos:end]
    else:  # the length field of the frame or bundle header
        at = 8 if data.startswith(PROGRAM_MAGIC) else 4
        _write_int(ch, buf, min(at, size))
    return bytes(buf)


def random_bytes(ch: Chooser, magic: bytes) -> bytes:
    """Random bytes, possibly behind a valid magic and a plausible length."""
    body = ch.bytes(ch.int(0, 200))
    if ch.int(0, 1):
        return body
    width = 8 if magic == PROGRAM_MAGIC else 4
    length = pick(ch, (len(body), ch.int(0, len(body) + 8), pick(ch, INTERESTING_INTS)))
    return magic + (length % (1 << (8 * width))).to_bytes(width, "little") + body


# ---------------------------------------------------------------- structured (JSON) mutations


DEEP = "\x00deep\x00"
"""Placeholder of a deeply nested JSON array, substituted into the serialized text."""
KNOWN_STRINGS = ("", "x", "0", "1", "%0", "int32", "bool", "bfloat16", "complex128", "object",
                 "<U1", "float128", "simp.pcall", "simp.constant", "simp.while_loop",
                 "tensor.run_jax", "spu.run", "spu.seal", "func.call", "func.func", "mp",
                 "tensor", "share", "spu", "$tuple", "$dict", "$bytes", "$array", "$mask",
                 "$type", "$float", "nan", "inf", "-inf", "none", "scalar", "bytes", "array",
                 "list", "spu.share", "cms.sketch", "kind", "sizes", "shape", "dtype",
                 "version", "meta", "graph", "buffers", "inputs", "ops", "outputs", "in",
                 "out", "attrs", "regions", "loc", "x" * 5000)
SPECIAL_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1.5, -0.0, 1e308, float("nan"), float("inf"), 10**30, -(2**63),
    [], {}, [[]], [0] * 65, [2**62, 0], [2**31, 2**30, 0], [-1], [2**64], list(range(300)),
    {"$array": ["int32", [2**40, 2**40], 0]}, {"$array": ["int32", [0] * 70, 0]},
    {"$array": [["int32"], [], 0]}, {"$bytes": 0}, {"$bytes": 2**40}, {"$mask": 2**62},
    {"$mask": 2**4000}, {"$tuple": [2**40]}, {"$tuple": [0, 1, 2**20]}, {"$dict": [[[1], 2]]},
    {"$dict": [[1, 2], [1, 3]]}, {"$float": "1e999"}, {"$type": {"tensor": ["int32", [-1]]}},
    {"$type": {"tensor": ["int32", [2**70]]}}, {"mp": [{"tensor": ["int32", []]}, None]},
    {"mp": [{"tensor": ["float32", [2, 3]]}, 7]}, {"share": ["spu", {"tensor": ["int32", [3]]}]},
    {"share": ["spu", {"share": ["spu", {"tensor": ["int32", []]}]}]},
    {"tensor": ["int32", [0] * 65]}, DEEP,
)


def _nodes(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) slot of a JSON document, in document order (root: (None, None))."""
    out: list[tuple[Any, Any]] = [(None, None)]
    stack = [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else \
            enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            out.append((node, key))
            stack.append(child)
    return out


def _all_subtrees(doc: Any) -> list[Any]:
    return [doc if c is None else c[k] for c, k in _nodes(doc)]


def _new_value(ch: Chooser, doc: Any, donors: Sequence[Any], old: Any) -> Any:
    kind = pick(ch, ("special", "string", "donor", "tweak", "wrap", "int"))
    if kind == "special":
        return copy.deepcopy(pick(ch, SPECIAL_VALUES))
    if kind == "string":
        return pick(ch, KNOWN_STRINGS)
    if kind == "donor":
        return copy.deepcopy(pick(ch, _all_subtrees(pick(ch, [doc, *donors]))))
    if kind == "int":
        return pick(ch, INTERESTING_INTS) * pick(ch, (1, -1))
    if kind == "wrap":
        return pick(ch, ([old], {"$tuple": [old]}, {"mp": [old, 1]}, {"$type": old},
                         {"x": old}, [old, old]))
    if type(old) is int:
        return pick(ch, (old + 1, old - 1, -old, old * 2**ch.int(1, 64), old + WORLD))
    if isinstance(old, str):
        return pick(ch, (old + "x", old[:-1], old.upper(), old * 2, old + "\x00", "$" + old))
    if isinstance(old, list) and old:
        return old[: ch.int(0, len(old) - 1)] if ch.int(0, 1) else old * 2
    return copy.deepcopy(pick(ch, SPECIAL_VALUES))  # later edits must not change the table


def mutate_json(ch: Chooser, doc: Any, donors: Sequence[Any]) -> Any:
    """One structured edit of a JSON document: replace, delete, insert or duplicate a node,
    or set an integer (a rank, mask, dim, span, size) to an interesting one."""
    graph = doc.get("graph") if isinstance(doc, dict) else None
    inside = isinstance(graph, dict) and ch.int(0, 1) == 1  # half the edits inside the graph
    nodes = _nodes(graph if inside else doc)
    ints = [(c, k) for c, k in nodes if c is not None and type(c[k]) is int]
    if ints and ch.int(0, 3) == 0:
        container, key = pick(ch, ints)
        container[key] = pick(ch, INTERESTING_INTS) * pick(ch, (1, 1, 1, -1))
        return doc
    container, key = pick(ch, nodes)
    if container is None and inside:
        container, key = doc, "graph"
    elif container is None:
        return _new_value(ch, doc, donors, doc)
    action = pick(ch, ("replace", "replace", "replace", "delete", "insert", "duplicate"))
    if action == "replace":
        container[key] = _new_value(ch, doc, donors, container[key])
    elif action == "delete":
        del container[key]
    elif action == "insert" and isinstance(container, dict):
        container[pick(ch, KNOWN_STRINGS[:60])] = _new_value(ch, doc, donors, None)
    elif action == "insert":
        container.insert(key, _new_value(ch, doc, donors, container[key]))
    elif isinstance(container, list):
        container.insert(key, copy.deepcopy(container[key]))
    else:
        container[key + "_"] = copy.deepcopy(container[key])
    return doc


def dump_json(doc: Any, ch: Chooser) -> bytes:
    text = json.dumps(doc, separators=(",", ":"))
    depth = pick(ch, (10, 100, 1000, 100_000))
    return text.replace(json.dumps(DEEP), "[" * depth + "]" * depth).encode()


@dataclass
class Framed:
    """A bundle or a frame cut into magic, JSON document and the bytes after it."""

    magic: bytes
    doc: Any
    tail: bytes

    @staticmethod
    def parse(data: bytes) -> Framed | None:
        for magic, length in ((PROGRAM_MAGIC, _U64), (VALUE_MAGIC, _U32)):
            if data.startswith(magic) and len(data) >= len(magic) + length.size:
                start = len(magic) + length.size
                (n,) = length.unpack_from(data, len(magic))
                try:
                    return Framed(magic, json.loads(data[start:start + n]), data[start + n:])
                except (ValueError, RecursionError):
                    return None
        return None

    def pack(self, ch: Chooser) -> bytes:
        text = dump_json(self.doc, ch)
        length = _U64 if self.magic == PROGRAM_MAGIC else _U32
        n = len(text) if ch.int(0, 9) else len(text) + ch.int(-3, 3)
        return self.magic + length.pack(n % (1 << (8 * length.size))) + text + self.tail


def mutate_structure(ch: Chooser, data: bytes, donors: Sequence[bytes]) -> bytes:
    """JSON-level edits of a bundle's or frame's header (falls back to a byte edit)."""
    framed = Framed.parse(data)
    if framed is None:
        return mutate_bytes(ch, data, donors)
    docs = [f.doc for f in map(Framed.parse, donors) if f is not None]
    try:
        for _ in range(ch.int(1, 3)):
            framed.doc = mutate_json(ch, framed.doc, docs)
        if ch.int(0, 3) == 0:
            framed.tail = mutate_bytes(ch, framed.tail, [framed.tail])
        return framed.pack(ch)
    except RecursionError:  # a document nested too deeply for copy or json.dumps
        return mutate_bytes(ch, data, donors)


# ---------------------------------------------------------------- value-specific mutations


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def random_protobuf(ch: Chooser, like: bytes) -> bytes:
    """A protobuf-ish message: fields 1..6 of any wire type, lengths true or not."""
    out = bytearray()
    for _ in range(ch.int(0, 6)):
        number, wire = ch.int(0, 6), pick(ch, (0, 2, 0, 2, 1, 3, 5, 7))
        out += _varint(number << 3 | wire)
        if wire == 0:
            out += _varint(pick(ch, INTERESTING_INTS)) if ch.int(0, 5) else b"\xff" * 11
        else:
            body = like[: ch.int(0, len(like))] if like and ch.int(0, 1) else ch.bytes(ch.int(0, 9))
            n = len(body) if ch.int(0, 2) else pick(ch, INTERESTING_INTS)
            out += _varint(n) + body
    return bytes(out)


def mutate_parts(ch: Chooser, data: bytes, donors: Sequence[bytes]) -> bytes:
    """Edit one part of a codec frame (an SPU share's meta or chunk) or one element of a
    list frame, and re-fix the header's sizes (or not)."""
    framed = Framed.parse(data)
    if framed is None or not isinstance(framed.doc, dict) \
            or not isinstance(framed.doc.get("sizes"), list) or not framed.doc["sizes"]:
        return mutate_structure(ch, data, donors)
    sizes = framed.doc["sizes"]
    if not all(type(s) is int and s >= 0 for s in sizes):
        return mutate_structure(ch, data, donors)
    parts, offset = [], 0
    for s in sizes:
        parts.append(framed.tail[offset:offset + s])
        offset += s
    i = ch.int(0, len(parts) - 1)
    if framed.doc.get("kind") == "list":
        parts[i] = generate_value_mutant(ch, parts[i], donors, depth=1)
    elif ch.int(0, 1):
        parts[i] = random_protobuf(ch, parts[i])
    else:
        parts[i] = mutate_bytes(ch, parts[i], parts)
    if ch.int(0, 4):
        framed.doc["sizes"] = [len(p) for p in parts]
    framed.tail = b"".join(parts)
    return framed.pack(ch)


# ---------------------------------------------------------------- generators


def _wrap(meta: dict[str, Any], body: bytes) -> bytes:
    from mplang.backends.wire import pack_message

    return b"".join(pack_message(meta, [body]))


def generate_program(ch: Chooser, seeds: Sequence[bytes]) -> tuple[str, bytes]:
    """A program-decoder input: ``("bundle", bytes)`` or ``("run", a /run body)``."""
    data = pick(ch, seeds)
    plan = weighted(ch, ((30, "bytes"), (40, "json"), (8, "splice"), (4, "random"),
                         (3, "seed"), (15, "json+bytes")))
    if plan == "random":
        data = random_bytes(ch, PROGRAM_MAGIC)
    elif plan == "splice":
        other = pick(ch, seeds)
        data = data[:ch.int(0, len(data))] + other[ch.int(0, len(other)):]
    elif plan == "bytes":
        for _ in range(ch.int(1, 3)):
            data = mutate_bytes(ch, data, seeds)
    elif plan != "seed":
        data = mutate_structure(ch, data, seeds)
        if plan == "json+bytes":
            data = mutate_bytes(ch, data, seeds)
    if ch.int(0, 9):
        return "bundle", data
    body = _wrap({"exec": "e1", "scope": "s", "inputs": []}, data)
    return "run", mutate_bytes(ch, body, seeds) if ch.int(0, 1) else body


def generate_value_mutant(ch: Chooser, data: bytes, donors: Sequence[bytes],
                          depth: int = 0) -> bytes:
    plan = weighted(ch, ((30, "bytes"), (35, "json"), (20, "parts"), (10, "splice"),
                         (5, "none")))
    if plan == "bytes":
        for _ in range(ch.int(1, 3)):
            data = mutate_bytes(ch, data, donors)
    elif plan == "json":
        data = mutate_structure(ch, data, donors)
    elif plan == "parts" and depth == 0:
        data = mutate_parts(ch, data, donors)
    elif plan == "splice":
        other = pick(ch, donors)
        data = data[:ch.int(0, len(data))] + other[ch.int(0, len(other)):]
    return data


def generate_value(ch: Chooser, seeds: Sequence[bytes]) -> tuple[str, bytes]:
    """A value-decoder input: ``("value", frame)`` or ``("msg", a /msg body)``."""
    from mplang.backends.wire import encode_value_bytes

    source = weighted(ch, ((60, "seed"), (30, "fresh"), (5, "random"), (5, "list")))
    if source == "random":
        data = random_bytes(ch, VALUE_MAGIC)
    else:
        if source == "seed":
            data = pick(ch, seeds)
        elif source == "fresh":
            data = encode_value_bytes(random_array(ch))
        else:
            data = encode_value_bytes([random_array(ch) for _ in range(ch.int(0, 3))])
        if ch.int(0, 9):
            data = generate_value_mutant(ch, data, seeds)
    if ch.int(0, 9):
        return "value", data
    body = _wrap({"src": 0, "exec": "e1", "key": "k"}, data)
    return "msg", mutate_bytes(ch, body, seeds) if ch.int(0, 1) else body


GENERATORS: dict[str, Callable[[Chooser, Sequence[bytes]], tuple[str, bytes]]] = {
    "program": generate_program, "value": generate_value}


def seeds_for(decoder: str) -> list[bytes]:
    return list((seed_programs() if decoder == "program" else seed_values()).values())


# ---------------------------------------------------------------- the decoders under test


def _ignore(stage: str) -> None:
    pass


Stage = Callable[[str], None]
"""Called with the name of each stage of a decoding as it starts."""


def decode_program_input(mode: str, data: bytes, load: bool = True,
                         stage: Stage = _ignore) -> Any:
    """What a worker does with a received program: decode, verify, type check (3 parties).
    An accepted program must also re-encode and, if ``load``, load as `mp.load` does
    (`Program.from_bytes`: the same checks under the world size of its metadata)."""
    from mplang.backends.wire import split_frame
    from mplang.edsl.primitive import check_types
    from mplang.edsl.program import Program
    from mplang.edsl.serde import decode_graph_bundle, encode_graph_bundle

    stage("split_frame")
    payload: bytes | memoryview = split_frame(data)[1] if mode == "run" else data
    stage("decode_graph_bundle")
    graph, meta = decode_graph_bundle(payload)
    stage("verify")
    graph.verify()
    stage("check_types")
    check_types(graph, WORLD)
    stage("encode_graph_bundle")
    encode_graph_bundle(graph, meta)
    if not load:
        return graph
    stage("Program.from_bytes")
    return Program.from_bytes(bytes(payload))


def decode_value_input(mode: str, data: bytes, stage: Stage = _ignore) -> Any:
    """What a worker does with a received value (``msg``: a /msg body around it); an
    accepted value must also re-encode."""
    from mplang.backends.wire import decode_value, encode_value_bytes, split_frame

    stage("split_frame")
    payload: bytes | memoryview = split_frame(data)[1] if mode == "msg" else data
    stage("decode_value")
    value = decode_value(payload)
    stage("encode_value")
    encode_value_bytes(value)
    return value


def classify(decoder: str, mode: str, data: bytes,
             stage: Stage = _ignore) -> tuple[str, str, str]:
    """``(outcome, error type, detail)`` of one input, run in this process."""
    from mplang.frontend.errors import MPLangError

    try:
        if decoder == "program":
            decode_program_input(mode, data, stage=stage)
        else:
            decode_value_input(mode, data, stage=stage)
    except MPLangError as e:
        return "mplang_error", type(e).__name__, str(e)[:300]
    except BaseException as e:  # every other escape is what we look for
        if isinstance(e, KeyboardInterrupt):
            raise
        return "other", type(e).__name__, traceback.format_exc(limit=12)
    return "ok", "", ""


# ---------------------------------------------------------------- input files


def write_inputs(path: str, inputs: Sequence[tuple[str, str, bytes]]) -> None:
    """``(origin, mode, data)`` records, length-prefixed."""
    with open(path, "wb") as f:
        for origin, mode, data in inputs:
            head = f"{origin}\t{mode}".encode()
            f.write(_U32.pack(len(head)) + head + _U64.pack(len(data)) + data)


def read_inputs(path: str) -> list[tuple[str, str, bytes]]:
    out = []
    with open(path, "rb") as f:
        blob = f.read()
    pos = 0
    while pos < len(blob):
        (n,) = _U32.unpack_from(blob, pos)
        origin, mode = blob[pos + 4:pos + 4 + n].decode().split("\t")
        pos += 4 + n
        (size,) = _U64.unpack_from(blob, pos)
        out.append((origin, mode, blob[pos + 8:pos + 8 + size]))
        pos += 8 + size
    return out


# ---------------------------------------------------------------- child process


def _memory_kib() -> dict[str, int]:
    """This process's memory counters (``VmRSS``, ``VmHWM``, ...) in KiB."""
    with open("/proc/self/status") as f:
        fields = (line.partition(":") for line in f)
        return {k: int(v.split()[0]) for k, _, v in fields if v.rstrip().endswith(" kB")}


def _reset_peak_rss() -> int:
    """Reset the peak RSS to the current RSS (Linux: ``clear_refs`` 5); returns it in KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _memory_kib()["VmRSS"]


def child_main(decoder: str, path: str, start: int, rss_mib: int, mem_gib: int) -> None:
    """Decode inputs ``start..`` of ``path``, one JSON line each on stdout."""
    limit = mem_gib << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import mplang.backends.spu_impl  # noqa: F401 - with mplang: every dialect and codec

    inputs = read_inputs(path)
    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for index in range(start, len(inputs)):
        _, mode, data = inputs[index]
        marks: list[tuple[str, int]] = []

        def stage(name: str, index: int = index, marks: list[tuple[str, int]] = marks) -> None:
            marks.append((name, _memory_kib()["VmHWM"]))
            out.write(json.dumps({"i": index, "stage": name}) + "\n")
            out.flush()

        before, began = _reset_peak_rss(), time.perf_counter()
        outcome, error, detail = classify(decoder, mode, data, stage)
        marks.append(("end", _memory_kib()["VmHWM"]))
        grew = (marks[-1][1] - before) // 1024
        # the stage during which the peak passed the limit: the one before the first mark
        # that shows it
        culprit = next((marks[k - 1][0] for k in range(1, len(marks))
                        if (marks[k][1] - before) // 1024 > rss_mib), marks[-2][0])
        if grew > rss_mib:
            detail = f"peak RSS grew by {grew} MiB (then: {error or outcome} {detail})"
            outcome = "memory"
        out.write(json.dumps({"i": index, "o": outcome, "e": error, "d": detail,
                              "s": culprit, "t": time.perf_counter() - began}) + "\n")
        out.flush()


# ---------------------------------------------------------------- campaign


@dataclass
class Result:
    index: int
    origin: str
    mode: str
    outcome: str
    error: str = ""
    detail: str = ""
    seconds: float = 0.0
    stage: str = ""
    """The stage that failed (raised, ran out of time, crashed or grew the memory)."""


@dataclass
class Options:
    decoder: str
    timeout: float
    startup: float
    rss_mib: int
    mem_gib: int


def _child_lines(proc: subprocess.Popen[bytes], timeout: float,
                 startup: float) -> Iterator[dict[str, Any] | None]:
    """The child's JSON lines; None when it stays silent too long (then it is killed)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    pending = b""
    wait = startup
    try:
        while True:
            if not sel.select(wait):
                proc.kill()
                proc.wait()
                yield None
                return
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                yield json.loads(line)
            wait = timeout
    finally:
        sel.close()


def run_batch(path: str, opts: Options) -> tuple[list[Result], list[str]]:
    """Run every input of ``path`` in child processes, resuming after crashes and hangs.

    Also returns the late exits: a child that died after answering for its last input
    (heap damage of an earlier input showing up at exit), not charged to any input.
    """
    inputs = read_inputs(path)
    results: list[Result] = []
    late: list[str] = []
    start = 0
    while start < len(inputs):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", path, "--decoder",
               opts.decoder, "--start", str(start), "--rss-mib", str(opts.rss_mib),
               "--mem-gib", str(opts.mem_gib)]
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONFAULTHANDLER": "1"}
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
            ready, next_index, hung = False, start, False
            current = ""
            for line in _child_lines(proc, opts.timeout, opts.startup):
                if line is None:
                    hung = True
                    break
                if "ready" in line:
                    ready = True
                    continue
                if "stage" in line:
                    current = line["stage"]
                    continue
                origin, mode, _ = inputs[line["i"]]
                results.append(Result(line["i"], origin, mode, line["o"], line["e"],
                                      line["d"], line["t"], line["s"]))
                next_index, current = line["i"] + 1, ""
            code = proc.wait()
            assert proc.stdout is not None
            proc.stdout.close()
            err.seek(0)
            stderr = err.read().decode(errors="replace")[-2000:]
        if not ready:
            raise RuntimeError(f"a fuzzing child did not start (exit {code}):\n{stderr}")
        if hung or (code != 0 and next_index < len(inputs)):
            origin, mode, _ = inputs[next_index]
            detail = (f"no answer within {opts.timeout} s" if hung
                      else f"exit code {code}; stderr tail:\n{stderr}")
            results.append(Result(next_index, origin, mode, "timeout" if hung else "crash",
                                  detail=detail, stage=current))
            next_index += 1
        elif code != 0:
            late.append(f"{os.path.basename(path)}: exit code {code} after the last input; "
                        f"stderr tail:\n{stderr}")
        start = next_index
    return results, late


def generate_inputs(decoder: str, count: int, seed: int,
                    seeds: Sequence[bytes]) -> list[tuple[str, str, bytes]]:
    """``count`` inputs: half drawn by hypothesis, half by plain `random`, all from ``seed``."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    generate = GENERATORS[decoder]
    out: list[tuple[str, str, bytes]] = []
    n_hypothesis = count // 2
    round_ = 0
    while len(out) < n_hypothesis:
        @hypothesis_seed(seed * 1000 + round_)
        @settings(max_examples=n_hypothesis - len(out), database=None, deadline=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(st.data())
        def draw(data: Any) -> None:
            if len(out) < n_hypothesis:
                mode, blob = generate(DrawChooser(data), seeds)
                out.append(("hypothesis", mode, blob))

        draw()
        round_ += 1
    rng = random.Random(seed)
    chooser = RandomChooser(rng)
    while len(out) < count:
        mode, blob = generate(chooser, seeds)
        out.append(("random", mode, blob))
    return out


def campaign(decoder: str, count: int, seed: int, jobs: int, batch: int,
             opts: Options) -> Summary:
    from concurrent.futures import ThreadPoolExecutor

    began = time.perf_counter()
    inputs = generate_inputs(decoder, count, seed, seeds_for(decoder))
    with tempfile.TemporaryDirectory(prefix="mplang-fuzz-") as tmp:
        paths = []
        for k in range(0, len(inputs), batch):
            paths.append(os.path.join(tmp, f"{decoder}-{k:07d}.bin"))
            write_inputs(paths[-1], inputs[k:k + batch])
        with ThreadPoolExecutor(jobs) as pool:
            parts = list(pool.map(lambda p: run_batch(p, opts), paths))
    results, late = [], []
    for k, (part, part_late) in enumerate(parts):
        results += [Result(**{**r.__dict__, "index": r.index + k * batch}) for r in part]
        late += part_late
    return summarize(decoder, results, inputs, late, time.perf_counter() - began)


@dataclass
class Summary:
    decoder: str
    inputs: int
    distinct: int
    seconds: float
    outcomes: dict[str, int]
    by_origin: dict[str, dict[str, int]]
    errors: dict[str, int]
    messages: dict[str, int]
    slowest: float
    late_exits: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


def _message_shape(message: str) -> str:
    """An error message with its numbers and quoted names blurred, to group alike ones."""
    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'…'", message.splitlines()[0]))[:90]


def summarize(decoder: str, results: list[Result], inputs: list[tuple[str, str, bytes]],
              late: list[str], seconds: float) -> Summary:
    outcomes = collections.Counter(r.outcome for r in results)
    by_origin: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for r in results:
        by_origin[f"{r.origin}/{r.mode}"][r.outcome] += 1
    refused = [r for r in results if r.outcome == "mplang_error"]
    errors = collections.Counter(r.error for r in refused)
    messages = collections.Counter(_message_shape(f"{r.error}: {r.detail}") for r in refused)
    failures = [{"index": r.index, "origin": r.origin, "mode": r.mode, "outcome": r.outcome,
                 "stage": r.stage, "error": r.error, "detail": r.detail,
                 "hex": inputs[r.index][2].hex()}
                for r in results if r.outcome in FAILURES]
    return Summary(decoder, len(results), len({d for _, _, d in inputs}), seconds,
                   {o: outcomes.get(o, 0) for o in OUTCOMES},
                   {k: dict(v) for k, v in sorted(by_origin.items())}, dict(errors.most_common()),
                   dict(messages.most_common(25)), max((r.seconds for r in results), default=0.0),
                   late, failures)


def report(summary: Summary, hex_limit: int) -> None:
    s = summary
    print(f"\n== {s.decoder} decoder: {s.inputs} inputs ({s.distinct} distinct) "
          f"in {s.seconds:.0f} s; slowest input {s.slowest:.2f} s")
    print("  " + "  ".join(f"{o}={n}" for o, n in s.outcomes.items()))
    for origin, counts in s.by_origin.items():
        print(f"  {origin:18} " + " ".join(f"{o}={n}" for o, n in sorted(counts.items())))
    print("  MPLangError types: " + ", ".join(f"{e}={n}" for e, n in s.errors.items()))
    print("  most frequent refusals:")
    for message, n in s.messages.items():
        print(f"    {n:6}  {message}")
    stages = collections.Counter(f"{f['outcome']} in {f['stage']}" for f in s.failures)
    if stages:
        print("  failures by stage: " + ", ".join(f"{k}={n}" for k, n in stages.items()))
    for exit_ in s.late_exits:
        print(f"\n  LATE EXIT {exit_}")
    for f in s.failures:
        data = f["hex"]
        shown = data[: 2 * hex_limit] + ("..." if len(data) > 2 * hex_limit else "")
        print(f"\n  FAILURE #{f['index']} ({f['origin']}/{f['mode']}): {f['outcome']} in "
              f"{f['stage']} {f['error']}\n  input ({len(data) // 2} bytes): {shown}\n"
              f"{f['detail']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=10_000, help="inputs per decoder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decoder", choices=[*DECODERS, "all"], default="all")
    parser.add_argument("--jobs", type=int, default=2, help="child processes at a time")
    parser.add_argument("--batch", type=int, default=500, help="inputs per child process")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per input")
    parser.add_argument("--startup", type=float, default=300.0, help="seconds to start a child")
    parser.add_argument("--rss-mib", type=int, default=256,
                        help="peak RSS growth of one input counted as a memory failure")
    parser.add_argument("--mem-gib", type=int, default=6, help="address-space limit of children")
    parser.add_argument("--hex-limit", type=int, default=2048,
                        help="bytes of a failing input shown")
    parser.add_argument("--save", help="directory for the failing inputs (one file each)")
    parser.add_argument("--json", help="write the summaries as JSON to this file")
    parser.add_argument("--replay", help="decode this file in this process and print the outcome")
    parser.add_argument("--mode", help="with --replay: bundle, run, value or msg")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:  # run as a script: the seeds come from tests/http/programs.py
        sys.path.insert(0, root)
    if args.child:
        child_main(args.decoder, args.child, args.start, args.rss_mib, args.mem_gib)
        return 0
    if args.replay:
        decoder = "program" if args.decoder == "all" else args.decoder
        with open(args.replay, "rb") as f:
            data = f.read()
        mode = args.mode or ("bundle" if decoder == "program" else "value")
        outcome, error, detail = classify(decoder, mode, data)
        print(outcome, error, detail, sep="\n")
        return 0 if outcome in ("ok", "mplang_error") else 1
    summaries = []
    for decoder in DECODERS if args.decoder == "all" else [args.decoder]:
        opts = Options(decoder, args.timeout, args.startup, args.rss_mib, args.mem_gib)
        summary = campaign(decoder, args.count, args.seed, args.jobs, args.batch, opts)
        report(summary, args.hex_limit)
        summaries.append(summary)
        if args.save:
            os.makedirs(args.save, exist_ok=True)
            for f in summary.failures:
                name = f"{decoder}-{f['index']}-{f['mode']}-{f['outcome']}.bin"
                with open(os.path.join(args.save, name), "wb") as out:
                    out.write(bytes.fromhex(f["hex"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump([s.__dict__ for s in summaries], out, indent=1)
    failed = sum(s.outcomes[o] for s in summaries for o in FAILURES) \
        + sum(len(s.late_exits) for s in summaries)
    print(f"\nfailures: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
