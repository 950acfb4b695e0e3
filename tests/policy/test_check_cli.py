"""``mplang check``: a saved program's data flows and each node's verdict, without running."""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cli.main import main
from mplang.cluster.local import init_cluster


def _sum_program(tmp_path: Path, reveal: str) -> tuple[Path, Path]:
    """A 2-node dev cluster, each node's x.npy, and a saved program revealing a joint sum
    (``reveal="sum"``) or party 1's raw vector (``"raw"``) to P0."""
    spec = init_cluster(2, tmp_path / "dev")
    cluster = mp.ClusterSpec.from_yaml(spec)
    roots = {n.name: tmp_path / "data" / n.name for n in cluster.nodes}
    for i, root in enumerate(roots.values()):
        root.mkdir(parents=True)
        np.save(root / "x.npy", np.arange(20, dtype=np.float32) + i)

    def joint(a: object, b: object) -> object:
        return jnp.sum(a) + jnp.sum(b) if reveal == "sum" else b

    @mp.function
    def prog() -> object:
        a = mp.device("P0")(lambda: tensor.load("x.npy"))()
        b = mp.device("P1")(lambda: tensor.load("x.npy"))()
        return mp.put("P0", mp.device("SP0")(joint)(a, b))

    sim = mp.Simulator(cluster, data_roots=roots)
    with sim:
        program = mp.compile(prog, cluster=cluster)
    sim.close()
    path = tmp_path / f"{reveal}.mpl"
    program.save(path)
    return spec, path


def test_check_prints_flows_and_accepts_under_each_node_s_policy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, program = _sum_program(tmp_path, "sum")
    assert main(["check", "--cluster", str(spec), str(program)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"program prog: digest [0-9a-f]{64}", out[0])
    assert out[1] == f"node_0 ({spec.parent / 'policies' / 'node_0.yaml'}): accepts"
    assert out[2].startswith("  flow: aggregate of 20 elements of x.npy -> driver (program "
                             "output 0, op spu.reveal at test_check_cli.py:")
    assert out[2].endswith("allowed: rule declassify {to: [*], when: aggregate, "
                           "min_elements: 10}")
    assert out[3] == f"node_1 ({spec.parent / 'policies' / 'node_1.yaml'}): accepts"
    assert "aggregate of 20 elements of x.npy -> node_0 (the value revealed from SP0" in out[4]


def test_check_refuses_a_raw_reveal_and_names_the_rule(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, program = _sum_program(tmp_path, "raw")
    assert main(["check", "--cluster", str(spec), "--node", "node_1", str(program)]) == 1
    out = capsys.readouterr().out
    assert "node_1 (" in out and "REFUSES" in out and "\nnode_0 (" not in out
    assert re.search(r"refused: op spu\.reveal at test_check_cli\.py:\d+ sends the value "
                     r"revealed from SP0, raw of x\.npy, to node_0; add node_0 to plaintext_to",
                     out), out


def test_check_with_a_given_policy_and_the_digest_allow_list(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, program = _sum_program(tmp_path, "raw")
    assert main(["check", "--cluster", str(spec), str(program)]) == 1
    digest = capsys.readouterr().out.split("digest ")[1].split()[0]
    allow = tmp_path / "allow.yaml"
    allow.write_text(f"programs: [{digest}]\n")
    assert main(["check", "--cluster", str(spec), "--policy", str(allow), str(program)]) == 0
    assert "allowed: the program digest is allow-listed" in capsys.readouterr().out
