"""Static data-flow analysis: where one party's data goes in a program.

For party p every value gets, per holding party, a label (`mplang.flows.labels`):
None if that party's copy is not derived from p's data. Every primitive states its
flow rule in its dialect (``Primitive.def_flow`` for simp-level ops,
``def_local_flow`` for ops inside party-local regions); `conservative` and
`local_conservative` are the rules of ops not modelled yet: every output copy is
raw from every labelled input, and every party holding it has received p's data.
A copy of p's data that arrives at another party is a `Send` the policy check judges.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.serde import encode_graph_bundle
from mplang.edsl.typing import MPType
from mplang.flows.labels import Flow, Label, join, join_all, raw

PartyLabels = dict[int, Flow]
"""A simp-level value's labels: holding party -> label of its copy (unlabelled omitted)."""
SimpRule = Callable[["Analysis", Operation, list[PartyLabels]], list[PartyLabels]]
LocalRule = Callable[["Analysis", Operation, list[Label], bool], list[Label]]
"""``rule(analysis, op, input labels, own)``; ``own``: the region runs on party p."""

_MAX_LOOP_ROUNDS = 8
DRIVER = -1
"""The receiver rank standing for the driver (program outputs it may fetch)."""


@dataclass(frozen=True)
class Send:
    """p's data (``label``) reaching party ``receiver`` (`DRIVER`: the driver) at ``op``."""

    op: Operation
    receiver: int
    label: Flow
    what: str

    @property
    def where(self) -> str:
        return where(self.op)


def where(op: Operation) -> str:
    """``op`` and the user's source line that made it, for messages."""
    return f"op {op.opcode}" + (f" at {op.loc}" if op.loc else "")


@dataclass
class Analysis:
    """The flows of party ``party``'s data through one program."""

    party: int
    world_size: int
    sends: list[Send] = field(default_factory=list)
    devices: list[tuple[Operation, dict[str, Any]]] = field(default_factory=list)
    """Secure-device ops touching p (member, or p's data sealed in) and their configs."""
    psi: list[tuple[Operation, str]] = field(default_factory=list)
    """PSI ops p takes part in and their protocols (its policy's ``psi_protocols``)."""
    loads: list[tuple[Operation, str]] = field(default_factory=list)
    """Sources of p's data the program reads: (op, name)."""
    writes: list[tuple[Operation, str]] = field(default_factory=list)
    """Files of p's data root the program writes: (op, path)."""
    whole: bool = False
    """The graph is a whole program: a ciphertext sent on is followed to where it is
    decrypted. In a part of one it may be decrypted out of sight, so it is plaintext."""
    runner: int | None = None
    """The party running the party-local region being followed (set by ``pcall``)."""
    attested: str = ""
    """The digest of the attested TEE computation being followed, if any."""
    releases: list[Any] = field(default_factory=list)
    """Differentially private releases of p's data (`mplang.flows.dp_flows.Release`)."""
    refusals: list[str] = field(default_factory=list)
    """Why the program is refused besides its flows (a release p cannot vouch for)."""
    used_draws: set[str] = field(default_factory=set)
    """p's random draws that releases took (each may feed one only)."""
    unowned: list[Operation] = field(default_factory=list)
    """PSI ops keeping rows of p's that are not p's data (no run-time row count check)."""
    looping: int = 0
    """How many loops the op being followed is in."""
    _seen: set[tuple[int, int]] = field(default_factory=set)

    # -- used by rules
    def send(self, op: Operation, receiver: int, label: Label, what: str) -> None:
        """Record that ``receiver`` gets a copy labelled ``label`` (once per op and
        receiver); a ciphertext (``sealed``) is no flow until it is decrypted."""
        if label is None or not label.mine or (label.sealed and self.whole) or \
                receiver == self.party or \
                (id(op), receiver) in self._seen:
            return
        self._seen.add((id(op), receiver))
        self.sends.append(Send(op, receiver, label, what))

    def source(self, op: Operation, name: str) -> None:
        self.loads.append((op, name))

    def write(self, op: Operation, path: str, runner: int) -> None:
        """Record that party ``runner`` writes ``path`` into its data root at ``op``."""
        if runner == self.party:
            self.writes.append((op, path))

    def observe(self, op: Operation, label: Label) -> None:
        """Whoever sees ``op``'s run time (the driver, every other party) learns
        ``label``: a loop's trip count or a branch taken that depends on p's data."""
        if label is None or not label.mine:
            return
        for q in [DRIVER, *range(self.world_size)]:
            self.send(op, q, label, "the run time of a loop or branch that depends on it")

    def holders(self, v: Value) -> list[int]:
        """The parties that may hold ``v`` (every party when unknown)."""
        t = v.type
        if isinstance(t, MPType) and t.pmask is not None:
            return list(t.pmask)
        return list(range(self.world_size))

    def graph(self, graph: Graph, inputs: Sequence[PartyLabels]) -> list[PartyLabels]:
        """The output labels of simp-level ``graph`` given its inputs' labels."""
        env: dict[int, PartyLabels] = {id(v): dict(lab) for v, lab in
                                       zip(graph.inputs, inputs, strict=True)}
        for op in graph.operations:
            ins = [env.get(id(v), {}) for v in op.inputs]
            rule = None if op.prim is None else op.prim.rule("flow")
            outs = rule(self, op, ins) if rule is not None else self.unknown(op, ins)
            for v, lab in zip(op.outputs, outs, strict=True):
                env[id(v)] = lab
        return [env.get(id(v), {}) for v in graph.outputs]

    def local(self, graph: Graph, inputs: Sequence[Label], own: bool) -> list[Label]:
        """The output labels of party-local ``graph`` run by p (``own``) or another party.

        p's data an attested TEE enclave opened (``enclave``) stays there only in the
        region whose digest p checked the quote for, and in the ops that seal it
        (`ENCLAVE_AWARE`); any other op gets it as the runner's plaintext."""
        outer = self.attested
        enclaves = {lab.enclave for lab in inputs if lab is not None and lab.mine} - {""}
        digest = region_digest(graph) if not own and enclaves else ""
        if digest in enclaves:
            self.attested = digest
        env: dict[int, Label] = {id(v): lab for v, lab in zip(graph.inputs, inputs, strict=True)}
        for op in graph.operations:
            ins = [env.get(id(v)) for v in op.inputs]
            rule = None if op.prim is None else op.prim.rule("local_flow")
            if not own and not self.attested and rule not in ENCLAVE_AWARE:
                ins = [self._outside_enclave(op, lab) for lab in ins]
            outs = rule(self, op, ins, own) if rule is not None else \
                local_conservative(self, op, ins, own)
            for v, lab in zip(op.outputs, outs, strict=True):
                env[id(v)] = lab
        outs = [env.get(id(v)) for v in graph.outputs]
        if self.attested and self.attested != outer:
            outs = [replace(lab, enclave=self.attested) if lab is not None and lab.mine
                    else lab for lab in outs]
        self.attested = outer
        return outs

    def _outside_enclave(self, op: Operation, label: Label) -> Label:
        if label is None or not label.mine or not label.enclave or label.sealed:
            return label
        plain = replace(label, enclave="")
        if self.runner is not None:
            self.send(op, self.runner, plain,
                      "data an attested enclave opened, used outside its attested computation")
        return plain

    def unknown(self, op: Operation, ins: Sequence[PartyLabels]) -> list[PartyLabels]:
        """No rule: each output copy is raw from every labelled input, received by its holder."""
        label = raw(lab for party_labels in ins for lab in party_labels.values())
        if label is None:
            return [{} for _ in op.outputs]
        outs: list[PartyLabels] = []
        for v in op.outputs:
            holders = self.holders(v)
            for q in holders:
                self.send(op, q, label, "an output of an op without a flow rule")
            outs.append(dict.fromkeys(holders, label))
        return outs

    def loop(self, state: list[PartyLabels],
             step: Callable[[list[PartyLabels]], list[PartyLabels]]) -> list[PartyLabels]:
        """Join ``step``'s labels into ``state`` until nothing changes (then raw)."""
        self.looping += 1
        try:
            for _ in range(_MAX_LOOP_ROUNDS):
                new = step(state)
                joined = [merge(a, b) for a, b in zip(state, new, strict=True)]
                if joined == state:
                    return state
                state = joined
        finally:
            self.looping -= 1
        return [{q: raw([lab]) or lab for q, lab in s.items()} for s in state]


