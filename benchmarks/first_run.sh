#!/bin/bash
# From `git clone` to the demo's output, then to the first cross-process result
# following tutorial 05 (init, up, the driver's program); pip's cache off.
# Usage: bash benchmarks/first_run.sh [REPO]   (REPO: what to clone; default this checkout)
set -e
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="${1:-$(dirname "$HERE")}"
rm -rf /tmp/fresh && T0=$(date +%s.%N)
git clone -q "$REPO" /tmp/fresh && cd /tmp/fresh
T1=$(date +%s.%N)
python3 -m venv .venv && .venv/bin/pip install -q --no-cache-dir -e '.[test]' 2>/dev/null
T2=$(date +%s.%N)
.venv/bin/mplang demo > demo.out 2>&1
T3=$(date +%s.%N)
mkdir -p t05 && cd t05
../.venv/bin/mplang init --nodes 3 --out dev > init.out
../.venv/bin/mplang up --cluster dev/cluster.yaml > up.out 2>&1 &
UP=$!
until grep -q "all workers are ready" up.out; do sleep 0.05; done
T4=$(date +%s.%N)
../.venv/bin/python "$HERE/first_run_driver.py" > cross.out 2>/dev/null
T5=$(date +%s.%N)
kill -INT $UP; wait $UP || true
d() { echo "$2 - $1" | bc; }
echo "clone $(d $T0 $T1) s, install $(d $T1 $T2) s, demo $(d $T2 $T3) s (demo output at $(d $T0 $T3) s)"
echo "init+up $(d $T3 $T4) s, driver program $(d $T4 $T5) s (first cross-process result at $(d $T0 $T5) s)"
echo "demo last line: $(tail -1 /tmp/fresh/demo.out)"; echo "cross: $(cat cross.out)"
