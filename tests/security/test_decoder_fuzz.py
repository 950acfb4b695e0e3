"""Untrusted bytes through the program, value and consent decoders give a result or an
MPLangError.

A seeded, derandomized subset of the campaign of ``benchmarks/fuzz_decoders.py``
(the same generators: byte edits, structured JSON edits, SPU share protobuf edits,
splices, random bytes; for the signed accept, swapped, edited and re-forged
openings, edited commitments and votes), run in this process over what a worker does
with a received program (decode, ``verify``, ``check_types``, re-encode), value
(``split_frame``, ``decode_value``, re-encode), ``/run`` body and gathered votes
(`split_program`, the program's checks, `decode_openings`, `open_program`,
`program_digest`; `check_votes`); then exact refusals of huge declared lengths,
truncated frames, wrong magic, tampered openings and votes, and regressions of the
decoder bugs the campaign found.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import fuzz_decoders as fz
from mplang.cluster.commitments import canonical_bytes
from mplang.edsl.errors import MPLangError, MPRefusedError, MPSerializationError
from mplang.edsl.primitive import check_types
from mplang.edsl.serde import decode_graph_bundle, numpy_can_hold
from mplang.edsl.typing import DTYPES, numpy_dtype
from mplang.kernels.spu.run import SpuShare
from mplang.transport.wire import (
    MAX_HEADER,
    decode_value,
    encode_value_bytes,
    pack_message,
    split_frame,
)

FUZZ = settings(max_examples=400, derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def programs() -> dict[str, bytes]:
    return fz.seed_programs()


@pytest.fixture(scope="module")
def values() -> dict[str, bytes]:
    return fz.seed_values()


@pytest.fixture(scope="module")
def consent() -> dict[str, bytes]:
    return fz.seed_consent()


# ---------------------------------------------------------------- properties


def test_every_seed_decodes(programs: dict[str, bytes], values: dict[str, bytes]) -> None:
    for data in programs.values():
        fz.decode_program_input("bundle", data)
    for data in values.values():
        fz.decode_value_input("value", data)


@pytest.mark.parametrize("decoder", ["program", "value"])
@FUZZ
@given(data=st.data())
def test_decoders_raise_only_mplang_errors(programs: dict[str, bytes], values: dict[str, bytes],
                                           decoder: str, data: st.DataObject) -> None:
    """A worker's path (for programs: without `Program.from_bytes`, whose world size comes
    from the metadata) gives a result or an MPLangError."""
    seeds = list((programs if decoder == "program" else values).values())
    mode, blob = fz.GENERATORS[decoder](fz.DrawChooser(data), seeds)
    with contextlib.suppress(MPLangError):
        if decoder == "program":
            fz.decode_program_input(mode, blob, load=False)
        else:
            fz.decode_value_input(mode, blob)


def test_every_consent_seed_is_accepted(consent: dict[str, bytes]) -> None:
    for name, body in consent.items():
        prepared = fz._parsed(body)
        if prepared is not None:
            fz.decode_consent_input(f"prepare{prepared.rank}", body)
        elif name == "votes":
            for rank in range(fz.WORLD):
                fz.decode_consent_input(f"run{rank}", body)
        else:
            with pytest.raises(MPRefusedError, match="is not a signature over this program"):
                fz.decode_consent_input("run0", body)


@FUZZ
@given(data=st.data())
def test_consent_decoder_raises_only_mplang_errors(consent: dict[str, bytes],
                                                   data: st.DataObject) -> None:
    """A ``/run`` body (committed program and openings) or the votes a worker gathered,
    as the worker checks them, gives a result or an MPLangError."""
    mode, blob = fz.generate_consent(fz.DrawChooser(data), list(consent.values()))
    with contextlib.suppress(MPLangError):
        fz.decode_consent_input(mode, blob)


DIMS = st.sampled_from([0, 1, 2, 3, 2**20, 2**31, 2**32, 2**60, 2**61 - 1, 2**61, 2**62,
                        2**63 - 1, 2**63, 2**64])


@settings(max_examples=200, derandomize=True, deadline=None, database=None)
@given(dtype=st.sampled_from(sorted(DTYPES)),
       shape=st.lists(DIMS, max_size=4) | st.lists(st.just(0), min_size=60, max_size=70))
def test_array_headers_with_any_shape(dtype: str, shape: list[int]) -> None:
    """The decoder's size rule is numpy's: it refuses exactly the shapes numpy cannot
    make, and makes the others (empty payload: some dim is 0)."""
    blob = frame({"kind": "array", "dtype": dtype, "shape": shape})
    empty = np.zeros(0, dtype=numpy_dtype(dtype))
    try:
        empty.reshape(shape)
        numpy_ok = 0 in shape
    except ValueError:
        numpy_ok = False
    if numpy_ok:
        assert numpy_can_hold(shape, empty.itemsize)
        assert decode_value(blob).shape == tuple(shape)
    else:
        with pytest.raises(MPSerializationError, match="malformed value: array"):
            decode_value(blob)


# ---------------------------------------------------------------- programs


def bundle(doc: Any, tail: bytes = b"", length: int | None = None) -> bytes:
    text = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    n = len(text) if length is None else length
    return fz.PROGRAM_MAGIC + struct.pack("<Q", n) + text + tail


def refused(data: bytes | memoryview, **kwargs: Any) -> str:
    with pytest.raises(MPSerializationError) as info:
        decode_graph_bundle(data, **kwargs)
    assert type(info.value) is MPSerializationError
    return str(info.value)


def constant_program(value_attr: Any, spans: list[list[int]], tail: bytes) -> bytes:
    op = {"op": "simp.constant", "in": [], "regions": [],
          "attrs": {"parties": {"$mask": 1}, "value": value_attr},
          "out": [["0", {"mp": [{"tensor": ["int32", []]}, 1]}]]}
    doc = {"version": 1, "meta": {}, "buffers": spans,
           "graph": {"inputs": [], "ops": [op], "outputs": ["0"]}}
    return bundle(doc, tail)


@pytest.mark.parametrize("length", [2**32, 2**60, 2**63, 2**64 - 1])
def test_huge_declared_json_length_is_refused_before_reading(length: int) -> None:
    assert refused(bundle(b"{}", length=length)) == "malformed program: truncated"


def test_program_over_the_size_limit() -> None:
    data = bundle(b"{}")
    assert refused(data, max_bytes=8) == f"program of {len(data)} bytes exceeds the 8 limit"


@pytest.mark.parametrize("magic", [b"MPLANG\x00\x02", b"MPV1\x00\x00\x00\x00", b"\x00" * 8])
def test_wrong_program_magic(programs: dict[str, bytes], magic: bytes) -> None:
    data = magic + programs["spu_int_arith"][8:]
    assert refused(data) == ("malformed program: bad magic (not an MPLang program; load only "
                             "files written by Program.save)")


@pytest.mark.parametrize("kind", ["program", "value"])
def test_every_truncation_is_refused(programs: dict[str, bytes], kind: str) -> None:
    """Cut inside the fixed header, inside the declared JSON, inside the payload."""
    if kind == "program":
        data, header, refuse = programs["spu_int_arith"], 16, refused
        short_json, short_payload = "truncated", "buffer span past the end"
    else:
        data = encode_value_bytes(np.arange(6, dtype=np.float64).reshape(2, 3))
        header, refuse = 8, rejected
        short_json, short_payload = "bad frame header", "array size does not match its shape"
    json_end = header + int.from_bytes(data[header // 2:header], "little")
    for size in range(len(data)):
        too_short = (f"too short ({size} bytes) to be an MPLang program; load only files "
                     "written by Program.save") if kind == "program" else "too short"
        want = too_short if size < header else short_json if size < json_end \
            else short_payload
        assert refuse(data[:size]) == f"malformed {kind}: {want}", size


@pytest.mark.parametrize("span", [[0, 2**60], [2**63, 1], [2**64, 0]])
def test_huge_buffer_spans(span: list[int]) -> None:
    data = constant_program({"$bytes": 0}, [span], b"abcd")
    assert refused(data) == "malformed program: buffer span past the end"


def test_huge_array_shape_with_a_small_buffer() -> None:
    data = constant_program({"$array": ["int32", [2**20, 2**20], 0]}, [[0, 4]], b"abcd")
    assert refused(data) == ("malformed program: graph.ops[0].attrs.value.$array: "
                             "array size does not match shape")


@pytest.mark.parametrize(("shape", "rank"), [([0] * 65, 65), ([2**62, 0], 2), ([0, 2**63], 2)])
def test_array_shapes_numpy_cannot_make(shape: list[int], rank: int) -> None:
    """Regression: these raised numpy's ValueError, reported without the field path."""
    data = constant_program({"$array": ["int32", shape, 0]}, [[0, 0]], b"")
    assert refused(data) == ("malformed program: graph.ops[0].attrs.value.$array: array "
                             f"shape: rank {rank} or size beyond numpy's limits")


