"""The text IR: `Program.to_text` / `Program.from_text` give back the same bytes, every
attribute kind has one exact textual form, errors name their line and column, hand
edited programs run, and run_jax modules print as StableHLO text."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import export as jax_export

import mplang as mp
from mplang import simp, tensor
from mplang.dialects.tensor import canonical_bytecode, module_info
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.private import Commitment
from mplang.edsl.pytree import LEAF
from mplang.edsl.serde import encode_attrs, encode_graph_bundle
from mplang.edsl.text_parser import parse_program
from mplang.edsl.text_printer import format_program, format_value
from mplang.edsl.typing import (
    BaseType,
    Mask,
    MPType,
    TensorType,
    TypeDecoder,
    TypeEncoder,
    register_type,
)
from tests.dialects.corpus import corpora
from tests.filecheck import filecheck

CORPUS_NAMES = sorted(corpora())
I32 = TensorType("int32", ())


@register_type("test.text_ir.boxed")
@dataclass(frozen=True)
class Boxed(BaseType):
    """A plugin type holding another type: printed by its tag and JSON body."""

    label: str
    inner: BaseType

    def to_json(self, encode: TypeEncoder) -> Any:
        return [self.label, encode(self.inner)]

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> Boxed:
        label, inner = body
        value = decode(inner, f"{path}[1]")
        assert isinstance(value, BaseType)
        return Boxed(label, value)


# ---------------------------------------------------------------- the conformance corpus


@pytest.fixture(scope="module")
def corpus() -> dict[str, mp.Program]:
    from tests.test_conformance import CLUSTER, CORPUS

    assert sorted(CORPUS) == CORPUS_NAMES
    return {name: mp.compile(fn, cluster=CLUSTER) for name, (fn, _) in CORPUS.items()}


@pytest.mark.parametrize("name", CORPUS_NAMES)
def test_corpus_program_round_trips_through_text(name: str,
                                                 corpus: dict[str, mp.Program]) -> None:
    program = corpus[name]
    text = program.to_text()
    loaded = mp.Program.from_text(text)
    assert loaded.to_bytes() == program.to_bytes()
    assert loaded.to_text() == text
    assert str(loaded) == str(program)


def test_corpus_run_jax_modules_print_as_stablehlo(corpus: dict[str, mp.Program]) -> None:
    text = corpus["tensor"].to_text()
    filecheck(text, """
        CHECK: program @tensor_corpus {world_size = 3, out_devices = [none, none], out_tree =
        CHECK: func() -> (f32[3]@{0}, f32[3]@{0,1}) {
        CHECK: func.call(%0) {callee = "triple"}
        CHECK: tensor.constant() {value = array<f32[3]: [3.0, 3.0, 3.0]>} : (f32[3]) loc(
        CHECK: = tensor.run_jax(%5, %6) {fn = "multiply", module = #stablehlo<
        CHECK-NEXT: |{"calling_convention":{{[0-9]+}},"in":[["float32",[3]],["float32",[3]]],
        CHECK-SAME: "kept":[0,1],"out":[["float32",[3]]],"platform":"cpu","version":1}
        CHECK-NEXT: |// StableHLO_v{{[0-9.]+}}
        CHECK: |  func.func public @main(%arg0: tensor<3xf32> loc("arrays[0]")
        CHECK-NEXT: |    %0 = stablehlo.multiply %arg0, %arg1 : tensor<3xf32>
        CHECK-NOT: b64"
        CHECK: >} : (f32[3]) loc(
        CHECK-NEXT: return %7
    """)


def test_spu_executables_print_as_base64(corpus: dict[str, mp.Program]) -> None:
    filecheck(corpus["spu"].to_text(), """
        CHECK: = spu.run(
        CHECK-SAME: executable = b64"
        CHECK-SAME: in_types = (i32[4], i32[4], i32[4]), members = (0, 1, 2)
        CHECK-SAME: : (!share<["spu", {"tensor": ["int32", [4]]}]>@{0,1,2})
    """)


# ---------------------------------------------------------------- attribute values


def _round_trip(attrs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    out = Value("x", MPType(I32, Mask(1)))
    graph = Graph([], [Operation("simp.constant", (), (out,), attrs)], [out])
    text = format_program(graph, "main", 1, LEAF.to_json(), [None])
    parsed, _ = parse_program(text)
    assert format_program(parsed, "main", 1, LEAF.to_json(), [None]) == text
    return text, dict(parsed.operations[0].attrs)


NAN_WITH_PAYLOAD = np.frombuffer(b"\x01\x00\xc0\x7f", np.float32)

VALUES: list[tuple[Any, str]] = [
    (None, "none"), (True, "true"), (False, "false"), (0, "0"), (-5, "-5"),
    (2**70, "1180591620717411303424"), (1.5, "1.5"), (3.0, "3.0"), (-0.0, "-0.0"),
    (1e300, "1e+300"), (5e-324, "5e-324"), (math.nan, "nan"), (math.inf, "inf"),
    (-math.inf, "-inf"), ('a "q"\n\tü', '"a \\"q\\"\\n\\tü"'), ("\ud800", '"\\ud800"'),
    (b"", 'b64""'), (b"\x00\xff", 'b64"AP8="'),
    (np.array([-128, 127], np.int8), "array<i8[2]: [-128, 127]>"),
    (np.array(2**64 - 1, np.uint64), "array<u64[]: 18446744073709551615>"),
    (np.array([[True, False]]), "array<bool[1,2]: [[true, false]]>"),
    (np.array([0.1, -0.0, np.inf, -np.inf, np.nan], np.float32),
     "array<f32[5]: [0.1, -0.0, inf, -inf, nan]>"),
    (np.array([0.1, 6e-8, 65504], np.float16), "array<f16[3]: [0.1, 6e-08, 6.55e+04]>"),
    (np.array([0.1, 3], ml_dtypes.bfloat16), "array<bf16[2]: [0.10009765625, 3.0]>"),
    (np.array([1 / 3, 1e22]), "array<f64[2]: [0.3333333333333333, 1e+22]>"),
    (np.array([1, 2], ">i4"), "array<i32[2]: [1, 2]>"),
    (np.zeros((2, 0), np.int32), "array<i32[2,0]: [[], []]>"),
    (np.zeros((0, 3), np.int32), "array<i32[0,3]: []>"),
    (np.array([1 + 2j], np.complex64), 'array<c64[1]: b64"AACAPwAAAEA=">'),
    (NAN_WITH_PAYLOAD, 'array<f32[1]: b64"AQDAfw==">'),
    (Mask.of([0, 2]), "@{0,2}"), (Mask(0), "@{}"),
    (TensorType("int32", (2, 3)), "i32[2,3]"), (MPType(TensorType("bool", ()), None), "bool[]@?"),
    (MPType(I32, Mask.of([1])), "i32[]@{1}"),
    (Boxed("k", TensorType("uint8", (4,))),
     '!test.text_ir.boxed<["k", {"tensor": ["uint8", [4]]}]>'),
    ((), "()"), ((1,), "(1,)"), ([1, [2.0, "s"]], '[1, [2.0, "s"]]'),
    ({2: 0, "k": (1, None), (1, 2): []}, '{2: 0, "k": (1, none), (1, 2): []}'),
    (Commitment(bytes(32), None), 'commitment<b64"' + "A" * 43 + '=">'),
    (Commitment(bytes(32), TensorType("float32", (3,))),
     'commitment<b64"' + "A" * 43 + '=", f32[3]>'),
]


@pytest.mark.parametrize("value,text", VALUES, ids=[t[:30] for _, t in VALUES])
def test_attribute_value_has_one_exact_text(value: Any, text: str) -> None:
    assert format_value(value) == text
    printed, attrs = _round_trip({"v": value})
    assert f"{{v = {text}}}" in printed
    assert encode_attrs(attrs) == encode_attrs({"v": value})
    assert type(attrs["v"]) is type(value)


def test_array_values_keep_dtype_shape_and_bits() -> None:
    values: dict[str, np.ndarray] = {
        "a": np.arange(100, dtype=np.float32).reshape(4, 25), "b": NAN_WITH_PAYLOAD,
        "c": np.array([[1.5]], np.float64)}
    text, attrs = _round_trip(values)
    assert 'a = array<f32[4,25]: b64"' in text
    for key, value in values.items():
        assert attrs[key].dtype == value.dtype and attrs[key].shape == value.shape
        assert attrs[key].tobytes() == value.tobytes()


def test_hand_written_arrays_accept_ints_for_floats_and_commented_lines() -> None:
    text = """program @main {world_size = 1, out_devices = [none], out_tree = {"kind": "leaf",
        "children": [], "meta": []}}  // the header may span lines
    func() -> (f32[2]@{0}) {
      // a comment line
      %c = simp.constant() {parties = @{0}, value = array<f32[2]: [1, -2.5e1]>} : (f32[2]@{0})
      return %c
    }"""
    program = mp.Program.from_text(text)
    value = program.graph.operations[0].attrs["value"]
    assert value.dtype == np.float32 and value.tolist() == [1.0, -25.0]


def test_names_that_are_not_bare_are_quoted() -> None:
    a, b = Value("a b", MPType(I32, Mask(1))), Value("", MPType(I32, Mask(1)))
    op = Operation("simp.converge", (a,), (b,), {})
    graph = Graph([a], [op], [b])
    text = format_program(graph, "my prog", 1, LEAF.to_json(), ["P0"])
    assert text.splitlines()[:3] == [
        'program @"my prog" {world_size = 1, out_devices = ["P0"], out_tree = '
        '{"kind":"leaf","children":[],"meta":[]}}',
        'func(%"a b": i32[]@{0}) -> (i32[]@{0}) {',
        '  %"" = simp.converge(%"a b") : (i32[]@{0})']
    program = mp.Program.from_text(text)
    assert program.name == "my prog" and program.out_devices == ("P0",)
    assert [v.name for v in program.graph.inputs] == ["a b"]
    assert program.to_bytes() == encode_program(graph, "my prog", 1, ["P0"])


def encode_program(graph: Graph, name: str, world_size: int, devices: list[Any]) -> bytes:
    return encode_graph_bundle(graph, {"name": name, "world_size": world_size,
                                       "out_tree": LEAF.to_json(), "out_devices": devices})


# ---------------------------------------------------------------- errors

BASE = """\
program @main {world_size = 2, out_devices = [none], out_tree = \
{"kind":"leaf","children":[],"meta":[]}}
func(%x: i32[]@{0}) -> (i32[]@{0,1}) {
  %y = simp.shuffle_static(%x) {routes = {1: 0}} : (i32[]@{1}) loc("f.py:3")
  %z = simp.converge(%x, %y) : (i32[]@{0,1})
  return %z
}
"""


def test_base_text_is_a_valid_program() -> None:
    program = mp.Program.from_text(BASE)
    assert program.to_text() == BASE
    assert program.graph.operations[0].loc == "f.py:3"


def _at(text: str, marker: str) -> str:
    """``line L, column C`` of the first occurrence of ``marker`` in ``text``."""
    pos = text.index(marker) + len(marker) - len(marker.lstrip("\n"))
    return f"line {text.count(chr(10), 0, pos) + 1}, column {pos - text.rfind(chr(10), 0, pos)}"


@pytest.mark.parametrize("old,new,marker,message", [
    ("(%x, %y)", "(%x, %w)", "%w", "%w is not defined"),
    ("%y = simp.shuffle_static", "%y = simp.shufle_static", "simp.shufle",
     "unknown op 'simp.shufle_static' (if a plugin defines dialect 'simp', load it here: "
     "mplang worker --plugin NAME)"),
    ("%z = simp", "%y = simp", "%y = simp.converge", "%y is defined twice"),
    ("(%x: i32", "(%x: i33", "i33", "expected a type, found 'i33'"),
    ("{1: 0}}", "{1: 0} ", ": (i32[]@{1})", "expected ',' or '}', found ':'"),
    (": (i32[]@{1})", ": (i32[]@{1}, i32[]@{1})", "i32[]@{1},", "1 result(s) but 2 type(s)"),
    ("{1: 0}}", "{1: [0}}", "}} :", "expected ',' or ']', found '}'"),
    ("{1: 0}}", "{1: 0, [1]: 2}}", "[1]", "a dict key must be hashable"),
    ("routes = ", "routes = routes = ", "routes = {", "expected an attribute value, "
                                                   "found 'routes'"),
    ("routes = {1: 0}", "routes = {1: 0}, routes = {1: 0}", "routes = {1: 0}}",
     "attribute 'routes' is given twice"),
    ('loc("f.py:3")', "loc(f.py:3)", "f.py", "expected a string, found 'f.py'"),
    ("@{0,1}) {", "@{0,1,1025}) {", "{0,1,1025}", "party rank 1025 is not below 1024"),
    ("  return %z\n}\n", "  return %z\n}\nextra", "extra",
     "expected end of text, found 'extra'"),
    ("  return %z\n", "", "\n}", "expected an op or 'return', found '}'"),
    ("world_size = 2", "world_size = two", "two", "expected the world size, found 'two'"),
    ('"kind":"leaf"', '"kind":"leaf",', ',"children"',
     "malformed JSON: Expecting property name enclosed in double quotes"),
    ('"kind":"leaf"', '"kind":"leap"', '{"kind"',
     "malformed out_tree: malformed tree definition kind 'leap'"),
    ("-> (i32[]@{0,1})", "-> (i32[]@{0})", "i32[]@{0}) {",
     "the output types do not match the returned values"),
    ("(%x, %y)", "(\n    %x,\n    %w)", "%w", "%w is not defined"),
])
def test_malformed_text_names_line_and_column(old: str, new: str, marker: str,
                                              message: str) -> None:
    assert old in BASE
    text = BASE.replace(old, new, 1)
    with pytest.raises(mp.MPSerializationError) as info:
        mp.Program.from_text(text)
    assert str(info.value) == f"{_at(text, marker)}: {message}"


@pytest.mark.parametrize("value,marker,message", [
    ("array<i32[2]: [1]>", "[1]", "expected 2 elements here, found 1"),
    ("array<i32[2]: [1, 2.5]>", "2.5", "expected an integer, found '2.5'"),
    ("array<bool[]: 1>", "1>", "expected true or false, found '1'"),
    ('array<i32[2]: b64"AAAA">', "b64", "3 bytes do not hold an array of i32[2]"),
    ('array<i32[2]: b64"A">', "b64", "malformed base64"),
    ('array<!test.text_ir.boxed<["k", {"tensor": ["uint8", []]}]>: 1>', "!",
     "an array's type is a tensor type"),
    ('commitment<b64"AAAA">', "b64", "a commitment's digest is 32 bytes"),
    ("!nope<1>", "!", "type: unknown type tag 'nope' (a type of a plugin that is not loaded "
                      "here?)"),
    ("!test.text_ir.boxed<3>", "!", "type.test.text_ir.boxed: TypeError: cannot unpack "
                                    "non-iterable int object"),
    ("!test.text_ir.boxed<[1, 2>", ">}", "malformed JSON: Expecting ',' delimiter"),
    ("#nope<\n  |x\n>", "#", "unknown payload kind #nope (its dialect is not loaded?)"),
    ("#stablehlo< x\n>", " x", "a payload starts on the next line"),
    ("#stablehlo<\n>", ">}", "expected a payload line starting with '|', found '>'"),
    ("#stablehlo<\n  |x\n>", "#", "#stablehlo: expected the metadata, then the line "
                                  "// StableHLO_vX.Y.Z"),
    ("1e5x", "x}", "expected ',' or '}', found 'x'"),
])
def test_malformed_attribute_value_names_its_column(value: str, marker: str,
                                                    message: str) -> None:
    text = BASE.replace("{1: 0}", value, 1)
    with pytest.raises(mp.MPSerializationError) as info:
        mp.Program.from_text(text)
    assert str(info.value) == f"{_at(text, marker)}: {message}"


def test_invalid_program_errors_are_those_of_from_bytes() -> None:
    text = BASE.replace("(i32[]@{0,1})", "(i32[]@{0})")
    with pytest.raises(mp.MPSerializationError) as from_text:
        mp.Program.from_text(text)
    graph, meta = parse_program(text)
    with pytest.raises(mp.MPSerializationError) as from_bytes:
        mp.Program.from_bytes(encode_graph_bundle(graph, meta))
    assert str(from_text.value) == str(from_bytes.value) == (
        "invalid program: graph: op #1 simp.converge: outputs are typed (i32[]@{0}) but its "
        "type rule gives (i32[]@{0,1})")


@pytest.mark.parametrize("old,new,message", [
    ("world_size = 2", "world_size = 0",
     "malformed program metadata (world_size is 1 to 1024)"),
    ("out_devices = [none]", "out_devices = [none, none]",
     "output tree does not match the graph outputs"),
    ("{routes = {1: 0}}", "{routes = {1: 0}, extra = 1}",
     "invalid program: graph: op #0 simp.shuffle_static (traced at f.py:3): attributes do not "
     "match the declaration (missing [], unknown ['extra'])"),
])
def test_metadata_and_declaration_errors_match_from_bytes(old: str, new: str,
                                                          message: str) -> None:
    text = BASE.replace(old, new, 1)
    with pytest.raises(mp.MPSerializationError, match=re.escape(message)):
        mp.Program.from_text(text)
    with pytest.raises(mp.MPSerializationError, match=re.escape(message)):
        mp.Program.from_bytes(encode_graph_bundle(*parse_program(text)))


def test_from_text_takes_a_str() -> None:
    with pytest.raises(mp.MPSerializationError, match="the text IR is a str, got bytes"):
        mp.Program.from_text(BASE.encode())  # type: ignore[arg-type]


# ---------------------------------------------------------------- hand-edited programs


def scaled() -> Any:
    x = simp.constant((0, 1), np.array([1, 2, 3], np.int32))
    return simp.pcall((0, 1), lambda v: tensor.run_jax(lambda a: a * 3, v), x)


def test_hand_edited_constant_runs_with_its_new_value(sim: mp.Simulator) -> None:
    program = mp.compile(scaled, world_size=3)
    text = program.to_text()
    assert "value = array<i32[3]: [1, 2, 3]>" in text
    edited = mp.Program.from_text(text.replace("[1, 2, 3]", "[10, 20, -7]"))
    out = mp.fetch(sim, mp.evaluate(sim, edited))
    assert [None if v is None else np.asarray(v).tolist() for v in out] == \
        [[30, 60, -21], [30, 60, -21], None]


def test_hand_edited_stablehlo_runs(sim: mp.Simulator) -> None:
    text = mp.compile(scaled, world_size=3).to_text()
    assert text.count("stablehlo.multiply") == 1
    edited = mp.Program.from_text(text.replace("stablehlo.multiply", "stablehlo.add"))
    out = mp.fetch(sim, mp.evaluate(sim, edited))
    assert np.asarray(out[0]).tolist() == [4, 5, 6]


def test_stablehlo_error_names_its_line_and_column_in_the_program_text() -> None:
    text = mp.compile(scaled, world_size=3).to_text()
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "stablehlo.multiply" in s)
    bad = text.replace("stablehlo.multiply %arg0", "stablehlo.multiply %argX")
    with pytest.raises(mp.MPSerializationError) as info:
        mp.Program.from_text(bad)
    column = text.splitlines()[line - 1].index("|") + 1 + len("    %0 = stablehlo.multiply ") + 1
    assert str(info.value) == (f"line {line}, column {column}: StableHLO: use of undeclared "
                               "SSA value name")


def test_module_metadata_errors_name_the_metadata_line() -> None:
    text = mp.compile(scaled, world_size=3).to_text()
    line = next(i for i, s in enumerate(text.splitlines(), 1) if '|{"calling_convention"' in s)
    column = text.splitlines()[line - 1].index("|") + 2
    with pytest.raises(mp.MPSerializationError) as info:
        mp.Program.from_text(text.replace('"platform":"cpu"', '"platform":"gpu"'))
    assert str(info.value) == (f"line {line}, column {column}: malformed run_jax module: "
                               "platform: expected one of cpu, cuda, rocm, tpu")


def test_unsupported_stablehlo_version_is_refused() -> None:
    text = mp.compile(scaled, world_size=3).to_text()
    bad = re.sub(r"// StableHLO_v[0-9.]+", "// StableHLO_v99.0.0", text)
    with pytest.raises(mp.MPSerializationError, match=r"StableHLO version 99\.0\.0 is not "
                                                      r"supported here \(versions "):
        mp.Program.from_text(bad)


# ---------------------------------------------------------------- run_jax modules


def test_traced_modules_are_already_canonical() -> None:
    program = mp.compile(scaled, world_size=3)
    module = program.graph.operations[1].regions[0].operations[0].attrs["module"]
    bytecode = module_info(module).bytecode
    assert canonical_bytecode(bytecode) == bytecode


def test_a_module_that_text_cannot_reproduce_prints_as_base64() -> None:
    """Bytes straight from jax.export (not canonical) still round-trip, as base64."""
    program = mp.compile(scaled, world_size=3)
    exported = jax_export.export(jax.jit(lambda a: a * 3))(
        jax.ShapeDtypeStruct((3,), jnp.int32))
    module = program.graph.operations[1].regions[0].operations[0].attrs["module"]
    header = module[:len(module) - len(module_info(module).bytecode)]
    raw = header + exported.mlir_module_serialized
    assert canonical_bytecode(exported.mlir_module_serialized) != \
        exported.mlir_module_serialized
    pcall = program.graph.operations[1]
    body = pcall.regions[0]
    op = body.operations[0].replace(attrs={"fn": "<lambda>", "module": raw})
    graph = Graph(program.graph.inputs, [program.graph.operations[0], pcall.replace(
        regions=(Graph(body.inputs, [op], body.outputs),))], program.graph.outputs)
    patched = mp.Program(graph, program.out_tree, 3, program.name, program.out_devices)
    text = patched.to_text()
    assert 'module = b64"' in text and "#stablehlo<" not in text
    assert mp.Program.from_text(text).to_bytes() == patched.to_bytes()
