"""The IR text form and the safe serialized form of programs."""

import copy
import json
import os
import pathlib
import pickle
import random
import re
import struct
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor

WORLD = 3
HEADER = struct.Struct("<8sQ")


# ---------------------------------------------------------------- programs


@mp.function
def design_prog(a):
    """The DESIGN.md example."""
    x = simp.constant((0,), a)
    y = simp.pcall((0,), lambda v: tensor.run_jax(jnp.square, v), x)
    return simp.shuffle_static(y, {1: 0})


@mp.func.func
def total(x):
    return simp.pcall(None, jnp.sum, x)


def every_op():
    """Uses every simp primitive, tensor.run_jax and func.func."""
    r = simp.prank()
    c = simp.constant((0, 1, 2), jnp.arange(3, dtype=jnp.int32))
    sq = simp.pcall(None, lambda a: tensor.run_jax(jnp.square, a), c)
    moved = simp.shuffle_static(simp.constant((0,), 7), {2: 0, 1: 0})
    idx = simp.pcall(None, lambda x: (x + 1) % 3, r)
    rot = simp.shuffle(r, idx)
    merged = simp.converge(simp.constant((0,), 100), moved)
    pred = simp.pcall(None, lambda x: x >= 0, r)
    chosen = simp.uniform_cond(pred, lambda m: m + 1, lambda m: m - 1, merged)
    count = simp.while_loop(lambda i: simp.pcall(None, lambda v: v < 5, i),
                            lambda i: i + 1, simp.constant((0, 1, 2), 0))
    return {"rot": rot, "moved": moved, "chosen": chosen, "count": count,
            "total": total(sq), "sq": sq}


EVERY_OP_RESULT = {
    "rot": [1, 2, 0],
    "moved": [None, 7, 7],
    "chosen": [101, 8, 8],
    "count": [5, 5, 5],
    "total": [5, 5, 5],
    "sq": [[0, 1, 4]] * 3,
}


def big_constant():
    x = simp.constant((1,), np.linspace(0.0, 1.0, 100, dtype=np.float32))
    return simp.pcall((1,), lambda v: v * 2.0, x)


SIMP_OPS = ["simp.constant", "simp.prank", "simp.pcall", "simp.shuffle_static", "simp.shuffle",
            "simp.converge", "simp.uniform_cond", "simp.while_loop"]


@pytest.fixture(scope="module")
def design_program():
    return mp.compile(design_prog, 3, world_size=WORLD)


@pytest.fixture(scope="module")
def every_op_program():
    return mp.compile(every_op, world_size=WORLD)


@pytest.fixture
def simulator():
    sim = mp.Simulator(WORLD)
    try:
        yield sim
    finally:
        sim.close()


def plain(values):
    """Fetched per-party values as plain Python data."""
    return [None if v is None else np.asarray(v).tolist() for v in values]


def split(data):
    """Serialized bytes -> (JSON document, buffer bytes)."""
    _magic, n = HEADER.unpack_from(data)
    return json.loads(data[HEADER.size:HEADER.size + n]), data[HEADER.size + n:]


def pack(doc, tail, text=None):
    if text is None:
        text = json.dumps(doc).encode()
    return HEADER.pack(b"MPLANG\x00\x01", len(text)) + text + tail


# ---------------------------------------------------------------- printer


DESIGN_TEXT = """\
func @design_prog() -> (i32[]@{1}) {
  %0 = simp.constant() {parties={0}, value=3:int32} : (i32[]@{0})
  %3 = simp.pcall(%0) {fn='<lambda>', parties={0}} : (i32[]@{0})
    region 0 (%1: i32[]) {
      %2 = tensor.run_jax(%1) {fn='square'} : (i32[])
      return %2
    }
  %4 = simp.shuffle_static(%3) {routes={1: 0}} : (i32[]@{1})
  return %4
}"""


def test_design_example_prints_as_golden_text(design_program):
    assert str(design_program) == DESIGN_TEXT


OP_LINE = re.compile(
    r"^(?P<indent> *)(%\d+(, %\d+)* = )?(?P<op>[a-z_]+\.[a-z_]+)\((%\d+(, %\d+)*)?\)"
    r"( \{.*\})? : \((?P<types>.*)\)$")