@pytest.mark.parametrize("dtype", [["int32"], {"int32": 1}])
def test_unhashable_array_dtype_names_its_field(dtype: Any) -> None:
    """Regression: an unhashable dtype raised TypeError (reported without the field path)."""
    data = constant_program({"$array": [dtype, [1], 0]}, [[0, 4]], b"abcd")
    assert refused(data) == ("malformed program: graph.ops[0].attrs.value.$array: "
                             f"array dtype {dtype!r}")


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_constants_are_refused(programs: dict[str, bytes], constant: bytes) -> None:
    """Regression: ``"meta": {"name": Infinity}`` decoded, then `encode_graph_bundle` of the
    decoded program raised ValueError (the encoder writes no NaN / Infinity)."""
    framed = fz.Framed.parse(programs["prank"])
    assert framed is not None
    text = json.dumps(framed.doc).encode().replace(b'"name": "prank"', b'"name": ' + constant)
    assert constant in text
    assert refused(bundle(text, framed.tail)) == \
        f"malformed program: invalid JSON: {constant.decode()} is not JSON"


def test_unhashable_dict_key_names_its_field() -> None:
    data = constant_program({"$dict": [[[1, 2], 3]]}, [], b"")
    assert refused(data) == ("malformed program: graph.ops[0].attrs.value.$dict: "
                             "a key is not hashable")


