"""The example plugin ``mplang-cms`` (``examples/plugin``), used as a user would.

Each party sketches its private items in a ``simp.pcall``; the sketches move to
party 0, are merged and queried. The results must equal a count-min sketch
computed here with plain Python from the hash family the plugin documents, on
the simulator and on real worker processes that load the plugin by name; a
worker without the plugin refuses the program.
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.analysis.cost_model import local_cost
from mplang.cli.main import main
from mplang.cluster.local import LocalCluster
from mplang.dialects import tensor
from mplang.edsl.errors import FeConfigError
from mplang.edsl.serde import decode_type, encode_type
from mplang.edsl.typing import MPType, TensorType
from mplang.flows.engine import conservative, local_conservative
from mplang.frontend.introspect import describe
from mplang.runtime.backend import missing_kernels
from mplang.transport.wire import decode_value, encode_value, encode_value_bytes
from tests.plugin.conftest import SKETCH, cms_spec_dict
from tests.worker import support

P = 2**31 - 1
RNG = np.random.default_rng(20240611)
ITEMS = [RNG.zipf(1.6, size=300).clip(max=400).astype(np.int32) - 1,  # heavy hitters 0, 1, 2
         RNG.integers(-50, 50, size=200).astype(np.int32),            # negative items too
         RNG.integers(0, 1000, size=250).astype(np.int32)]
KEYS = np.arange(-60, 120, dtype=np.int32)


# ---------------------------------------------------------------- the plaintext reference


def ref_hashes(seed: int, depth: int) -> list[tuple[int, int]]:
    """(a_i, b_i) as the plugin's docstring specifies them, with Python integers."""
    out = []
    for i in range(depth):
        d = hashlib.sha256(f"mplang-cms:{seed}:{i}".encode()).digest()
        out.append((1 + int.from_bytes(d[0:8], "little") % (P - 1),
                    int.from_bytes(d[8:16], "little") % P))
    return out


def ref_bucket(a: int, b: int, x: int, width: int) -> int:
    return ((a * (x % P) + b) % P) % width


def ref_counts(items: list[np.ndarray], width: int, depth: int, seed: int) -> np.ndarray:
    counts = np.zeros((depth, width), dtype=np.int64)
    for i, (a, b) in enumerate(ref_hashes(seed, depth)):
        for x in np.concatenate([np.ravel(v) for v in items]).tolist():
            counts[i, ref_bucket(a, b, int(x), width)] += 1
    return counts


def ref_query(counts: np.ndarray, keys: np.ndarray, seed: int) -> np.ndarray:
    depth, width = counts.shape
    hashes = ref_hashes(seed, depth)
    return np.array([min(counts[i, ref_bucket(a, b, int(k), width)]
                         for i, (a, b) in enumerate(hashes)) for k in keys.tolist()],
                    dtype=np.int64)


def truth(items: list[np.ndarray], keys: np.ndarray) -> np.ndarray:
    values, counts = np.unique(np.concatenate(items), return_counts=True)
    table = dict(zip(values.tolist(), counts.tolist(), strict=True))
    return np.array([table.get(k, 0) for k in keys.tolist()], dtype=np.int64)


REF = ref_counts(ITEMS, **SKETCH)
EXPECTED = ref_query(REF, KEYS, SKETCH["seed"])


def check_estimates(estimates: Any) -> None:
    estimates = np.asarray(estimates)
    assert estimates.dtype == np.int64 and estimates.shape == KEYS.shape
    np.testing.assert_array_equal(estimates, EXPECTED)
    true_counts = truth(ITEMS, KEYS)
    assert (estimates >= true_counts).all()
    assert (estimates[true_counts > 0] > 0).all()


# ---------------------------------------------------------------- the programs


def sketch_program(cms: ModuleType) -> Any:
    """Each party sketches its items; party 0 receives, merges and queries the sketches."""
    @mp.function
    def prog() -> Any:
        sketches = [simp.pcall((i,), lambda x: cms.build(x, **SKETCH),
                               simp.constant((i,), ITEMS[i])) for i in range(3)]
        at0 = [sketches[0], *(simp.shuffle_static(sketches[i], {0: i}) for i in (1, 2))]

        def merge_and_query(a: Any, b: Any, c: Any) -> Any:
            merged = cms.merge(cms.merge(a, b), c)
            return merged, cms.query(merged, tensor.constant(KEYS))

        return simp.pcall((0,), merge_and_query, *at0)

    return prog


