"""The crypto dialect: its types and type rules while tracing, its kernels on a
2-party simulator, the confinement of key material, and the wire codecs of keys."""

from __future__ import annotations

import hashlib
import json
import pickle
from typing import Any

import jax
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.analysis.cost_model import local_cost
from mplang.dialects import crypto
from mplang.dialects.crypto import (
    PrivateKey,
    PublicKey,
    SharedSecret,
    SymmetricKey,
    key_flow,
    open_flow,
    seal_flow,
)
from mplang.edsl.primitive import primitive
from mplang.edsl.serde import decode_type, encode_type
from mplang.edsl.typing import TensorType
from mplang.flows.dp_flows import entropy_flow
from mplang.flows.engine import local_conservative
from mplang.frontend import list_ops
from mplang.kernels.crypto import (
    AUTH_FAILED,
    PrivateKeyValue,
    PublicKeyValue,
    SharedSecretValue,
    SymmetricKeyValue,
    aes_gcm_open,
    ed25519_public,
    ed25519_sign,
    hkdf_sha256,
    x25519,
    x25519_public,
)
from mplang.passes import optimize
from mplang.transport import wire
from tests.simulators import simulated

X = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
"""A float32 plaintext: 48 bytes, so its ciphertext is u8[76]."""


sim = simulated(2, scope="function")


def compile_error(fn: Any) -> str:
    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(fn, world_size=2)
    return str(info.value)


def run(sim: mp.Simulator, fn: Any) -> Any:
    return mp.fetch(sim, mp.evaluate(sim, fn))


def runtime_error(sim: mp.Simulator, fn: Any) -> mp.MPRuntimeError:
    with pytest.raises(mp.MPRuntimeError) as info:
        mp.fetch(sim, mp.evaluate(sim, fn))
    return info.value


def agree(info: bytes = b"session") -> tuple[Any, Any, Any, Any]:
    """X25519 between parties 0 and 1 (public keys swapped), then HKDF at each:
    (key at 0, key at 1, private key at 0, public key of 1 at 0)."""
    pk0, sk0 = simp.pcall((0,), crypto.x25519_keygen)
    pk1, sk1 = simp.pcall((1,), crypto.x25519_keygen)
    pk1_at_0 = simp.shuffle_static(pk1, {0: 1})
    pk0_at_1 = simp.shuffle_static(pk0, {1: 0})

    def derive(sk: Any, peer: Any) -> Any:
        return crypto.hkdf(crypto.x25519_shared(sk, peer), info=info, length=32)

    return (simp.pcall((0,), derive, sk0, pk1_at_0), simp.pcall((1,), derive, sk1, pk0_at_1),
            sk0, pk1_at_0)


def encrypted_at_0(value: np.ndarray, aad: bytes = b"hdr") -> tuple[Any, Any]:
    """(ciphertext of ``value`` moved to party 1, the AES key at party 1)."""
    k0, k1, _, _ = agree()
    c = simp.pcall((0,), lambda k: crypto.aes_encrypt(tensor.constant(value), k, aad=aad), k0)
    return simp.shuffle_static(c, {1: 0}), k1


# ---------------------------------------------------------------- types


def test_types_print_compactly_and_confine_key_material() -> None:
    assert [str(t) for t in (PublicKey("x25519"), PublicKey("ed25519"), PrivateKey("x25519"),
                             SymmetricKey(), SymmetricKey(64), SharedSecret())] == \
        ["x25519.pk", "ed25519.pk", "x25519.sk", "symkey[32]", "symkey[64]", "x25519.shared"]
    assert [t.confined for t in (PublicKey("ed25519"), PrivateKey("ed25519"), SymmetricKey(),
                                 SharedSecret())] == [False, True, True, True]
    assert TensorType("uint8", (3,)).confined is False


@pytest.mark.parametrize("t", [PublicKey("x25519"), PublicKey("ed25519"), PrivateKey("ed25519"),
                               SymmetricKey(32), SymmetricKey(16), SharedSecret()])
def test_types_round_trip_through_json(t: Any) -> None:
    for v in (t, mp.MPType(t, mp.Mask.of([1])), mp.MPType(t, None)):
        data = json.loads(json.dumps(encode_type(v)))
        assert decode_type(data) == v
    assert encode_type(t) == {t.type_tag: t.to_json(encode_type)}