def test_deeply_nested_program_json() -> None:
    message = refused(bundle(b"[" * 100_000 + b"]" * 100_000))
    assert message.startswith("malformed program: invalid JSON: maximum recursion depth")


def test_member_outside_the_world_fails_type_check(programs: dict[str, bytes]) -> None:
    framed = fz.Framed.parse(programs["spu_int_arith"])
    assert framed is not None
    seal = next(op for op in framed.doc["graph"]["ops"] if op["op"] == "spu.seal")
    seal["attrs"]["members"] = {"$tuple": [0, 1, 5]}
    graph, _ = decode_graph_bundle(bundle(framed.doc, framed.tail))
    graph.verify()
    with pytest.raises(MPLangError, match=r"members \(0, 1, 5\) are outside the world"):
        check_types(graph, fz.WORLD)


# ---------------------------------------------------------------- values


def frame(header: Any, payload: bytes = b"", length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(text) if length is None else length
    return fz.VALUE_MAGIC + struct.pack("<I", n) + text + payload


def rejected(data: bytes | memoryview) -> str:
    with pytest.raises(MPSerializationError) as info:
        decode_value(data)
    assert type(info.value) is MPSerializationError
    return str(info.value)


@pytest.mark.parametrize("length", [MAX_HEADER + 1, 2**31, 2**32 - 1])
def test_huge_declared_header_length(length: int) -> None:
    data = frame({"kind": "none"}, length=length) + b" " * (MAX_HEADER + 16)
    assert rejected(data) == "malformed value: bad frame header"


@pytest.mark.parametrize("data", [b"MPV2\x02\x00\x00\x00{}", b"PK\x03\x04\x02\x00\x00\x00{}",
                                  b"\x00" * 64])
def test_wrong_value_magic(data: bytes) -> None:
    assert rejected(data) == "malformed value: bad frame header"


@pytest.mark.parametrize(("header", "payload", "message"), [
    ({"kind": "list", "sizes": [2**60]}, b"", "list sizes"),
    ({"kind": "list", "sizes": [-1, 1]}, b"", "list sizes"),
    ({"kind": "bytes", "size": 2**60}, b"ab", "bytes size"),
    ({"kind": "array", "dtype": "int32", "shape": [2**20, 2**20]}, b"abcd",
     "array size does not match its shape"),
    ({"kind": "array", "dtype": "object", "shape": [1]}, b"abcd", "array dtype 'object'"),
    ({"kind": "share", "sizes": [2**60]}, b"", "share sizes"),
    ({"kind": "pickle"}, b"", "unknown kind 'pickle'"),
    ({"kind": ["list"]}, b"", "unknown kind ['list']"),
    ([1, 2], b"", "header is not an object"),
])
def test_malformed_headers(header: Any, payload: bytes, message: str) -> None:
    assert rejected(frame(header, payload)) == f"malformed value: {message}"


def test_a_list_inside_a_list() -> None:
    inner = encode_value_bytes([1, 2])
    data = frame({"kind": "list", "sizes": [len(inner)]}, inner)
    assert rejected(data) == "malformed value: a list inside a list"


@pytest.mark.parametrize("dtype", [["int32"], {"x": "uint8"}])
def test_unhashable_value_dtype(dtype: Any) -> None:
    """Regression: an unhashable dtype raised TypeError."""
    data = frame({"kind": "array", "dtype": dtype, "shape": [1]}, b"abcd")
    assert rejected(data) == f"malformed value: array dtype {dtype!r}"


@pytest.mark.parametrize(("shape", "rank"), [([0] * 65, 65), ([2**61, 0], 2),
                                             ([2**31, 2**30, 0], 3), ([0, 2**63], 2)])
def test_value_shapes_numpy_cannot_make(shape: list[int], rank: int) -> None:
    """Regression: these raised numpy's ValueError."""
    data = frame({"kind": "array", "dtype": "int32", "shape": shape})
    assert rejected(data) == (f"malformed value: array shape: rank {rank} or size beyond "
                              "numpy's limits")


def test_largest_empty_array_numpy_makes() -> None:
    data = frame({"kind": "array", "dtype": "int32", "shape": [2**61 - 1, 0]})
    assert decode_value(data).shape == (2**61 - 1, 0)


@pytest.mark.parametrize("text", [b"[" * 200_000 + b"]" * 200_000,
                                  b'{"a":' * 100_000 + b"1" + b"}" * 100_000])
def test_deeply_nested_header(text: bytes) -> None:
    """Regression: the JSON parser's RecursionError escaped from `split_frame`."""
    assert rejected(frame(text)).startswith(
        "malformed value: invalid JSON header: maximum recursion depth exceeded")


def test_msg_body_around_a_value() -> None:
    body = b"".join(pack_message({"src": 0, "exec": "e", "key": "k"},
                                 [encode_value_bytes(b"xyz")]))
    header, payload = split_frame(body)
    assert header == {"src": 0, "exec": "e", "key": "k"} and decode_value(payload) == b"xyz"
    with pytest.raises(MPSerializationError, match=r"^malformed value: bad frame header$"):
        split_frame(body[:20])
    assert rejected(split_frame(body[:-1])[1]) == "malformed value: bytes size"


# ---------------------------------------------------------------- SPU shares


@pytest.fixture(scope="module")
def share_parts() -> list[bytes]:
    (share, *_), *_ = fz.spu_shares()
    meta, chunks = share.to_parts()
    return [meta, *chunks]


def share_frame(parts: list[bytes]) -> bytes:
    return frame({"kind": "share", "sizes": [len(p) for p in parts]}, b"".join(parts))


def test_a_share_round_trips(share_parts: list[bytes]) -> None:
    decoded = decode_value(share_frame(share_parts))
    assert isinstance(decoded, SpuShare)
    meta, chunks = decoded.to_parts()
    assert [meta, *chunks] == share_parts


@pytest.mark.parametrize(("edit", "message"), [
    (lambda p: p[:1], "a share is a meta chunk and at least one data chunk"),
    (lambda p: [b"\x08" + b"\xff" * 11, *p[1:]], "truncated or overlong varint"),
    (lambda p: [p[0], b"\x08\x01\x1a\x04abcd"], "share chunk: content exceeds its declared total"),
    (lambda p: [p[0], b"\x1a\xff\xff\xff\xff\x0fab"], "share chunk: field 3 runs past the end"),
    (lambda p: [p[0] + b"\x30\x01", *p[1:]], "share meta: unexpected field 6 (wire type 0)"),
    (lambda p: [b"\x2a\x02\x00\x01", *p[1:]],
     "share meta: storage type is not a printable name"),
])
def test_malformed_shares(share_parts: list[bytes], edit: Any, message: str) -> None:
    assert rejected(share_frame(edit(share_parts))) == \
        f"malformed value: share: ValueError: {message}"


def test_a_received_program_cannot_name_a_huge_party_rank() -> None:
    """SPU members with rank 2^31 once made check_types build a 2^31-bit mask (half a
    GiB, seconds per op); ranks stay below MAX_PARTIES now."""
    import time

    import numpy as np

    import mplang as mp
    from mplang.edsl.errors import MPLangError
    from mplang.edsl.primitive import check_types
    from mplang.edsl.serde import decode_graph_bundle, encode_graph_bundle
    from mplang.edsl.typing import MAX_PARTIES

    cluster = mp.ClusterSpec.simple(3)
    program = mp.compile(lambda: mp.device("SP0")(lambda a: a + 1)(
        mp.put("P0", np.int32(1))), cluster=cluster)
    bundle = encode_graph_bundle(program.graph, {})
    size = int.from_bytes(bundle[8:16], "little")
    doc = json.loads(bundle[16:16 + size])
    text = json.dumps(doc).replace('"members": {"$tuple": [0, 1, 2]}',
                                   '"members": {"$tuple": [0, 1, 2147483648]}')
    assert text != json.dumps(doc)
    raw = text.encode()
    mutated = bundle[:8] + len(raw).to_bytes(8, "little") + raw + bundle[16 + size:]
    start = time.perf_counter()
    with pytest.raises(MPLangError, match=f"not below {MAX_PARTIES}"):
        graph, _ = decode_graph_bundle(mutated)
        check_types(graph, 3)
    assert time.perf_counter() - start < 1.0


def test_a_received_share_must_have_the_declared_shape() -> None:
    """libspu allocates by the shape a share's meta declares: a peer's share for an op
    must declare exactly the op's shape (a 2^40-element meta once reached libspu)."""
    import numpy as np
    import spu.libspu as libspu

    from mplang.dialects.spu import SpuConfig, io_for
    from mplang.edsl.graph import Operation, Value
    from mplang.edsl.typing import Mask, MPType, TensorType
    from mplang.kernels.spu import run as spu_impl

    config = SpuConfig("SP0", (0, 1, 2), "ABY3", "FM64", 18)
    (share, *_) = io_for(config).make_shares(np.arange(6, dtype=np.int32).reshape(2, 3),
                                             libspu.Visibility.VIS_SECRET)
    received = spu_impl.SpuShare(share)
    assert spu_impl.share_shape(received) == (2, 3)
    x = Value("x", MPType(TensorType("int32", (6,)), Mask.of([0])))
    y = Value("y", MPType(TensorType("int32", (6,)), Mask.of([0, 1, 2])))
    op = Operation("spu.seal", (x,), (y,), {})
    with pytest.raises(RuntimeError, match=r"party 0 sent a share of shape \(2, 3\); "
                                           r"spu.seal declares \(6,\)"):
        spu_impl._received_share(received, op, 0, TensorType("int32", (6,)))
    with pytest.raises(RuntimeError, match="not a secret share"):
        spu_impl._received_share(np.zeros(6), op, 0, TensorType("int32", (6,)))
    assert spu_impl._received_share(received, op, 0, TensorType("int32", (2, 3))) is received


# ---------------------------------------------------------------- the signed accept


def received(consent: dict[str, bytes], name: str) -> fz.Prepare:
    prepared = fz._parsed(consent[name])
    assert prepared is not None
    return copy.deepcopy(prepared)


def prepare_refusal(prepared: fz.Prepare, rank: int | None = None) -> MPLangError:
    body = fz.prepare_body(prepared.program(), prepared.encoded_openings(), prepared.rank)
    with pytest.raises(MPLangError) as info:
        fz.decode_consent_input(f"prepare{prepared.rank if rank is None else rank}", body)
    return info.value


def test_another_partys_openings_are_refused(consent: dict[str, bytes]) -> None:
    mine, theirs = received(consent, "private@0"), received(consent, "private@1")
    mine.openings = theirs.openings
    error = prepare_refusal(mine)
    assert type(error) is MPRefusedError and error.status == 400
    assert re.fullmatch(r"party 0: op #0 simp.constant \(traced at .*\), attribute 'value': "
                        "the driver sent no opening for this party's committed value",
                        str(error))
    mine = received(consent, "private@0")
    mine.openings["1:value"] = theirs.openings["1:value"]  # party 1's constant, not 0's
    assert str(prepare_refusal(mine)) == ("party 0: openings for attributes this party may "
                                          "not see or that the program does not have: "
                                          "['1:value']")


def test_openings_of_another_program_do_not_match(consent: dict[str, bytes]) -> None:
    mine, theirs = received(consent, "constant@0"), received(consent, "while_loop@0")
    mine.openings = {"0:value": theirs.openings["0:value"], "1:value": mine.openings["1:value"]}
    assert str(prepare_refusal(mine)).endswith("the opening does not match its commitment")


@pytest.mark.parametrize(("edit", "message"), [
    (lambda v: v.astype(np.float64), "the opened value is f64[2,3], its commitment "
                                     "declares f32[2,3]"),
    (lambda v: v.reshape(-1), "the opened value is f32[6], its commitment declares f32[2,3]"),
    (lambda v: v.tolist(), "the opened value is None, its commitment declares f32[2,3]"),
])
def test_a_reforged_commitment_must_declare_the_opened_type(
        consent: dict[str, bytes], edit: Any, message: str) -> None:
    """The driver can re-forge a digest for any value; the opened value must still have
    the type the committed program was type-checked with."""
    prepared = received(consent, "private@0")
    value, nonce = prepared.openings["0:value"]
    value = edit(value)
    prepared.openings["0:value"] = (value, nonce)
    body = prepared.commitment("0:value")
    prepared.set_digest(body, hashlib.sha256(nonce + canonical_bytes(value)).digest())
    error = prepare_refusal(prepared)
    assert type(error) is MPRefusedError and str(error).endswith(message)


def test_a_short_nonce_is_refused_when_decoded(consent: dict[str, bytes]) -> None:
    prepared = received(consent, "private@0")
    value, nonce = prepared.openings["0:value"]
    prepared.openings["0:value"] = (value, nonce[:15])
    error = prepare_refusal(prepared)
    assert type(error) is MPSerializationError
    assert str(error) == ("malformed program: openings.0:value: expected (value, nonce of "
                          "16+ bytes)")


def test_a_commitment_must_declare_a_base_type(consent: dict[str, bytes]) -> None:
    prepared = received(consent, "private@0")
    prepared.commitment("1:value")[1] = {"mp": [{"tensor": ["int64", []]}, 6]}
    error = prepare_refusal(prepared)
    assert str(error) == "malformed program: graph.ops[1].attrs.value.$commit[1]: not a base type"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda v: {**v, "1": v["2"]}, "the vote of party 1 for execution e1 is not a signature"),
    (lambda v: {**v, "1": v["1"] * 6}, "the vote of party 1 for execution e1 is not a"),
    (lambda v: {**v, "2": v["2"].rstrip("=") + "!"}, "the vote of party 2 for execution e1"),
    (lambda v: {"0": v["0"], "2": v["2"]}, "the vote of party 1 for execution e1 is not a"),
    (lambda v: list(v.values()), "the vote of party 1 for execution e1 is not a"),
])
def test_tampered_votes_are_refused(edit: Any, message: str) -> None:
    body = fz.run_body(edit(fz.sign_votes()))
    with pytest.raises(MPRefusedError, match=re.escape(message)) as info:
        fz.decode_consent_input("run0", body)
    assert info.value.status == 409
