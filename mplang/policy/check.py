"""Judge a program against one party's policy (`check`), and the labels of the
objects a party stores (`LabelTable`), checked when the driver fetches them."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mplang.edsl.errors import MPRefusedError
from mplang.edsl.graph import Graph, Operation
from mplang.flows.dp_flows import charges
from mplang.flows.engine import DRIVER, Analysis, PartyLabels, Send, analyze, where
from mplang.flows.labels import Flow, Label, Rows, release_cuts, smallest_part
from mplang.policy.ledger import BudgetExhausted, Charge, Ledger, Selection
from mplang.policy.policy import DRIVER as DRIVER_NAME
from mplang.policy.policy import DeclassifyRule, Policy
from mplang.policy.psi_protocols import check_psi_protocols


class PolicyRefusedError(MPRefusedError):
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
    judged: list[bool] = field(default_factory=list)
    """Per output, whether the driver's fetch of the party's copy was allowed already."""
    charges: dict[str, float] = field(default_factory=dict)
    """The epsilon the program's differentially private releases spend, per source of
    the party's data (charged when it is accepted: `mplang.policy.ledger`)."""
    rows: dict[str, list[Selection]] = field(default_factory=dict)
    """The rows of each source its exact releases combine (recorded with the charge)."""
    releases: list[dict[str, Any]] = field(default_factory=list)
    """Each allowed flow: ``description``, ``receiver``, ``allowed_by``, ``kind``, ``epsilon``."""
    sources: list[str] = field(default_factory=list)
    """The sources of the party's data the program loads."""
    unowned: list[Operation] = field(default_factory=list)
    """PSI ops whose rows kept at this party are not its data (`Guard.check_rows`)."""

    def message(self, node: str) -> str:
        return f"{node} refuses the program: " + "; ".join(dict.fromkeys(self.reasons))


def judge(policy: Policy, receiver: str, label: Flow, digest: str | None
          ) -> tuple[str | None, DeclassifyRule | None]:
    """Why ``receiver`` may get a value labelled ``label`` (None: it may not), and the
    aggregate or compare rule that allows it (its ``min_rows`` then bounds overlapping
    releases, its ``max_releases`` their number)."""
    if policy.may_receive_plaintext(receiver):
        return f"plaintext_to lists {receiver}", None
    if digest is not None and digest in policy.programs:
        return "the program digest is allow-listed", None
    if label.form == "approved":
        approvals = policy.approvals(receiver, label.approved)
        return None if approvals is None else \
            f"approve {', '.join(map(str, approvals))}", None
    form = label.declassified_as
    rule = policy.rule_for(receiver, form, label.rows if form == "aggregate" else None,
                           label.epsilon)
    if rule is None:
        return None, None
    return f"rule {rule}", rule if rule.when in ("aggregate", "compare") else None


_KINDS = {"rule": "rule", "approve": "approval", "plaintext_to": "plaintext"}  # else digest


def _hint(receiver: str, label: Flow, policy: Policy, digest: str | None) -> str:
    """The narrowest change to ``policy`` that lets ``receiver`` get ``label``."""
    program = f"approve: - {{program: {digest or 'DIGEST'}}}"  # `mplang check` prints it
    form = label.declassified_as
    if form == "approved":
        missing = [n for n in sorted(label.approved)
                   if policy.approvals(receiver, frozenset([n])) is None]
        return "add " + ", ".join(f"approve: - {{library: {n}, to: [{receiver}]}}"
                                  for n in missing)
    if form == "raw":
        return (f"approve this program alone with {program} (row-wise or raw values are "
                f"never declassified by aggregate or compare rules; plaintext_to would give "
                f"{receiver} every row of every program)")
    if form == "dp":
        return (f"add a rule {{to: [{receiver}], when: dp, max_epsilon: {label.epsilon:g}}} "
                f"to declassify, or {program}")
    if form == "aggregate" and label.rows is None:
        return ("aggregate it in the secure device with groups of at least min_rows rows "
                f"enforced at run time (mplang.libs.groupby), or add {program}")
    extra = f", min_rows: {label.rows}" if form == "aggregate" else ""
    return f"add a rule {{to: [{receiver}], when: {form}{extra}}} to declassify, or {program}"


