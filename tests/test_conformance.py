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

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import builtin, crypto, func, phe, simp, tensor
from mplang.backends import wire
from mplang.cluster.commitments import program_digest
from mplang.dialects import table, tee
from mplang.dialects.spu import SecretShareType, SpuConfig, reconstruct
from mplang.edsl import registry as primitive_registry
from mplang.edsl.graph import Graph
from mplang.edsl.primitive import Primitive, primitives
from mplang.edsl.private import Commitment
from mplang.edsl.serde import decode_type, encode_type
from mplang.edsl.traits import OpTraits
from mplang.edsl.typing import BaseType, MPType, TensorType, registered_types
from mplang.frontend import list_ops
from mplang.libs import psi as psi_lib
from mplang.runtime.backend import missing_kernels

CLUSTER = mp.ClusterSpec.simple(3)

BUILTIN_DIALECTS = frozenset(m.rsplit(".", 1)[1] for m in builtin.MODULES
                             if m.startswith("mplang.dialects."))
"""The dialects `mplang.builtin` loads; their primitives must all be exercised here."""


def _builtin(module: str) -> bool:
    return module == "mplang" or module.startswith("mplang.")


# ---------------------------------------------------------------- the corpus


def host_double(a: np.ndarray) -> np.ndarray:
    """A host function for ``tensor.pyfunc`` (module level: a stable name)."""
    return a * 2


@func.func
def triple(v: Any) -> Any:
    """A ``func.call`` whose body uses ``tensor.run_jax`` and ``tensor.constant``."""
    return simp.pcall(None, lambda t: tensor.run_jax(
        jnp.multiply, t, tensor.constant(np.full(3, 3, np.float32))), v)


def simp_corpus() -> Any:
    """Every simp primitive."""
    a = simp.constant((0,), np.int32(5))
    b = simp.constant((1,), np.int32(7))
    both = simp.converge(a, b)                       # 5 on party 0, 7 on party 1
    moved = simp.shuffle_static(both, {2: 0})        # 5 on party 2
    all3 = simp.converge(both, moved)                # [5, 7, 5]
    idx = (simp.prank() + 1) % 3                     # [1, 2, 0]
    got = simp.shuffle(all3, idx)                    # [7, 5, 5]
    flag = simp.constant((0, 1, 2), True)
    doubled = simp.uniform_cond(flag, lambda v: v * 2, lambda v: v - 1, got)
    _, acc = simp.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] + got),
                             (simp.constant((0, 1, 2), np.int32(0)), doubled))
    return all3, got, acc


SIMP_EXPECTED = ([5, 7, 5], [7, 5, 5], [14 + 21, 10 + 15, 10 + 15])


def tensor_corpus() -> Any:
    """tensor.constant, tensor.run_jax, tensor.pyfunc and func.call."""
    x = simp.constant((0, 1), np.arange(3, dtype=np.float32))
    y = simp.pcall((0,), lambda v: tensor.pyfunc(
        host_double, v, out=jax.ShapeDtypeStruct((3,), jnp.float32)), x)
    return y, triple(x)


TENSOR_EXPECTED = ([[0.0, 2.0, 4.0], None, None], [[0.0, 3.0, 6.0], [0.0, 3.0, 6.0], None])


def spu_corpus() -> Any:
    """spu.seal, spu.shares (a driver constant), spu.run and spu.reveal, through the
    device API."""
    x = mp.device("P0")(lambda: jnp.arange(4, dtype=jnp.int32))()
    y = mp.device("P1")(lambda: jnp.full((4,), 10, dtype=jnp.int32))()
    one = mp.put("SP0", np.ones(4, dtype=np.int32))
    z = mp.device("SP0")(lambda a, b, c: a * b + a * c)(x, y, one)
    return mp.put("P2", z)


SPU_EXPECTED = [0, 11, 22, 33]

def data_corpus() -> Any:
    """tensor.load and simp.load: private inputs (types declared, since the corpus is
    compiled without a simulator to look them up)."""
    x = simp.pcall((0, 1), lambda: tensor.load("x.npy", dtype="int32", shape=(3,)))
    return x, simp.load(2, "v", dtype="int32", shape=(3,))


DATA_EXPECTED = ([[0, 1, 2], [0, 1, 2], None], [None, None, [7, 8, 9]])


def crypto_corpus() -> Any:
    """Every crypto primitive: key agreement, AES-GCM both ways, signatures, hashing."""
    x = np.arange(4, dtype=np.int32)
    pk0, sk0 = simp.pcall((0,), crypto.x25519_keygen)
    pk1, sk1 = simp.pcall((1,), crypto.x25519_keygen)
    raw1 = simp.shuffle_static(simp.pcall((1,), crypto.public_bytes, pk1), {0: 1})
    k0 = simp.pcall((0,), lambda sk, b: crypto.hkdf(crypto.x25519_shared(
        sk, crypto.public_key(b, algorithm="x25519")), info=b"corpus"), sk0, raw1)
    k1 = simp.pcall((1,), lambda sk, pk: crypto.hkdf(crypto.x25519_shared(sk, pk),
                                                     info=b"corpus"),
                    sk1, simp.shuffle_static(pk0, {1: 0}))
    c = simp.pcall((0,), lambda k: crypto.aes_encrypt(tensor.constant(x), k, aad=b"a"), k0)
    y = simp.pcall((1,), lambda c, k: crypto.aes_decrypt(c, k, like=x, aad=b"a"),
                   simp.shuffle_static(c, {1: 0}), k1)

    def signed() -> Any:
        spk, ssk = crypto.ed25519_keygen()
        crypto.random_bits(count=4)
        digest = crypto.sha256(tensor.constant(x))
        return crypto.verify(digest, crypto.sign(digest, ssk), spk), \
            crypto.aes_encrypt(digest, crypto.aes_keygen())

    ok, sealed = simp.pcall((2,), signed)
    return y, ok, sealed, pk0