def aggregate_program(cms: ModuleType, to: int) -> Any:
    """Every party sketches its items in one pcall; ``cms.aggregate`` sums them at ``to``."""
    @mp.function
    def prog() -> Any:
        items = simp.converge(*(simp.constant((i,), ITEMS[i][:200]) for i in range(3)))
        sketch = simp.pcall(None, lambda x: cms.build(x, **SKETCH), items)
        total = cms.aggregate(sketch, to=to)
        return simp.pcall((to,), lambda s: cms.query(s, tensor.constant(KEYS)), total)

    return prog


def device_program(cms: ModuleType) -> Any:
    """The same on devices: items on P0..P2 move to the CMS device C0 as sketches."""
    @mp.function
    def prog() -> Any:
        held = [mp.put(f"P{i}", ITEMS[i]) for i in range(3)]
        merged_query = mp.device("C0")(
            lambda a, b, c, keys: cms.query(cms.merge(cms.merge(a, b), c), keys))
        estimates = merged_query(*held, KEYS)
        return estimates, mp.put("P2", estimates)

    return prog


# ---------------------------------------------------------------- on the simulator


def test_sketch_program_on_the_simulator(cms: ModuleType, cms_sim: mp.Simulator,
                                         mode: str) -> None:
    merged, estimates = mp.evaluate(cms_sim, sketch_program(cms), mode=mode)
    sketches = mp.fetch(cms_sim, merged)
    assert sketches[1:] == [None, None]
    assert isinstance(sketches[0], cms.Sketch)
    np.testing.assert_array_equal(sketches[0].counts, REF)
    values = mp.fetch(cms_sim, estimates)
    assert values[1:] == [None, None]
    check_estimates(values[0])


def test_the_program_is_typed_and_serializable(cms: ModuleType, tmp_path: Any) -> None:
    program = mp.compile(sketch_program(cms), world_size=3)
    text = str(program)
    assert "cms.build" in text and "cms<4x64,seed=7>@{0}" in text
    path = tmp_path / "sketch.mpl"
    program.save(path)
    assert str(mp.load(path)) == text
    sim = mp.Simulator(3)
    try:
        _, estimates = mp.evaluate(sim, mp.load(path))
        check_estimates(mp.fetch(sim, estimates)[0])
    finally:
        sim.close()


@pytest.mark.parametrize("to", [0, 2])
def test_aggregate_sums_every_holders_sketch(cms: ModuleType, cms_sim: mp.Simulator,
                                             mode: str, to: int) -> None:
    values = mp.fetch(cms_sim, mp.evaluate(cms_sim, aggregate_program(cms, to), mode=mode))
    items = [v[:200] for v in ITEMS]
    counts = ref_counts(items, **SKETCH)
    np.testing.assert_array_equal(values[to], ref_query(counts, KEYS, SKETCH["seed"]))
    assert [v is None for v in values] == [p != to for p in range(3)]


def test_device_program_on_the_simulator(cms: ModuleType, cms_sim: mp.Simulator) -> None:
    estimates, on_p2 = mp.evaluate(cms_sim, device_program(cms))
    assert estimates.device == "C0" and on_p2.device == "P2"
    check_estimates(mp.fetch(cms_sim, estimates))
    check_estimates(mp.fetch(cms_sim, on_p2))
    program = mp.compile(device_program(cms), cluster=cms_sim.cluster)
    text = str(program)
    # raw items never leave their party: only sketches are sent (to node_0, C0's member)
    assert text.count("cms.aggregate") == 2 and "simp.shuffle_static" in text
    assert all("i32" not in line for line in text.splitlines() if "aggregate" in line)


def test_the_cost_analysis_sees_the_aggregate(cms: ModuleType) -> None:
    report = mp.analyze(mp.compile(aggregate_program(cms, 0), world_size=3))
    assert report.rounds >= 1


# ---------------------------------------------------------------- type rules and metadata