REGION_LINE = re.compile(r"^(?P<indent> *)region \d+ \((%\d+: \S+(, %\d+: \S+)*)?\) \{$")


def test_every_line_is_an_op_a_region_header_a_return_or_a_brace(every_op_program):
    text = str(every_op_program)
    lines = text.splitlines()
    assert lines[0].startswith("func @every_op() -> (")
    assert lines[-1] == "}"
    ops = 0
    for line in lines[1:-1]:
        stripped = line.strip()
        if OP_LINE.match(line):
            ops += 1
        else:
            assert REGION_LINE.match(line) or stripped == "}" or stripped.startswith("return"), (
                line)
    assert ops == sum(1 for _ in every_op_program.graph.walk())


def test_printed_ops_and_types(every_op_program):
    text = str(every_op_program)
    for name in [*SIMP_OPS, "tensor.run_jax", "func.call"]:
        assert f" = {name}(" in text or f" {name}(" in text
    assert "simp.prank() : (i32[]@{0,1,2})" in text
    assert "value=[0,1,2]:int32} : (i32[3]@{0,1,2})" in text
    assert "{routes={1: 0, 2: 0}} : (i32[]@{1,2})" in text
    assert "{callee='total'}" in text
    assert "{verify_uniform=True}" in text
    assert "module" not in text  # the StableHLO bytes are not printed


def test_regions_are_indented_under_their_op(every_op_program):
    lines = str(every_op_program).splitlines()
    for i, line in enumerate(lines):
        m = OP_LINE.match(line)
        if m and m["op"] in ("simp.pcall", "simp.uniform_cond", "simp.while_loop", "func.call"):
            indent = len(m["indent"])
            header = lines[i + 1]
            assert REGION_LINE.match(header), header
            assert len(header) - len(header.lstrip()) == indent + 2
            body = lines[i + 2]
            assert len(body) - len(body.lstrip()) == indent + 4


def test_region_inputs_print_their_types(every_op_program):
    text = str(every_op_program)
    # pcall bodies are party-local (no pmask); control-flow regions are simp level
    assert re.search(r"region 0 \(%\d+: i32\[3\]\) \{", text)
    assert re.search(r"region 0 \(%\d+: i32\[\]@\{0,1,2\}\) \{", text)
    assert re.search(r"region 0 \(%\d+: i32\[3\]@\{0,1,2\}\) \{", text)  # func.call body


def test_header_lists_output_types(every_op_program):
    first = str(every_op_program).splitlines()[0]
    outs = ", ".join(str(v.type) for v in every_op_program.graph.outputs)
    assert first == f"func @every_op() -> ({outs}) {{"


def test_large_array_attribute_is_summarized():
    text = str(mp.compile(big_constant, world_size=WORLD))
    assert "value=array<float32[100]>" in text
    assert "0.0101" not in text


# ---------------------------------------------------------------- round trip


def roundtrip(program):
    data = program.to_bytes()
    back = mp.Program.from_bytes(data)
    return data, back


@pytest.mark.parametrize("fn, args", [(design_prog, (3,)), (every_op, ()),
                                      (big_constant, ())], ids=["design", "every-op", "big"])
def test_roundtrip_bytes(fn, args):
    program = mp.compile(fn, *args, world_size=WORLD)
    data, back = roundtrip(program)
    assert isinstance(data, bytes)
    assert back.to_bytes() == data
    assert back.world_size == WORLD
    assert back.name == program.name
    assert back.out_tree == program.out_tree
    assert back.input_types == program.input_types
    assert back.output_types == program.output_types


@pytest.mark.parametrize("fn, args", [(design_prog, (3,)), (every_op, ()),
                                      (big_constant, ())], ids=["design", "every-op", "big"])
def test_roundtrip_text(fn, args):
    program = mp.compile(fn, *args, world_size=WORLD)
    _, back = roundtrip(program)
    assert str(back) == str(program)


