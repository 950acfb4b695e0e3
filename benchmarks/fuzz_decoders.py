"""Fuzz the decoders of untrusted bytes: programs (graph bundles), values (wire frames) and
the signed accept (committed programs with openings, votes).

A worker decodes what other parties send: a program (`decode_graph_bundle`, then
``graph.verify()`` and ``check_types``), a ``/run`` body around it (`split_frame`),
values (`decode_value`, with the registered value codecs such as ``share`` (SPU shares)) and
``/msg`` bodies around them. Whatever the bytes, each must give a decoded object or an
`MPLangError`; any other exception, a crash, a hang or a large allocation is a bug.

Inputs start from real encodings: compiled programs (those of ``tests/worker/programs.py``:
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

The ``consent`` decoder is a worker's side of the signed accept: a ``/run`` body
(`split_program`: the committed program, then the receiving party's openings) is decoded,
verified and type checked, its openings decoded and checked against the commitments
(`open_program` for party R, the mode ``prepareR``), and the program digest taken; the
votes party R gathered from the other parties' ``/vote`` bodies (a JSON object by rank
in a frame's header, the mode ``runR``) are checked as party R does (`check_votes`). Seeds
commit real programs with private constants (`simp.constant`, `tensor.constant` in
pcalls, driver shares in ``SP0``; nonces fresh each run) and carry each party's
openings and valid votes; besides the byte and JSON edits of both parts, openings are
swapped between parties and programs, merged, dropped or renamed, their nonces and
values edited and their commitments' digests re-forged to match (so the type checks
after the digest are reached), commitments' declared types and buffers edited, and
votes swapped, retyped and re-encoded.

Inputs run in batches in child processes, one JSON line of outcome each, so a crash
(a death by signal) or a hang (no answer within ``--timeout``) is observed, counted
and the batch resumes after it. Children run under an address-space limit, and an
input whose peak RSS (reset before each input) exceeds the RSS before it by more than
``--rss-mib`` counts as a ``memory`` failure, whatever its outcome.

    .venv/bin/python benchmarks/fuzz_decoders.py --count 10000 --seed 0 [--jobs 2]
    .venv/bin/python benchmarks/fuzz_decoders.py --replay input.bin --decoder value
    .venv/bin/python benchmarks/fuzz_decoders.py --replay in.bin --decoder consent --mode prepare1
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import hashlib
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

DECODERS = ("program", "value", "consent")
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
    from tests.worker.programs import CASES
    from tests.worker.programs import WORLD as CASES_WORLD

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

    from mplang.dialects.spu import SpuConfig, io_for
    from mplang.kernels.spu.run import SpuShare

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

    from mplang.transport.wire import encode_value_bytes

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
                 "list", "share", "cms.sketch", "kind", "sizes", "shape", "dtype",
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
    from mplang.transport.wire import pack_message

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
    from mplang.transport.wire import encode_value_bytes

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


# ---------------------------------------------------------------- the signed accept


EXEC, SCOPE = "e1", "s"
VOTE_DIGEST = "ab" * 32
"""The execution digest every seed vote signs (a worker checks votes against its own)."""


def private_constants() -> Any:
    """Private constants of every kind a driver commits: `simp.constant` on one, two and
    all parties, `tensor.constant` inside pcalls (one inside a while_loop body) and a
    driver constant secret-shared into ``SP0`` (`spu.shares`, one share per member)."""
    import numpy as np

    import mplang as mp
    from mplang import simp, tensor

    a = simp.constant((0,), np.arange(6, dtype=np.float32).reshape(2, 3))
    b = simp.constant((1, 2), np.int64(-7))
    c = simp.constant((0, 1, 2), np.array([True, False]))
    d = simp.pcall((1,), lambda: tensor.constant(np.array([[3, 4]], dtype=np.int32)))
    e = simp.pcall((0,), lambda x: x * tensor.constant(np.float32(2)), a)
    f = simp.while_loop(lambda i: i < 3, lambda i: simp.pcall(
        (0, 1, 2), lambda v: v + tensor.constant(np.int64(1)), i),
        simp.constant((0, 1, 2), np.int64(0)))
    s = mp.put("SP0", np.array([1234567, -7654321, 42], dtype=np.int32))
    t = mp.put("P2", mp.device("SP0")(lambda u: u * 3 - 1)(s))
    return a, b, c, d, e, f, t


def secret_sum() -> Any:
    """Party 0's constant moved to party 1, which adds a constant of its own."""
    import numpy as np

    from mplang import simp, tensor

    x = simp.constant((0,), np.array([0.5, -1.5, 2.0], dtype=np.float32))
    y = simp.shuffle_static(x, {1: 0})
    z = simp.constant((2,), 5)
    return simp.pcall((1,), lambda v: v + tensor.constant(np.ones(3, np.float32)), y), z


