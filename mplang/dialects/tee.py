"""The ``tee`` dialect: mock attestation of a trusted execution environment.

Real hardware quotes are out of reach here, so attestation is SIMULATED: a mock
attestation service signs each quote with an Ed25519 key that is published in
this code (`mplang.kernels.tee.MOCK_VENDOR_PUBLIC_KEY`), so anyone can make
a valid mock quote. A mock quote shows the protocol's flow and catches honest
mistakes (another measurement, another vendor key); it proves nothing about the
hardware or the code the TEE node really runs.

- ``tee.mock_quote(tee_pk_bytes, computation=...)`` (on the TEE's party): a quote
  binding the TEE's X25519 public key to its measurement,
  ``SHA-256("mplang-tee-measurement/1" ‖ code digest ‖ computation digest)``,
  where the code digest is the TEE node's own MPLang code (self-reported: mock)
  and the computation digest is the program's TEE function.
- ``tee.verify_quote(quote, computation=..., code=..., vendor_key=...)`` (on a
  data owner's party): the TEE's X25519 public key if the quote is signed by
  the expected vendor key and reports the expected measurement; otherwise the op
  fails, so nothing that depends on the key (the owner's sealed data) is sent.
"""

from __future__ import annotations

from mplang.analysis.cost_model import local_cost
from mplang.dialects.crypto import PublicKey
from mplang.edsl.attrs import Attr, NoneType
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.graph import Operation
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Constraint, Operand, Primitive, Result, Signature
from mplang.edsl.traits import OpTraits
from mplang.edsl.typing import TensorType, ValueType
from mplang.flows.engine import Analysis, local_conservative
from mplang.flows.labels import Flow, Label
from mplang.frontend.feop import feop

mark_library(__file__)

QUOTE_MAGIC = b"MPLANG-MOCK-QUOTE/1\0"
"""The first bytes of every quote: it is a mock."""
DIGEST_BYTES = 32
QUOTE_BYTES = len(QUOTE_MAGIC) + 2 * DIGEST_BYTES + 64
"""magic ‖ measurement (32) ‖ TEE X25519 public key (32) ‖ Ed25519 signature (64)."""
_CHECK = OpTraits(pure=False, communicates=False)
_KEY_BYTES = TensorType("uint8", (DIGEST_BYTES,))
_QUOTE = TensorType("uint8", (QUOTE_BYTES,))
_TEE_KEY = PublicKey("x25519")
_DIGEST_DOC = f"hex SHA-256 ({2 * DIGEST_BYTES} lowercase hex digits)"

mock_quote_p = Primitive(
    "tee.mock_quote", kind="compute", execution_model="single_rank", traits=_CHECK,
    operands=[Operand("tee_public_key", Constraint(f"{_KEY_BYTES} (an X25519 public key)",
                                                   lambda t: t == _KEY_BYTES))],
    attrs={"computation": Attr(str, required=True,
                               doc=f"the TEE function's digest, {_DIGEST_DOC}")},
    results=[Result("quote", Constraint(str(_QUOTE), lambda t: t == _QUOTE))],
    targets=("TEE",), cost=local_cost, doc="A MOCK attestation quote of this TEE party.")
verify_quote_p = Primitive(
    "tee.verify_quote", kind="compute", execution_model="single_rank", traits=_CHECK,
    operands=[Operand("quote", Constraint(f"{_QUOTE} (a mock quote)", lambda t: t == _QUOTE))],
    attrs={"computation": Attr(str, required=True,
                               doc=f"the expected computation digest, {_DIGEST_DOC}"),
           "code": Attr((str, NoneType), default=None,
                        doc=f"the expected code digest, {_DIGEST_DOC} (None: this party's "
                            "own MPLang code)"),
           "vendor_key": Attr((str, NoneType), default=None,
                              doc="the vendor's Ed25519 public key, hex (None: the built-in "
                                  "mock vendor)")},
    results=[Result("tee_public_key", Constraint(str(_TEE_KEY), lambda t: t == _TEE_KEY))],
    targets=("PPU",), cost=local_cost, doc="Check a MOCK quote; give the TEE's X25519 key.")


def _hex(op: str, name: str, value: str | None) -> None:
    if value is not None and not (len(value) == 2 * DIGEST_BYTES
                                  and all(c in "0123456789abcdef" for c in value)):
        raise MPTypeError(f"{op}: '{name}' must be {2 * DIGEST_BYTES} lowercase hex digits, "
                          f"got {value!r}")


@mock_quote_p.def_type_rule
def _quote_rule(sig: Signature) -> list[ValueType]:
    _hex("tee.mock_quote", "computation", sig.computation)
    return [_QUOTE]


mock_quote_p.def_local_flow(local_conservative)


@verify_quote_p.def_type_rule
def _verify_rule(sig: Signature) -> list[ValueType]:
    op = "tee.verify_quote"
    _hex(op, "computation", sig.computation)
    _hex(op, "code", sig.code)
    _hex(op, "vendor_key", sig.vendor_key)
    return [_TEE_KEY]


@verify_quote_p.def_local_flow
def _verify_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """The TEE's key: attested for the quote's computation when this party checked it
    (`mplang.dialects.crypto`), a key like any other otherwise."""
    return [Flow("foreign", enclave=str(op.attrs["computation"])) if own else None]


@feop(mock_quote_p, example="q = tee.mock_quote(crypto.public_bytes(pk), computation=digest)")
@function
def mock_quote(tee_public_key: MPObject, *, computation: str) -> MPObject:
    """A MOCK quote binding ``tee_public_key`` (u8[32]) to this node's measurement for
    ``computation`` (hex SHA-256 of the TEE function)."""
    return mock_quote_p.bind([tee_public_key], {"computation": computation})[0]


@feop(verify_quote_p, example="tee_pk = tee.verify_quote(q, computation=digest)")
@function
def verify_quote(quote: MPObject, *, computation: str, code: str | None = None,
                 vendor_key: str | None = None) -> MPObject:
    """The TEE's X25519 public key from MOCK ``quote``, checked against the measurement of
    ``computation`` on ``code`` (hex code digest; None: this party's own MPLang code) and
    signed by ``vendor_key`` (hex Ed25519 key; None: the built-in mock vendor). A failed
    check fails the op."""
    return verify_quote_p.bind([quote], {"computation": computation, "code": code,
                                         "vendor_key": vendor_key})[0]


__all__ = ["QUOTE_BYTES", "QUOTE_MAGIC", "mock_quote", "verify_quote"]