def test_roundtrip_keeps_every_op(every_op_program):
    _, back = roundtrip(every_op_program)
    ops = {op.opcode for op in back.graph.walk()}
    assert set(SIMP_OPS) <= ops
    assert {"tensor.run_jax", "func.call"} <= ops
    back.graph.verify()


def test_roundtrip_keeps_attribute_values(every_op_program):
    _, back = roundtrip(every_op_program)
    before = list(every_op_program.graph.walk())
    after = list(back.graph.walk())
    assert len(before) == len(after)
    for a, b in zip(before, after, strict=True):
        assert a.opcode == b.opcode
        assert set(a.attrs) == set(b.attrs)
        for key, value in a.attrs.items():
            if isinstance(value, np.ndarray):
                assert b.attrs[key].dtype == value.dtype
                np.testing.assert_array_equal(b.attrs[key], value)
            else:
                assert b.attrs[key] == value
                assert type(b.attrs[key]) is type(value)


def test_roundtrip_of_bfloat16_program():
    def fn():
        x = simp.constant((0,), 1.5)
        return simp.pcall((0,), lambda v: v.astype(jnp.bfloat16), x)

    program = mp.compile(fn, world_size=WORLD)
    assert "bf16[]@{0}" in str(program)
    data, back = roundtrip(program)
    assert back.to_bytes() == data


def test_roundtripped_program_runs_the_same(every_op_program, simulator):
    _, back = roundtrip(every_op_program)
    for program in (every_op_program, back):
        out = mp.fetch(simulator, mp.evaluate(simulator, program))
        assert {k: plain(v) for k, v in out.items()} == EVERY_OP_RESULT


def test_loaded_design_program_runs(design_program, simulator, tmp_path):
    path = tmp_path / "prog.mpl"
    design_program.save(path)
    out = mp.fetch(simulator, mp.evaluate(simulator, mp.load(path)))
    assert plain(out) == [None, 9, None]


# ---------------------------------------------------------------- determinism


def test_compiling_twice_gives_identical_bytes():
    assert (mp.compile(every_op, world_size=WORLD).to_bytes()
            == mp.compile(every_op, world_size=WORLD).to_bytes())
    assert (mp.compile(design_prog, 3, world_size=WORLD).to_bytes()
            == mp.compile(design_prog, 3, world_size=WORLD).to_bytes())


def test_separately_defined_identical_functions_give_identical_bytes():
    def make():
        def prog():
            x = simp.constant((0, 1), np.arange(4, dtype=np.float32))
            y = simp.pcall(None, lambda v: tensor.run_jax(jnp.cumsum, v), x)
            return {"b": simp.shuffle_static(y, {2: 1, 0: 0}), "a": y}
        return prog

    assert (mp.compile(make(), world_size=WORLD).to_bytes()
            == mp.compile(make(), world_size=WORLD).to_bytes())


def test_different_programs_give_different_bytes():
    assert (mp.compile(design_prog, 3, world_size=WORLD).to_bytes()
            != mp.compile(design_prog, 4, world_size=WORLD).to_bytes())


def test_bytes_do_not_depend_on_the_process(tmp_path):
    script = tmp_path / "emit.py"
    script.write_text(textwrap.dedent("""
        import hashlib
        import jax.numpy as jnp
        import mplang as mp
        from mplang import simp, tensor

        def prog():
            r = simp.prank()
            x = simp.constant((0, 1, 2), jnp.arange(3, dtype=jnp.int32))
            y = simp.pcall(None, lambda a, b: tensor.run_jax(jnp.add, a, b), x, r)
            z = simp.shuffle_static(y, {2: 0, 0: 1, 1: 2})
            return {"zz": z, "aa": (y, [r]), "mm": simp.converge(simp.constant((1,), 5))}

        print(hashlib.sha256(mp.compile(prog, world_size=3).to_bytes()).hexdigest())
    """))
    digests = set()
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed, JAX_PLATFORMS="cpu")
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              env=env, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        digests.add(done.stdout.strip())
    assert len(digests) == 1


# ---------------------------------------------------------------- save / load