def _party_key(party: int) -> Any:
    """Party ``party``'s signing key: the same in every process (derived from the rank)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.derive_private_key(0x6D706C616E67 + party, ec.SECP256R1())


class _Peers:
    """The part of a `PeerDirectory` that `check_votes` reads: the spec digest and each
    party's node certificate (self-signed over its `_party_key`)."""

    digest = "cd" * 32

    def __init__(self) -> None:
        import datetime as dt

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.x509.oid import NameOID

        from mplang.cluster.identity import parse_certificate

        self.certificates = []
        for party in range(WORLD):
            key = _party_key(party)
            name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"node_{party}")])
            cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                    .public_key(key.public_key()).serial_number(party + 1)
                    .not_valid_before(dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
                    .not_valid_after(dt.datetime(2120, 1, 1, tzinfo=dt.UTC))
                    .sign(key, hashes.SHA256()))
            self.certificates.append(parse_certificate(
                cert.public_bytes(serialization.Encoding.PEM)))

    def node_certificate(self, party: int) -> Any:
        return self.certificates[party]


_PEERS: list[_Peers] = []


def _peers() -> _Peers:
    if not _PEERS:
        _PEERS.append(_Peers())
    return _PEERS[0]


def sign_votes(digest: str = VOTE_DIGEST, exec_id: str = EXEC) -> dict[str, str]:
    """Every party's vote (base64 signature) for execution ``exec_id`` of ``digest``."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    from mplang.cluster.commitments import encode_vote, vote_message

    message = vote_message(exec_id, SCOPE, digest, _Peers.digest, range(WORLD))
    return {str(p): encode_vote(_party_key(p).sign(message, ec.ECDSA(hashes.SHA256())))
            for p in range(WORLD)}


def prepare_body(program: bytes, openings: bytes, rank: int,
                 header: dict[str, Any] | None = None) -> bytes:
    """A ``/run`` body for party ``rank`` (the harness's ``rank`` field says which party
    the openings were made for; a worker ignores it)."""
    from mplang.worker.consent import PROGRAM_BYTES

    meta = header if header is not None else {"exec": EXEC, "scope": SCOPE,
                                              "parties": list(range(WORLD)),
                                              PROGRAM_BYTES: len(program), "rank": rank}
    return _wrap(meta, program + openings)


def run_body(votes: Any) -> bytes:
    """The votes a party gathered, by rank, as a frame's header (the ``runR`` input)."""
    from mplang.transport.wire import pack_message

    return b"".join(pack_message({"exec": EXEC, "scope": SCOPE, "votes": votes}, []))


def seed_consent() -> dict[str, bytes]:
    """``/run`` bodies (a committed program and one party's openings) of programs with
    private constants (those of `private_constants`, `secret_sum` and the shared test
    programs that have some), for each party, and gathered votes, valid and wrong."""
    import mplang as mp
    from mplang.cluster.commitments import commit, encode_openings
    from mplang.edsl.serde import encode_graph_bundle
    from tests.worker.programs import CASES

    makers = {"private": private_constants, "secret_sum": secret_sum} | \
        {case.name: case.program for case in CASES}
    cluster = mp.ClusterSpec.simple(WORLD)
    out = {}
    for name, fn in makers.items():
        committed = commit(mp.compile(fn, cluster=cluster).graph, WORLD)
        if not any(committed.openings):
            continue  # a program without private constants: the program decoder's seed
        program = encode_graph_bundle(committed.graph, {})
        for rank in range(WORLD):
            out[f"{name}@{rank}"] = prepare_body(
                program, encode_openings(committed.openings[rank]), rank)
    out["votes"] = run_body(sign_votes())
    out["votes-other-digest"] = run_body(sign_votes("ef" * 32))
    out["votes-other-exec"] = run_body(sign_votes(exec_id="e2"))
    return out