def check(graph: Graph, world_size: int, rank: int, policy: Policy, *,
          names: Sequence[str] | None = None, driver: str | None = None,
          digest: str | None = None, input_labels: Sequence[PartyLabels | None] | None = None,
          outputs_fetchable: bool = True, sends_reach_driver: bool = False,
          uses: Callable[[str], int] | None = None,
          past: Callable[[str], list[Selection]] | None = None) -> Verdict:
    """Party ``rank``'s verdict on ``graph`` under ``policy``.

    ``names``: node names by rank; ``driver``: the asking driver's name (checked
    against ``drivers``); ``digest``: the program digest (``programs``);
    ``input_labels``: labels of the graph inputs (stored objects); with
    ``outputs_fetchable``, every output of this party's data another party holds is a
    flow to the driver (one it holds is judged when fetched or used, unless `judged`
    now); with ``sends_reach_driver`` (one op at a time, where a holder cannot judge a
    later fetch), so is every copy sent to another party;
    ``uses(name)``: how many executions used an uploaded object so far (``max_uses``);
    ``past(source)``: the earlier programs' releases of a source (`Ledger.selections`).
    """
    names = list(names) if names is not None else [f"node_{r}" for r in range(world_size)]
    analysis, outs = analyze(graph, world_size, rank, input_labels, whole=outputs_fetchable)
    verdict = Verdict(True, sources=sorted({name for _, name in analysis.loads}),
                      unowned=analysis.unowned)
    if driver is not None and not policy.accepts_driver(driver):
        verdict.reasons.append(f"driver {driver!r} is not in drivers "
                               f"[{', '.join(policy.drivers or ())}] of {policy.source}")
    sends = list(analysis.sends)
    if sends_reach_driver:
        sends += [Send(s.op, DRIVER, s.label, s.what + ", which the driver may fetch from "
                       + names[s.receiver]) for s in analysis.sends if s.receiver != DRIVER]
    verdict.outputs, verdict.judged = [lab.get(rank) for lab in outs], [False] * len(outs)
    outputs = _output_flows(graph, outs, names, verdict)
    kept = {id(s): i for i, holder, s in outputs if holder == rank}  # no release yet
    sends += [s for _, holder, s in outputs if outputs_fetchable or holder == rank]
    allowed: list[tuple[Send, DeclassifyRule]] = []
    seen: set[tuple[int, str]] = set()
    for send in sends:
        receiver = DRIVER_NAME if send.receiver == DRIVER else names[send.receiver]
        why, rule = judge(policy, receiver, send.label, digest)
        verdict.flows.append(f"{send.label} -> {receiver} ({send.what}, {send.where}): " + (
            f"allowed: {why}" if why else "kept, judged when fetched or used"
            if id(send) in kept else "REFUSED"))
        verdict.releases += [{"description": str(send.label), "receiver": receiver,
                              "allowed_by": why, "kind": _KINDS.get(why.split()[0], "digest"),
                              "epsilon": send.label.epsilon if send.label.form == "dp" else 0.0}
                             ] if why else []
        if rule is not None:
            allowed.append((send, rule))
        if id(send) in kept:  # judged when fetched or used, but not apart from the others
            verdict.judged[kept[id(send)]] = outputs_fetchable and why is not None
        elif why is None and (id(send.op), receiver) not in seen:
            seen.add((id(send.op), receiver))
            cause = f" (it became raw at {send.label.cause})" if send.label.cause else ""
            verdict.reasons.append(f"{send.where} sends {send.what}, {send.label}, to "
                                   f"{receiver}; {_hint(receiver, send.label, policy, digest)} in "
                                   f"{policy.source}{cause}")
    verdict.reasons += [r for r in analysis.refusals if r not in verdict.reasons]
    verdict.charges = charges(analysis.releases)
    verdict.rows = _selections(allowed)
    earlier = {name: past(name) for name in verdict.rows} if past is not None else {}
    _overlaps(allowed, sends, policy, verdict, earlier)
    _max_releases(allowed, policy, verdict, earlier)
    _devices(analysis, policy, rank, verdict)
    check_psi_protocols(analysis, policy, verdict)
    _uses(analysis, policy, uses, verdict)
    _writes(analysis, policy, verdict)
    verdict.accepted = not verdict.reasons
    return verdict


def _output_flows(graph: Graph, outs: list[PartyLabels], names: list[str], verdict: Verdict
                  ) -> list[tuple[int, int, Send]]:
    """Every program output derived from this party's data, whoever holds it, reaches the
    driver when it fetches it: (output index, holder, flow) triples."""
    sends = []
    producers = {id(v): op for op in graph.operations for v in op.outputs}
    for index, (v, labels) in enumerate(zip(graph.outputs, outs, strict=True)):
        for holder, label in sorted(labels.items()):
            if not label.mine:
                continue
            producer = producers.get(id(v))
            if producer is None:
                verdict.flows.append(f"program input {index} is returned as output {index}")
                break
            sends.append((index, holder, Send(producer, DRIVER, label, f"program output "
                                              f"{index}, held by {names[holder]}")))
    return sends