def test_save_and_load(design_program, tmp_path):
    path = tmp_path / "prog.mpl"
    design_program.save(path)
    assert path.read_bytes() == design_program.to_bytes()
    loaded = mp.load(path)
    assert isinstance(loaded, mp.Program)
    assert loaded.to_bytes() == design_program.to_bytes()
    assert loaded.output_types == design_program.output_types


def test_save_accepts_str_paths(every_op_program, tmp_path):
    path = str(tmp_path / "every.mpl")
    every_op_program.save(path)
    assert mp.load(path).to_bytes() == every_op_program.to_bytes()


def test_saved_file_starts_with_magic(design_program, tmp_path):
    path = tmp_path / "p.mpl"
    design_program.save(path)
    assert path.read_bytes()[:8] == b"MPLANG\x00\x01"


def test_load_of_a_non_program_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    with pytest.raises(mp.MPSerializationError):
        mp.load(path)


# ---------------------------------------------------------------- malformed input


@pytest.fixture(scope="module")
def valid():
    """(document, buffers) of a program with a run_jax module and an array constant."""
    def fn():
        x = simp.constant((0,), np.arange(4, dtype=np.int32))
        return simp.pcall((0,), lambda v: v + 1, x)

    doc, tail = split(mp.compile(fn, world_size=WORLD).to_bytes())
    assert doc["graph"]["ops"][0]["op"] == "simp.constant"
    assert doc["graph"]["ops"][1]["op"] == "simp.pcall"
    return doc, tail


def mutated(valid, change):
    doc, tail = valid
    doc = copy.deepcopy(doc)
    change(doc)
    return pack(doc, tail)


def assert_rejected(data, match=None):
    with pytest.raises(mp.MPSerializationError, match=match):
        mp.Program.from_bytes(data)


def test_unmodified_valid_document_loads(valid):
    mp.Program.from_bytes(mutated(valid, lambda d: None))


def test_every_truncation_is_rejected(design_program):
    data = design_program.to_bytes()
    for n in range(len(data)):
        try:
            mp.Program.from_bytes(data[:n])
        except mp.MPSerializationError:
            continue
        pytest.fail(f"a program truncated to {n} of {len(data)} bytes was accepted")


def test_truncations_of_a_large_program_are_rejected(every_op_program):
    data = every_op_program.to_bytes()
    for n in sorted({*range(0, 40), *range(0, len(data), 97), len(data) - 1}):
        assert_rejected(data[:n])


@pytest.mark.parametrize("magic", [b"MPLANG\x00\x02", b"\x00" * 8, b"PK\x03\x04\x00\x00\x00\x00"])
def test_bad_magic(design_program, magic):
    data = design_program.to_bytes()
    assert_rejected(magic + data[8:], match="magic")


def test_bad_json(valid):
    _, tail = valid
    assert_rejected(pack(None, tail, text=b"{not json"), match="JSON")
    assert_rejected(pack(None, tail, text=b"\xff\xfe\x00"), match="JSON")
    assert_rejected(pack(None, tail, text=b"[" * 100_000 + b"]" * 100_000))


@pytest.mark.parametrize("text", [b"[]", b"null", b"{}", b'{"version": 1}', b"3"])
def test_json_of_the_wrong_shape(valid, text):
    assert_rejected(pack(None, valid[1], text=text))


def test_json_with_a_huge_integer_literal(valid):
    text = b'{"version": ' + b"9" * 5000 + b', "meta": {}, "graph": {}, "buffers": []}'
    assert_rejected(pack(None, valid[1], text=text))


def set_op(i, key, value):
    def change(doc):
        doc["graph"]["ops"][i][key] = value
    return change


def set_attr(i, key, value):
    def change(doc):
        doc["graph"]["ops"][i]["attrs"][key] = value
    return change


def set_region_op(key, value):
    def change(doc):
        doc["graph"]["ops"][1]["regions"][0]["ops"][0][key] = value
    return change