@dataclass
class Prepare:
    """A ``/run`` body cut into its parts: the committed program's bundle (magic,
    JSON document, buffers) and the openings' (decoded)."""

    doc: Any
    tail: bytearray
    openings: dict[str, Any]
    rank: int

    @staticmethod
    def parse(body: bytes) -> Prepare | None:
        from mplang.edsl.errors import MPLangError
        from mplang.transport.wire import split_frame
        from mplang.worker.consent import split_program

        try:
            header, payload = split_frame(body)
            program, openings = split_program(header, payload)
        except MPLangError:
            return None
        framed = Framed.parse(bytes(program))
        if framed is None or not isinstance(header.get("rank"), int):
            return None
        return Prepare(framed.doc, bytearray(framed.tail), dict(openings), header["rank"])

    def commitment(self, path: str) -> Any:
        """The ``$commit`` body (``[buffer, type]``) of attribute ``path``, or None."""
        where, _, name = path.partition(":")
        node = self.doc.get("graph")
        try:
            for depth, index in enumerate(where.split("/")):
                node = node["ops" if depth % 2 == 0 else "regions"][int(index)]
            body = node["attrs"][name]["$commit"]
        except (KeyError, IndexError, TypeError, ValueError):
            return None
        return body if isinstance(body, list) and len(body) == 2 else None

    def set_digest(self, body: Any, digest: bytes) -> None:
        """Write ``digest`` over the buffer of commitment ``body``."""
        offset, size = self.doc["buffers"][body[0]]
        self.tail[offset:offset + size] = digest[:size].ljust(size, b"\x00")

    def program(self) -> bytes:
        text = json.dumps(self.doc, separators=(",", ":")).encode()
        return PROGRAM_MAGIC + _U64.pack(len(text)) + text + bytes(self.tail)

    def encoded_openings(self) -> bytes:
        from mplang.cluster.commitments import encode_openings

        return encode_openings(self.openings) if self.openings else b""


TYPE_EDITS: tuple[Any, ...] = (
    None, {"tensor": ["float32", [2, 3]]}, {"tensor": ["int32", []]},
    {"tensor": ["int64", [2**62]]}, {"tensor": ["bool", [2]]}, {"tensor": ["uint8", [-1]]},
    {"tensor": ["object", [1]]}, {"mp": [{"tensor": ["int32", []]}, 1]},
    {"share": ["spu", {"tensor": ["int32", [3]]}]}, {"tensor": "int32"}, [], 7, "tensor")
"""Declared types of a commitment: other tensor types, malformed ones, non-base types."""


def _edit_value(ch: Chooser, value: Any, donors: Sequence[Any]) -> Any:
    """Another value for an opening: retyped, reshaped, cut, or of another kind."""
    import numpy as np

    from mplang.edsl.private import Commitment

    if isinstance(value, np.ndarray) and ch.int(0, 2):
        name = pick(ch, sorted(_dtype_names()))
        kind = pick(ch, ("astype", "flat", "cut", "bump", "scalar", "list", "wrap"))
        with np.errstate(all="ignore"):
            if kind == "astype":
                return value.astype(_numpy_dtype(name))
            if kind == "bump":
                return np.asarray(value ^ True if value.dtype == np.bool_ else value + 1)
        if kind == "flat":
            return value.reshape(-1) if value.ndim != 1 else value.reshape(1, -1)
        if kind == "cut":
            return value.reshape(-1)[:0]
        if kind == "scalar":
            return np.zeros((), dtype=value.dtype)
        return value.tolist() if kind == "list" else (value,)
    if isinstance(value, tuple) and value and all(isinstance(p, bytes) for p in value) \
            and ch.int(0, 2):
        parts = list(value)
        i = ch.int(0, len(parts) - 1)
        kind = pick(ch, ("drop", "mutate", "protobuf", "swap", "extra"))
        if kind == "drop":
            del parts[i]
        elif kind == "mutate":
            parts[i] = mutate_bytes(ch, parts[i], parts)
        elif kind == "protobuf":
            parts[i] = random_protobuf(ch, parts[i])
        elif kind == "swap":
            parts[i], parts[-1] = parts[-1], parts[i]
        else:
            parts.append(parts[i])
        return tuple(parts)
    return pick(ch, (None, 0, -1, 2**64, 1.5, "x", b"", b"\x00" * 16, (), [value],
                     Commitment(bytes(32), None), pick(ch, donors) if donors else value))