def test_type_rules_reject_bad_programs(cms: ModuleType) -> None:
    def build_on(values: Any, **attrs: Any) -> Any:
        return lambda: simp.pcall((0,), lambda x: cms.build(x, **attrs),
                                  simp.constant((0,), values))

    with pytest.raises(mp.MPTypeError, match=r"cms\.build: the items must be an integer tensor"):
        mp.compile(build_on(np.ones(3, np.float32)), world_size=2)
    with pytest.raises(FeConfigError, match="'width' must lie in"):
        mp.compile(build_on(np.ones(3, np.int32), width=0), world_size=2)

    def mixed_seeds() -> Any:
        x = simp.constant((0,), np.arange(4))
        return simp.pcall((0,), lambda v: cms.merge(cms.build(v, seed=1), cms.build(v, seed=2)),
                          x)

    with pytest.raises(mp.MPTypeError, match=r"cms.merge: cannot merge cms<4x256,seed=1> with "
                                             r"cms<4x256,seed=2>"):
        mp.compile(mixed_seeds, world_size=2)
    with pytest.raises(mp.MPTypeError, match="party-local op"):
        mp.compile(lambda: cms.build(simp.constant((0,), np.arange(3))), world_size=2)

    def bad_target() -> Any:
        s = simp.pcall((0,), lambda v: cms.build(v), simp.constant((0,), np.arange(3)))
        return cms.aggregate(s, to=5)

    with pytest.raises(mp.MPTypeError, match="'to' must be a party of a 2-party world"):
        mp.compile(bad_target, world_size=2)


def test_cms_devices_are_validated(cms: ModuleType) -> None:
    base = cms_spec_dict([7201, 7202, 7203])
    for device, message in [
        ({"kind": "CMS", "members": ["node_0", "node_1"]}, "needs exactly one member"),
        ({"kind": "CMS", "members": ["node_0"], "config": {"width": 0}}, "'width' must lie"),
        ({"kind": "CMS", "members": ["node_0"], "config": {"rows": 3}}, "unknown config"),
    ]:
        base["devices"]["C0"] = device
        with pytest.raises(mp.ClusterSpecError, match=message):
            mp.ClusterSpec.from_dict(base)


def test_a_float_tensor_cannot_move_to_the_cms_device(cms: ModuleType,
                                                      cms_sim: mp.Simulator) -> None:
    def prog() -> Any:
        return mp.put("C0", mp.put("P1", np.ones(3, np.float32)))

    with pytest.raises(mp.MPTypeError, match=r"put\('C0'\).*integer tensor"):
        mp.compile(prog, cluster=cms_sim.cluster)


def test_every_op_has_its_kernels_and_metadata(cms: ModuleType) -> None:
    assert not [m for m in missing_kernels() if m[0].startswith("cms.")]
    info = describe("cms.aggregate")
    assert info["family"] == "cms" and info["routes"] == ["CMS"]
    assert info["traits"]["communicates"] and info["traits"]["pure"]
    assert info["traits"]["runtimes"] == ["worker", "driver"]
    build = describe("cms.build")
    assert build["execution_model"] == "single_rank" and "PPU" in build["routes"]
    assert set(build["config_schema"]) == {"width", "depth", "seed"}


def test_every_op_is_declared_once(cms: ModuleType) -> None:
    build, merge, query = (cms.dialect.prims.build, cms.dialect.prims.merge,
                           cms.dialect.prims.query)
    assert build.attrs == dict(cms.SKETCH_CONFIG.fields)  # the schema declares the attributes
    assert [(o.name, str(o.type)) for o in build.operands] == [("x", "TensorType")]
    assert [str(r.type) for r in build.results] == ["SketchType"]
    assert [o.name for o in merge.operands] == ["a", "b"]
    assert all(p.rule("local_flow") is local_conservative for p in (build, merge, query))
    assert all(p.rule("cost") is local_cost for p in (build, merge, query))
    agg = cms.aggregate_p
    assert agg.targets == ("CMS",) and agg.rule("flow") is conservative
    assert agg.attrs["to"].required and [o.name for o in agg.operands] == ["s"]

    def merge_items() -> Any:
        x = simp.constant((0,), np.arange(3, dtype=np.int32))
        return simp.pcall((0,), lambda v: cms.merge(v, v), x)

    with pytest.raises(mp.MPTypeError, match=r"^cms\.merge: operand a must be SketchType, "
                                             r"got i32\[3\]"):
        mp.compile(merge_items, world_size=2)

    def aggregate_items() -> Any:
        return cms.aggregate(simp.constant((0,), np.arange(3, dtype=np.int32)), to=1)

    with pytest.raises(mp.MPTypeError, match=r"^cms\.aggregate: operand s must be a sketch at "
                                             r"the simp level, got i32\[3\]@\{0\}"):
        mp.compile(aggregate_items, world_size=2)