@pytest.mark.parametrize("tag, body, message", [
    ("crypto.public_key", "rsa", "expected an algorithm in ['x25519', 'ed25519'], got 'rsa'"),
    ("crypto.public_key", None, "expected an algorithm in ['x25519', 'ed25519'], got None"),
    ("crypto.private_key", ["x25519"], "expected an algorithm in ['x25519', 'ed25519'], "
                                       "got ['x25519']"),
    ("crypto.symmetric_key", 8, "expected a key length in [16, 8160], got 8"),
    ("crypto.symmetric_key", "32", "expected a key length in [16, 8160], got '32'"),
    ("crypto.symmetric_key", True, "expected a key length in [16, 8160], got True"),
    ("crypto.shared_secret", None, "expected [], got None"),
    ("crypto.shared_secret", [1], "expected [], got [1]"),
])
def test_malformed_type_bodies_are_refused(tag: str, body: Any, message: str) -> None:
    with pytest.raises(ValueError) as direct:
        crypto_type = {"crypto.public_key": PublicKey, "crypto.private_key": PrivateKey,
                       "crypto.symmetric_key": SymmetricKey,
                       "crypto.shared_secret": SharedSecret}[tag]
        crypto_type.from_json(body, decode_type, "t")
    assert str(direct.value) == message
    with pytest.raises(mp.MPSerializationError) as info:
        decode_type({tag: body}, "graph.ops[2].out[0].type")
    assert str(info.value) == (f"malformed program: graph.ops[2].out[0].type.{tag}: "
                               f"ValueError: {message}")


def test_constructing_an_invalid_type_is_a_type_error() -> None:
    with pytest.raises(mp.MPTypeError, match=r"^public key: expected an algorithm in "):
        PublicKey("ecdsa")
    with pytest.raises(mp.MPTypeError, match=r"^a symmetric key has 16 to 8160 bytes, got 4$"):
        SymmetricKey(4)


def test_randomized_ops_are_not_pure_and_the_rest_are() -> None:
    impure = {"crypto.aes_keygen", "crypto.aes_encrypt", "crypto.x25519_keygen",
              "crypto.ed25519_keygen", "crypto.random_bits"}
    ops = {i.name for i in list_ops("crypto")}
    assert ops == impure | {"crypto.aes_decrypt", "crypto.sha256", "crypto.x25519_shared",
                            "crypto.hkdf", "crypto.sign", "crypto.verify",
                            "crypto.public_bytes", "crypto.public_key"}
    for name in ops:
        traits = primitive(name).traits
        assert traits.pure is (name not in impure), name
        assert traits.communicates is False, name


def test_every_op_is_declared_once() -> None:
    prims = vars(crypto.dialect.prims)
    assert {p.name for p in prims.values()} == {i.name for i in list_ops("crypto")}
    sealing = {"aes_keygen": key_flow, "aes_encrypt": seal_flow, "aes_decrypt": open_flow,
               "x25519_keygen": key_flow, "x25519_shared": key_flow, "hkdf": key_flow,
               "public_bytes": key_flow, "random_bits": entropy_flow}
    for name, prim in prims.items():
        assert prim.rule("local_flow") is sealing.get(name, local_conservative), prim.name
        assert prim.rule("cost") is local_cost, prim.name
    hkdf = prims["hkdf"]
    assert [(o.name, str(o.type)) for o in hkdf.operands] == [
        ("ikm", "SharedSecret | SymmetricKey")]
    assert {n: (a.default, a.min, a.max) for n, a in hkdf.attrs.items()} == {
        "info": (b"", None, None), "length": (32, 16, 8160), "salt": (None, None, None)}
    assert prims["public_key"].attrs["algorithm"].choices == crypto.ALGORITHMS
    assert [str(r.type) for r in prims["x25519_keygen"].results] == ["PublicKey", "PrivateKey"]


# ---------------------------------------------------------------- type rules while tracing