def phe_corpus() -> Any:
    """Every phe primitive: keys at party 0, encryption and arithmetic at party 1."""
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
    pk1 = simp.shuffle_static(pk, {1: 0})

    def work(k: Any) -> Any:
        c = phe.encrypt(tensor.constant(x), k)
        d = phe.sub(phe.add(c, c), phe.mul_plain(c, np.int32(2)))  # 0
        return (phe.add(d, c), phe.sum(c, axis=1), phe.dot(c, np.ones(3, np.int32)),
                phe.bucket_sum(c, np.array([[1], [0]], np.int8), n_bins=2))

    outs = simp.pcall((1,), work, pk1)
    return [simp.pcall((0,), phe.decrypt, simp.shuffle_static(o, {0: 1}), sk) for o in outs]


def tee_corpus() -> Any:
    """tee.mock_quote at the TEE's party and tee.verify_quote at a data owner."""
    computation = "ab" * 32
    quote = simp.pcall((2,), lambda: tee.mock_quote(crypto.public_bytes(
        crypto.x25519_keygen()[0]), computation=computation))
    key = simp.pcall((0,), lambda q: tee.verify_quote(q, computation=computation),
                     simp.shuffle_static(quote, {0: 2}))
    return simp.pcall((0,), crypto.public_bytes, key)


def table_corpus() -> Any:
    """Every table primitive: a constant, a file read (schema declared), SQL, both tensor
    bridges and a write, on party 0."""
    def body() -> Any:
        c = table.constant({"k": np.array([1, 2, 3], np.int64), "v": [0.5, 1.5, 2.5]})
        t = table.read_csv("t.csv", schema={"k": "int64", "w": "float64"})
        r = table.sql("SELECT c.k, c.v * t.w AS p FROM c JOIN t USING (k) ORDER BY c.k",
                      c=c, t=t)
        table.write_csv(r, "out/r.csv")
        x = table.to_tensor(r, rows=3)
        return x, table.from_tensor(x, ["a", "b"])
    return simp.pcall((0,), body)


TABLE_EXPECTED = [[1.0, 5.0], [2.0, 30.0], [3.0, 125.0]]


def _check_table(result: Any) -> None:
    x, t = result
    assert np.asarray(x[0]).tolist() == TABLE_EXPECTED and x[1] is None
    assert t[0].to_pandas().to_numpy().tolist() == TABLE_EXPECTED



def psi_corpus() -> Any:
    """psi.join (full) and psi.intersection_size between parties 0 and 1, psi.join_n of
    three tables, psi.ub_prepare at party 1 then psi.ub_join of party 2's table."""
    a = simp.pcall((0,), lambda: table.constant({"id": np.array([1, 2, 3], np.int64)}))
    b = simp.pcall((1,), lambda: table.constant({"id": np.array([3, 2, 9], np.int64)}))
    c = simp.pcall((2,), lambda: table.constant({"id": np.array([5, 3, 2], np.int64)}))
    ja, jb = psi_lib.join(a, b, "id", how="full")
    prepared = psi_lib.ub_prepare(b, "id", name="corpus")
    return (ja, jb, psi_lib.intersection_size(a, b, "id", reveal_to=(0, 1, 2)),
            psi_lib.join_n([a, b, c], "id"), prepared,
            psi_lib.ub_join(c, "id", server=1, name="corpus"))

def _check_simp(result: Any) -> None:
    assert [[int(v) for v in part] for part in result] == [list(e) for e in SIMP_EXPECTED]


def _check_tensor(result: Any) -> None:
    for got, expected in zip(result, TENSOR_EXPECTED, strict=True):
        assert [None if v is None else np.asarray(v).tolist() for v in got] == expected


def _check_spu(result: Any) -> None:
    assert np.asarray(result).tolist() == SPU_EXPECTED


def _check_data(result: Any) -> None:
    for got, expected in zip(result, DATA_EXPECTED, strict=True):
        assert [None if v is None else np.asarray(v).tolist() for v in got] == expected


def _check_crypto(result: Any) -> None:
    y, ok, sealed, pk0 = result
    assert [None if v is None else np.asarray(v).tolist() for v in y] == \
        [None, [0, 1, 2, 3], None]
    assert bool(ok[2]) is True and sealed[2].shape == (60,) and pk0[0].algorithm == "x25519"


