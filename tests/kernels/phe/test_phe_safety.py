"""Key separation, key mixing, overflow and the wire form of the phe dialect."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import phe, simp
from mplang.edsl.errors import MPRuntimeError, MPSerializationError, MPTypeError
from mplang.kernels.phe import PheCiphertext, PhePrivateKey, PhePublicKey
from mplang.transport.wire import decode_value, encode_value, encode_value_bytes
from tests.kernels.phe.conftest import KEY_BITS
from tests.op_failures import assert_generic, logged_failure, traced_at


def keys(party: int = 0) -> tuple[Any, Any]:
    return simp.pcall((party,), lambda: phe.keygen(key_bits=KEY_BITS))


# ---------------------------------------------------------------- key separation (compile time)


def test_moving_a_private_key_is_a_compile_error() -> None:
    def prog() -> Any:
        _, sk = keys()
        return simp.shuffle_static(sk, {1: 0})

    with pytest.raises(MPTypeError, match=r"simp\.shuffle_static: the value is "
                       r"phe\.sk<paillier1024,k0>@\{0\}, key material that never leaves"):
        mp.compile(prog, world_size=2)


def test_converging_or_dynamically_shuffling_a_private_key_is_a_compile_error() -> None:
    def conv() -> Any:
        _, sk0 = keys(0)
        _, sk1 = keys(1)
        return simp.converge(sk0, sk1)

    def dyn() -> Any:
        _, sk = keys()
        idx = simp.constant((1,), np.int32(0))
        return simp.shuffle(sk, idx)

    with pytest.raises(MPTypeError, match=r"simp\.converge: input 0 is .*key material"):
        mp.compile(conv, world_size=2)
    with pytest.raises(MPTypeError, match=r"simp\.shuffle: the value is .*key material"):
        mp.compile(dyn, world_size=2)


def test_a_pcall_on_another_party_cannot_take_a_private_key() -> None:
    def prog() -> Any:
        pk, sk = keys()
        c = simp.pcall((0,), lambda k: phe.encrypt(np.float32(1), k), pk)
        c1 = simp.shuffle_static(c, {1: 0})
        return simp.pcall((1,), phe.decrypt, c1, sk)

    with pytest.raises(MPTypeError, match=r"simp\.pcall on parties \{1\}: input 1 is "
                       r"phe\.sk<paillier1024,k0>@\{0\}, key material"):
        mp.compile(prog, world_size=2)


def test_fetching_a_private_key_is_refused(sim2: mp.Simulator) -> None:
    _, sk = mp.evaluate(sim2, lambda: keys())
    with pytest.raises(MPTypeError, match=r"fetch: .* is key material"):
        mp.fetch(sim2, sk)


def test_public_keys_and_ciphertexts_move_freely(sim2: mp.Simulator) -> None:
    def prog() -> Any:
        pk, sk = keys()
        pk1 = simp.shuffle_static(pk, {1: 0})
        c = simp.pcall((1,), lambda k: phe.encrypt(np.int32(41), k) + 1, pk1)
        return simp.pcall((0,), phe.decrypt, simp.shuffle_static(c, {0: 1}), sk)

    assert mp.fetch(sim2, mp.evaluate(sim2, prog))[0] == 42


def test_keygen_runs_on_one_party() -> None:
    def prog() -> Any:
        return simp.pcall((0, 1), lambda: phe.keygen(key_bits=KEY_BITS))

    with pytest.raises(MPTypeError, match=r"phe\.keygen: a key pair belongs to one party, but "
                       r"this body runs on parties \{0,1\}"):
        mp.compile(prog, world_size=2)


# ---------------------------------------------------------------- mixing keys


def test_decrypting_with_the_other_key_pair_is_a_compile_error() -> None:
    def prog() -> Any:
        pk_a, _ = keys()
        _, sk_b = keys()
        return simp.pcall((0,), lambda k, s: phe.decrypt(phe.encrypt(np.int32(1), k), s),
                          pk_a, sk_b)

    with pytest.raises(MPTypeError, match=r"phe\.decrypt: phe\.ct<int32\[\],k0> is under key "
                       r"pair k0, but the private key is of key pair k1"):
        mp.compile(prog, world_size=1)


def test_adding_ciphertexts_under_different_keys_is_a_compile_error() -> None:
    def prog() -> Any:
        pk_a, _ = keys()
        pk_b, _ = keys()
        return simp.pcall((0,), lambda a, b: phe.add(phe.encrypt(np.int32(1), a),
                                                     phe.encrypt(np.int32(2), b)), pk_a, pk_b)

    with pytest.raises(MPTypeError, match=r"phe\.add: the operands are under different key "
                       r"pairs \(phe\.ct<int32\[\],k0> and phe\.ct<int32\[\],k1>\)"):
        mp.compile(prog, world_size=1)


def test_kernels_check_fingerprints_when_types_cannot_tell(sim2: mp.Simulator) -> None:
    """Two programs each name their key pair k0: the types agree, the keys do not."""
    pk_a, _ = mp.evaluate(sim2, lambda: keys())
    _, sk_b = mp.evaluate(sim2, lambda: keys())
    c = mp.evaluate(sim2, lambda k: simp.pcall((0,), lambda kk: phe.encrypt(np.int32(5), kk),
                                               k), pk_a)
    with pytest.raises(MPRuntimeError, match=r"op phe\.decrypt: PheCiphertext\(.*\) is not "
                       r"under this private key's pair"):
        mp.fetch(sim2, mp.evaluate(sim2, lambda a, s: simp.pcall((0,), phe.decrypt, a, s),
                                   c, sk_b))


def test_other_type_errors_name_the_op() -> None:
    def mul_two() -> Any:
        pk, _ = keys()
        return simp.pcall((0,), lambda k: phe.encrypt(np.int32(1), k) *
                          phe.encrypt(np.int32(2), k), pk)

    def bad_axis() -> Any:
        pk, _ = keys()
        return simp.pcall((0,), lambda k: phe.sum(phe.encrypt(np.zeros((2, 2, 2), np.int32), k),
                                                  axis=0), pk)

    def bad_dot() -> Any:
        pk, _ = keys()
        return simp.pcall((0,), lambda k: phe.dot(phe.encrypt(np.zeros(3, np.int32), k),
                                                  np.zeros(4, np.int32)), pk)

    with pytest.raises(MPTypeError, match=r"phe\.mul_plain: cannot multiply two ciphertexts"):
        mp.compile(mul_two, world_size=1)
    with pytest.raises(MPTypeError, match=r"phe\.sum: sums along an axis take ciphertexts of at "
                       "most 2 dimensions"):
        mp.compile(bad_axis, world_size=1)
    with pytest.raises(MPTypeError, match=r"phe\.dot: inner dimensions differ"):
        mp.compile(bad_dot, world_size=1)


# ---------------------------------------------------------------- overflow


def failed_on_party_0(sim2: mp.Simulator, prog: Any, caplog: pytest.LogCaptureFixture,
                      tag: str, op: str = "phe.decrypt") -> str:
    """Run ``prog``, whose ``op`` (traced at the line tagged ``tag``) fails on party 0: the
    driver hears only that it failed; the full text, returned, is in party 0's log (the
    values are party 0's data)."""
    with pytest.raises(MPRuntimeError) as info:
        mp.fetch(sim2, mp.evaluate(sim2, prog))
    at = traced_at(__file__, tag)
    assert_generic(info.value, op, at, 0)
    return logged_failure(caplog, op, at, "node_0")