def test_output_types_of_every_op() -> None:
    def prog() -> Any:
        def body() -> Any:
            x = tensor.constant(X)
            k = crypto.aes_keygen()
            c = crypto.aes_encrypt(x, k, aad=b"a")
            pk, sk = crypto.x25519_keygen()
            spk, ssk = crypto.ed25519_keygen()
            s = crypto.x25519_shared(sk, pk)
            sig = crypto.sign(x, ssk)
            return (c, crypto.aes_decrypt(c, k, like=x, aad=b"a"), crypto.sha256(x), pk, sk,
                    s, crypto.hkdf(s, info=b"i", length=48, salt=b"s"), spk, sig,
                    crypto.verify(x, sig, spk), crypto.public_bytes(spk),
                    crypto.public_key(crypto.public_bytes(pk), algorithm="x25519"), k)
        return simp.pcall((0,), body)

    program = mp.compile(prog, world_size=2)
    assert [str(t) for t in program.output_types] == [
        "u8[76]@{0}", "f32[3,4]@{0}", "u8[32]@{0}", "x25519.pk@{0}", "x25519.sk@{0}",
        "x25519.shared@{0}", "symkey[48]@{0}", "ed25519.pk@{0}", "u8[64]@{0}", "bool[]@{0}",
        "u8[32]@{0}", "x25519.pk@{0}", "symkey[32]@{0}"]
    # the program, with its key types and bytes attributes, survives serialization
    again = mp.Program.from_bytes(program.to_bytes())
    assert str(again) == str(program)
    assert again.to_bytes() == program.to_bytes()


@pytest.mark.parametrize("like", [
    X, TensorType("float32", (3, 4)), ("float32", (3, 4)), (np.float32, [3, 4]),
    jax.ShapeDtypeStruct((3, 4), np.float32)], ids=["array", "type", "pair", "numpy pair",
                                                     "jax struct"])
def test_aes_decrypt_takes_its_type_from_like(like: Any) -> None:
    def prog() -> Any:
        def body() -> Any:
            k = crypto.aes_keygen()
            return crypto.aes_decrypt(crypto.aes_encrypt(tensor.constant(X), k), k, like=like)
        return simp.pcall((1,), body)

    if isinstance(like, jax.ShapeDtypeStruct):  # not among the accepted forms
        msg = compile_error(prog)
        assert msg.startswith("crypto.aes_decrypt: 'like' must be a traced tensor, a numpy "
                              "array, a TensorType or (dtype, shape), got ShapeDtypeStruct")
        return
    assert [str(t) for t in mp.compile(prog, world_size=2).output_types] == ["f32[3,4]@{1}"]


def test_like_of_a_numpy_array_has_the_dtype_the_array_gets_as_a_constant() -> None:
    wide = np.arange(4, dtype=np.int64)
    assert crypto.like_type(wide) == TensorType(
        jax.dtypes.canonicalize_dtype(np.int64).name, (4,))
    assert crypto.like_type(("int64", (4,))) == TensorType("int64", (4,))


def test_aes_decrypt_with_a_like_of_another_size_fails_while_tracing() -> None:
    def prog() -> Any:
        def body() -> Any:
            k = crypto.aes_keygen()
            c = crypto.aes_encrypt(tensor.constant(X), k)
            return crypto.aes_decrypt(c, k, like=np.zeros((3, 3), np.float32))
        return simp.pcall((0,), body)

    msg = compile_error(prog)
    assert msg.startswith("crypto.aes_decrypt: the ciphertext must be u8[64] (nonce, tag and "
                          "the 36 bytes of f32[3,3]), got u8[76]")