def _edit_openings(ch: Chooser, prep: Prepare, donors: Sequence[Prepare]) -> None:
    """Edit one opening of ``prep`` (its nonce, value or path), drop or add one; with the
    commitment digest re-forged to match (or not), so the checks after it are reached."""
    from mplang.cluster.commitments import canonical_bytes
    from mplang.edsl.errors import MPLangError

    others = [(path, o) for d in donors for path, o in d.openings.items()]
    if not prep.openings:
        if others:
            path, opening = pick(ch, others)
            prep.openings[path] = opening
        return
    path = pick(ch, sorted(prep.openings))
    value, nonce = prep.openings[path]
    kind = pick(ch, ("nonce", "value", "value", "path", "drop", "add", "copy"))
    if kind == "nonce":
        nonce = pick(ch, (nonce[:-1], nonce + b"\x00", b"", nonce[:15], nonce[::-1],
                          bytes(16), nonce * 64, mutate_bytes(ch, nonce, [nonce])))
    elif kind == "value":
        value = _edit_value(ch, value, [v for _, (v, _) in others])
    elif kind == "path":
        del prep.openings[path]
        where, _, name = path.partition(":")
        path = pick(ch, (f"{where}:parties", f"{where}/0/0:{name}", f"9{path}", f"-{path}",
                         f"0{path}", where, path + ":x", f"{where}:{name.upper()}", "",
                         "x" * 1000, pick(ch, others)[0] if others else path))
    elif kind == "drop":
        del prep.openings[path]
        return
    elif kind == "add" and others:
        path, (value, nonce) = pick(ch, others)
    elif kind == "copy":
        path = pick(ch, sorted(prep.openings))
    prep.openings[path] = (value, nonce)
    body = prep.commitment(path)
    if body is not None and ch.int(0, 2):
        # not re-forged: an unencodable value, or a buffer table edited before
        with contextlib.suppress(MPLangError, LookupError, TypeError, ValueError):
            prep.set_digest(body, hashlib.sha256(nonce + canonical_bytes(value)).digest())


def _edit_commitment(ch: Chooser, prep: Prepare, donors: Sequence[Prepare]) -> None:
    """Edit a ``$commit`` of the program: its digest, its declared type, its buffer index;
    or open it in the program itself (the plain value of another party's opening)."""
    import numpy as np

    from mplang.edsl.serde import encode_type
    from mplang.edsl.typing import TensorType

    commits = [(c, k) for c, k in _nodes(prep.doc) if isinstance(c, dict | list)
               and isinstance(c[k], dict) and "$commit" in c[k]]
    if not commits:
        return
    container, key = pick(ch, commits)
    body = container[key]["$commit"]
    kind = pick(ch, ("digest", "type", "type", "index", "plain", "retype"))
    if kind == "digest" and isinstance(body, list) and body:
        digest = pick(ch, (bytes(32), b"\xff" * 32, ch.bytes(32)))
        with contextlib.suppress(LookupError, TypeError, ValueError):
            prep.set_digest(body, digest)
    elif kind == "type" and isinstance(body, list) and len(body) == 2:
        body[1] = copy.deepcopy(pick(ch, TYPE_EDITS))
    elif kind == "index" and isinstance(body, list) and body:
        body[0] = pick(ch, (0, -1, len(prep.doc.get("buffers", [])), 2**63, "0", None))
    elif kind == "plain":
        container[key] = {"$array": ["int32", [1], 0]}
    elif kind == "retype":  # the type of another party's opened value, re-forged digest
        arrays = [v for d in (prep, *donors) for v, _ in d.openings.values()
                  if isinstance(v, np.ndarray)]
        if arrays and isinstance(body, list) and len(body) == 2:
            body[1] = encode_type(TensorType.of(pick(ch, arrays).dtype, pick(ch, arrays).shape))


