"""A script for ``mplang run``: the context comes from the command line.

    mplang run examples/run_me.py --sim 3            # in-memory simulator, 3 parties
    mplang run examples/run_me.py 6 --sim 3          # the script's own argument: length 6
    mplang init --nodes 3 --out dev && mplang up --cluster dev/cluster.yaml &
    mplang run examples/run_me.py --cluster dev/cluster.yaml   # the same, on workers

``mplang run`` creates the simulator or driver and calls ``main(ctx)`` with it;
the same program runs unchanged on either. Party 0 and party 1 each hold a
vector, the SPU ``SP0`` adds them on secret shares, and only party 0 (``P0``)
receives the sum. (Here the vectors are constants of the script, so whoever
runs it knows them; real parties read their own files with ``tensor.load``.)
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import mplang as mp


def main(ctx: Any) -> None:
    """Add P0's and P1's vectors on the SPU and print the sum P0 receives."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    a = np.arange(n, dtype=np.int32)          # party 0's vector
    b = 10 * np.arange(n, dtype=np.int32)     # party 1's vector

    @mp.function
    def secure_sum() -> Any:
        x = mp.device("P0")(lambda: a)()
        y = mp.device("P1")(lambda: b)()
        total = mp.device("SP0")(lambda u, v: u + v)(x, y)   # on secret shares
        return mp.put("P0", total)                           # revealed to P0 only

    total = mp.fetch(ctx, mp.evaluate(ctx, secure_sum))
    print(f"sum on {ctx.world_size} parties, revealed to P0: {np.asarray(total).tolist()}")