@pytest.mark.parametrize("body, message", [
    (lambda: crypto.aes_encrypt(tensor.constant(X), crypto.x25519_keygen()[0]),
     "crypto.aes_encrypt: operand key must be SymmetricKey, got x25519.pk"),
    (lambda: crypto.aes_encrypt(tensor.constant(X), crypto.hkdf(crypto.aes_keygen(), length=16)),
     "crypto.aes_encrypt: the key must be a 32-byte symmetric key, got symkey[16]"),
    (lambda: crypto.aes_encrypt(crypto.aes_keygen(), crypto.aes_keygen()),
     "crypto.aes_encrypt: operand x must be TensorType, got symkey[32]"),
    (lambda: crypto.aes_encrypt(tensor.constant(X), crypto.aes_keygen(), aad="text"),
     "crypto.aes_encrypt: aad must be bytes, got str"),
    (lambda: crypto.aes_decrypt(tensor.constant(np.zeros(76, np.float32)), crypto.aes_keygen(),
                                like=X),
     "crypto.aes_decrypt: the ciphertext must be u8[76] (nonce, tag and the 48 bytes of "
     "f32[3,4]), got f32[76]"),
    (lambda: crypto.aes_decrypt(tensor.constant(np.zeros(76, np.uint8)),
                                crypto.ed25519_keygen()[1], like=X),
     "crypto.aes_decrypt: operand key must be SymmetricKey, got ed25519.sk"),
    (lambda: crypto.x25519_shared(crypto.ed25519_keygen()[1], crypto.x25519_keygen()[0]),
     "crypto.x25519_shared: the key must be an x25519 private key, got ed25519.sk"),
    (lambda: crypto.x25519_shared(crypto.x25519_keygen()[1], crypto.ed25519_keygen()[0]),
     "crypto.x25519_shared: the peer key must be an x25519 public key, got ed25519.pk"),
    (lambda: crypto.hkdf(tensor.constant(X)),
     "crypto.hkdf: operand ikm must be SharedSecret | SymmetricKey, got f32[3,4]"),
    (lambda: crypto.hkdf(crypto.aes_keygen(), length=8),
     "crypto.hkdf: attribute 'length' must lie in [16, 8160], got 8"),
    (lambda: crypto.hkdf(crypto.aes_keygen(), salt=7),
     "crypto.hkdf: salt must be bytes, got int"),
    (lambda: crypto.sign(tensor.constant(X), crypto.x25519_keygen()[1]),
     "crypto.sign: the key must be an ed25519 private key, got x25519.sk"),
    (lambda: crypto.verify(tensor.constant(X), tensor.constant(np.zeros(63, np.uint8)),
                           crypto.ed25519_keygen()[0]),
     "crypto.verify: the signature must be u8[64], got u8[63]"),
    (lambda: crypto.verify(tensor.constant(X), tensor.constant(np.zeros(64, np.uint8)),
                           crypto.x25519_keygen()[0]),
     "crypto.verify: the key must be an ed25519 public key, got x25519.pk"),
    (lambda: crypto.public_bytes(crypto.x25519_keygen()[1]),
     "crypto.public_bytes: operand pk must be PublicKey, got x25519.sk"),
    (lambda: crypto.public_key(tensor.constant(np.zeros(31, np.uint8)), algorithm="x25519"),
     "crypto.public_key: the raw key must be u8[32], got u8[31]"),
    (lambda: crypto.public_key(tensor.constant(np.zeros(32, np.uint8)), algorithm="rsa"),
     "crypto.public_key: attribute 'algorithm' must be one of ['x25519', 'ed25519'], "
     "got 'rsa'"),
])
def test_ill_typed_crypto_ops_fail_while_tracing(body: Any, message: str) -> None:
    msg = compile_error(lambda: simp.pcall((0,), body))
    assert msg.startswith(message), msg


# ---------------------------------------------------------------- key material stays put


def _keys() -> dict[str, Any]:
    _, sk = simp.pcall((0,), crypto.x25519_keygen)
    return {"private": sk, "symmetric": simp.pcall((0,), crypto.aes_keygen),
            "shared": simp.pcall((0,), lambda s: crypto.x25519_shared(s, crypto.x25519_keygen()[0]),
                                 sk)}


@pytest.mark.parametrize("kind, shown", [("private", "x25519.sk@{0}"),
                                         ("symmetric", "symkey[32]@{0}"),
                                         ("shared", "x25519.shared@{0}")])
def test_moving_key_material_fails_while_tracing(kind: str, shown: str) -> None:
    msg = compile_error(lambda: simp.shuffle_static(_keys()[kind], {1: 0}))
    assert msg.startswith(f"simp.shuffle_static: the value is {shown}, key material that "
                          "never leaves the party holding it ({0})"), msg
    msg = compile_error(lambda: simp.shuffle(_keys()[kind], simp.constant((0,), np.int32(0))))
    assert msg.startswith("simp.shuffle: ") and "key material" in msg, msg
    msg = compile_error(lambda: simp.converge(_keys()[kind], simp.pcall((1,), crypto.aes_keygen)))
    assert msg.startswith("simp.converge: ") and "key material" in msg, msg
    msg = compile_error(lambda: simp.pcall((1,), lambda k: k, _keys()[kind]))
    assert msg.startswith("simp.pcall on parties {1}: input 0 is ") and "key material" in msg


def test_public_keys_and_ciphertexts_move() -> None:
    def prog() -> Any:
        pk, _ = simp.pcall((0,), crypto.ed25519_keygen)
        c = simp.pcall((0,), lambda: crypto.aes_encrypt(tensor.constant(X), crypto.aes_keygen()))
        return simp.shuffle_static(pk, {1: 0}), simp.shuffle_static(c, {1: 0})

    assert [str(t) for t in mp.compile(prog, world_size=2).output_types] == \
        ["ed25519.pk@{1}", "u8[76]@{1}"]


