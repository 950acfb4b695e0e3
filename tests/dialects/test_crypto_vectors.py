"""The crypto backend's primitives against the published test vectors.

AES-256-GCM: McGrew & Viega, "The Galois/Counter Mode of Operation", test cases 13-16
(also NIST SP 800-38D's examples); X25519: RFC 7748 §5.2 and §6.1; Ed25519: RFC 8032
§7.1 TEST 1-3; HKDF-SHA256: RFC 5869 A.1-A.3; SHA-256: FIPS 180-2 "abc" and "".
"""

from __future__ import annotations

import pytest

import mplang as mp
from mplang.kernels.crypto import (
    AUTH_FAILED,
    CryptoError,
    aes_gcm_open,
    aes_gcm_seal,
    ed25519_public,
    ed25519_sign,
    ed25519_verify,
    hkdf_sha256,
    sha256,
    x25519,
    x25519_public,
)

h = bytes.fromhex

# ---------------------------------------------------------------- AES-256-GCM

GCM_K = h("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
GCM_IV = h("cafebabefacedbaddecaf888")
GCM_P = h("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
          "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255")
GCM_C = h("522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
          "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad")
GCM_A = h("feedfacedeadbeeffeedfacedeadbeefabaddad2")

GCM_CASES = {
    # name: (key, iv, plaintext, aad, ciphertext, tag)
    "13": (bytes(32), bytes(12), b"", b"", b"", h("530f8afbc74536b9a963b4f1c4cb738b")),
    "14": (bytes(32), bytes(12), bytes(16), b"", h("cea7403d4d606b6e074ec5d3baf39d18"),
           h("d0d1c8a799996bf0265b98b5d48ab919")),
    "15": (GCM_K, GCM_IV, GCM_P, b"", GCM_C, h("b094dac5d93471bdec1a502270e3cc6c")),
    "16": (GCM_K, GCM_IV, GCM_P[:60], GCM_A, GCM_C[:60], h("76fc6ece0f4e1768cddf8853bb2d551b")),
}


@pytest.mark.parametrize("case", sorted(GCM_CASES))
def test_aes_256_gcm_test_case_seals_to_nonce_ciphertext_and_tag(case: str) -> None:
    key, iv, plain, aad, cipher, tag = GCM_CASES[case]
    sealed = aes_gcm_seal(key, plain, aad, nonce=iv)
    assert sealed == iv + cipher + tag
    assert aes_gcm_open(key, sealed, aad) == plain


def test_aes_gcm_test_case_16_refuses_any_changed_byte_or_aad() -> None:
    key, iv, _, aad, cipher, tag = GCM_CASES["16"]
    sealed = iv + cipher + tag
    for i in (0, 11, 12, 40, len(sealed) - 1):  # nonce, ciphertext and tag bytes
        bad = bytearray(sealed)
        bad[i] ^= 0x01
        with pytest.raises(CryptoError) as info:
            aes_gcm_open(key, bytes(bad), aad)
        assert str(info.value) == AUTH_FAILED
    for wrong_key, wrong_aad in ((key, aad[:-1]), (key, b""), (bytes(32), aad)):
        with pytest.raises(mp.MPRuntimeError) as error:
            aes_gcm_open(wrong_key, sealed, wrong_aad)
        assert str(error.value) == ("authentication failed: the ciphertext or its associated "
                                    "data was tampered with, or the key is wrong")


def test_aes_gcm_checks_sizes() -> None:
    with pytest.raises(CryptoError, match="an AES-256-GCM key must be 32 bytes, got 16 bytes"):
        aes_gcm_seal(bytes(16), b"x", b"")
    with pytest.raises(CryptoError, match="an AES-GCM nonce must be 12 bytes, got 8 bytes"):
        aes_gcm_seal(bytes(32), b"x", b"", nonce=bytes(8))
    with pytest.raises(CryptoError, match=r"at least 28 bytes .* got 27$"):
        aes_gcm_open(bytes(32), bytes(27), b"")


def test_aes_gcm_draws_a_fresh_nonce_each_time() -> None:
    first, second = (aes_gcm_seal(GCM_K, GCM_P, b"") for _ in range(2))
    assert len(first) == 12 + len(GCM_P) + 16
    assert first[:12] != second[:12] and first[12:] != second[12:]
    assert aes_gcm_open(GCM_K, first, b"") == aes_gcm_open(GCM_K, second, b"") == GCM_P


# ---------------------------------------------------------------- X25519 (RFC 7748)

X25519_52 = [
    ("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4",
     "e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c",
     "c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552"),
    ("4b66e9d4d1b4673c5ad22691957d6af5c11b6421e0ea01d42ca4169e7918ba0d",
     "e5210f12786811d3f4b7959d0538ae2c31dbe7106fc03c3efc4cd549c715a493",
     "95cbde9476e8907d7aade45cb4b873f88b595a68799fa152e6f8f7647aac7957"),
]


@pytest.mark.parametrize("scalar, u, out", X25519_52)
def test_x25519_rfc7748_section_5_2(scalar: str, u: str, out: str) -> None:
    assert x25519(h(scalar), h(u)) == h(out)


def test_x25519_rfc7748_section_5_2_iterated_1_and_1000_times() -> None:
    k = u = (9).to_bytes(32, "little")
    for i in range(1000):
        k, u = x25519(k, u), k
        if i == 0:
            assert k == h("422c8e7a6227d7bca1350b3e2bb7279f7897b87bb6854b783c60e80311ae3079")
    assert k == h("684cf59ba83309552800ef566f2f4d3c1c3887c49360e3875f2eb94d99532c51")


def test_x25519_rfc7748_section_6_1_diffie_hellman() -> None:
    alice = h("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    bob = h("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
    alice_pub, bob_pub = x25519_public(alice), x25519_public(bob)
    assert alice_pub == h("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
    assert bob_pub == h("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
    shared = h("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
    assert x25519(alice, bob_pub) == shared
    assert x25519(bob, alice_pub) == shared


@pytest.mark.parametrize("point", [bytes(32), (1).to_bytes(32, "little")])
def test_x25519_refuses_a_low_order_public_key(point: bytes) -> None:
    alice = h("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
    with pytest.raises(CryptoError, match=r"^X25519: the peer's public key is a low-order "
                                          r"point \(the shared secret is all zeros\)"):
        x25519(alice, point)


# ---------------------------------------------------------------- Ed25519 (RFC 8032)

ED25519_71 = {
    "TEST 1": ("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
               "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a", "",
               "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
               "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"),
    "TEST 2": ("4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
               "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c", "72",
               "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
               "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"),
    "TEST 3": ("c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
               "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025", "af82",
               "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac"
               "18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"),
}


@pytest.mark.parametrize("name", sorted(ED25519_71))
def test_ed25519_rfc8032_section_7_1(name: str) -> None:
    seed, public, message, signature = (h(v) for v in ED25519_71[name])
    assert ed25519_public(seed) == public
    assert ed25519_sign(seed, message) == signature
    assert ed25519_verify(public, message, signature) is True
    assert ed25519_verify(public, message + b"\x00", signature) is False
    flipped = bytes([signature[0] ^ 1]) + signature[1:]
    assert ed25519_verify(public, message, flipped) is False
    assert ed25519_verify(public, message, signature[:63]) is False
    other = h(ED25519_71["TEST 1" if name != "TEST 1" else "TEST 2"][1])
    assert ed25519_verify(other, message, signature) is False


# ---------------------------------------------------------------- HKDF-SHA256 (RFC 5869)

HKDF_CASES = {
    "A.1": (h("0b" * 22), h("000102030405060708090a0b0c"), h("f0f1f2f3f4f5f6f7f8f9"), 42,
            h("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
              "34007208d5b887185865")),
    "A.2": (bytes(range(0x00, 0x50)), bytes(range(0x60, 0xb0)), bytes(range(0xb0, 0x100)), 82,
            h("b11e398dc80327a1c8e7f78c596a49344f012eda2d4efad8a050cc4c19afa97c"
              "59045a99cac7827271cb41c65e590e09da3275600c2f09b8367793a9aca3db71"
              "cc30c58179ec3e87c14c01d5c1f3434f1d87")),
    # A.3: no salt (None, the API's default) and empty info
    "A.3": (h("0b" * 22), None, b"", 42,
            h("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d"
              "9d201395faa4b61a96c8")),
}


@pytest.mark.parametrize("case", sorted(HKDF_CASES))
def test_hkdf_sha256_rfc5869(case: str) -> None:
    ikm, salt, info, length, okm = HKDF_CASES[case]
    assert hkdf_sha256(ikm, info, length, salt=salt) == okm


def test_hkdf_refuses_lengths_beyond_255_hashes() -> None:
    assert len(hkdf_sha256(b"k", b"", 8160)) == 8160
    with pytest.raises(CryptoError, match="HKDF-SHA256 gives 1 to 8160 bytes, not 8161"):
        hkdf_sha256(b"k", b"", 8161)


# ---------------------------------------------------------------- SHA-256 (FIPS 180-2)


def test_sha256_standard_digests() -> None:
    assert sha256(b"abc") == h("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    assert sha256(b"") == h("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
