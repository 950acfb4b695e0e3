"""Flow rules of the crypto ops that seal data (`mplang.dialects.crypto` registers them).

Key material carries no party's data. A key p derives from a TEE key whose quote p
itself checked (`tee.verify_quote`) is attested for that quote's computation, and so
is a ciphertext p encrypts under it: only that enclave opens it, and what it opens
stays p's data inside the enclave (`Analysis.local` lets it reach the attested region
only). Any other ciphertext is ``sealed``: no flow until it is decrypted, which is a
flow of the plaintext to the party that decrypts.
"""

from __future__ import annotations

from dataclasses import replace

from mplang.edsl.graph import Operation
from mplang.flows.engine import Analysis, enclave_aware
from mplang.flows.labels import Flow, Label, raw


@enclave_aware
def key_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Keys carry no data; one derived from an attested key is attested too."""
    if any(lab is not None and lab.mine for lab in ins):
        return [raw(ins)] * len(op.outputs)
    attested = {lab.enclave for lab in ins if lab is not None and lab.enclave}
    marker = Flow("foreign", enclave=attested.pop()) if len(attested) == 1 else None
    return [marker] * len(op.outputs)


@enclave_aware
def seal_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """A ciphertext of the plaintext's label: sealed, and for the attested enclave if the
    key is attested."""
    x, key = ins[0], ins[1]
    if key is not None and key.mine:
        return [raw([x, key])]
    if x is None or not x.mine:
        return [x]
    enclave = key.enclave if key is not None else ""
    return [replace(x, sealed=True, enclave=enclave)]


@enclave_aware
def open_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Decrypting: inside the attested enclave p's data stays there; elsewhere it is a
    flow of the plaintext to the party that decrypts."""
    c = ins[0]
    if c is None or not c.mine or not c.sealed:
        return [c]
    plain = replace(c, sealed=False)
    if not c.enclave and not own and a.runner is not None:
        a.send(op, a.runner, plain, "the plaintext it decrypts")
    return [plain]