def test_fetching_key_material_fails(sim: mp.Simulator) -> None:
    k = mp.evaluate(sim, lambda: simp.pcall((0,), crypto.aes_keygen))
    with pytest.raises(mp.MPTypeError) as info:
        mp.fetch(sim, k)
    assert str(info.value).startswith("fetch: symkey[32]@{0} is key material, which never "
                                      "leaves the party holding it")
    pk, sk = mp.evaluate(sim, lambda: simp.pcall((1,), crypto.ed25519_keygen))
    with pytest.raises(mp.MPTypeError, match=r"^fetch: ed25519\.sk@\{1\} is key material"):
        mp.fetch(sim, (pk, sk))
    fetched = mp.fetch(sim, pk)
    assert fetched[0] is None and isinstance(fetched[1], PublicKeyValue)
    assert fetched[1].algorithm == "ed25519" and len(fetched[1].raw) == 32


# ---------------------------------------------------------------- end to end


def test_key_agreement_then_encrypt_at_0_and_decrypt_at_1(sim: mp.Simulator) -> None:
    def prog() -> Any:
        c, k1 = encrypted_at_0(X)
        return c, simp.pcall((1,), lambda c, k: crypto.aes_decrypt(c, k, like=X, aad=b"hdr"),
                             c, k1)

    c, y = run(sim, prog)
    assert c[0] is None and c[1].dtype == np.uint8 and c[1].shape == (76,)
    assert y[0] is None
    assert y[1].dtype == np.float32 and y[1].shape == (3, 4)
    np.testing.assert_array_equal(y[1], X)


def test_int64_plaintext_decrypts_with_the_numpy_array_as_like(sim: mp.Simulator) -> None:
    wide = np.arange(-3, 3, dtype=np.int64).reshape(2, 3) * 1000

    def prog() -> Any:
        c, k1 = encrypted_at_0(wide)
        return simp.pcall((1,), lambda c, k: crypto.aes_decrypt(c, k, like=wide, aad=b"hdr"),
                          c, k1)

    y = run(sim, prog)[1]
    assert y.dtype == jax.dtypes.canonicalize_dtype(np.int64)
    assert y.tolist() == wide.tolist()


def test_both_parties_derive_the_same_key_from_x25519_and_hkdf(sim: mp.Simulator) -> None:
    k0, k1, sk0, pk1 = mp.evaluate(sim, lambda: agree(b"ctx"))
    held0, held1 = sim.held(k0)[0], sim.held(k1)[1]
    assert isinstance(held0, SymmetricKeyValue) and isinstance(held1, SymmetricKeyValue)
    assert held0.raw == held1.raw and len(held0.raw) == 32
    secret = sim.held(sk0)[0]
    peer = sim.held(pk1)[0]
    assert isinstance(secret, PrivateKeyValue) and isinstance(peer, PublicKeyValue)
    assert held0.raw == hkdf_sha256(x25519(secret.raw, peer.raw), b"ctx", 32)


def test_hkdf_info_and_salt_separate_keys(sim: mp.Simulator) -> None:
    def prog() -> Any:
        def body() -> Any:
            k = crypto.aes_keygen()
            return (k, crypto.hkdf(k, info=b"a"), crypto.hkdf(k, info=b"b"),
                    crypto.hkdf(k, info=b"a", salt=b"salt"), crypto.hkdf(k, info=b"a", length=64))
        return simp.pcall((0,), body)

    k, a, b, salted, long = (sim.held(v)[0].raw for v in mp.evaluate(sim, prog))
    assert a == hkdf_sha256(k, b"a", 32) and b == hkdf_sha256(k, b"b", 32)
    assert salted == hkdf_sha256(k, b"a", 32, salt=b"salt")
    assert long == hkdf_sha256(k, b"a", 64) and long[:32] == a
    assert len({k, a, b, salted}) == 4


