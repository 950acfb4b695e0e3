"""Flow rules of differentially private releases.

A release is a secure-device op running a function registered with
`mplang.flows.vouched.releasing` (its members derive it themselves, so its
``epsilon`` is the noise it adds): a secret-sharing device's run, or a
``tensor.run_jax`` inside a TEE enclave. Party p counts its outputs as a ``dp`` release
of its data, of that epsilon, only if:

- if p is a member of the device, its own random input is a fresh draw of its own
  (``crypto.random_bits`` run by p, used by no other release): with it uniform and
  secret, the joint randomness is, whatever the others put in (the device's members
  check their own inputs; a data owner outside the device trusts its model, as it
  does for every computation there);
- no other random input carries p's data; in an enclave p attested (not p's own), the
  one random input is drawn inside the enclave, in the attested computation;
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
from fractions import Fraction

from mplang.edsl.graph import Operation
from mplang.edsl.typing import MPType
from mplang.flows.engine import Analysis, PartyLabels, everywhere
from mplang.flows.labels import Flow, Label, Rows, raw
from mplang.flows.vouched import Releasing

ENTROPY = "fresh randomness drawn at op"
"""The start of the source name of a party's own random draw."""


@dataclass(frozen=True)
class Release:
    """A release of p's data ``sources`` at ``op``, of privacy loss ``epsilon``."""

    op: Operation
    epsilon: float
    mechanism: str
    sources: frozenset[str]


def exact(epsilon: float) -> Fraction:
    """``epsilon`` as the shortest decimal that reads as it (0.1 is 1/10, not the float
    nearest 0.1), so that epsilons add exactly as written."""
    return Fraction(repr(float(epsilon)))


def entropy_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """p's own random draw is p's secret (raw, of a source naming the draw); a draw inside
    an enclave p attested is marked as such (of no one's data); another party's draw
    carries nothing of p's."""
    name = f"{ENTROPY} {id(op):x}"
    if own:
        return [Flow("raw", frozenset([name]), pure=True)] * len(op.outputs)
    if a.attested:
        return [Flow("foreign", frozenset([name]), enclave=a.attested)] * len(op.outputs)
    return [None] * len(op.outputs)


def _fresh(label: Label, enclave: str = "") -> str | None:
    """The draw ``label`` is, if it is p's random draw as drawn (``enclave``: a draw inside
    that attested enclave)."""
    if label is None or len(label.sources) != 1:
        return None
    if enclave and (label.form != "foreign" or label.enclave != enclave):
        return None
    if not enclave and (label.form != "raw" or not label.pure):
        return None
    (name,) = label.sources
    return name if name.startswith(ENTROPY) else None


def _row_problem(i: int, label: Flow, shape: tuple[object, ...] | None) -> str | None:
    window = label.window
    if label.form != "rowwise" or window is None or label.axis != 0 or window.step or \
            label.outer is not None or shape is None or len(shape) != 1 or \
            shape[0] != window.size:
        return (f"data input {i} is {label} of shape {shape}, not one element per row of "
                "this party's data")
    if label.rowsets:
        return (f"data input {i} mixes an aggregate of this party's rows into each row's "
                "contribution (one row would move every element)")
    return None


def _shape(t: object) -> tuple[object, ...] | None:
    plain = t.base.plaintext() if isinstance(t, MPType) else t
    shape = getattr(plain, "shape", None)
    return shape if isinstance(shape, tuple) else None


def _overlap(a: Rows, b: Rows) -> bool:
    return bool(a.sources & b.sources) and a.lo < b.hi and b.lo < a.hi


