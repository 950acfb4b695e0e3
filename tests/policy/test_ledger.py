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


def test_epsilons_add_exactly(tmp_path: Path) -> None:
    """Epsilons add as the decimals they are written as: ten charges of 0.1 spend a budget
    of 1 (0 left, an eleventh refused), 0.1 + 0.2 meets a budget of 0.3 and not a bit
    more; a restart keeps the exact sums; what is saved and shown has no float noise."""
    path = tmp_path / "budget.json"
    ledger = Ledger(path)
    for i in range(10):
        ledger.charge({"a.npy": 0.1}, 1.0, f"p{i}")
    eleventh = r"spend epsilon 0\.1, but only 0 of the budget 1 is left \(1 spent\)"
    with pytest.raises(BudgetExhausted, match=eleventh):
        ledger.charge({"a.npy": 0.1}, 1.0, "p10")
    ledger.charge({"b.npy": 0.1}, 0.3, "q1")
    ledger.charge({"b.npy": 0.2}, 0.3, "q2")
    with pytest.raises(BudgetExhausted, match=r"only 0 of the budget 0\.3 is left"):
        ledger.charge({"b.npy": 1e-12}, 0.3, "q3")
    again = Ledger(path)  # a restarted worker
    with pytest.raises(BudgetExhausted, match=eleventh):
        again.charge({"a.npy": 0.1}, 1.0, "p10")
    report = again.report(1.0)
    assert report["spent"] == {"a.npy": 1.0, "b.npy": 0.3}
    assert report["left"] == {"a.npy": 0.0, "b.npy": 0.7}
    assert json.loads(path.read_text())["spent"] == {"a.npy": 1.0, "b.npy": 0.3}
    assert "0000000" not in path.read_text() + json.dumps(report)
    assert format_report("node_0", report).splitlines()[1:3] == [
        "  a.npy: spent 1, left 0", "  b.npy: spent 0.3, left 0.7"]


def test_a_ledger_of_floats_loads_with_exact_sums(tmp_path: Path) -> None:
    """A file whose ``spent`` holds a float sum (as ledgers wrote before sums were exact):
    the charges not refunded are added up again, exactly."""
    path = tmp_path / "budget.json"
    charges = [{"number": i, "time": 0.0, "program": "p", "epsilon": {"a.npy": eps},
                "refunded": i == 2} for i, eps in enumerate([0.1, 0.2, 0.5])]
    path.write_text(json.dumps({"spent": {"a.npy": 0.1 + 0.2}, "charges": charges}))
    ledger = Ledger(path)
    assert ledger.spent() == {"a.npy": 0.3}
    ledger.charge({"a.npy": 0.7}, 1.0, "p")
    assert ledger.report(1.0)["left"] == {"a.npy": 0.0}
