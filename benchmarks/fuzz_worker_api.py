"""Schemathesis campaign over a real worker's HTTP API, over mutual TLS.

Starts a 3-worker development cluster (worker processes), sends ``--cases``
schemathesis-generated cases to worker ``node_0`` as listed drivers and nodes
(and a few as the wrong role, or with a certificate no spec lists, or with a
missing or different spec digest), then checks the workers: alive, no traceback
in their logs, ``/health`` answering, a real program running. The harness and its
rules are in ``tests/security/worker_api_fuzz.py``; the CI subset (200 cases) is
``tests/security/test_worker_api_fuzz.py``.

    .venv/bin/python benchmarks/fuzz_worker_api.py --cases 2000 [--seed 0] [--show 20]

Exits 1 when a case broke a rule that is not a known issue, or the cluster was
not well after the campaign.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.security import worker_api_fuzz  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="findings to print in full")
    parser.add_argument("--reasons", type=int, default=40,
                        help="most frequent answers to print (path, status, error)")
    parser.add_argument("--json", help="write the summary here too")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="mplang-fuzz-api-") as tmp, \
            worker_api_fuzz.campaign(Path(tmp)) as (fuzz, driver):
        stats = fuzz.run(args.cases, seed=args.seed)
        problems = fuzz.aftermath(driver)
        known_tracebacks = dict(fuzz.known_tracebacks)

    summary = {**stats.summary(), "seed": args.seed, "after": problems or "ok",
               "known_tracebacks_in_worker_logs": known_tracebacks}
    print(json.dumps(summary, indent=1))
    print(f"\nmost frequent answers ({len(stats.by_reason)} kinds):")
    for reason, count in stats.by_reason.most_common(args.reasons):
        print(f"{count:6d}  {reason}")
    groups = collections.Counter(f"{f.rule} {f.method} {f.path}"
                                 + (f" (known: {f.known})" if f.known else "")
                                 for f in stats.findings)
    if groups:
        print("\nfindings by rule and path:")
        for group, count in groups.most_common():
            print(f"{count:6d}  {group}")
        shown: set[str] = set()
        print()
        for finding in stats.findings:
            group = f"{finding.rule} {finding.path} {finding.known}"
            if group in shown or len(shown) >= args.show:
                continue
            shown.add(group)
            print(finding.describe(), end="\n\n")
    for problem in problems:
        print("AFTER THE CAMPAIGN:", problem)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 1 if stats.new_findings or problems else 0


if __name__ == "__main__":
    sys.exit(main())