def _judge(a: Analysis, op: Operation, entry: Releasing, members: list[int],
           labels: list[Label], enclave: str = "") -> Flow | str | None:
    """The ``dp`` label of release ``op``'s outputs given its inputs' ``labels`` (random
    inputs first, one per member: inside an attested ``enclave``, drawn there); None if
    none of p's data goes in; the reason p refuses it otherwise."""
    static = op.attrs["library_args"]
    if static[entry.members_arg] != len(members) or len(labels) <= len(members):
        return "its random inputs are not one per member"
    problems: list[str] = []
    for member, label in zip(members, labels, strict=False):
        draw = _fresh(label, "" if member == a.party else enclave)
        if member != a.party and not enclave:
            if label is not None and label.mine:
                problems.append(f"the random input of party {member} carries {label}")
        elif draw is None:
            problems.append("this party's random input is not a fresh crypto.random_bits "
                            "draw of its own" if member == a.party else "the random input "
                            "is not drawn inside the attested enclave")
        elif draw in a.used_draws and not any(r.op is op for r in a.releases):
            problems.append("its random draw is used by another release")
        else:
            a.used_draws.add(draw)
    mine = [(i, lab) for i, lab in enumerate(labels) if i >= len(members)
            and lab is not None and lab.mine]
    problems += [p for i, lab in mine if (p := _row_problem(i, lab, _shape(op.inputs[i].type)))]
    windows = [lab.window for _, lab in mine if lab.window is not None]
    if any(_overlap(x, y) for x, y in itertools.combinations(windows, 2)):
        problems.append("two data inputs hold the same rows of this party's data")
    if mine and a.looping:
        problems.append("it runs in a loop, an unknown number of times")
    if problems:
        return "; ".join(problems)
    if not mine:
        return None
    epsilon = float(static[entry.epsilon_arg])
    sources = frozenset(s for _, lab in mine for s in lab.sources)
    if not any(r.op is op for r in a.releases):
        a.releases.append(Release(op, epsilon, entry.mechanism, sources))
    return Flow("dp", sources, epsilon=epsilon, enclave=enclave)


def _refused(a: Analysis, op: Operation, entry: Releasing, why: str, labels: list[Label],
             members: int) -> Label:
    """Record why p refuses the release; the label of its outputs: raw from every input
    but the random ones."""
    where = f"op {op.opcode}" + (f" at {op.loc}" if op.loc else "")
    reason = (f"{where} is a differentially private release ({entry.mechanism}) this party "
              "cannot vouch for: " + why)
    if reason not in a.refusals:
        a.refusals.append(reason)
    return raw(lab for i, lab in enumerate(labels) if i >= members or (
        lab is not None and lab.mine and _fresh(lab) is None))


def release_flow(a: Analysis, op: Operation, ins: list[PartyLabels], entry: Releasing
                 ) -> list[PartyLabels]:
    """The labels of the outputs of vouched release ``entry`` on a secret-sharing device
    (the ``dp`` label of p's data), or the refusal of it (`Analysis.refusals`)."""
    members: list[int] = list(op.attrs["members"])
    labels = [everywhere(v) for v in ins]
    out = _judge(a, op, entry, members, labels)
    if isinstance(out, str):
        out = _refused(a, op, entry, out, labels, len(members))
    return [{} if out is None else dict.fromkeys(members, out) for _ in op.outputs]


def enclave_release_flow(a: Analysis, op: Operation, ins: list[Label], entry: Releasing
                         ) -> list[Label]:
    """The labels of the outputs of vouched release ``entry`` run by one party: p itself
    (with a draw of its own), or an enclave p attested, with the noise drawn there (else
    not vouched for); another owner's release is none of p's concern."""
    if not any(lab is not None and lab.mine for lab in ins):
        return [raw(ins)] * len(op.outputs)
    if a.runner == a.party:
        out = _judge(a, op, entry, [a.party], ins)
    elif not a.attested or a.runner is None:
        out = "it does not run inside an enclave this party attested"
    else:
        out = _judge(a, op, entry, [a.runner], ins, a.attested)
    if isinstance(out, str):
        out = _refused(a, op, entry, out, ins, 1)
    return [out] * len(op.outputs)


def charges(releases: list[Release]) -> dict[str, float]:
    """The epsilon spent per source by ``releases`` (basic composition: the exact sum)."""
    out: dict[str, Fraction] = {}
    for release in releases:
        for source in release.sources:
            out[source] = out.get(source, Fraction()) + exact(release.epsilon)
    return {source: float(eps) for source, eps in out.items()}
