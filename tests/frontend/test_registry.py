"""The op registry (reflection) and the error taxonomy."""

import pytest

import mplang as mp
from mplang.edsl.primitive import Primitive, get_primitive, primitives
from mplang.frontend import FeOpInfo

SIMP_OPS = [
    "simp.constant",
    "simp.prank",
    "simp.pcall",
    "simp.shuffle_static",
    "simp.shuffle",
    "simp.converge",
    "simp.uniform_cond",
    "simp.while_loop",
    "simp.load",
]
OTHER_OPS = ["tensor.run_jax", "tensor.constant", "tensor.load", "func.func"]


def names(infos):
    return [i.name for i in infos]


def test_list_ops_has_every_core_op():
    listed = names(mp.list_ops())
    for name in SIMP_OPS + OTHER_OPS:
        assert name in listed


def test_list_ops_is_sorted_and_unique():
    listed = names(mp.list_ops())
    assert listed == sorted(listed)
    assert len(listed) == len(set(listed))


def test_list_ops_returns_frontend_op_infos():
    infos = mp.list_ops()
    assert all(isinstance(i, FeOpInfo) for i in infos)


def test_list_ops_filters_by_family():
    simp_ops = mp.list_ops("simp")
    assert sorted(names(simp_ops)) == sorted(SIMP_OPS)
    assert all(i.family == "simp" for i in simp_ops)
    assert "tensor.run_jax" in names(mp.list_ops("tensor"))
    assert "simp.pcall" not in names(mp.list_ops("tensor"))
    assert "func.func" in names(mp.list_ops("func"))
    assert "func.func" not in names(mp.list_ops("simp"))


def test_primitives_are_listed_with_their_traits():
    prims = primitives("simp")
    assert [p.name for p in prims] == sorted(SIMP_OPS)
    assert [d["name"] for d in mp.list_primitives("simp")] == sorted(SIMP_OPS)
    pcall = mp.describe("simp.pcall")["traits"]
    assert (pcall["pure"], pcall["communicates"], pcall["regions"], pcall["fusable"]) == (
        True, False, "call", True)
    assert mp.describe("simp.shuffle_static")["traits"]["batchable"]
    assert not mp.describe("tensor.pyfunc")["traits"]["pure"]


def test_list_ops_unknown_dialect_is_empty():
    assert mp.list_ops("no_such_dialect") == []


def test_describe_pcall():
    d = mp.describe("simp.pcall")
    assert isinstance(d, dict)
    assert set(d) >= {"name", "dialect", "kind", "execution_model", "side_effects", "doc"}
    assert d["name"] == "simp.pcall"
    assert d["dialect"] == "simp"
    assert d["kind"] == "call"
    assert d["execution_model"] == "multi_party"
    assert d["side_effects"] is False
    assert isinstance(d["doc"], str)
    assert d["doc"].strip()


@pytest.mark.parametrize(
    "name, kind, model",
    [
        ("simp.constant", "source", "multi_party"),
        ("simp.prank", "source", "multi_party"),
        ("simp.shuffle_static", "communication", "multi_party"),
        ("simp.shuffle", "communication", "multi_party"),
        ("simp.uniform_cond", "control_flow", "multi_party"),
        ("simp.while_loop", "control_flow", "multi_party"),
        ("tensor.run_jax", "compiler", "single_rank"),
        ("tensor.constant", "source", "single_rank"),
    ],
)
def test_describe_metadata(name, kind, model):
    d = mp.describe(name)
    assert d["name"] == name
    assert d["dialect"] == name.split(".")[0]
    assert d["kind"] == kind
    assert d["execution_model"] == model


@pytest.mark.parametrize("name", SIMP_OPS + OTHER_OPS)
def test_every_core_op_has_documentation(name):
    assert mp.describe(name)["doc"].strip()


def test_describe_is_a_copy():
    d = mp.describe("simp.prank")
    d["doc"] = "changed"
    assert mp.describe("simp.prank")["doc"] != "changed"


def test_describe_unknown_op():
    with pytest.raises(KeyError, match=r"simp\.nope"):
        mp.describe("simp.nope")


def test_declaring_a_taken_name_raises():
    before = mp.describe("tensor.run_jax")
    with pytest.raises(ValueError, match=r"'tensor\.run_jax' is already declared \(at "
                                         r"mplang/dialects/tensor\.py:\d+\); a second "
                                         r"declaration at .*test_registry\.py:\d+ is refused"):
        Primitive("tensor.run_jax", kind="compute", execution_model="single_rank", results=[])
    assert get_primitive("tensor.run_jax") is not None
    assert mp.describe("tensor.run_jax") == before  # unchanged


def test_op_name_must_carry_its_dialect_prefix():
    with pytest.raises(ValueError, match=r"must be named DIALECT\.OP"):
        Primitive("nodialect", kind="compute", execution_model="any", results=[])
    assert get_primitive("nodialect") is None


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "cls, bases",
    [
        (mp.MPTypeError, (mp.MPLangError, TypeError)),
        (mp.MPTraceError, (mp.MPLangError,)),
        (mp.MPVerifyError, (mp.MPLangError,)),
        (mp.MPSerializationError, (mp.MPLangError, ValueError)),
        (mp.MPRuntimeError, (mp.MPLangError, RuntimeError)),
        (mp.MPCommunicationError, (mp.MPRuntimeError, mp.MPLangError, RuntimeError)),
        (mp.MPLangError, (Exception,)),
    ],
)
def test_error_hierarchy(cls, bases):
    for base in bases:
        assert issubclass(cls, base)


def test_errors_are_catchable_by_their_python_base():
    with pytest.raises(TypeError):
        raise mp.MPTypeError("x")
    with pytest.raises(ValueError):
        raise mp.MPSerializationError("x")
    with pytest.raises(RuntimeError):
        raise mp.MPCommunicationError("x")


def test_distinct_error_families_are_not_confused():
    assert not issubclass(mp.MPTraceError, TypeError)
    assert not issubclass(mp.MPTypeError, mp.MPTraceError)
    assert not issubclass(mp.MPSerializationError, mp.MPRuntimeError)
    assert not issubclass(mp.MPVerifyError, mp.MPSerializationError)


def test_runtime_error_carries_party_and_op():
    e = mp.MPRuntimeError("boom", party=2, op="simp.pcall")
    assert str(e) == "boom"
    assert e.party == 2
    assert e.op == "simp.pcall"
    plain = mp.MPCommunicationError("late")
    assert plain.party is None
    assert plain.op is None


def test_frontend_package_reexports_the_same_objects():
    from mplang import frontend

    assert frontend.MPTypeError is mp.MPTypeError
    assert frontend.list_ops is mp.list_ops
    assert frontend.describe is mp.describe