def test_an_overflowing_result_is_an_error_not_a_wrap(sim2: mp.Simulator,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    def prog() -> Any:
        pk, sk = keys()
        return simp.pcall((0,), lambda k, s: phe.decrypt(  # @overflow
            phe.encrypt(np.int32(1 << 30), k) * 4, s), pk, sk)

    assert re.search(r"op phe\.decrypt: a decrypted value \(4294967296\) does not fit int32 "
                     r"\[-2147483648, 2147483647\]",
                     failed_on_party_0(sim2, prog, caplog, "overflow"))


def test_two_to_the_eighty_does_not_decode_to_zero(sim2: mp.Simulator,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    big = np.int32(1 << 20)

    def prog() -> Any:
        pk, sk = keys()
        return simp.pcall((0,), lambda k, s: phe.decrypt(  # @2^80
            phe.encrypt(big, k) * big * big * big, s), pk, sk)

    assert re.search(r"a decrypted value \(about 2\^81\) does not fit int32 "
                     r"\[-2147483648, 2147483647\]: the computation overflowed",
                     failed_on_party_0(sim2, prog, caplog, "2^80"))


def test_a_wrapped_float_is_an_error(sim2: mp.Simulator,
                                     caplog: pytest.LogCaptureFixture) -> None:
    """Past the plaintext space (n/2) a value wraps modulo n: decrypt refuses it."""
    def prog() -> Any:
        pk, sk = keys()

        def body(k: Any, s: Any) -> Any:
            c = phe.encrypt(np.float32(1e6), k)
            for _ in range(20):  # scale 2^(24 * 21) ~ 2^504 and values ~ 2^(20*20)
                c = c * np.float32(1e6)
            return phe.decrypt(c, s)  # @wrapped

        return simp.pcall((0,), body, pk, sk)

    assert re.search(r"op phe\.decrypt: a decrypted value \(about 2\^\d+ / scale 2\^504\) "
                     r"does not fit float32", failed_on_party_0(sim2, prog, caplog, "wrapped"))


def test_nan_cannot_be_encrypted(sim2: mp.Simulator, caplog: pytest.LogCaptureFixture) -> None:
    def prog() -> Any:
        pk, _ = keys()
        return simp.pcall((0,), lambda k: phe.encrypt(np.float32(np.nan), k), pk)  # @nan

    assert re.search(r"op phe\.encrypt: phe\.encrypt: cannot encode NaN or infinity",
                     failed_on_party_0(sim2, prog, caplog, "nan", op="phe.encrypt"))


# ---------------------------------------------------------------- the wire


@pytest.fixture(scope="module")
def ciphertext() -> tuple[PheCiphertext, PhePrivateKey]:
    """A ciphertext of [[0, 1, 2], [3, 4, 5]] and its private key, made with sf-heu."""
    from heu import numpy as hnp
    from heu import phe as hphe

    kit = hnp.setup(hphe.SchemaType.ZPaillier, KEY_BITS)
    public = PhePublicKey("paillier", KEY_BITS, kit.public_key().serialize(), kit)
    plain = kit.array(np.arange(6, dtype=np.int64).reshape(2, 3), kit.integer_encoder(scale=1))
    return PheCiphertext(kit.encryptor().encrypt(plain), public), PhePrivateKey(kit, public)


def test_keys_and_ciphertexts_round_trip_without_pickle(ciphertext: Any) -> None:
    from mplang.kernels.phe import decrypt_in_range

    value, private = ciphertext
    back = decode_value(encode_value_bytes(value))
    assert isinstance(back, PheCiphertext) and back.shape == (2, 3)
    assert back.public.fingerprint == value.public.fingerprint
    plain = decrypt_in_range(private, back, phe.Ciphertext("int32", (2, 3), "k0", 1))
    np.testing.assert_array_equal(plain, np.arange(6).reshape(2, 3))
    pk = decode_value(encode_value_bytes(value.public))
    assert isinstance(pk, PhePublicKey) and pk.raw == value.public.raw


def test_a_private_key_has_no_wire_form(ciphertext: Any) -> None:
    with pytest.raises(MPSerializationError, match="a PHE private key is key material: it "
                       "never leaves the party that made it"):
        encode_value(ciphertext[1])


def _edit(parts: list[bytes], index: int, data: bytes) -> bytes:
    from mplang.transport.wire import _frame

    parts = list(parts)
    parts[index] = data
    kind = "phe.ciphertext" if len(parts) == 4 else "phe.public_key"
    return b"".join(_frame({"kind": kind, "sizes": [len(p) for p in parts]}, parts))


def test_malformed_payloads_are_refused(ciphertext: Any) -> None:
    from mplang.kernels.phe import _KEY_HEAD, _encode_ciphertext, _encode_public

    value, _ = ciphertext
    ct_parts = [bytes(p) for p in _encode_ciphertext(value)]
    pk_parts = [bytes(p) for p in _encode_public(value.public)]
    cases = {
        "bad scheme": (_edit(pk_parts, 0, b"XXXX" + pk_parts[0][4:]), "unknown scheme code"),
        "fingerprint": (_edit(pk_parts, 1, pk_parts[1][:-1] + bytes([pk_parts[1][-1] ^ 1])),
                        "fingerprint does not match"),
        "garbage key": (_edit([_KEY_HEAD.pack(b"PHEP", hashlib.sha256(b"\x93garbage").digest()
                                              [:16], KEY_BITS), b""], 1, b"\x93garbage"),
                        "sf-heu cannot read it"),
        "shape lie": (_edit(ct_parts, 2, ct_parts[2][:4] + (5).to_bytes(4, "little") +
                            ct_parts[2][8:]), r"the array is \[2, 3\], the header says \[5, 3\]"),
        "huge shape": (_edit(ct_parts, 2, b"PHEC" + (1 << 20).to_bytes(4, "little") * 2),
                       "cannot hold"),
        "truncated": (_edit(ct_parts, 3, ct_parts[3][:100]), "100 bytes cannot hold 2x3"),
        "garbled": (_edit(ct_parts, 3, ct_parts[3][:800] + b"\xff" * (len(ct_parts[3]) - 800)),
                    "sf-heu cannot read the array"),
    }
    for name, (data, message) in cases.items():
        with pytest.raises(MPSerializationError, match=message):
            decode_value(data)
        assert name


def test_without_sf_heu_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "heu", None)  # `import heu` now raises ImportError
    sim = mp.Simulator(1)
    try:
        with pytest.raises(MPRuntimeError, match=r"PHE needs the sf-heu package: pip install "
                           r"'mplang\[phe\]'"):
            mp.evaluate(sim, lambda: keys())
    finally:
        sim.close()