def _selections(allowed: list[tuple[Send, DeclassifyRule]]) -> dict[str, list[Selection]]:
    """Per source, an entry per release (one per op) naming its rule, then an entry per
    row set that data did not choose the releases combine (without a rule)."""
    out: dict[str, list[Selection]] = {}
    texts = {rule: str(rule) for _, rule in allowed}
    releases = {id(s.op): (s.label, rule) for s, rule in allowed}.values()
    for label, rule in releases:
        for name in label.sources:
            out.setdefault(name, []).append((0, 0, 0, texts[rule]))
    for r in frozenset().union(*(label.rowsets for label, _ in releases)):
        if not r.gate and r.hi > r.lo:
            for name in r.sources & out.keys():
                out[name].append((r.lo, r.hi, r.step, ""))
    return out


def _max_releases(allowed: list[tuple[Send, DeclassifyRule]], policy: Policy,
                  verdict: Verdict, earlier: dict[str, list[Selection]]) -> None:
    """Refuse releases past a rule's ``max_releases`` per source, the ``earlier``
    programs' (per source) counted."""
    capped = {rule: str(rule) for _, rule in allowed if rule.max_releases is not None}
    for name, rows in verdict.rows.items():
        for rule, text in capped.items():
            done = sum(1 for *_, t in earlier.get(name, ()) if t == text)
            now = sum(1 for *_, t in rows if t == text)
            if now and done + now > (rule.max_releases or 0):
                verdict.reasons.append(
                    f"its {now} release(s) of {name} under rule {rule} would make "
                    f"{done + now}, over max_releases {rule.max_releases} in {policy.source}")


def _overlaps(allowed: list[tuple[Send, DeclassifyRule]], sends: list[Send], policy: Policy,
              verdict: Verdict, earlier: dict[str, list[Selection]]) -> None:
    """Refuse aggregates whose row sets overlap others' (in this program or, ``earlier``
    per source, an earlier one) so that subtracting them isolates fewer than
    ``min_rows`` rows."""
    released = {r for s in sends if s.label.mine for r in s.label.rowsets}
    past = {name: {Rows(frozenset([name]), lo, hi, step) for lo, hi, step, _ in rows
                   if hi > lo} for name, rows in earlier.items()}
    cuts = release_cuts(released.union(*past.values()))
    for send, rule in allowed:
        if rule.when != "aggregate":
            continue
        part = smallest_part(cuts, send.label.rowsets.union(
            *(past.get(name, ()) for name in send.label.sources)))
        if part is not None and part[1] < rule.min_rows:
            isolated = f"isolates {part[0]} of {', '.join(sorted(part[0].sources))}"
        else:
            chosen = _other_rows(released, send.label.rowsets)
            if chosen is None:
                continue
            isolated = (f"may isolate as few as one row of {', '.join(sorted(chosen))} (the "
                        "releases combine rows that data chose differently)")
        reason = (f"{send.where} sends {send.what}, {send.label}, which overlaps another "
                  f"release of this party's data: subtracting them {isolated}, fewer than "
                  f"min_rows {rule.min_rows} of {rule} in {policy.source}")
        if reason not in verdict.reasons:
            verdict.reasons.append(reason)


def _other_rows(released: set[Rows], within: frozenset[Rows]) -> frozenset[str] | None:
    """The sources shared by one of ``within``'s row sets that data chose (a PSI join's,
    a group's) and a released row set chosen otherwise: their difference is rows data
    chose, as few as one. None if there is none. A partition's groups and the whole of
    the rows it partitions are not chosen otherwise: the groups add up to the whole."""
    for rows in within:
        if rows.gate:
            for other in released:
                shared = rows.sources & other.sources
                if shared and other.gate != rows.gate and not _partitioned(rows, other):
                    return shared
    return None


def _partitioned(rows: Rows, other: Rows) -> bool:
    """Whether ``other`` is the whole of the rows that partition ``rows`` splits."""
    return rows.partition and not other.gate and not other.step and not rows.step \
        and (other.lo, other.hi) == (rows.lo, rows.hi)