ENCLAVE_AWARE: set[Callable[..., Any]] = set()
"""Local flow rules that keep p's data inside an attested enclave (sealing it, opening
it there, deriving keys); `enclave_aware` adds one."""


def enclave_aware(rule: LocalRule) -> LocalRule:
    """Mark a local flow rule as handling labels inside an attested enclave itself."""
    ENCLAVE_AWARE.add(rule)
    return rule


def region_digest(region: Graph) -> str:
    """SHA-256 (hex) of a party-local region: the computation a TEE quote attests, which
    each data owner recomputes from the region the TEE runs."""
    return hashlib.sha256(encode_graph_bundle(region, {})).hexdigest()


def conservative(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """The flow rule of a simp-level op not modelled yet: each output copy is raw from
    every labelled input, and every party holding it has received it."""
    return a.unknown(op, ins)


def local_conservative(a: Analysis, op: Operation, ins: list[Label], own: bool
                       ) -> list[Label]:
    """The flow rule of a party-local op not modelled yet: every output is raw from every
    labelled input."""
    return [raw(ins)] * len(op.outputs)


def merge(a: PartyLabels, b: PartyLabels) -> PartyLabels:
    """Per party, the join of two values' labels."""
    out = dict(a)
    for q, lab in b.items():
        joined = join(out.get(q), lab)
        if joined is not None:
            out[q] = joined
    return out


def everywhere(labels: PartyLabels) -> Label:
    """The join of every party's copy."""
    return join_all(labels.values())


def analyze(graph: Graph, world_size: int, party: int,
            input_labels: Sequence[PartyLabels | None] | None = None, whole: bool = True
            ) -> tuple[Analysis, list[PartyLabels]]:
    """Follow ``party``'s data through ``graph`` (``whole``: a whole program); the
    analysis and the outputs' labels."""
    analysis = Analysis(party, world_size, whole=whole)
    inputs = [dict(lab or {}) for lab in (input_labels or [None] * len(graph.inputs))]
    return analysis, analysis.graph(graph, inputs)
