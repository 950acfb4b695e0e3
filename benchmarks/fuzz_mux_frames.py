"""Fuzzed ``mplang/1`` frames against a real worker, from listed peers and outsiders.

Starts a 3-worker development cluster (worker processes, mutual TLS on loopback),
sends ``--frames`` fuzzed frames and messages to worker ``node_0`` (the mix and the
rules are in ``tests/security/mux_frame_fuzz.py``) while the real driver probes
node_0 (a program across node_0 and node_2, and ``/health``), then prints a summary:
cases by kind and outcome, the worker's answers, probe latencies, workers alive and
their RSS before and after. The CI subset is ``tests/security/test_mux_frame_fuzz.py``.

    .venv/bin/python benchmarks/fuzz_mux_frames.py --frames 10000 [--seed 0]

Exits 1 when a rule was broken (a 5xx, an outsider served, a probe over 1 s, a worker
dead or with a traceback, a wrong value after the campaign).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.security import mux_frame_fuzz  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=10_000,
                        help="fuzzed frames and messages (cases) to send")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the summary here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mplang-fuzz-mux-") as tmp:
        summary = mux_frame_fuzz.fuzz(Path(tmp), args.frames, args.seed)
    details = summary.pop("finding_details")
    print(json.dumps(summary, indent=1))
    for detail in details:
        print(detail, end="\n\n")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 1 if summary["findings"] or summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
