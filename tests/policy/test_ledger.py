"""The privacy budget ledger: charges within a budget, refusals past it (nothing spent),
refunds once, a file that a new ledger (a restarted worker) reads back, and an unreadable
file refused rather than taken as a fresh ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mplang.edsl.errors import MPLangError
from mplang.policy.ledger import BudgetExhausted, Ledger, format_report


def test_charges_refusals_and_refunds(tmp_path: Path) -> None:
    path = tmp_path / "state" / "budget.json"
    ledger = Ledger(path)
    first = ledger.charge({"a.npy": 0.1, "b.npy": 0.5}, 1.0, "p1")
    ledger.charge({"a.npy": 0.2}, 1.0, "p2")
    with pytest.raises(BudgetExhausted, match=(
            r"its releases of b\.npy spend epsilon 0\.6, but only 0\.5 of the budget 1 is "
            r"left \(0\.5 spent\)")):
        ledger.charge({"a.npy": 0.1, "b.npy": 0.6}, 1.0, "p3")
    assert ledger.spent() == pytest.approx({"a.npy": 0.3, "b.npy": 0.5})
    ledger.charge({"a.npy": 0.7}, 1.0, "p4")  # 0.1 + 0.2 + 0.7 meets the budget exactly
    ledger.refund(first)
    ledger.refund(first)  # a second refund gives nothing back
    assert ledger.spent() == pytest.approx({"a.npy": 0.9, "b.npy": 0.0})
    again = Ledger(path)  # a restarted worker reads it back
    assert again.spent() == ledger.spent()
    assert [c["refunded"] for c in again.report(1.0)["charges"]] == [True, False, False]
    assert format_report("node_0", again.report(1.0)).splitlines() == [
        "node_0: privacy budget per source: epsilon 1", "  a.npy: spent 0.9, left 0.1",
        "  b.npy: spent 0, left 1", "charges: 3 (1 refunded)"]
    assert Ledger().charge({"a.npy": 1e6}, None, "p").epsilons == {"a.npy": 1e6}


def test_an_unreadable_ledger_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "budget.json"
    path.write_text(json.dumps({"spent": {"a": "x"}}))
    with pytest.raises(MPLangError, match=r"is unreadable .* a fresh ledger would forget"):
        Ledger(path)
