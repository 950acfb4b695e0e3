"""A party's privacy budget: the epsilon its differentially private releases spent, per
source of its data.

Composition is basic: the epsilons of the releases of a source add up (each release
is ``epsilon``-DP, so all of them together are ``sum``-DP; their small ``delta``s, from
the sampler's distance to exact noise, add up too), exactly, as the decimals they are
written as (`exact`: 0.1 + 0.2 spends 0.3; ten charges of 0.1 spend a budget of 1). A
program is charged when the party accepts it, before anything runs; the charge is refunded
only if its run never starts (another party refused it, or its driver dropped it). A
worker keeps the ledger in ``budget.json`` in its state folder, rewritten atomically on
every change, so a restart keeps it (its ``spent``, rounded to floats, is for readers: a
ledger loading the file adds up the charges not refunded); the simulator keeps it in
memory.

Each charge also records the rows of each source its exact releases (``aggregate`` and
``compare``) combined, and the rule that allowed each (`Selection`): a later program is
judged against them (`mplang.policy.check`), so that two programs cannot be differenced
into fewer than ``min_rows`` rows, and a rule's ``max_releases`` counts them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from mplang.edsl.errors import MPLangError
from mplang.flows.dp_flows import exact

LEDGER_FILE = "budget.json"
"""The ledger's file in a worker's state folder."""


def default_state_dir(node: str) -> Path:
    """A worker's state folder when ``--state-dir`` is not given: ``./state/<node>``."""
    return Path("state") / node


Selection = tuple[int, int, int, str]
"""Rows ``[lo, hi)`` of a source (in blocks of ``step`` if nonzero) that one release
combined (``hi <= lo``: rows not known statically), and the rule that allowed it."""


@dataclass(frozen=True)
class Charge:
    """One program's charge: ``number`` in the ledger, epsilon per source."""

    number: int
    epsilons: dict[str, float]


class BudgetExhausted(MPLangError):
    """A charge would take a source over its budget (the caller refuses the program)."""


class Ledger:
    """Epsilon spent per source of one party's data (``path``: its file; None: memory)."""

    def __init__(self, path: str | os.PathLike[str] | None = None):
        self.path = None if path is None else Path(path)
        self._lock = threading.RLock()
        self._spent: dict[str, Fraction] = {}
        self._charges: list[dict[str, Any]] = []
        if self.path is not None and self.path.exists():
            self._load(self.path)

    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            self._charges = list(data["charges"])
            for record in self._charges:
                self._add(record["epsilon"], 0 if record["refunded"] else 1)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise MPLangError(f"the privacy budget ledger {path} is unreadable ({e}); "
                              "restore it from a backup: a fresh ledger would forget what "
                              "was spent") from None

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        text = json.dumps({"spent": self.spent(), "charges": self._charges}, indent=1)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _add(self, epsilons: dict[str, float], sign: int) -> None:
        for source, eps in epsilons.items():
            self._spent[source] = self._spent.get(source, Fraction()) + sign * exact(eps)

    def spent(self) -> dict[str, float]:
        """Epsilon spent so far, per source (the float nearest the exact sum)."""
        with self._lock:
            return {s: float(e) for s, e in self._spent.items()}

    def selections(self, source: str) -> list[Selection]:
        """The releases of ``source`` that charges not refunded recorded."""
        with self._lock:
            return [(lo, hi, step, rule) for c in self._charges if not c["refunded"]
                    for lo, hi, step, rule in c.get("rows", {}).get(source, ())]

    def charge(self, epsilons: dict[str, float], budget: float | None, program: str,
               rows: dict[str, list[Selection]] | None = None) -> Charge:
        """Spend ``epsilons`` (per source) for ``program`` (its digest, for the record) and
        record its exact releases' ``rows``, or raise `BudgetExhausted` naming the first
        source it would take over ``budget`` (None: no limit) and spend nothing."""
        with self._lock:
            if budget is not None:
                for source, eps in sorted(epsilons.items()):
                    used = self._spent.get(source, Fraction())
                    if used + exact(eps) > exact(budget):
                        raise BudgetExhausted(
                            f"its releases of {source} spend epsilon {eps:g}, but only "
                            f"{float(max(Fraction(), exact(budget) - used)):g} of the budget "
                            f"{budget:g} is left ({float(used):g} spent)")
            self._add(epsilons, 1)
            number = len(self._charges)
            self._charges.append({"number": number, "time": round(time.time(), 3),
                                  "program": program, "epsilon": dict(epsilons),
                                  "rows": {s: [list(r) for r in v] for s, v in
                                           (rows or {}).items()},
                                  "refunded": False})
            self._save()
            return Charge(number, dict(epsilons))

    def refund(self, charge: Charge) -> None:
        """Give ``charge`` back (its run never started); a second refund does nothing."""
        with self._lock:
            record = self._charges[charge.number]
            if record["refunded"]:
                return
            record["refunded"] = True
            self._add(charge.epsilons, -1)
            self._save()

    def report(self, budget: float | None) -> dict[str, Any]:
        """The ledger as `mplang budget` shows it: ``budget``, ``spent`` and ``left`` per
        source, and the charges."""
        with self._lock:
            left = {s: None if budget is None else float(max(Fraction(), exact(budget) - e))
                    for s, e in self._spent.items()}
            return {"budget": budget, "spent": self.spent(), "left": left,
                    "charges": [dict(c) for c in self._charges]}


def format_report(node: str, report: dict[str, Any]) -> str:
    """`Ledger.report` of ``node`` as text."""
    budget = report["budget"]
    lines = [f"{node}: privacy budget per source: "
             + ("no limit" if budget is None else f"epsilon {budget:g}")]
    for source, eps in sorted(report["spent"].items()):
        left = report["left"].get(source)
        lines.append(f"  {source}: spent {eps:g}" + ("" if left is None else f", left {left:g}"))
    if not report["spent"]:
        lines.append("  nothing spent")
    charges = report["charges"]
    refunded = sum(1 for c in charges if c.get("refunded"))
    lines.append(f"charges: {len(charges)} ({refunded} refunded)")
    return "\n".join(lines)