def test_two_encryptions_of_one_value_use_different_nonces(sim: mp.Simulator) -> None:
    def prog() -> Any:
        def body() -> Any:
            k = crypto.aes_keygen()
            x = tensor.constant(X)
            c1, c2 = crypto.aes_encrypt(x, k, aad=b"a"), crypto.aes_encrypt(x, k, aad=b"a")
            return c1, c2, crypto.aes_decrypt(c1, k, like=x, aad=b"a"), \
                crypto.aes_decrypt(c2, k, like=x, aad=b"a"), k
        return simp.pcall((0,), body)

    objs = mp.evaluate(sim, prog)
    c1, c2, y1, y2 = (v[0] for v in mp.fetch(sim, objs[:4]))
    assert c1[:12].tobytes() != c2[:12].tobytes()
    assert c1[12:].tobytes() != c2[12:].tobytes()
    np.testing.assert_array_equal(y1, X)
    np.testing.assert_array_equal(y2, X)
    key = sim.held(objs[4])[0].raw
    assert aes_gcm_open(key, c1.tobytes(), b"a") == X.tobytes()


def test_keygens_and_encryptions_survive_the_optimizer() -> None:
    def prog() -> Any:
        def body() -> Any:
            x = tensor.constant(X)
            k1, k2 = crypto.aes_keygen(), crypto.aes_keygen()
            return (k1, k2, crypto.aes_encrypt(x, k1), crypto.aes_encrypt(x, k1),
                    crypto.sha256(x), crypto.sha256(x))
        return simp.pcall((0,), body)

    text = str(optimize(mp.compile(prog, world_size=2)))
    assert text.count("crypto.aes_keygen(") == 2
    assert text.count("crypto.aes_encrypt(") == 2
    assert text.count("crypto.sha256(") == 1  # pure: the common subexpression is shared


@pytest.mark.parametrize("value", [
    X, np.arange(-5, 5, dtype=np.int32), np.array(True), np.zeros((2, 0), np.float32),
    np.array([1.5, -2.25], dtype=np.float16), np.arange(6, dtype=np.uint16).reshape(3, 2).T])
def test_sha256_of_the_raw_little_endian_bytes(sim: mp.Simulator, value: np.ndarray) -> None:
    traced, direct = run(sim, lambda: simp.pcall(
        (1,), lambda: (crypto.sha256(tensor.constant(value)), crypto.sha256(value))))
    expected = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).tobytes()
    for digest in (traced[1], direct[1]):
        assert digest.dtype == np.uint8 and digest.shape == (32,)
        assert digest.tobytes() == hashlib.sha256(expected).digest()


def test_sign_at_0_verify_at_1(sim: mp.Simulator) -> None:
    msg = np.arange(10, dtype=np.int32)

    def prog() -> Any:
        spk, ssk = simp.pcall((0,), crypto.ed25519_keygen)
        m = simp.constant((0,), msg)
        sig = simp.pcall((0,), crypto.sign, m, ssk)
        at1 = [simp.shuffle_static(v, {1: 0}) for v in (m, sig, spk)]
        good = simp.pcall((1,), crypto.verify, *at1)
        forged = simp.pcall((1,), lambda m, s, k: crypto.verify(m + 1, s, k), *at1)
        other = simp.pcall((1,), lambda m, s: crypto.verify(m, s, crypto.ed25519_keygen()[0]),
                           at1[0], at1[1])
        zeros = simp.pcall((1,), lambda m, k: crypto.verify(
            m, tensor.constant(np.zeros(64, np.uint8)), k), at1[0], at1[2])
        return sig, good, forged, other, zeros, ssk

    objs = mp.evaluate(sim, prog)
    sig, good, forged, other, zeros = (v for v in mp.fetch(sim, objs[:5]))
    assert sig[0].dtype == np.uint8 and sig[0].shape == (64,)
    seed = sim.held(objs[5])[0].raw
    assert sig[0].tobytes() == ed25519_sign(seed, msg.astype("<i4").tobytes())
    assert good[1].dtype == np.bool_ and good[1].shape == ()
    assert bool(good[1]) is True
    assert bool(forged[1]) is False
    assert bool(other[1]) is False
    assert bool(zeros[1]) is False


def test_public_bytes_and_public_key_round_trip(sim: mp.Simulator) -> None:
    def prog() -> Any:
        pk, _ = simp.pcall((0,), crypto.x25519_keygen)
        b = simp.pcall((0,), crypto.public_bytes, pk)
        back = simp.pcall((1,), lambda b: crypto.public_key(b, algorithm="x25519"),
                          simp.shuffle_static(b, {1: 0}))
        digest = simp.pcall((0,), lambda b: crypto.sha256(b), b)
        return pk, b, back, digest

    pk, b, back, digest = run(sim, prog)
    assert b[0].dtype == np.uint8 and b[0].tobytes() == pk[0].raw
    assert back[1] == PublicKeyValue("x25519", pk[0].raw) == pk[0]
    assert digest[0].tobytes() == hashlib.sha256(pk[0].raw).digest()


