"""The declarations and type rules of the tee primitives."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.analysis.cost_model import local_cost
from mplang.dialects import tee
from mplang.edsl.errors import MPTypeError
from mplang.edsl.primitive import primitives
from mplang.edsl.typing import MPType
from mplang.flows.engine import local_conservative

DIGEST = "ab" * 32


def test_tee_primitives_are_declared() -> None:
    mock, verify = primitives("tee")
    assert (mock.name, mock.targets, verify.name, verify.targets) == \
        ("tee.mock_quote", ("TEE",), "tee.verify_quote", ("PPU",))
    for p in (mock, verify):
        assert p.side_effects and p.rule("cost") is local_cost
    assert mock.rule("local_flow") is local_conservative
    assert verify.rule("local_flow").__name__ == "_verify_flow"  # an attested key
    assert {a["name"]: (a["required"], a["default"]) for a in verify.describe()["attributes"]} \
        == {"computation": (True, None), "code": (False, None), "vendor_key": (False, None)}


def _compile(body: Any) -> mp.Program:
    return mp.compile(lambda: simp.pcall((0,), body), world_size=1)


def test_quote_and_key_types() -> None:
    def body() -> Any:
        quote = tee.mock_quote(tensor.constant(np.zeros(32, np.uint8)), computation=DIGEST)
        return quote, tee.verify_quote(quote, computation=DIGEST)

    quote, key = _compile(body).output_types
    assert isinstance(quote, MPType) and isinstance(key, MPType)
    assert str(quote.base) == f"u8[{tee.QUOTE_BYTES}]" and str(key.base) == "x25519.pk"


@pytest.mark.parametrize(("body", "message"), [
    (lambda: tee.mock_quote(tensor.constant(np.zeros(16, np.uint8)), computation=DIGEST),
     r"tee\.mock_quote: operand tee_public_key must be u8\[32\] \(an X25519 public key\), "
     r"got u8\[16\]"),
    (lambda: tee.mock_quote(tensor.constant(np.zeros(32, np.uint8)), computation="AB" * 32),
     r"tee\.mock_quote: 'computation' must be 64 lowercase hex digits, got 'ABAB"),
    (lambda: tee.mock_quote(tensor.constant(np.zeros(32, np.uint8)), computation=None),  # type: ignore[arg-type]
     r"tee\.mock_quote: attribute 'computation' must be str, got None"),
    (lambda: tee.verify_quote(tensor.constant(np.zeros(32, np.uint8)), computation=DIGEST),
     r"tee\.verify_quote: operand quote must be u8\[\d+\] \(a mock quote\), got u8\[32\]"),
    (lambda: tee.verify_quote(tensor.constant(np.zeros(tee.QUOTE_BYTES, np.uint8)),
                              computation=DIGEST, vendor_key="00"),
     r"tee\.verify_quote: 'vendor_key' must be 64 lowercase hex digits, got '00'"),
    (lambda: tee.verify_quote(tensor.constant(np.zeros(tee.QUOTE_BYTES, np.uint8)),
                              computation=DIGEST, code=7),  # type: ignore[arg-type]
     r"tee\.verify_quote: attribute 'code' must be str or None, got 7"),
])
def test_type_errors_name_the_op(body: Any, message: str) -> None:
    with pytest.raises(MPTypeError, match=message):
        _compile(body)