def _check_phe(result: Any) -> None:
    x = np.arange(6).reshape(2, 3)
    wants = [x, x.sum(1), x @ np.ones(3), x[::-1].reshape(1, 1, 2, 3)]
    for got, want in zip([r[0] for r in result], wants, strict=True):
        np.testing.assert_array_equal(got, want)


def _check_tee(result: Any) -> None:
    assert result[0].shape == (32,) and result[1] is None and result[2] is None


def _check_psi(result: Any) -> None:
    ja, jb, count, joined, prepared, client = result
    assert ja[0].column("id").to_pylist() == [2, 3, 1, None]
    assert jb[1].column("id").to_pylist() == [2, 3, None, 9]
    assert [int(c) for c in count] == [2, 2, 2]
    assert [j[p].column("id").to_pylist() for p, j in enumerate(joined)] == [[2, 3]] * 3
    assert int(prepared[1]) == 3 and client[2].column("id").to_pylist() == [2, 3]


CORPUS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
    "psi": (psi_corpus, _check_psi),
    "crypto": (crypto_corpus, _check_crypto),
    "phe": (phe_corpus, _check_phe),
    "tee": (tee_corpus, _check_tee),
    "simp": (simp_corpus, _check_simp),
    "tensor": (tensor_corpus, _check_tensor),
    "spu": (spu_corpus, _check_spu),
    "data": (data_corpus, _check_data),
    "table": (table_corpus, _check_table),
}


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


def spu_value(sim: mp.Simulator) -> tuple[list[Any], Callable[[list[Any]], None]]:
    """Real SPU shares: each member's share of a value computed on SP0."""
    def prog() -> Any:
        x = mp.device("P0")(lambda: jnp.arange(6, dtype=jnp.int32).reshape(2, 3))()
        return mp.device("SP0")(lambda a: a * 3 - 1)(x)

    z = mp.evaluate(sim, prog)
    shares = sim.held(z)
    config = SpuConfig.of(CLUSTER, CLUSTER.device("SP0"))
    plaintext = z.base_type.plaintext_type
    expected = np.arange(6, dtype=np.int32).reshape(2, 3) * 3 - 1

    def check(decoded: list[Any]) -> None:
        value = reconstruct(config, [s.to_libspu() for s in decoded], plaintext)
        np.testing.assert_array_equal(value, expected)

    return shares, check


def crypto_public_key_value(sim: mp.Simulator) -> tuple[list[Any], Callable[[list[Any]], None]]:
    """X25519 public keys made by two parties."""
    pk = mp.evaluate(sim, lambda: simp.pcall((0, 1), crypto.x25519_keygen)[0])
    values = [v for v in sim.held(pk) if v is not None]
    expected = [(v.algorithm, v.raw) for v in values]

    def check(decoded: list[Any]) -> None:
        assert [(v.algorithm, v.raw) for v in decoded] == expected

    return values, check


def _phe_run(sim: mp.Simulator) -> tuple[Any, Any, Any]:
    return mp.evaluate(sim, lambda: _phe_keys_and_ciphertext())


def _phe_keys_and_ciphertext() -> Any:
    pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
    c = simp.pcall((0,), lambda k: phe.encrypt(np.arange(6, dtype=np.int32).reshape(2, 3), k),
                   pk)
    return pk, sk, c


def phe_values(sim: mp.Simulator, which: int) -> tuple[list[Any], Callable[[list[Any]], None]]:
    """Party 0's PHE public key (``which`` 0) or a ciphertext under it (2)."""
    from mplang.backends.phe_impl import decrypt_in_range

    pk, sk, c = _phe_run(sim)
    value, private = sim.held([pk, sk, c][which])[0], sim.held(sk)[0]

    def check(decoded: list[Any]) -> None:
        for d in decoded:
            if which == 0:
                assert d.raw == value.raw and d.fingerprint == value.fingerprint
            else:
                got = decrypt_in_range(private, d, phe.Ciphertext("int32", (2, 3), "k0", 1))
                np.testing.assert_array_equal(got, np.arange(6).reshape(2, 3))

    return [value], check


def table_value(sim: mp.Simulator) -> tuple[list[Any], Callable[[list[Any]], None]]:
    """A table made by SQL on party 0."""
    out = mp.evaluate(sim, lambda: simp.pcall((0,), lambda: table.sql(
        "SELECT k, upper(s) AS s FROM c", c=table.constant({"k": [1, 2], "s": ["a", None]}))))
    values = [sim.held(out)[0]]

    def check(decoded: list[Any]) -> None:
        assert [d.to_pylist() for d in decoded] == [[{"k": 1, "s": "A"}, {"k": 2, "s": None}]]

    return values, check


VALUE_PRODUCERS: dict[str, Callable[[mp.Simulator],
                                    tuple[list[Any], Callable[[list[Any]], None]]]] = {
    "share": spu_value,
    "crypto.public_key": crypto_public_key_value,
    "phe.public_key": lambda sim: phe_values(sim, 0),
    "phe.ciphertext": lambda sim: phe_values(sim, 2),
    "table.table": table_value,
}
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
