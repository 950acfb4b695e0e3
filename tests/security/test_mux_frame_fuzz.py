"""Fuzzed ``mplang/1`` frames against a real worker process: ~500 cases from listed
peers and outsiders break no rule (no crash, no 5xx but a failed run's, no traceback,
outsiders never served, the real driver served within 1 s throughout, a real program
right afterwards). The harness is `tests.security.mux_frame_fuzz`; the full campaign
(10,000 cases) is ``benchmarks/fuzz_mux_frames.py``."""

from __future__ import annotations

from pathlib import Path

from tests.security import mux_frame_fuzz

CI_CASES = 500


def test_fuzzed_frames_break_no_rule(tmp_path: Path) -> None:
    summary = mux_frame_fuzz.fuzz(tmp_path, CI_CASES, seed=0)
    assert not summary["findings"], "\n\n".join(summary["finding_details"])
    assert not summary["problems"], "\n".join(summary["problems"])
    assert summary["cases"] == CI_CASES
    assert summary["max_probe_s"] < mux_frame_fuzz.PROBE_LIMIT
    assert all(summary["alive"].values())
    assert min(p["probes"] for p in (summary["probes"]["program"],
                                     summary["probes"]["health"])) >= 20
    # the campaign reached every outcome: refusals, answers, closes, outsiders shut out
    outcomes = summary["by_outcome"]
    for outcome in ("answered 2xx", "answered 4xx", "closed by the worker",
                    "outsider: closed by the worker", "outsider: closed after the handshake"):
        assert outcomes.get(outcome, 0) > 0, outcomes
    answers = summary["by_answer"]
    for reached in ("/run 200", "/run 500", "/health 200", "/msg none (admitted)"):
        assert answers.get(reached, 0) > 0, answers
