"""The PSI protocols a party joins with: its policy's ``psi_protocols`` (docs/psi.md,
"Protocols and policies"). Every one reveals the row counts; the default set is those
that reveal nothing else but their result (the intersection, or its size)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mplang.flows.engine import where

if TYPE_CHECKING:
    from mplang.flows.engine import Analysis
    from mplang.policy.check import Verdict
    from mplang.policy.policy import Policy

DEFAULT_PSI_PROTOCOLS = ("rr22", "kkrt", "ecdh", "ecdh_cardinality", "aby3")
"""``psi.join``'s protocols, ``psi.intersection_size``'s and ``psi.join_n``'s ``aby3``."""
PSI_PROTOCOLS = (*DEFAULT_PSI_PROTOCOLS, "ecdh_3pc", "ecdh_npc", "kkrt_npc", "ecdh_oprf_ub")
"""Every PSI protocol: also libpsi's n-party ones (they reveal pairwise overlaps) and
unbalanced PSI's (the client keeps the server's whole evaluated set)."""


def check_psi_protocols(analysis: Analysis, policy: Policy, verdict: Verdict) -> None:
    """Refuse the PSI ops the party takes part in whose protocol its policy does not list."""
    for op, protocol in analysis.psi:
        if protocol not in policy.psi_protocols:
            reason = (f"{where(op)} uses PSI protocol {protocol}, which psi_protocols "
                      f"[{', '.join(policy.psi_protocols)}] of {policy.source} does not accept")
            if reason not in verdict.reasons:
                verdict.reasons.append(reason)
