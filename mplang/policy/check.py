"""Judge a program against one party's policy (`check`), and the labels of the
objects a party stores (`LabelTable`), checked when the driver fetches them."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mplang.edsl.errors import MPLangError
from mplang.edsl.graph import Graph
from mplang.policy.flows import DRIVER, PartyLabels, Send, analyze
from mplang.policy.labels import Flow, Label
from mplang.policy.policy import DRIVER as DRIVER_NAME
from mplang.policy.policy import Policy


class PolicyRefusedError(MPLangError):
    """A party's policy refuses a program or a fetch. The message names the op, its
    source line and the rule to add to that party's policy file to allow it."""


@dataclass
class Verdict:
    """A party's verdict on a program: accepted, the reasons it is not, and where each
    source of the party's data goes (``flows``: one line per flow)."""

    accepted: bool
    reasons: list[str] = field(default_factory=list)
    flows: list[str] = field(default_factory=list)
    outputs: list[Label] = field(default_factory=list)
    """The label of the party's copy of each program output."""

    def message(self, node: str) -> str:
        return f"{node} refuses the program: " + "; ".join(self.reasons)


def judge(policy: Policy, receiver: str, label: Flow, digest: str | None) -> str | None:
    """Why ``receiver`` may get a value labelled ``label`` (None: it may not)."""
    if policy.may_receive_plaintext(receiver):
        return f"plaintext_to lists {receiver}"
    if digest is not None and digest in policy.programs:
        return "the program digest is allow-listed"
    rule = policy.rule_for(receiver, label.form, label.elements)
    return None if rule is None else f"rule {rule}"


def _hint(receiver: str, label: Flow) -> str:
    if label.form == "raw":
        return (f"add {receiver} to plaintext_to, or the program digest to programs (a raw "
                "value is never declassified by aggregate/compare/count rules)")
    return (f"add a rule {{to: [{receiver}], when: {label.form}"
            + (f", min_elements: {label.elements}" if label.form in ("aggregate", "count")
               else "") + "} to declassify, or the program digest to programs")


def check(graph: Graph, world_size: int, rank: int, policy: Policy, *,
          names: Sequence[str] | None = None, driver: str | None = None,
          digest: str | None = None, input_labels: Sequence[PartyLabels | None] | None = None,
          outputs_fetchable: bool = True, uses: Callable[[str], int] | None = None) -> Verdict:
    """Party ``rank``'s verdict on ``graph`` under ``policy``.

    ``names``: node names by rank; ``driver``: the asking driver's name (checked
    against ``drivers``); ``digest``: the program digest (``programs``);
    ``input_labels``: labels of the graph inputs (stored objects); with
    ``outputs_fetchable``, an output of this party's that derives from its data is
    a flow to the driver; ``uses(name)``: how many executions used an uploaded
    object so far (``max_uses``).
    """
    names = list(names) if names is not None else [f"node_{r}" for r in range(world_size)]
    analysis, outs = analyze(graph, world_size, rank, input_labels)
    verdict = Verdict(True)
    if driver is not None and not policy.accepts_driver(driver):
        verdict.reasons.append(f"driver {driver!r} is not in drivers "
                               f"[{', '.join(policy.drivers or ())}] of {policy.source}")
    sends = list(analysis.sends)
    verdict.outputs = [lab.get(rank) for lab in outs]
    for index, (v, label) in enumerate(zip(graph.outputs, verdict.outputs, strict=True)):
        if label is not None and outputs_fetchable:
            producer = next((op for op in graph.operations if v in op.outputs), None)
            if producer is not None:
                sends.append(Send(producer, DRIVER, label, f"program output {index}"))
            else:
                verdict.flows.append(f"program input {index} is returned as output {index}")
    seen: set[tuple[int, str]] = set()
    for send in sends:
        receiver = DRIVER_NAME if send.receiver == DRIVER else names[send.receiver]
        why = judge(policy, receiver, send.label, digest)
        verdict.flows.append(f"{send.label} -> {receiver} ({send.what}, {send.where}): "
                             + (f"allowed: {why}" if why else "REFUSED"))
        if why is None and (id(send.op), receiver) not in seen:
            seen.add((id(send.op), receiver))
            verdict.reasons.append(f"{send.where} sends {send.what}, {send.label}, to "
                                   f"{receiver}; {_hint(receiver, send.label)} in "
                                   f"{policy.source}")
    for op, attrs in analysis.devices:
        members = list(attrs.get("members", ()))
        protocol, beaver = str(attrs.get("protocol")), str(attrs.get("beaver", ""))
        if not policy.accepts_protocol(protocol, beaver, bool(members) and members[0] == rank):
            where = f"op {op.opcode}" + (f" at {op.loc}" if op.loc else "")
            reason = (f"{where} uses device {attrs.get('device')} with protocol {protocol}"
                      + (f" (Beaver source {beaver})" if beaver else "")
                      + f", which protocols of {policy.source} does not accept")
            if reason not in verdict.reasons:
                verdict.reasons.append(reason)
    for op, name in analysis.loads:
        limit = policy.max_uses.get(name)
        if limit is None:
            continue
        used = uses(name) if uses is not None else 0
        if used >= limit:
            where = f"op {op.opcode}" + (f" at {op.loc}" if op.loc else "")
            verdict.reasons.append(f"{where} uses {name!r}, already used by {used} "
                                   f"executions: max_uses {name}: {limit} in {policy.source}")
    verdict.accepted = not verdict.reasons
    return verdict


