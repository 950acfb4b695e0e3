"""Conformance of everything the registries hold.

Every declared primitive has a full declaration (operands, attributes, results), a
type rule, a cost rule, a flow rule for each level it runs at, `OpTraits` and a kernel
for each runtime its traits claim; every primitive of a built-in dialect is emitted by a
frontend op and appears in a corpus of real programs, which round-trip through
their serialized form byte for byte and give the same results when reloaded;
every registered type tag round-trips through serde; every registered value
codec round-trips values produced by running a program and refuses truncated or
corrupted payloads with `MPSerializationError`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import builtin
from mplang.cluster.commitments import program_digest
from mplang.dialects.spu import SecretShareType
from mplang.edsl import registry as primitive_registry
from mplang.edsl.graph import Graph
from mplang.edsl.primitive import Primitive, primitives
from mplang.edsl.private import Commitment
from mplang.edsl.serde import decode_type, encode_type
from mplang.edsl.traits import OpTraits
from mplang.edsl.typing import BaseType, MPType, TensorType, registered_types
from mplang.frontend import list_ops
from mplang.runtime.backend import missing_kernels
from mplang.transport import wire
from tests.dialects.corpus import CLUSTER, corpora

BUILTIN_DIALECTS = frozenset(m.rsplit(".", 1)[1] for m in builtin.MODULES
                             if m.startswith("mplang.dialects."))
"""The dialects `mplang.builtin` loads; their primitives must all be exercised here."""


def _builtin(module: str) -> bool:
    return module == "mplang" or module.startswith("mplang.")


# ---------------------------------------------------------------- the corpus

CORPORA = corpora()
CORPUS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    name: (getattr(module, f"{name}_corpus"), module.check) for name, module in CORPORA.items()}
"""Each dialect's corpus program and the check of its results (`tests.dialects.corpus`)."""


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mp.Simulator]:
    root = tmp_path_factory.mktemp("data")
    np.save(root / "x.npy", np.arange(3, dtype=np.int32))
    (root / "t.csv").write_text("k,w\n1,10\n2,20\n3,50\n")
    simulator = mp.Simulator(CLUSTER, data_roots={n.name: root for n in CLUSTER.nodes},
                             policies="open")  # results fetched and compared
    simulator.upload("node_2", "v", np.array([7, 8, 9], dtype=np.int32))
    try:
        yield simulator
    finally:
        simulator.close()


@pytest.fixture(scope="module")
def programs() -> dict[str, mp.Program]:
    return {name: mp.compile(fn, cluster=CLUSTER) for name, (fn, _) in CORPUS.items()}


def _opcodes(graph: Graph) -> set[str]:
    return {op.opcode for op in graph.walk()}


# ---------------------------------------------------------------- primitives


def _flow_levels(prim: Primitive) -> list[str]:
    """The flow rules a primitive needs: at the simp level, inside local regions, or both."""
    return {"multi_party": ["flow"], "single_rank": ["local_flow"],
            "any": ["flow", "local_flow"]}[prim.execution_model]


def test_every_primitive_is_declared_with_its_rules() -> None:
    prims = primitives()
    assert {p.name for p in prims} >= {"simp.pcall", "tensor.run_jax", "spu.run", "func.call"}
    for prim in prims:
        assert isinstance(prim.traits, OpTraits), f"{prim.name}: traits {prim.traits!r}"
        assert prim.name.startswith(prim.dialect + "."), prim.name
        for slot in ["type", "cost", *_flow_levels(prim)]:
            assert prim.rule(slot) is not None, f"{prim.name} has no {slot} rule"
        assert set(prim.traits.runtimes) <= {"worker", "driver", "launch"}, prim.name


def test_the_conformance_check_can_fail() -> None:
    """A primitive declared without rules is reported (so the test above means something)."""
    bare = Primitive("conformance_probe.bare", kind="compute", execution_model="single_rank",
                     attrs={}, results=[])
    try:
        missing = [slot for slot in ["type", "cost", *_flow_levels(bare)]
                   if bare.rule(slot) is None]
        assert missing == ["type", "cost", "local_flow"]
        assert ("conformance_probe.bare", "worker") in missing_kernels()
    finally:
        del primitive_registry.PRIMITIVES[bare.name]


