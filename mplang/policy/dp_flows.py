"""Flow rules of differentially private releases.

A release is a secure-device op running a function registered with
`mplang.policy.vouched.releasing` (its members derive it themselves, so its
``epsilon`` is the noise it adds). Party p counts its outputs as a ``dp`` release of
its data, of that epsilon, only if:

- if p is a member of the device, its own random input is a fresh draw of its own
  (``crypto.random_bits`` run by p, used by no other release): with it uniform and
  secret, the joint randomness is, whatever the others put in (the device's members
  check their own inputs; a data owner outside the device trusts its model, as it
  does for every computation there);
- no other random input carries p's data;
- every data input carrying p's data has one element per row of p's data (row-wise,
  one dimension, as many elements as rows), no row twice across inputs: the
  function's sensitivity assumes each row changes one element;
- it is not inside a loop (which would release an unknown number of times).

Otherwise the program is refused with the reason. Every release of p's data is
charged to p's budget when p accepts the program (`mplang.policy.ledger`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from mplang.edsl.graph import Operation
from mplang.edsl.typing import MPType
from mplang.policy.flows import Analysis, PartyLabels, everywhere
from mplang.policy.labels import Flow, Label, Rows, raw
from mplang.policy.vouched import Releasing

ENTROPY = "fresh randomness drawn at op"
"""The start of the source name of a party's own random draw."""


@dataclass(frozen=True)
class Release:
    """A release of p's data ``sources`` at ``op``, of privacy loss ``epsilon``."""

    op: Operation
    epsilon: float
    mechanism: str
    sources: frozenset[str]


def entropy_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """p's own random draw is p's secret (raw, of a source naming the draw); another
    party's draw carries nothing of p's."""
    if not own:
        return [None] * len(op.outputs)
    return [Flow("raw", frozenset([f"{ENTROPY} {id(op):x}"]), pure=True)] * len(op.outputs)


def _fresh(label: Label) -> str | None:
    """The draw ``label`` is, if it is p's random draw as drawn."""
    if label is None or label.form != "raw" or not label.pure or len(label.sources) != 1:
        return None
    (name,) = label.sources
    return name if name.startswith(ENTROPY) else None


def _row_problem(op: Operation, i: int, label: Flow) -> str | None:
    t = op.inputs[i].type
    plain = t.base.plaintext() if isinstance(t, MPType) else None
    shape = getattr(plain, "shape", None)
    window = label.window
    if label.form != "rowwise" or window is None or label.axis != 0 or window.step or \
            label.outer is not None or shape is None or len(shape) != 1 or \
            shape[0] != window.size:
        return (f"data input {i} is {label} of shape {shape}, not one element per row of "
                "this party's data")
    return None


def _overlap(a: Rows, b: Rows) -> bool:
    return bool(a.sources & b.sources) and a.lo < b.hi and b.lo < a.hi


def release_flow(a: Analysis, op: Operation, ins: list[PartyLabels], entry: Releasing
                 ) -> list[PartyLabels]:
    """The labels of the outputs of a vouched release ``entry`` (the ``dp`` label of p's
    data), or the refusal of it (`Analysis.refusals`)."""
    members: list[int] = list(op.attrs["members"])
    static = op.attrs["library_args"]
    epsilon, mechanism = float(static[entry.epsilon_arg]), entry.mechanism
    entropy, data = ins[:len(members)], ins[len(members):]
    where = f"op {op.opcode}" + (f" at {op.loc}" if op.loc else "")
    problems: list[str] = []
    if static[entry.members_arg] != len(members) or len(ins) <= len(members):
        return _refuse(a, op, where, mechanism, ["its random inputs are not one per member"],
                       ins)
    for member, labels in zip(members, entropy, strict=True):
        label = everywhere(labels)
        if member != a.party:
            if label is not None and label.mine:
                problems.append(f"the random input of party {member} carries {label}")
            continue
        draw = _fresh(label)
        if draw is None:
            problems.append("this party's random input is not a fresh crypto.random_bits "
                            "draw of its own")
        elif draw in a.used_draws and not any(r.op is op for r in a.releases):
            problems.append("this party's random draw is used by another release")
        else:
            a.used_draws.add(draw)
    mine = [(i, lab) for i, lab in enumerate(everywhere(d) for d in data)
            if lab is not None and lab.mine]
    problems += [p for i, lab in mine if (p := _row_problem(op, len(members) + i, lab))]
    windows = [lab.window for _, lab in mine if lab.window is not None]
    if any(_overlap(x, y) for x, y in itertools.combinations(windows, 2)):
        problems.append("two data inputs hold the same rows of this party's data")
    if mine and a.looping:
        problems.append("it runs in a loop, an unknown number of times")
    if not mine and not problems:
        return [{} for _ in op.outputs]
    if problems:
        return _refuse(a, op, where, mechanism, problems, ins)
    sources = frozenset(s for _, lab in mine for s in lab.sources)
    if not any(r.op is op for r in a.releases):
        a.releases.append(Release(op, epsilon, mechanism, sources))
    label = Flow("dp", sources, epsilon=epsilon)
    return [dict.fromkeys(members, label) for _ in op.outputs]


def _refuse(a: Analysis, op: Operation, where: str, mechanism: str, problems: list[str],
            ins: list[PartyLabels]) -> list[PartyLabels]:
    """Record why p refuses the release; its outputs are raw from every input but p's
    fresh draws."""
    reason = (f"{where} is a differentially private release ({mechanism}) this party "
              "cannot vouch for: " + "; ".join(problems))
    if reason not in a.refusals:
        a.refusals.append(reason)
    label = raw(lab for v in ins if _fresh(lab := everywhere(v)) is None)
    return [{} if label is None else dict.fromkeys(op.attrs["members"], label)
            for _ in op.outputs]


def charges(releases: list[Release]) -> dict[str, float]:
    """The epsilon spent per source by ``releases`` (basic composition: the sum)."""
    out: dict[str, float] = {}
    for release in releases:
        for source in release.sources:
            out[source] = out.get(source, 0.0) + release.epsilon
    return out
