"""The tee corpus: tee.mock_quote and tee.verify_quote (`tests.dialects.corpus`)."""

from __future__ import annotations

from typing import Any

from mplang import crypto, simp
from mplang.dialects import tee


def tee_corpus() -> Any:
    """tee.mock_quote at the TEE's party and tee.verify_quote at a data owner."""
    computation = "ab" * 32
    quote = simp.pcall((2,), lambda: tee.mock_quote(crypto.public_bytes(
        crypto.x25519_keygen()[0]), computation=computation))
    key = simp.pcall((0,), lambda q: tee.verify_quote(q, computation=computation),
                     simp.shuffle_static(quote, {0: 2}))
    return simp.pcall((0,), crypto.public_bytes, key)


def check(result: Any) -> None:
    assert result[0].shape == (32,) and result[1] is None and result[2] is None