def test_the_rfc7748_exchange_runs_through_the_ops(sim: mp.Simulator) -> None:
    alice_pub = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    bob = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    assert x25519_public(bob) != alice_pub

    def prog() -> Any:
        def body() -> Any:
            peer = crypto.public_key(tensor.constant(np.frombuffer(alice_pub, np.uint8)),
                                     algorithm="x25519")
            _, sk = crypto.x25519_keygen()
            return sk, crypto.hkdf(crypto.x25519_shared(sk, peer), info=b"rfc")
        return simp.pcall((0,), body)

    sk, k = mp.evaluate(sim, prog)
    mine = sim.held(sk)[0].raw
    assert sim.held(k)[0].raw == hkdf_sha256(x25519(mine, alice_pub), b"rfc", 32)


# ---------------------------------------------------------------- failures at run time


def test_a_tampered_ciphertext_fails_to_authenticate(sim: mp.Simulator) -> None:
    def prog() -> Any:
        c, k1 = encrypted_at_0(X)

        def body(c: Any, k: Any) -> Any:
            bad = tensor.run_jax(lambda v: v.at[30].set(v[30] ^ np.uint8(1)), c)
            return crypto.aes_decrypt(bad, k, like=X, aad=b"hdr")

        return simp.pcall((1,), body, c, k1)

    err = runtime_error(sim, prog)
    assert str(err).startswith(f"party 1: op crypto.aes_decrypt: {AUTH_FAILED}"), str(err)
    assert err.party == 1 and err.op == "crypto.aes_decrypt"
    assert "test_crypto.py:" in str(err)  # the user's line that traced the op


def test_a_tampered_ciphertext_passed_as_a_constant_fails(sim: mp.Simulator) -> None:
    k1 = None

    def encrypt() -> Any:
        nonlocal k1
        c, k1 = encrypted_at_0(X, aad=b"")
        return c, k1

    c, k = mp.evaluate(sim, encrypt)
    sealed = mp.fetch(sim, c)[1]
    for i in (0, 12, 75):  # a nonce, a ciphertext and a tag byte
        bad = sealed.copy()
        bad[i] ^= 0x80

        def decrypt(k: Any, bad: np.ndarray = bad) -> Any:  # numpy arrays become constants
            return simp.pcall((1,), lambda k: crypto.aes_decrypt(bad, k, like=X), k)

        with pytest.raises(mp.MPRuntimeError, match="authentication failed: the ciphertext or "
                                                    "its associated data was tampered with"):
            mp.fetch(sim, mp.evaluate(sim, decrypt, k))

    # the untouched ciphertext still decrypts, as a constant too
    good = mp.evaluate(sim, lambda k: simp.pcall(
        (1,), lambda k: crypto.aes_decrypt(tensor.constant(sealed), k, like=X), k), k)
    np.testing.assert_array_equal(mp.fetch(sim, good)[1], X)


def test_other_aad_or_another_key_fails_to_authenticate(sim: mp.Simulator) -> None:
    def wrong_aad() -> Any:
        c, k1 = encrypted_at_0(X, aad=b"hdr")
        return simp.pcall((1,), lambda c, k: crypto.aes_decrypt(c, k, like=X, aad=b"hdR"), c, k1)

    def wrong_key() -> Any:
        c, _ = encrypted_at_0(X)
        return simp.pcall((1,), lambda c: crypto.aes_decrypt(c, crypto.aes_keygen(), like=X,
                                                             aad=b"hdr"), c)

    for prog in (wrong_aad, wrong_key):
        err = runtime_error(sim, prog)
        assert str(err).startswith(f"party 1: op crypto.aes_decrypt: {AUTH_FAILED}")


def test_a_low_order_peer_key_is_refused(sim: mp.Simulator) -> None:
    def prog() -> Any:
        def body() -> Any:
            _, sk = crypto.x25519_keygen()
            peer = crypto.public_key(tensor.constant(np.zeros(32, np.uint8)), algorithm="x25519")
            return crypto.hkdf(crypto.x25519_shared(sk, peer))
        return simp.pcall((0,), body)

    err = runtime_error(sim, prog)
    assert str(err).startswith("party 0: op crypto.x25519_shared: X25519: the peer's public "
                               "key is a low-order point (the shared secret is all zeros); "
                               "refusing it")


