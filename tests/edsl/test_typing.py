"""The type system: party masks, base types and multi-party types."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects.spu import SecretShareType
from mplang.edsl.errors import MPTypeError
from mplang.edsl.typing import (
    Mask,
    MPType,
    TensorType,
    register_type,
    scalar,
    type_for_tag,
)

# ---------------------------------------------------------------- Mask


def test_mask_of_sets_one_bit_per_party():
    assert Mask.of([0, 2]).bits == 0b101
    assert Mask.of([]).bits == 0
    assert Mask.of((3,)).bits == 0b1000


def test_mask_of_ignores_order_and_duplicates():
    assert Mask.of([2, 0, 2]) == Mask.of([0, 2])
    assert Mask.of(np.array([1, 2])) == Mask.of([1, 2])


@pytest.mark.parametrize("bad", [[-1], [True], [1.0], ["0"], [None]])
def test_mask_of_rejects_non_ranks(bad):
    with pytest.raises(MPTypeError, match="non-negative integers"):
        Mask.of(bad)


def test_mask_rejects_negative_bits():
    with pytest.raises(MPTypeError, match="negative"):
        Mask(-1)


@pytest.mark.parametrize("n, bits", [(1, 0b1), (3, 0b111), (5, 0b11111), (0, 0)])
def test_mask_all(n, bits):
    assert Mask.all(n).bits == bits
    assert Mask.all(n).parties == tuple(range(n))


def test_mask_parties_iter_len():
    m = Mask.of([4, 1, 0])
    assert m.parties == (0, 1, 4)
    assert list(m) == [0, 1, 4]
    assert len(m) == 3
    assert len(Mask(0)) == 0


def test_mask_contains():
    m = Mask.of([0, 2])
    assert 0 in m
    assert 2 in m
    assert 1 not in m
    assert 3 not in m
    assert 100 not in m
    assert -1 not in m
    assert "0" not in m


def test_mask_contains_numpy_rank():
    # Mask.of accepts numpy integers as ranks, so membership must too.
    m = Mask.of([0, 2])
    assert np.int64(2) in m
    assert np.int32(1) not in m


def test_mask_and_or():
    a, b = Mask.of([0, 1]), Mask.of([1, 2])
    assert a & b == Mask.of([1])
    assert a | b == Mask.of([0, 1, 2])
    assert Mask.of([0]) & Mask.of([1]) == Mask(0)


def test_mask_issubset():
    assert Mask.of([1]).issubset(Mask.of([0, 1]))
    assert Mask.of([0, 1]).issubset(Mask.of([0, 1]))
    assert Mask(0).issubset(Mask.of([2]))
    assert not Mask.of([0, 2]).issubset(Mask.of([0, 1]))
    assert not Mask.all(3).issubset(Mask.all(2))


def test_mask_str_and_repr():
    assert str(Mask.of([0, 1])) == "{0,1}"
    assert str(Mask.of([2])) == "{2}"
    assert str(Mask(0)) == "{}"
    assert repr(Mask.of([0, 3])) == "Mask({0,3})"


def test_mask_is_immutable_and_hashable():
    m = Mask.of([0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.bits = 3  # type: ignore[misc]
    assert {Mask.of([0, 1]): "x"}[Mask.of([1, 0])] == "x"


def test_mask_is_public():
    assert mp.Mask is Mask


# ---------------------------------------------------------------- TensorType


@pytest.mark.parametrize(
    "dtype, shape, text",
    [
        ("float32", (3, 4), "f32[3,4]"),
        ("int32", (), "i32[]"),
        ("bool", (2,), "bool[2]"),
        ("uint8", (0,), "u8[0]"),
        ("int64", (1, 1, 1), "i64[1,1,1]"),
        ("float64", (7,), "f64[7]"),
        ("complex64", (), "c64[]"),
        ("float16", (2,), "f16[2]"),
    ],
)
def test_tensor_type_str(dtype, shape, text):
    assert str(TensorType(dtype, shape)) == text


def test_tensor_type_of_accepts_numpy_and_jax_dtypes():
    assert TensorType.of(np.float32, [3, 4]) == TensorType("float32", (3, 4))
    assert TensorType.of(np.dtype("int32"), ()) == TensorType("int32", ())
    assert TensorType.of(jnp.bfloat16, (2,)) == TensorType("bfloat16", (2,))
    assert str(TensorType.of(jnp.bfloat16, (2,))) == "bf16[2]"
    assert TensorType.of("int8", (np.int64(5),)).shape == (5,)


def test_scalar_helper():
    assert scalar("int32") == TensorType("int32", ())
    assert str(scalar(np.bool_)) == "bool[]"
    assert scalar("float32").is_scalar
    assert not TensorType("float32", (1,)).is_scalar


def test_tensor_type_compares_by_value():
    a = TensorType("float32", (3, 4))
    b = TensorType.of("float32", [3, 4])
    assert a == b
    assert a is not b
    assert hash(a) == hash(b)
    assert a != TensorType("float32", (4, 3))
    assert a != TensorType("float64", (3, 4))
    assert len({a, b}) == 1


@pytest.mark.parametrize("dtype", ["str", "object", "float128x", "f32", ""])
def test_tensor_type_rejects_bad_dtype(dtype):
    with pytest.raises(MPTypeError, match="unsupported tensor dtype"):
        TensorType(dtype, ())


@pytest.mark.parametrize("dtype", [object, np.str_, "U3"])
def test_tensor_type_of_rejects_non_numeric_dtype(dtype):
    with pytest.raises(MPTypeError, match="unsupported tensor dtype"):
        TensorType.of(dtype, ())


@pytest.mark.parametrize("shape", [(-1,), (2, -3), (1.5,), ("3",)])
def test_tensor_type_rejects_bad_shape(shape):
    with pytest.raises(MPTypeError, match="non-negative ints"):
        TensorType("float32", shape)


# ---------------------------------------------------------------- other base types

F32_3 = TensorType("float32", (3,))


def test_secret_share_type():
    s = SecretShareType("semi2k", F32_3)
    assert str(s) == "share<semi2k,f32[3]>"
    assert s == SecretShareType("semi2k", TensorType.of("float32", [3]))
    assert s != SecretShareType("aby3", F32_3)
    assert s != SecretShareType("semi2k", TensorType("float32", (4,)))


def test_base_types_of_different_kinds_differ():
    share = SecretShareType("s", F32_3)
    assert share != F32_3
    assert len({share, SecretShareType("t", F32_3), F32_3}) == 3


def test_types_register_a_unique_tag():
    assert type_for_tag("tensor") is TensorType
    assert type_for_tag("share") is SecretShareType
    with pytest.raises(ValueError, match="already registered"):
        register_type("tensor")(SecretShareType)


# ---------------------------------------------------------------- MPType


def test_mptype_str():
    assert str(MPType(F32_3, Mask.of([0, 1]))) == "f32[3]@{0,1}"
    assert str(MPType(scalar("int32"), Mask.of([2]))) == "i32[]@{2}"
    assert str(MPType(SecretShareType("semi2k", F32_3), Mask.all(3))) == (
        "share<semi2k,f32[3]>@{0,1,2}")


def test_mptype_unknown_pmask_prints_question_mark():
    assert str(MPType(F32_3, None)) == "f32[3]@?"


def test_mptype_equality_includes_pmask():
    a = MPType(F32_3, Mask.of([0, 1]))
    assert a == MPType(TensorType("float32", (3,)), Mask.of([1, 0]))
    assert a != MPType(F32_3, Mask.of([0]))
    assert a != MPType(F32_3, None)
    assert a != MPType(TensorType("float32", (4,)), Mask.of([0, 1]))
    assert hash(a) == hash(MPType(F32_3, Mask.of([0, 1])))


def test_mptype_with_pmask():
    a = MPType(F32_3, Mask.of([0]))
    b = a.with_pmask(Mask.of([1, 2]))
    assert b == MPType(F32_3, Mask.of([1, 2]))
    assert a.pmask == Mask.of([0])  # unchanged
    assert a.with_pmask(None).pmask is None