class LabelTable:
    """Labels of the stored objects derived from this party's data, by URI."""

    def __init__(self) -> None:
        self._labels: dict[str, Flow] = {}
        self._lock = threading.Lock()

    def record(self, uris: Sequence[str | None], labels: Sequence[Label]) -> None:
        with self._lock:
            for uri, label in zip(uris, labels, strict=False):
                if uri is not None and label is not None:
                    self._labels[uri] = label

    def of(self, uri: str | None) -> Label:
        with self._lock:
            return None if uri is None else self._labels.get(uri)

    def forget(self, uri: str) -> None:
        with self._lock:
            self._labels.pop(uri, None)


class Guard:
    """One party's enforcement: its policy, the node names, the names of the drivers by
    certificate fingerprint, and the labels of its stored objects."""

    def __init__(self, policy: Policy, rank: int, names: Sequence[str],
                 drivers: dict[str, str] | None = None):
        self.policy = policy
        self.rank = rank
        self.names = list(names)
        self.drivers = dict(drivers or {})
        self.labels = LabelTable()
        self._vetted: weakref.WeakKeyDictionary[Graph, tuple[str | None, Verdict]] = \
            weakref.WeakKeyDictionary()
        """graph -> (its digest, the verdict `vet` gave it)."""

    @property
    def node(self) -> str:
        return self.names[self.rank]

    def vet(self, graph: Graph, digest: str | None, driver: str,
            uses: Callable[[str], int] | None = None) -> Verdict:
        """The verdict on running ``graph`` (``digest``) for the driver whose certificate
        fingerprint is ``driver`` (a driver the spec does not name is not checked)."""
        verdict = check(graph, len(self.names), self.rank, self.policy, names=self.names,
                        driver=self.drivers.get(driver), digest=digest,
                        outputs_fetchable=False, uses=uses)
        self._vetted[graph] = (digest, verdict)
        return verdict

    def admit(self, graph: Graph, input_uris: Sequence[str | None]) -> Verdict:
        """The verdict on running ``graph`` on stored objects ``input_uris`` (whose labels
        it takes); raises `PolicyRefusedError` if refused. A graph `vet` accepted whose
        inputs carry no label of this party's data has that verdict already."""
        inputs = [None if (lab := self.labels.of(uri)) is None else {self.rank: lab}
                  for uri in input_uris]
        digest, vetted = self._vetted.get(graph, (None, None))
        if vetted is not None and vetted.accepted and not any(inputs):
            return vetted
        verdict = check(graph, len(self.names), self.rank, self.policy, names=self.names,
                        digest=digest, input_labels=inputs, outputs_fetchable=False)
        if not verdict.accepted:
            raise PolicyRefusedError(verdict.message(self.node))
        return verdict

    def check_fetch(self, uri: str) -> None:
        """Raise `PolicyRefusedError` if the driver may not fetch object ``uri``."""
        label = self.labels.of(uri)
        if label is None or judge(self.policy, DRIVER_NAME, label, None) is not None:
            return
        raise PolicyRefusedError(
            f"{self.node} refuses to send object {uri[:80]} to the driver: it is {label}; "
            f"{_hint(DRIVER_NAME, label)} in {self.policy.source} (or reveal it under a rule)")
