"""One declaration per op: what a `Primitive` checks from its declaration, and the rules and
kernels registered on it (each once, a second registration naming both places)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.edsl import registry
from mplang.edsl.attrs import Attr, NoneType
from mplang.edsl.errors import MPTypeError, MPVerifyError
from mplang.edsl.graph import Graph
from mplang.edsl.primitive import (
    LOCAL,
    SIMP,
    Operand,
    Primitive,
    Result,
    Signature,
    check_types,
    held,
)
from mplang.edsl.traits import LOCAL_PURE
from mplang.edsl.typing import Mask, MPType, TensorType, ValueType

F32 = TensorType("float32", (3,))


@pytest.fixture()
def probe() -> Iterator[Primitive]:
    """A local op ``probe.scale(x, *, factor, mode)`` with a type rule, removed afterwards."""
    prim = Primitive(
        "probe.scale", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
        operands=[Operand("x", LOCAL)], results=[Result("y", LOCAL)],
        attrs={"factor": Attr(float, required=True, min=0.0),
               "mode": Attr(str, default="fast", choices=("fast", "exact")),
               "note": Attr((str, NoneType), default=None)},
        doc="Scale a tensor.")

    @prim.def_type_rule
    def _rule(sig: Signature) -> list[ValueType]:
        assert sig.inputs == [sig.x]
        return [sig.x]

    try:
        yield prim
    finally:
        del registry.PRIMITIVES[prim.name]


def test_the_declaration_checks_arity_attributes_and_defaults(probe: Primitive) -> None:
    assert probe.infer([F32], {"factor": 2.0}, (), 1) == [F32]
    assert probe.check_attrs({"factor": 2.0}) == {"factor": 2.0, "mode": "fast", "note": None}
    cases: list[tuple[list[ValueType], dict[str, Any], str]] = [
        ([], {"factor": 1.0}, "probe.scale: takes 1 operands (x), got 0"),
        ([F32, F32], {"factor": 1.0}, "probe.scale: takes 1 operands (x), got 2"),
        ([MPType(F32, Mask.of([0]))], {"factor": 1.0},
         "probe.scale: operand x must be a party-local value, got f32[3]@{0}"),
        ([F32], {}, "probe.scale: attribute 'factor' is required"),
        ([F32], {"factor": "2"}, "probe.scale: attribute 'factor' must be float, got '2'"),
        ([F32], {"factor": -1.0}, "probe.scale: attribute 'factor' must lie in [0.0, None], "
                                  "got -1.0"),
        ([F32], {"factor": 1.0, "mode": "slow"},
         "probe.scale: attribute 'mode' must be one of ['fast', 'exact'], got 'slow'"),
        ([F32], {"factor": 1.0, "note": 3},
         "probe.scale: attribute 'note' must be str or None, got 3"),
        ([F32], {"factor": 1.0, "fator": 1},
         "probe.scale: unknown attribute(s) ['fator']; it declares ['factor', 'mode', 'note']"),
    ]
    for types, attrs, message in cases:
        with pytest.raises(MPTypeError, match=re.escape(message)):
            probe.infer(types, attrs, (), 1)
    with pytest.raises(MPTypeError, match=re.escape("probe.scale: takes 0 region(s) (none), "
                                                    "got 1")):
        probe.infer([F32], {"factor": 1.0}, (Graph([], [], []),), 1)


def test_variadic_operands_and_constraints() -> None:
    prim = Primitive("probe.gather", kind="compute", execution_model="multi_party",
                     operands=[Operand("first", SIMP), Operand("rest", held(TensorType),
                                                                 variadic=True)],
                     attrs={}, results=[Result("outs", SIMP, variadic=True)])
    try:
        prim.def_type_rule(lambda sig: [sig.first, *sig.rest])
        a, b = MPType(F32, Mask.of([0])), MPType(F32, None)
        assert prim.infer([a, b, b], {}, (), 2) == [a, b, b]
        with pytest.raises(MPTypeError, match=re.escape("takes at least 1 operands (first, "
                                                        "rest...), got 0")):
            prim.infer([], {}, (), 2)
        with pytest.raises(MPTypeError, match=re.escape("operand rest[1] must be "
                                                        "mp<TensorType>, got f32[3]")):
            prim.infer([a, b, F32], {}, (), 2)
        with pytest.raises(ValueError, match="at most one variadic operand"):
            Primitive("probe.two", kind="compute", execution_model="any",
                      operands=[Operand("a", variadic=True), Operand("b", variadic=True)],
                      results=[])
    finally:
        del registry.PRIMITIVES[prim.name]


def test_a_second_registration_is_refused_naming_both_places(probe: Primitive) -> None:
    here = __file__.rsplit("/", 2)[-2:]

    def rule(sig: Signature) -> list[ValueType]:
        return []

    with pytest.raises(ValueError) as e:
        probe.def_type_rule(rule)
    message = str(e.value)
    assert message.startswith("probe.scale already has a type (registered at ")
    assert "/".join(here) in message and "a second one at" in message and "is refused" in message
    lines = [int(n) for n in re.findall(r"test_primitive\.py:(\d+)", message)]
    assert len(lines) == 2 and lines[0] != lines[1]

    def kernel(interp: Any, op: Any, args: list[Any], key: str) -> list[Any]:
        return args

    probe.def_kernel("worker")(kernel)
    with pytest.raises(ValueError, match=r"already has a kernel:worker \(registered at .*"
                                         r"test_primitive\.py:\d+\); a second one at "
                                         r".*test_primitive\.py:\d+ is refused"):
        probe.def_kernel("worker")(kernel)
    probe.def_kernel("worker", override=True)(kernel)  # asked for: allowed
    with pytest.raises(ValueError, match="unknown runtime 'gpu'"):
        probe.def_kernel("gpu")  # type: ignore[arg-type]


def test_real_dialect_rules_cannot_be_registered_twice() -> None:
    pcall = registry.primitive("simp.pcall")
    with pytest.raises(ValueError, match=r"simp\.pcall already has a flow \(registered at "
                                         r"mplang/dialects/simp\.py:\d+\)"):
        pcall.def_flow(lambda a, op, ins: [])
    with pytest.raises(ValueError, match=r"simp\.pcall already has a kernel:worker"):
        pcall.def_kernel("worker")(lambda *a: [])


def test_describe_gives_the_whole_contract_as_plain_data(probe: Primitive) -> None:
    d = mp.describe("probe.scale")
    assert json.loads(json.dumps(d)) == d
    assert d["operands"] == [{"name": "x", "type": "a party-local value", "variadic": False,
                              "doc": ""}]
    assert [a["name"] for a in d["attributes"]] == ["factor", "mode", "note"]
    assert d["attributes"][1] == {"name": "mode", "type": ["str"], "required": False,
                                  "default": "fast", "choices": ["fast", "exact"], "min": None,
                                  "max": None, "doc": ""}
    assert d["kernels"] == {"worker": False, "driver": False, "launch": False}
    assert d["type_rule"]["where"].startswith("tests/edsl/test_primitive.py:")
    assert d["flow"] is None and d["cost"] is None


def test_loaded_programs_are_checked_against_the_declaration() -> None:
    program = mp.compile(lambda: simp.constant((0,), np.int32(3)), world_size=2)
    (op,) = program.graph.operations
    assert set(op.attrs) == {"parties", "value"}
    bad = Graph([], [op.replace(attrs={"parties": Mask.of([0])})], [])
    with pytest.raises(MPVerifyError, match=r"op #0 simp\.constant.*attributes do not match the "
                                            r"declaration \(missing \['value'\], unknown \[\]\)"):
        check_types(bad, 2)
    wrong = Graph([], [op.replace(attrs={"parties": [0], "value": np.int32(3)})], [])
    with pytest.raises(MPVerifyError, match=r"attribute 'parties' must be Mask, got \[0\]"):
        check_types(wrong, 2)


def test_operations_resolve_their_primitive_once() -> None:
    program = mp.compile(lambda: simp.prank(), world_size=2)
    (op,) = program.graph.operations
    assert op.prim is registry.primitive("simp.prank")
    assert op.replace(loc="x.py:1").prim is op.prim


def test_a_kernel_receives_operands_by_position_and_attributes_by_name(probe: Primitive
                                                                       ) -> None:
    """`by_name`: the attributes the kernel names, an absent optional one as its default;
    the `Call` names the op, its key and the party in errors."""
    from mplang.edsl.graph import Operation, Value
    from mplang.runtime.interpreter import Call, Interpreter, KernelTable, by_name

    seen: dict[str, Any] = {}

    def scale(call: Call, x: Any, *, factor: float, mode: str) -> list[Any]:
        seen.update(call=call, mode=mode)
        return [x * factor]

    kernel = by_name(probe, scale)
    op = Operation("probe.scale", (Value("a", F32),), (Value("b", F32),), {"factor": 2.0},
                   loc="prog.py:7")
    interp = Interpreter(KernelTable(("worker",)), {}, party=1, exec_id="e1")
    assert kernel(interp, op, [np.ones(3)], "/0")[0].tolist() == [2.0, 2.0, 2.0]
    call = seen["call"]
    assert seen["mode"] == "fast" and call.tag == ("e1", "/0") and call.in_type(0) == F32
    assert str(call.error("no good")) == "party 1: op probe.scale: no good"


def test_a_kernel_naming_an_undeclared_attribute_is_refused_where_registered(
        probe: Primitive) -> None:
    from mplang.runtime.interpreter import Call, by_name

    def scale(call: Call, x: Any, *, factor: float, speed: str) -> list[Any]:
        return [x]

    with pytest.raises(ValueError, match=re.escape(
            "kernel test_a_kernel_naming_an_undeclared_attribute_is_refused_where_registered."
            "<locals>.scale of probe.scale names ['speed'], not attributes of probe.scale "
            "(it declares ['factor', 'mode', 'note'])")):
        by_name(probe, scale)