def generate_consent(ch: Chooser, seeds: Sequence[bytes]) -> tuple[str, bytes]:
    """A consent input: ``("prepareR", a /run body)`` as party R receives it (its
    committed program and openings) or ``("runR", votes)``: the votes party R checks."""
    preps = [p for p in map(_parsed, seeds) if p is not None]
    runs = [s for s in seeds if _parsed(s) is None]
    if ch.int(0, 5) == 0:
        return f"run{ch.int(0, WORLD - 1)}", _vote_mutant(ch, pick(ch, runs), runs)
    prep = copy.deepcopy(pick(ch, preps))
    rank = prep.rank if ch.int(0, 7) else ch.int(0, WORLD - 1)
    donors = [pick(ch, preps) for _ in range(3)]
    program, openings = prep.program(), prep.encoded_openings()
    plan = weighted(ch, ((2, "seed"), (12, "program-bytes"), (16, "program-json"),
                         (8, "openings-bytes"), (10, "openings-json"), (8, "swap-party"),
                         (6, "swap-program"), (4, "merge"), (18, "edit-openings"),
                         (12, "edit-commitment")))
    if plan == "program-bytes":
        program = mutate_bytes(ch, program, [d.program() for d in donors])
    elif plan == "program-json":
        program = mutate_structure(ch, program, [d.program() for d in donors])
    elif plan == "openings-bytes":
        openings = mutate_bytes(ch, openings, [d.encoded_openings() for d in donors])
    elif plan == "openings-json":
        openings = mutate_structure(ch, openings, [d.encoded_openings() for d in donors])
    elif plan in ("swap-party", "swap-program", "merge"):
        same = [p for p in preps if p.doc == prep.doc and p.rank != prep.rank]
        other = pick(ch, same) if plan == "swap-party" and same else donors[0]
        prep.openings = (prep.openings | other.openings) if plan == "merge" \
            else dict(other.openings)
        openings = prep.encoded_openings()
    elif plan == "edit-openings":
        for _ in range(ch.int(1, 2)):
            _edit_openings(ch, prep, donors)
        program, openings = prep.program(), prep.encoded_openings()
    elif plan == "edit-commitment":
        _edit_commitment(ch, prep, donors)
        if ch.int(0, 1):
            _edit_openings(ch, prep, donors)
        program, openings = prep.program(), prep.encoded_openings()
    header = None
    if ch.int(0, 9) == 0:  # the split point, wrong or of the wrong type
        from mplang.worker.consent import PROGRAM_BYTES

        header = {"exec": EXEC, "scope": SCOPE, PROGRAM_BYTES: pick(
            ch, (len(program) + ch.int(-3, 3), 0, -1, len(program) + len(openings) + 1,
                 2**64, str(len(program)), float(len(program)), True, None, [len(program)]))}
    body = prepare_body(program, openings, prep.rank, header)
    if ch.int(0, 9) == 0:
        body = mutate_bytes(ch, body, seeds)
    return f"prepare{rank}", body


def _parsed(body: bytes) -> Prepare | None:
    """The parts of a seed ``/run`` body (None for gathered votes), parsed once."""
    if body not in _PARSED:
        _PARSED[body] = Prepare.parse(body)
    return _PARSED[body]


_PARSED: dict[bytes, Prepare | None] = {}


def _vote_mutant(ch: Chooser, body: bytes, donors: Sequence[bytes]) -> bytes:
    """Edits of gathered votes: swapped, dropped, of other types, base64 edits."""
    framed = Framed.parse(body)
    if framed is None or not isinstance(framed.doc, dict) \
            or not isinstance(framed.doc.get("votes"), dict) or not ch.int(0, 4):
        return generate_value_mutant(ch, body, donors)
    votes = framed.doc["votes"]
    for _ in range(ch.int(1, 3)):
        party = pick(ch, sorted(votes) or ["0"])
        vote = votes.get(party, "")
        kind = pick(ch, ("swap", "drop", "key", "type", "text", "text", "b64", "other"))
        if kind == "swap" and len(votes) > 1:
            a, b = pick(ch, sorted(votes)), pick(ch, sorted(votes))
            votes[a], votes[b] = votes[b], votes[a]
        elif kind == "drop":
            votes.pop(party, None)
        elif kind == "key":
            votes[pick(ch, (f"0{party}", f" {party}", f"{party}.0", f"-{party}", "3",
                            str(2**64)))] = votes.pop(party, vote)
        elif kind == "type":
            votes[party] = copy.deepcopy(pick(ch, SPECIAL_VALUES[:20]))
        elif kind == "text" and isinstance(vote, str):
            pos = ch.int(0, len(vote))
            votes[party] = pick(ch, (vote[:pos] + vote[pos + 1:], vote[:pos] + "A" + vote[pos:],
                                     vote.rstrip("="), vote + "=", vote + "\n",
                                     vote.replace("+", "-").replace("/", "_"), vote * 8,
                                     vote[:pos], " " + vote, vote.upper(), "", "====",
                                     "\u00e9" * 8))
        elif kind == "b64":
            import base64

            votes[party] = base64.b64encode(ch.bytes(pick(ch, (0, 1, 2, 64, 70, 72, 128,
                                                                 383)))).decode()
        else:
            other = Framed.parse(pick(ch, donors))
            if other is not None and isinstance(other.doc, dict) \
                    and isinstance(other.doc.get("votes"), dict):
                votes[party] = other.doc["votes"].get(party)
    if ch.int(0, 5) == 0:
        framed.doc["votes"] = pick(ch, (list(votes.values()), None, "votes", 0, [votes]))
    return framed.pack(ch)