def _devices(analysis: Analysis, policy: Policy, rank: int, verdict: Verdict) -> None:
    for op, attrs in analysis.devices:
        members = list(attrs.get("members", ()))
        protocol, beaver = str(attrs.get("protocol")), str(attrs.get("beaver", ""))
        if not policy.accepts_protocol(protocol, beaver, bool(members) and members[0] == rank):
            reason = (f"{where(op)} uses device {attrs.get('device')} with protocol "
                      f"{protocol}" + (f" (Beaver source {beaver})" if beaver else "")
                      + f", which protocols of {policy.source} does not accept")
            if reason not in verdict.reasons:
                verdict.reasons.append(reason)


def _uses(analysis: Analysis, policy: Policy, uses: Callable[[str], int] | None,
          verdict: Verdict) -> None:
    for op, name in analysis.loads:
        limit = policy.max_uses.get(name)
        if limit is None:
            continue
        used = uses(name) if uses is not None else 0
        if used >= limit:
            verdict.reasons.append(f"{where(op)} uses {name!r}, already used by {used} "
                                   f"executions: max_uses {name}: {limit} in {policy.source}")


def _writes(analysis: Analysis, policy: Policy, verdict: Verdict) -> None:
    for op, path in analysis.writes:
        if not policy.may_write(path):
            verdict.reasons.append(
                f"{where(op)} writes {path!r} into this party's data root: writes: "
                f"[{', '.join(policy.writes)}] in {policy.source} does not allow it")


