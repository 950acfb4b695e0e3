"""Tutorial 05's first program on workers (the millionaire's problem), for first_run.sh."""

from pathlib import Path

import numpy as np

import mplang as mp
from mplang import tensor

for node, wealth in [("node_0", 1_000_000), ("node_1", 2_000_000)]:
    Path("data", node).mkdir(parents=True, exist_ok=True)
    np.save(f"data/{node}/wealth.npy", np.int32(wealth))


@mp.function
def millionaire():
    alice = mp.device("P0")(lambda: tensor.load("wealth.npy"))()
    bob = mp.device("P1")(lambda: tensor.load("wealth.npy"))()
    poorer = mp.device("SP0")(lambda a, b: a < b)(alice, bob)
    return mp.put("P0", poorer)


drv = mp.Driver("dev/cluster.yaml", key="dev/keys/driver.key")
with drv:
    program = mp.compile(millionaire, cluster=drv.cluster)
print(mp.fetch(drv, mp.evaluate(drv, program)))