def test_every_claimed_runtime_has_a_kernel() -> None:
    assert missing_kernels() == []


def test_every_builtin_primitive_is_emitted_by_a_frontend_op() -> None:
    emitted = {p for info in list_ops() for p in info.primitives}
    orphans = [p.name for p in primitives()
               if p.dialect in BUILTIN_DIALECTS and p.name not in emitted]
    assert orphans == [], f"primitives no frontend op lists in FeOpInfo.primitives: {orphans}"


def test_reflection_gives_every_primitive_contract_as_json() -> None:
    listed = mp.list_primitives()
    assert [d["name"] for d in listed] == sorted(p.name for p in primitives())
    assert json.loads(json.dumps(listed)) == listed  # plain data
    for d in listed:
        assert set(d) >= {"name", "operands", "attributes", "results", "traits", "kernels",
                          "flow", "cost", "security"}, d["name"]
        assert d["flow"] is not None and d["cost"] is not None and d["security"], d["name"]
    assert mp.describe("tensor.run_jax")["flow"]["name"] == "_run_jax_flow"
    call = mp.describe("func.call")
    assert (call["flow"]["name"], call["local_flow"]["name"]) == ("_call_flow",
                                                                  "_local_call_flow")
    shuffle = mp.describe("simp.shuffle_static")
    assert [o["name"] for o in shuffle["operands"]] == ["values"]
    assert shuffle["operands"][0]["variadic"] is True
    assert shuffle["attributes"][0]["name"] == "routes"
    assert shuffle["attributes"][0]["required"] is True
    assert shuffle["kernels"] == {"worker": True, "driver": True, "launch": False}
    assert shuffle["flow"]["name"] == "_shuffle_static_flow"
    assert shuffle["cost"]["name"] == "_shuffle_static_cost"
    run = mp.describe("spu.run")
    assert run["security"]["SPU"].startswith("semi-honest") or run["security"]["SPU"]


# ---------------------------------------------------------------- the corpus


def test_builtin_dialects_are_the_expected_ones() -> None:
    assert {"func", "simp", "tensor", "spu"} <= BUILTIN_DIALECTS


def test_corpus_covers_every_builtin_primitive(programs: dict[str, mp.Program]) -> None:
    covered = set().union(*(_opcodes(p.graph) for p in programs.values()))
    uncovered = sorted(p.name for p in primitives()
                       if p.dialect in BUILTIN_DIALECTS and p.name not in covered)
    assert uncovered == [], f"primitives no corpus program uses: {uncovered}"


def test_private_attributes_may_travel_as_commitments(programs: dict[str, mp.Program]) -> None:
    """A party that may not see a private attribute receives a commitment in its place, so
    every attribute a private rule names admits one in its declaration."""
    checked = set()
    for program in programs.values():
        for op in program.graph.walk():
            assert op.prim is not None
            for name in op.prim.private_attrs(op):
                declared = op.prim.attrs[name].type
                types = declared if isinstance(declared, tuple) else (declared,)
                assert Commitment in types, f"{op.opcode}.{name} admits no commitment"
                checked.add(f"{op.opcode}.{name}")
    assert {"simp.constant.value", "tensor.constant.value", "spu.shares.share",
            "table.constant.data"} <= checked


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_program_round_trips_byte_for_byte(name: str,
                                                  programs: dict[str, mp.Program]) -> None:
    program = programs[name]
    data = program.to_bytes()
    loaded = mp.Program.from_bytes(data)
    assert loaded.to_bytes() == data
    assert str(loaded) == str(program)
    assert [op.opcode for op in loaded.graph.walk()] == [op.opcode for op in program.graph.walk()]
    assert [op.loc for op in loaded.graph.walk()] == [op.loc for op in program.graph.walk()]
    assert loaded.out_devices == program.out_devices
    # tracing the same source again gives the same program: the same bytes but for the
    # driver's secret shares, which are fresh each time (so the same program digest)
    again = mp.compile(CORPUS[name][0], cluster=CLUSTER)
    world = program.world_size
    assert program_digest(again.graph, world) == program_digest(program.graph, world)
    if name != "spu":
        assert again.to_bytes() == data


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_program_runs_the_same_after_reloading(name: str, sim: mp.Simulator,
                                                      programs: dict[str, mp.Program]) -> None:
    fn, check = CORPUS[name]
    check(mp.fetch(sim, mp.evaluate(sim, fn)))
    loaded = mp.Program.from_bytes(programs[name].to_bytes())
    check(mp.fetch(sim, mp.evaluate(sim, loaded)))