# ---------------------------------------------------------------- codecs


def test_sketch_type_round_trips(cms: ModuleType) -> None:
    t = cms.SketchType(64, 4, 7)
    for value in (t, MPType(t, mp.Mask.of([0, 2])), MPType(t, None)):
        encoded = encode_type(value)
        assert json.loads(json.dumps(encoded)) == encoded
        assert decode_type(encoded) == value
    assert encode_type(t) == {"cms.sketch": [64, 4, 7]}
    assert t.plaintext() == TensorType("int64", (4, 64))


@pytest.mark.parametrize("body", [[64, 4], [0, 4, 7], [64, 4, -1], ["64", 4, 7], {"w": 64},
                                  [64, 4, 7.0], [64, 1 << 10, 7], [True, 4, 7]])
def test_malformed_sketch_types_are_refused(cms: ModuleType, body: Any) -> None:
    with pytest.raises(mp.MPSerializationError, match=r"t\.cms\.sketch"):
        decode_type({"cms.sketch": body}, "t")


def test_sketch_codec_round_trips(cms: ModuleType) -> None:
    sketch = cms.Sketch(64, 4, 7, REF)
    assert decode_value(encode_value_bytes(sketch)) == sketch
    other = cms.Sketch.of_items(ITEMS[0], **SKETCH)
    assert decode_value(encode_value_bytes([sketch, other])) == [sketch, other]
    assert cms.Sketch.of_items(np.concatenate(ITEMS), **SKETCH) == sketch
    empty = cms.Sketch.of_items(np.zeros(0, np.int64), width=1, depth=1, seed=0)
    assert decode_value(encode_value_bytes(empty)) == empty


def _sketch_frame(head: bytes, *chunks: bytes) -> bytes:
    sizes = [len(head), *(len(c) for c in chunks)]
    text = json.dumps({"kind": "cms.sketch", "sizes": sizes}).encode()
    return b"MPV1" + struct.pack("<I", len(text)) + text + head + b"".join(chunks)


def _head(width: int = 8, depth: int = 2, seed: int = 7, magic: bytes = b"CMS1") -> bytes:
    return struct.pack("<4sIIQ", magic, width, depth, seed)


GOOD_COUNTS = np.arange(16, dtype="<i8").tobytes()


@pytest.mark.parametrize("data, message", [
    (_sketch_frame(_head(), GOOD_COUNTS[:-8]), "120 bytes of counts, expected 128"),
    (_sketch_frame(_head(), GOOD_COUNTS + b"\0" * 8), "136 bytes of counts"),
    (_sketch_frame(_head(magic=b"XXXX"), GOOD_COUNTS), "bad magic"),
    (_sketch_frame(_head()[:-1], GOOD_COUNTS), "header of 19 bytes"),
    (_sketch_frame(_head(), GOOD_COUNTS, b""), "expected 2 chunks"),
    (_sketch_frame(_head(width=0), b""), "width must be an int in"),
    (_sketch_frame(_head(depth=1000), GOOD_COUNTS), "depth must be an int in"),
    (_sketch_frame(_head(seed=1 << 63), GOOD_COUNTS), "seed must be an int in"),
    (_sketch_frame(_head(width=1 << 21, depth=32), b""), "width must be an int in"),
    (_sketch_frame(_head(), np.full(16, -1, "<i8").tobytes()), "negative counts"),
])
def test_malformed_sketch_payloads_are_refused(cms: ModuleType, data: bytes,
                                               message: str) -> None:
    assert decode_value(_sketch_frame(_head(), GOOD_COUNTS)) == \
        cms.Sketch(8, 2, 7, np.arange(16, dtype=np.int64).reshape(2, 8))
    with pytest.raises(mp.MPSerializationError, match=message):
        decode_value(data)


def test_the_frame_sizes_must_match_the_payload(cms: ModuleType) -> None:
    good = b"".join(bytes(c) for c in encode_value(cms.Sketch(8, 2, 7, np.zeros((2, 8),
                                                                                 np.int64))))
    with pytest.raises(mp.MPSerializationError, match=r"cms\.sketch sizes"):
        decode_value(good[:-1])


# ---------------------------------------------------------------- real worker processes