class LabelTable:
    """Labels of the stored objects derived from this party's data, by URI, and whether
    the driver's fetch of each was judged already (a program output this party accepted)."""

    def __init__(self) -> None:
        self._labels: dict[str, tuple[Flow, bool]] = {}
        self._lock = threading.Lock()

    def record(self, uris: Sequence[str | None], labels: Sequence[Label],
               judged: Sequence[bool]) -> None:
        with self._lock:
            for uri, label, done in zip(uris, labels, judged, strict=False):
                if uri is not None and label is not None and label.mine:
                    self._labels[uri] = (label, done)

    def of(self, uri: str | None) -> Label:
        with self._lock:
            entry = None if uri is None else self._labels.get(uri)
            return None if entry is None else entry[0]

    def judged(self, uri: str) -> bool:
        with self._lock:
            entry = self._labels.get(uri)
            return entry is not None and entry[1]

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
        self.drivers = None if drivers is None else dict(drivers)
        """Driver names by certificate fingerprint (None: drivers are not identified, as
        in the simulator); replaced when a worker reloads its spec."""
        self.labels = LabelTable()
        self.ledger = Ledger()
        """The privacy budget spent (a worker replaces it with one kept in its state folder)."""
        self.audit: Callable[[dict[str, Any]], None] = lambda event: None
        """Where budget events go (a worker's audit log; by default nowhere)."""
        self._pending: weakref.WeakKeyDictionary[Graph, Charge] = weakref.WeakKeyDictionary()
        """Charges of accepted graphs whose run has not started (refunded if it never does)."""
        self._vetted: weakref.WeakKeyDictionary[Graph, tuple[str | None, bool, Verdict]] = \
            weakref.WeakKeyDictionary()
        """graph -> (its digest, whether it is a whole program, the verdict `vet` gave)."""
        self._unowned: weakref.WeakSet[Operation] = weakref.WeakSet()
        """PSI ops of vetted graphs whose rows kept here are not this party's data."""

    @property
    def node(self) -> str:
        return self.names[self.rank]

    def vet(self, graph: Graph, digest: str | None, driver: str, whole: bool,
            uses: Callable[[str], int] | None = None) -> Verdict:
        """The verdict on running ``graph`` (``digest``) for the driver whose certificate
        fingerprint is ``driver`` (one `drivers` does not name is refused unless the policy
        accepts every driver; none is checked when `drivers` is None). If
        ``graph`` is the ``whole`` program, every output derived from this party's data
        that another party holds is judged as a flow to the driver; if it is one op of a
        program the driver interprets, every copy of this party's data sent to another
        party is (the driver may fetch it there). The outputs this party holds are judged
        when the driver fetches them or a program uses them, unless allowed now."""
        verdict = check(graph, len(self.names), self.rank, self.policy, names=self.names,
                        driver=self.driver_name(driver), digest=digest, uses=uses,
                        outputs_fetchable=whole, sends_reach_driver=not whole,
                        past=self.ledger.selections)
        charge = self._charge(verdict, digest or "")
        if charge is not None:
            self._pending[graph] = charge
        self._vetted[graph] = (digest, whole, verdict)
        self._unowned.update(verdict.unowned)
        return verdict

    def verdict(self, graph: Graph) -> Verdict | None:
        """The verdict `vet` gave ``graph`` (None: not vetted)."""
        return self._vetted.get(graph, (None, False, None))[2]

    def _charge(self, verdict: Verdict, program: str) -> Charge | None:
        """Charge an accepted ``verdict``'s releases to the ledger (None: nothing to
        charge); a charge over the budget refuses it instead (``verdict.accepted`` False,
        with the reason)."""
        if not verdict.accepted or not (verdict.charges or verdict.rows):
            return None
        try:
            charge = self.ledger.charge(verdict.charges, self.policy.dp_budget(), program,
                                        verdict.rows)
        except BudgetExhausted as e:
            verdict.reasons.append(f"the privacy budget is spent: {e} (dp rules of "
                                   f"{self.policy.source})")
            verdict.accepted = False
            return None
        if charge.epsilons:
            self._event("charge", program, charge)
        return charge

    def refund(self, graph: Graph) -> None:
        """Give back the charge of accepted ``graph`` whose run never started."""
        charge = self._pending.pop(graph, None)
        if charge is not None:
            self.ledger.refund(charge)
            if charge.epsilons:
                self._event("refund", self._vetted.get(graph, ("",))[0] or "", charge)

    def _event(self, action: str, program: str, charge: Charge) -> None:
        self.audit({"event": "budget", "action": action, "program": program,
                    "epsilon": charge.epsilons})

    def driver_name(self, fingerprint: str) -> str | None:
        """The name of the driver with certificate ``fingerprint``, as its policy is
        checked (None: drivers are not identified)."""
        if self.drivers is None:
            return None
        return self.drivers.get(fingerprint, f"(unnamed, certificate {fingerprint[:16]}...)")

    def admit(self, graph: Graph, input_uris: Sequence[str | None]) -> Verdict:
        """The verdict on running ``graph`` on stored objects ``input_uris`` (whose labels
        it takes); raises `PolicyRefusedError` if refused. A graph `vet` accepted whose
        inputs carry no label of this party's data has that verdict already; another is
        judged (and charged) again with those labels, against earlier programs' releases;
        a graph not vetted (one op sent on its own) is judged as one op of a program."""
        inputs = [None if (lab := self.labels.of(uri)) is None else {self.rank: lab}
                  for uri in input_uris]
        digest, whole, vetted = self._vetted.get(graph, (None, False, None))
        if vetted is not None and vetted.accepted and not any(inputs):
            self._pending.pop(graph, None)  # its run starts: the charge stays
            return vetted
        self.refund(graph)  # charged below with its inputs' labels instead
        verdict = check(graph, len(self.names), self.rank, self.policy, names=self.names,
                        digest=digest, input_labels=inputs, outputs_fetchable=whole,
                        sends_reach_driver=not whole, past=self.ledger.selections)
        self._charge(verdict, digest or "")
        if not verdict.accepted:
            raise PolicyRefusedError(verdict.message(self.node))
        return verdict

    def record(self, uris: Sequence[str | None], verdict: Verdict) -> None:
        """Keep the labels of the outputs stored at ``uris``, and whether ``verdict``
        allowed the driver's fetch of each already."""
        self.labels.record(uris, verdict.outputs, verdict.judged)

    def check_rows(self, op: Operation, rows: int, what: str) -> None:
        """Refuse (`PolicyRefusedError`) ``op`` keeping ``rows`` rows of this party's
        data chosen by another owner's data (``what``: a PSI join's rows) if that is fewer
        than the largest ``min_rows`` of its aggregate rules: every aggregate over them
        then meets every rule (the analysis counts on this check)."""
        rules = [r for r in self.policy.declassify if r.when == "aggregate"]
        if not rules or op in self._unowned:
            return
        rule = max(rules, key=lambda r: r.min_rows)
        if rows < rule.min_rows:
            raise PolicyRefusedError(
                f"{self.node} refuses {where(op)}: {what} has fewer than min_rows "
                f"{rule.min_rows} rows ({rule} in {self.policy.source}), so no aggregate "
                "over them may leave it")

    def check_fetch(self, uri: str) -> None:
        """Raise `PolicyRefusedError` if the driver may not fetch object ``uri``."""
        label = self.labels.of(uri)
        if label is None or self.labels.judged(uri) or \
                judge(self.policy, DRIVER_NAME, label, None)[0] is not None:
            return
        raise PolicyRefusedError(
            f"{self.node} refuses to send object {uri[:80]} to the driver: it is {label}; "
            f"{_hint(DRIVER_NAME, label, self.policy, None)} in {self.policy.source} (or "
            "reveal it under a rule)")