# ---------------------------------------------------------------- runtime values and the wire


def test_public_keys_cross_the_wire() -> None:
    pk = PublicKeyValue("ed25519", ed25519_public(bytes(range(32))))
    data = wire.encode_value_bytes(pk)
    header, _ = wire.split_frame(data)
    assert header == {"kind": "crypto.public_key", "sizes": [7, 32]}
    back = wire.decode_value(data)
    assert type(back) is PublicKeyValue and back == pk
    assert wire.payload_bytes(pk) == 39
    assert wire.privacy_kind(pk) == "plaintext"
    assert wire.decode_value(wire.encode_value_bytes([pk, pk])) == [pk, pk]


def _public_frame(chunks: list[bytes]) -> bytes:
    return b"".join(bytes(b) for b in wire._frame(
        {"kind": "crypto.public_key", "sizes": [len(c) for c in chunks]}, chunks))


@pytest.mark.parametrize("chunks, message", [
    ([b"x25519", bytes(31)], "crypto.public_key: 31 key bytes, expected 32"),
    ([b"x25519", bytes(33)], "crypto.public_key: 33 key bytes, expected 32"),
    ([b"rsa", bytes(32)], "crypto.public_key: unknown algorithm b'rsa'"),
    ([b"X25519", bytes(32)], "crypto.public_key: unknown algorithm b'X25519'"),
    ([bytes(32)], "crypto.public_key: expected 2 chunks (algorithm, key), got 1"),
    ([], "crypto.public_key: expected 2 chunks (algorithm, key), got 0"),
    ([b"x25519", bytes(32), b""], "crypto.public_key: expected 2 chunks (algorithm, key), got 3"),
])
def test_malformed_public_key_payloads_are_refused(chunks: list[bytes], message: str) -> None:
    with pytest.raises(mp.MPSerializationError) as info:
        wire.decode_value(_public_frame(chunks))
    assert str(info.value) == f"malformed value: {message}"


def test_a_truncated_public_key_frame_is_refused() -> None:
    data = wire.encode_value_bytes(PublicKeyValue("x25519", bytes(32)))
    for cut in (1, 16, len(data) // 2):
        with pytest.raises(mp.MPSerializationError, match=r"^malformed value"):
            wire.decode_value(data[:-cut])


@pytest.mark.parametrize("value, kind", [
    (PrivateKeyValue("x25519", bytes(range(32))), "private key"),
    (SymmetricKeyValue(bytes(range(32))), "symmetric key"),
    (SharedSecretValue(bytes(range(32))), "shared secret")])
def test_key_material_never_encodes_and_never_shows(value: Any, kind: str) -> None:
    with pytest.raises(mp.MPSerializationError) as info:
        wire.encode_value(value)
    assert str(info.value) == (f"cannot send a {kind}: key material never leaves the party "
                               "that holds it")
    with pytest.raises(mp.MPSerializationError):
        wire.encode_value([value])
    with pytest.raises(TypeError, match="is key material and is not serialized"):
        pickle.dumps(value)
    assert wire.privacy_kind(value) == "key material"
    assert bytes(range(32)).hex() not in repr(value) and "secret bytes" in repr(value)
    assert str(list(value.raw)) not in repr(value)
    # a peer's frame claiming to carry key material is refused as well
    tag = f"crypto.{kind.replace(' ', '_')}"
    frame = b"".join(bytes(b) for b in wire._frame({"kind": tag, "sizes": [32]}, [bytes(32)]))
    with pytest.raises(mp.MPSerializationError, match=f"^malformed value: {kind}: key material "
                                                      "is never sent"):
        wire.decode_value(frame)


def test_runtime_key_values_check_their_bytes() -> None:
    with pytest.raises(ValueError, match="public key: expected 32 raw bytes, got 31"):
        PublicKeyValue("x25519", bytes(31))
    with pytest.raises(ValueError, match="public key: unknown algorithm 'rsa'"):
        PublicKeyValue("rsa", bytes(32))
    with pytest.raises(ValueError, match="private key: expected 32 raw bytes"):
        PrivateKeyValue("ed25519", bytes(64))
    with pytest.raises(AttributeError, match="immutable"):
        PublicKeyValue("x25519", bytes(32)).raw = bytes(32)  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        SymmetricKeyValue(bytes(32)).raw = bytes(32)  # type: ignore[misc]