def test_sketch_program_on_worker_processes(cms: ModuleType, cms_driver: mp.Driver) -> None:
    for mode in ("launch", "standard"):
        merged, estimates = mp.evaluate(cms_driver, sketch_program(cms), mode=mode)
        sketches = mp.fetch(cms_driver, merged)  # sent back through the plugin's codec
        assert isinstance(sketches[0], cms.Sketch) and sketches[1:] == [None, None]
        np.testing.assert_array_equal(sketches[0].counts, REF)
        check_estimates(mp.fetch(cms_driver, estimates)[0])


def test_aggregate_and_device_programs_on_worker_processes(cms: ModuleType,
                                                           cms_driver: mp.Driver) -> None:
    items = [v[:200] for v in ITEMS]
    want = ref_query(ref_counts(items, **SKETCH), KEYS, SKETCH["seed"])
    for mode in ("launch", "standard"):
        values = mp.fetch(cms_driver, mp.evaluate(cms_driver, aggregate_program(cms, 1),
                                                  mode=mode))
        np.testing.assert_array_equal(values[1], want)
    estimates, on_p2 = mp.evaluate(cms_driver, device_program(cms))
    check_estimates(mp.fetch(cms_driver, estimates))
    check_estimates(mp.fetch(cms_driver, on_p2))


def _one_node_spec(with_cms: bool) -> mp.ClusterSpec:
    data = cms_spec_dict(support.free_ports(1))
    data["devices"] = {"P0": data["devices"]["P0"]}
    if with_cms:
        data["devices"]["C0"] = {"kind": "CMS", "members": ["node_0"]}
    return mp.ClusterSpec.from_dict(data)


def test_a_worker_without_the_plugin_refuses_the_program(cms: ModuleType) -> None:
    spec = _one_node_spec(with_cms=False)

    @mp.function
    def prog() -> Any:
        x = simp.constant((0,), ITEMS[0])
        return simp.pcall((0,), lambda v: cms.query(cms.build(v, **SKETCH), v), x)

    with LocalCluster(spec) as cluster:
        driver = cluster.driver(timeout=30.0)
        try:
            with pytest.raises(mp.MPRuntimeError) as info:
                mp.evaluate(driver, prog)
            message = str(info.value)
            assert "party 0" in message and "refused to run" in message and " 400 " in message
            assert "cms.sketch" in message or "cms.build" in message
            # the worker is still up and runs programs that need no plugin
            out = mp.evaluate(driver, lambda: simp.constant((0,), 3))
            assert mp.fetch(driver, out) == [3]
        finally:
            driver.close()


def test_a_worker_without_the_plugin_cannot_serve_a_cms_device(cms: ModuleType) -> None:
    cluster = LocalCluster(_one_node_spec(with_cms=True))
    try:
        with pytest.raises(mp.MPLangError, match=r"exited with code 2.*kind must be one of"):
            cluster.start(timeout=60)
    finally:
        cluster.close()


# ---------------------------------------------------------------- the command line


def test_mplang_ops_lists_the_plugins_ops(cms: ModuleType) -> None:
    result = subprocess.run([*support.mplang_command(), "ops", "--family", "cms", "--json"],
                            capture_output=True, text=True, timeout=120, check=True)
    ops = json.loads(result.stdout)
    assert [op["name"] for op in ops] == ["cms.aggregate", "cms.build", "cms.merge",
                                          "cms.query"]
    by_name = {op["name"]: op for op in ops}
    assert all(op["family"] == "cms" for op in ops)
    assert by_name["cms.build"]["execution_model"] == "single_rank"
    assert by_name["cms.build"]["routes"] == ["CMS", "PPU"]
    assert by_name["cms.aggregate"]["execution_model"] == "multi_party"
    assert by_name["cms.aggregate"]["routes"] == ["CMS"]
    assert by_name["cms.query"]["doc"].startswith("The estimated count of each key")
    assert {"name", "family", "op_kind", "execution_model", "routes", "doc"} <= set(ops[0])


@pytest.mark.parametrize("command", ["worker", "up"])
def test_worker_and_up_refuse_an_unknown_plugin(cms: ModuleType, command: str, tmp_path: Any,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    args = [command, "--cluster", str(tmp_path / "cluster.yaml"), "--plugin", "no_such_plugin"]
    assert main([*args, "--node", "node_0"] if command == "worker" else args) == 2
    err = capsys.readouterr().err
    assert f"mplang {command}: cannot load plugin 'no_such_plugin'" in err
    assert "installed plugins:" in err and "cms" in err