def set_path(*path_and_value):
    *path, value = path_and_value

    def change(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return change


MALFORMED = {
    "unknown-op": (set_op(0, "op", "simp.teleport"), "unknown op"),
    "unknown-region-op": (set_region_op("op", "tensor.eval_python"), "unknown op"),
    "op-name-not-str": (set_op(0, "op", 5), None),
    "unknown-attr-tag": (set_attr(0, "value", {"$pickle": "gASV"}), "tag"),
    "attr-two-tags": (set_attr(0, "value", {"$mask": 1, "$bytes": 0}), None),
    "array-object-dtype": (set_attr(0, "value", {"$array": ["object", [4], 0]}), "dtype"),
    "array-str-dtype": (set_attr(0, "value", {"$array": ["<U1", [4], 0]}), "dtype"),
    "array-dtype-list": (set_attr(0, "value", {"$array": [["int32"], [4], 0]}), None),
    "array-wrong-size": (set_attr(0, "value", {"$array": ["int32", [5], 0]}), "size"),
    "array-wrong-size-huge": (set_attr(0, "value", {"$array": ["int32", [2**40, 2**40], 0]}),
                              "size"),
    "array-negative-shape": (set_attr(0, "value", {"$array": ["int32", [-4], 0]}), "shape"),
    "array-bad-body": (set_attr(0, "value", {"$array": ["int32", [4]]}), None),
    "array-buffer-index": (set_attr(0, "value", {"$array": ["int32", [4], 99]}), "buffer"),
    "bytes-bad-index": (set_attr(0, "value", {"$bytes": -1}), "buffer"),
    "mask-negative": (set_attr(0, "parties", {"$mask": -1}), None),
    "float-bad": (set_attr(0, "value", {"$float": "1e999999"}), None),
    "dict-unhashable-key": (set_attr(0, "value", {"$dict": [[[1, 2], 3]]}), None),
    "dict-array-key": (set_attr(0, "value", {"$dict": [[{"$array": ["int32", [4], 0]}, 1]]}),
                       None),
    "deep-tuple": (set_attr(0, "value", json.loads('{"$tuple": [' * 70 + "1" + "]}" * 70)),
                   None),
    "span-past-end": (set_path("buffers", 0, [0, 10**9]), "past the end"),
    "span-negative": (set_path("buffers", 0, [-1, 4]), None),
    "span-not-pair": (set_path("buffers", 0, [0]), None),
    "buffers-not-list": (set_path("buffers", {"0": [0, 4]}), None),
    "undefined-input": (set_op(1, "in", ["999"]), "not defined"),
    "undefined-region-input": (set_region_op("in", ["0"]), "not defined"),
    "undefined-output": (set_path("graph", "outputs", ["12345"]), "not defined"),
    "value-defined-twice": (set_op(1, "out", [["0", {"mp": [{"tensor": ["int32", [4]]}, 1]}]]),
                            "twice"),
    "unknown-type-tag": (set_op(0, "out", [["0", {"pyobject": "os.system"}]]), "type"),
    "bad-dtype-in-type": (set_op(0, "out", [["0", {"mp": [{"tensor": ["object", [4]]}, 1]}]]),
                          "dtype"),
    "negative-shape-in-type": (set_op(0, "out", [["0", {"mp": [{"tensor": ["int32", [-4]]}, 1]}]]),
                               None),
    "negative-pmask": (set_op(0, "out", [["0", {"mp": [{"tensor": ["int32", [4]]}, -1]}]]), None),
    "mp-of-mp": (set_op(0, "out", [["0", {"mp": [{"mp": [{"tensor": ["int32", []]}, 1]}, 1]}]]),
                 None),
    "op-missing-field": (lambda d: d["graph"]["ops"][0].pop("regions"), None),
    "op-extra-field": (set_op(0, "code", "print(1)"), None),
    "regions-not-list": (set_op(1, "regions", {"0": 1}), None),
    "region-not-graph": (set_op(1, "regions", [5]), None),
    "attrs-not-object": (set_op(0, "attrs", []), None),
    "version": (set_path("version", 2), "version"),
    "world-size-zero": (set_path("meta", "world_size", 0), "metadata"),
    "world-size-str": (set_path("meta", "world_size", "3"), "metadata"),
    "name-not-str": (set_path("meta", "name", 5), "metadata"),
    "meta-not-object": (set_path("meta", []), "metadata"),
    "out-tree-mismatch": (set_path("meta", "out_tree",
                                   {"kind": "tuple", "children": [], "meta": []}), "output tree"),
    "out-tree-bad-kind": (set_path("meta", "out_tree",
                                   {"kind": "module", "children": [], "meta": []}), None),
    "out-tree-unhashable-dict-key": (
        set_path("meta", "out_tree", {"kind": "dict", "meta": [[1]], "children": [
            {"kind": "leaf", "children": [], "meta": []}]}), None),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_document_is_rejected(valid, name):
    change, match = MALFORMED[name]
    assert_rejected(mutated(valid, change), match=match)


def test_random_corruption_is_rejected_or_loads(every_op_program):
    data = every_op_program.to_bytes()
    rng = random.Random(20240601)
    for _ in range(400):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        try:
            loaded = mp.Program.from_bytes(bytes(corrupt))
        except mp.MPSerializationError:
            continue
        str(loaded)  # whatever loads can be printed and re-encoded
        loaded.to_bytes()


def test_random_json_corruption_is_rejected_or_loads(every_op_program):
    data = every_op_program.to_bytes()
    n = HEADER.unpack_from(data)[1]
    rng = random.Random(7)
    for _ in range(400):
        corrupt = bytearray(data)
        for _ in range(rng.randint(1, 2)):
            corrupt[rng.randrange(HEADER.size, HEADER.size + n)] = rng.choice(
                b'{}[]",:0123456789-.eE $truefalsn')
        try:
            mp.Program.from_bytes(bytes(corrupt))
        except mp.MPSerializationError:
            continue


def test_oversized_program_is_rejected():
    from mplang.edsl.serde import decode_graph_bundle

    with pytest.raises(mp.MPSerializationError, match="exceeds"):
        decode_graph_bundle(b"MPLANG\x00\x01" + b"\x00" * 100, max_bytes=50)


# ---------------------------------------------------------------- no code execution


class _TouchOnUnpickle:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def evil_pickle(path, protocol=pickle.HIGHEST_PROTOCOL):
    return pickle.dumps(_TouchOnUnpickle(path), protocol=protocol)


def test_the_pickle_payload_is_live(tmp_path):
    # control: unpickling this payload really creates the file
    marker = tmp_path / "control"
    pickle.loads(evil_pickle(marker))
    assert marker.exists()


@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_pickle_payload_is_rejected_and_not_executed(tmp_path, protocol):
    marker = tmp_path / "pwned"
    with pytest.raises(mp.MPSerializationError):
        mp.Program.from_bytes(evil_pickle(marker, protocol))
    assert not marker.exists()


def test_pickle_payload_behind_a_valid_header_is_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(mp.MPSerializationError):
        mp.Program.from_bytes(pack(None, b"", text=evil_pickle(marker)))
    assert not marker.exists()


def test_pickle_file_is_not_executed_by_load(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "prog.mpl"
    path.write_bytes(evil_pickle(marker))
    with pytest.raises(mp.MPSerializationError):
        mp.load(path)
    assert not marker.exists()


def test_pickle_in_a_buffer_stays_data(valid, tmp_path):
    marker = tmp_path / "pwned"
    doc, tail = copy.deepcopy(valid[0]), valid[1]
    payload = evil_pickle(marker)
    doc["buffers"].append([len(tail), len(payload)])
    index = len(doc["buffers"]) - 1
    noted = copy.deepcopy(doc)
    noted["graph"]["ops"][0]["attrs"]["note"] = {"$bytes": index}  # an undeclared attribute
    with pytest.raises(mp.MPSerializationError, match=r"op #0 simp\.constant.*attributes do "
                                                      r"not match the declaration \(missing "
                                                      r"\[\], unknown \['note'\]\)"):
        mp.Program.from_bytes(pack(noted, tail + payload))
    body = doc["graph"]["ops"][1]["regions"][0]["ops"][0]
    assert body["op"] == "tensor.run_jax"
    body["attrs"]["module"] = {"$bytes": index}  # the run_jax "code" is a pickle
    with pytest.raises(mp.MPSerializationError, match="malformed run_jax module: header: bad "
                                                      "magic"):
        mp.Program.from_bytes(pack(doc, tail + payload))
    assert not marker.exists()

