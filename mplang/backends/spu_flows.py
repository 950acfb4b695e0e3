"""Flow rules of the spu dialect: how a party's data moves through an SPU (see
`mplang.policy.flows`).

Sealing sends secret shares (not plaintext), so the label follows the shares to
every member unchecked; ``spu.run`` carries labels through the pphlo of its
executable; ``spu.reveal`` is a declassification to the receiving party, which
the data owner's policy must allow.
"""

from __future__ import annotations

from mplang.analysis.spu_rounds import executable_code
from mplang.dialects import spu
from mplang.edsl.graph import Operation
from mplang.policy.flows import Analysis, PartyLabels, everywhere, flow_rule
from mplang.policy.rules import through


def _device_use(a: Analysis, op: Operation, sealed_from: int | None = None) -> None:
    if a.party in op.attrs["members"] or sealed_from == a.party:
        a.devices.append((op, dict(op.attrs)))


@flow_rule(spu.seal_p)
def _seal(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Shares are not plaintext: the label follows them to every member, unchecked."""
    holders = a.holders(op.inputs[0])
    src = holders[0] if len(holders) == 1 else None
    _device_use(a, op, src)
    label = ins[0].get(src) if src is not None else everywhere(ins[0])
    return [{} if label is None else dict.fromkeys(op.attrs["members"], label)]


@flow_rule(spu.run_p)
def _spu_run(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    _device_use(a, op)
    outs = through(executable_code, op.attrs["executable"], [everywhere(v) for v in ins],
                    len(op.outputs))
    members = op.attrs["members"]
    return [{} if lab is None else dict.fromkeys(members, lab) for lab in outs]


@flow_rule(spu.reveal_p)
def _reveal(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    _device_use(a, op)
    to: int = op.attrs["to"]
    label = everywhere(ins[0])
    a.send(op, to, label, f"the value revealed from {op.attrs['device']}")
    return [{} if label is None else {to: label}]
