"""Random programs against the flow analysis: how many it releases under each rule and
how many of those break the rule's definition (`tests.flows.oracle`).

    .venv/bin/python benchmarks/oracle_campaign.py [N] [--seed S] [--show K] [--selection]

``--selection`` also runs the selection heuristic (aggregates of rows chosen by their
own values), reported on its own line.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.flows.oracle import RandomChooser, Violation, analyse, check, program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=5, help="violating programs to print")
    parser.add_argument("--selection", action="store_true")
    args = parser.parse_args()
    chooser = RandomChooser(args.seed)
    rules: collections.Counter[str] = collections.Counter()
    bad: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    shown: list[Violation] = []
    invalid = 0
    start = time.perf_counter()
    for _ in range(args.n):
        p = program(chooser)
        if isinstance(analyse(p), str):
            invalid += 1
            continue
        rule, found = check(p, selection=args.selection)
        if rule is None:
            continue
        rules[rule] += 1
        strict = [v for v in found if v.kind != "selected"]
        if strict:
            bad[rule] += 1
            if len(shown) < args.show:
                shown.append(strict[0])
        kinds.update({v.kind for v in found})
    took = time.perf_counter() - start
    print(f"{args.n} programs ({invalid} not valid JAX) in {took:.0f} s, seed {args.seed}")
    for rule in ("aggregate", "compare", "free"):
        print(f"  accepted as {rule}: {rules[rule]}, violating its definition: {bad[rule]}")
    print(f"  violations by kind (programs): {dict(kinds)}")
    for v in shown:
        print(v)


if __name__ == "__main__":
    main()