# ---------------------------------------------------------------- type tags


def _types_in(program: mp.Program) -> Iterator[Any]:
    def attr_types(value: Any) -> Iterator[Any]:
        if isinstance(value, BaseType | MPType):
            yield value
        elif isinstance(value, list | tuple):
            for v in value:
                yield from attr_types(v)
        elif isinstance(value, dict):
            for v in value.values():
                yield from attr_types(v)

    def graph_types(graph: Graph) -> Iterator[Any]:
        for v in graph.inputs:
            yield v.type
        for op in graph.operations:
            for v in (*op.inputs, *op.outputs):
                yield v.type
            yield from attr_types(dict(op.attrs))
            for region in op.regions:
                yield from graph_types(region)

    yield from graph_types(program.graph)


def _base_types(t: Any) -> Iterator[BaseType]:
    base = t.base if isinstance(t, MPType) else t
    yield base
    if isinstance(base, SecretShareType):
        yield base.plaintext_type


@pytest.fixture(scope="module")
def type_samples(programs: dict[str, mp.Program]) -> dict[str, list[BaseType]]:
    samples: dict[str, list[BaseType]] = {}
    for program in programs.values():
        for t in _types_in(program):
            for base in _base_types(t):
                bucket = samples.setdefault(base.type_tag, [])
                if base not in bucket:
                    bucket.append(base)
    return samples


def test_every_builtin_type_tag_occurs_in_the_corpus(
        type_samples: dict[str, list[BaseType]]) -> None:
    tags = registered_types()
    assert {"tensor", "share"} <= set(tags)
    missing = sorted(tag for tag, cls in tags.items()
                     if _builtin(cls.__module__) and tag not in type_samples)
    assert missing == [], f"registered type tags no corpus program uses: {missing}"


def test_every_registered_type_tag_round_trips(type_samples: dict[str, list[BaseType]]) -> None:
    for tag, cls in registered_types().items():
        assert cls.type_tag == tag
        for base in type_samples.get(tag, []):
            assert isinstance(base, cls)
            for t in (base, MPType(base, mp.Mask.of([0, 2])), MPType(base, None)):
                data = json.loads(json.dumps(encode_type(t)))  # plain JSON, nothing else
                assert decode_type(data) == t, (tag, t)
                assert encode_type(decode_type(data)) == encode_type(t)


@pytest.mark.parametrize("tag", sorted(t for t, c in registered_types().items()
                                       if _builtin(c.__module__)))
def test_malformed_type_body_names_its_field_path(tag: str) -> None:
    with pytest.raises(mp.MPSerializationError, match=rf"graph\.ops\[3\]\.out\[1\]\.type\.{tag}"):
        decode_type({tag: None}, "graph.ops[3].out[1].type")


def test_unknown_and_nested_type_errors_name_their_path() -> None:
    with pytest.raises(mp.MPSerializationError, match=r"x\.type: unknown type tag 'nope'"):
        decode_type({"nope": []}, "x.type")
    plain = encode_type(TensorType("int32", (2,)))
    with pytest.raises(mp.MPSerializationError, match=r"x\.type\.share\[1\]: unknown type tag"):
        decode_type({"share": ["spu", {"nope": 1}]}, "x.type")
    with pytest.raises(mp.MPSerializationError, match=r"x\.type\.mp\[0\]"):
        decode_type({"mp": [{"mp": [plain, 1]}, 1]}, "x.type")