GENERATORS: dict[str, Callable[[Chooser, Sequence[bytes]], tuple[str, bytes]]] = {
    "program": generate_program, "value": generate_value, "consent": generate_consent}


def seeds_for(decoder: str) -> list[bytes]:
    makers = {"program": seed_programs, "value": seed_values, "consent": seed_consent}
    return list(makers[decoder]().values())


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
    from mplang.edsl.primitive import check_types
    from mplang.edsl.program import Program
    from mplang.edsl.serde import decode_graph_bundle, encode_graph_bundle
    from mplang.transport.wire import split_frame

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
    from mplang.transport.wire import decode_value, encode_value_bytes, split_frame

    stage("split_frame")
    payload: bytes | memoryview = split_frame(data)[1] if mode == "msg" else data
    stage("decode_value")
    value = decode_value(payload)
    stage("encode_value")
    encode_value_bytes(value)
    return value


def decode_consent_input(mode: str, data: bytes, stage: Stage = _ignore) -> Any:
    """What party R (``mode``'s last digit) does with a ``/run`` body: split it, decode,
    verify and type check the committed program, decode the openings, check them against
    the commitments and open (`open_program`), take the program digest; an accepted
    program must re-encode opened. With gathered votes: check the others' votes (a
    worker gathers them by rank, so anything but an object stands for none)."""
    from mplang.cluster.commitments import open_program, program_digest
    from mplang.edsl.primitive import check_types
    from mplang.edsl.serde import decode_graph_bundle, encode_graph_bundle
    from mplang.transport.wire import split_frame
    from mplang.worker.consent import check_votes, split_program

    kind, rank = mode[:-1], int(mode[-1])
    stage("split_frame")
    header, payload = split_frame(data)
    if kind == "run":
        stage("check_votes")
        votes = header.get("votes")
        check_votes(votes if isinstance(votes, dict) else {}, _peers(),  # type: ignore[arg-type]
                    rank, frozenset(range(WORLD)), EXEC, SCOPE, VOTE_DIGEST)
        return header
    stage("split_program")
    program, openings = split_program(header, payload)
    stage("decode_graph_bundle")
    graph, _ = decode_graph_bundle(program)
    stage("verify")
    graph.verify()
    stage("check_types")
    check_types(graph, WORLD)
    stage("open_program")
    opened = open_program(graph, openings, rank, WORLD)
    stage("program_digest")
    program_digest(graph, WORLD)
    stage("encode_graph_bundle")
    encode_graph_bundle(opened, {})
    return opened


def classify(decoder: str, mode: str, data: bytes,
             stage: Stage = _ignore) -> tuple[str, str, str]:
    """``(outcome, error type, detail)`` of one input, run in this process."""
    from mplang.edsl.errors import MPLangError

    try:
        if decoder == "program":
            decode_program_input(mode, data, stage=stage)
        elif decoder == "consent":
            decode_consent_input(mode, data, stage=stage)
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
    import mplang.kernels.spu.run  # noqa: F401 - with mplang: every dialect and codec

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
    parser.add_argument("--mode", help="with --replay: bundle, run, value, msg, prepareR "
                                       "or runR (R: the receiving party's rank)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:  # run as a script: the seeds come from tests/worker/programs.py
        sys.path.insert(0, root)
    if args.child:
        child_main(args.decoder, args.child, args.start, args.rss_mib, args.mem_gib)
        return 0
    if args.replay:
        decoder = "program" if args.decoder == "all" else args.decoder
        with open(args.replay, "rb") as f:
            data = f.read()
        mode = args.mode or {"program": "bundle", "value": "value"}.get(decoder, "prepare0")
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
