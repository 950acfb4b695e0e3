"""Kernels of the ``tee`` dialect: the MOCK attestation service and quote checks.

The mock vendor's Ed25519 key is derived from a seed published here, so anyone
can sign a mock quote: it is a stand-in for a hardware vendor's attestation
service, labelled as a mock in every quote (`QUOTE_MAGIC`), op name, device
config (``attestation: mock``) and warning. The TEE node reports its own code
digest (`code_digest`), where real hardware would measure it.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from mplang.dialects.tee import (
    DIGEST_BYTES,
    QUOTE_BYTES,
    QUOTE_MAGIC,
    mock_quote_p,
    verify_quote_p,
)
from mplang.edsl.errors import MPPublicError
from mplang.kernels.crypto import (
    PublicKeyValue,
    ed25519_sign,
    ed25519_verify,
)
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call

MOCK_VENDOR_SEED = hashlib.sha256(b"mplang MOCK attestation vendor: NOT SECURE, this seed is "
                                  b"public and anyone can sign mock quotes").digest()
MOCK_VENDOR_PUBLIC_KEY = "39d824188a90945caf240febde402da7e4f9058871f129f92a776cc325f562a9"
"""The mock attestation service's Ed25519 public key (hex); its private key is public too.
It is ``ed25519_public(MOCK_VENDOR_SEED)``, written out so that importing this module does
not load ``cryptography``."""
MEASUREMENT_DOMAIN = b"mplang-tee-measurement/1"


@functools.cache
def code_digest() -> str:
    """SHA-256 (hex) of this installation's MPLang code: every ``.py`` file of the package,
    by relative path and content, in path order (what a TEE running it would measure)."""
    root = Path(__file__).resolve().parents[1]  # the package: mplang/kernels/tee.py
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix().encode()
        data = path.read_bytes()
        h.update(len(rel).to_bytes(4, "little") + rel + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def measurement(code: str, computation: str) -> bytes:
    """The measurement a quote reports: SHA-256 of the domain, the code digest and the
    computation digest (both hex)."""
    return hashlib.sha256(MEASUREMENT_DOMAIN + bytes.fromhex(code) +
                          bytes.fromhex(computation)).digest()


def make_quote(tee_public_key: bytes, code: str, computation: str,
               vendor_seed: bytes = MOCK_VENDOR_SEED) -> bytes:
    """A MOCK quote: magic ‖ measurement ‖ TEE public key ‖ the vendor's signature."""
    body = QUOTE_MAGIC + measurement(code, computation) + tee_public_key
    return body + ed25519_sign(vendor_seed, body)


def check_quote(quote: bytes, code: str, computation: str, vendor_key: str) -> bytes:
    """The TEE's X25519 public key in MOCK ``quote`` if it is signed by ``vendor_key`` and
    reports the measurement of ``computation`` on ``code``; ValueError saying why not."""
    if len(quote) != QUOTE_BYTES or not quote.startswith(QUOTE_MAGIC):
        raise ValueError("not a mock quote (bad length or magic)")
    body, signature = quote[:-64], quote[-64:]
    if not ed25519_verify(bytes.fromhex(vendor_key), body, signature):
        raise ValueError(f"the quote's signature does not verify under the expected vendor "
                         f"key {vendor_key[:16]}...")
    start = len(QUOTE_MAGIC)
    reported = body[start:start + DIGEST_BYTES]
    expected = measurement(code, computation)
    if reported != expected:
        raise ValueError(f"the quote reports measurement {reported.hex()[:16]}..., expected "
                         f"{expected.hex()[:16]}... (code {code[:16]}..., computation "
                         f"{computation[:16]}...): the TEE runs other code or another "
                         "computation")
    return body[start + DIGEST_BYTES:]


backend = register_backend("tee")


@backend.kernel(mock_quote_p)
def _mock_quote(call: Call, tee_public_key: Any, *, computation: str) -> list[Any]:
    tee_key = np.asarray(tee_public_key, dtype=np.uint8).tobytes()
    quote = make_quote(tee_key, code_digest(), computation)
    return [np.frombuffer(quote, dtype=np.uint8).copy()]


@backend.kernel(verify_quote_p)
def _verify_quote(call: Call, quote: Any, *, computation: str, code: str | None,
                  vendor_key: str | None) -> list[Any]:
    raw = np.asarray(quote, dtype=np.uint8).tobytes()
    try:
        tee_key = check_quote(raw, code or code_digest(), computation,
                              vendor_key or MOCK_VENDOR_PUBLIC_KEY)
    except ValueError as e:
        raise call.error(f"attestation refused, nothing is sent to the TEE: {e}",
                         MPPublicError) from None
    return [PublicKeyValue("x25519", tee_key)]