# ---------------------------------------------------------------- value codecs


VALUE_PRODUCERS: dict[str, Callable[[mp.Simulator],
                                    tuple[list[Any], Callable[[list[Any]], None]]]] = {
    kind: make for module in CORPORA.values()
    for kind, make in getattr(module, "VALUES", {}).items()}
"""Codec kind -> a program run giving values of that kind, and a check of decoded values."""


def _builtin_codecs() -> list[wire.ValueCodec]:
    return [c for c in wire.value_codecs() if _builtin(c.cls.__module__) or c.kind == "table.table"]


def test_every_builtin_value_codec_has_a_producer() -> None:
    """Key material has no wire form (its codecs refuse both ways): no producer for it."""
    kinds = [c.kind for c in _builtin_codecs() if c.privacy != "key material"]
    assert "share" in kinds
    assert sorted(set(kinds) - set(VALUE_PRODUCERS)) == []


@pytest.fixture(scope="module")
def produced(sim: mp.Simulator) -> dict[str, tuple[list[Any], Callable[[list[Any]], None]]]:
    return {kind: make(sim) for kind, make in VALUE_PRODUCERS.items()}


@pytest.mark.parametrize("kind", sorted(VALUE_PRODUCERS))
def test_value_codec_round_trips_a_value_from_a_run(kind: str, produced: Any) -> None:
    codec = next(c for c in wire.value_codecs() if c.kind == kind)
    values, check = produced[kind]
    assert values and all(type(v) is codec.cls for v in values)
    decoded = []
    for value in values:
        data = wire.encode_value_bytes(value)
        header, _ = wire.split_frame(data)
        assert header["kind"] == kind
        back = wire.decode_value(data)
        assert type(back) is codec.cls
        assert wire.encode_value_bytes(back) == data  # re-encoding gives the same bytes
        assert wire.payload_bytes(value) == sum(header["sizes"])
        decoded.append(back)
    check(decoded)
    # several values in one message (a batched shuffle)
    batch = wire.decode_value(wire.encode_value_bytes(list(values)))
    assert [wire.encode_value_bytes(v) for v in batch] == \
        [wire.encode_value_bytes(v) for v in values]
    check(batch)


def _frame(kind: str, chunks: list[bytes]) -> bytes:
    return b"".join(bytes(b) for b in wire._frame(
        {"kind": kind, "sizes": [len(c) for c in chunks]}, chunks))


def _corruptions(chunks: list[bytes]) -> dict[str, list[bytes]]:
    """Self-consistent frames (the sizes match) whose chunks are damaged."""
    first = chunks[0]
    return {
        "no chunks": [],
        "garbage first chunk": [b"\xff" * len(first), *chunks[1:]],
        "first chunk cut in half": [first[: len(first) // 2], *chunks[1:]],
    }


@pytest.mark.parametrize("kind", sorted(VALUE_PRODUCERS))
def test_value_codec_refuses_truncated_frames(kind: str, produced: Any) -> None:
    data = wire.encode_value_bytes(produced[kind][0][0])
    for cut in (1, 7, len(data) // 2, len(data) - 9):
        with pytest.raises(mp.MPSerializationError, match="malformed value"):
            wire.decode_value(data[:-cut])


@pytest.mark.parametrize("kind", sorted(VALUE_PRODUCERS))
@pytest.mark.parametrize("damage", ["no chunks", "garbage first chunk",
                                    "first chunk cut in half"])
def test_value_codec_refuses_corrupted_payloads(kind: str, damage: str, produced: Any) -> None:
    codec = next(c for c in wire.value_codecs() if c.kind == kind)
    chunks = [bytes(c) for c in codec.encode(produced[kind][0][0])]
    bad = _frame(kind, _corruptions(chunks)[damage])
    with pytest.raises(mp.MPSerializationError, match=rf"malformed value: {kind}"):
        wire.decode_value(bad)
