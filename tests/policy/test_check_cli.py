"""``mplang check``: a saved program's data flows and each node's verdict, without running."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cli.main import main
from mplang.cluster.local import init_cluster
from tests.policy.hints import raw_hint, undigested


def _sum_program(tmp_path: Path, reveal: str) -> tuple[Path, Path]:
    """A 2-node dev cluster, each node's x.npy, and a saved program revealing a joint sum
    (``reveal="sum"``) or party 1's raw vector (``"raw"``) to P0."""
    spec = init_cluster(2, tmp_path / "dev")
    cluster = mp.ClusterSpec.from_yaml(spec)
    roots = {n.name: tmp_path / "data" / n.name for n in cluster.nodes}
    for i, root in enumerate(roots.values()):
        root.mkdir(parents=True)
        np.save(root / "x.npy", np.arange(20, dtype=np.float32) + i)

    def joint(a: Any, b: Any) -> Any:
        return jnp.sum(a) + jnp.sum(b) if reveal == "sum" else b

    @mp.function
    def prog() -> object:
        a = mp.device("P0")(lambda: tensor.load("x.npy"))()
        b = mp.device("P1")(lambda: tensor.load("x.npy"))()
        return mp.put("P0", mp.device("SP0")(joint)(a, b))  # the reveal

    sim = mp.Simulator(cluster, data_roots=roots)
    with sim:
        program = mp.compile(prog, cluster=cluster)
    sim.close()
    path = tmp_path / f"{reveal}.mpl"
    program.save(path)
    return spec, path


REVEAL = "op spu.reveal at test_check_cli.py:" + str(next(
    i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
    if line.endswith("# the reveal")))
"""Where the programs of `_sum_program` reveal."""


def test_check_prints_flows_and_accepts_under_each_node_s_policy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, program = _sum_program(tmp_path, "sum")
    assert main(["check", "--cluster", str(spec), str(program)]) == 0
    out = capsys.readouterr().out.splitlines()
    rule = 'allowed: rule {to: ["*"], when: aggregate, min_rows: 10}'
    assert re.fullmatch(r"program prog: digest [0-9a-f]{64}", out[0])
    assert out[1:] == [
        f"node_0 ({spec.parent / 'policies' / 'node_0.yaml'}): accepts",
        "  flow: aggregate over 20 rows of x.npy -> driver (program output 0, held by node_0, "
        f"{REVEAL}): {rule}",
        f"node_1 ({spec.parent / 'policies' / 'node_1.yaml'}): accepts",
        "  flow: aggregate over 20 rows of x.npy -> node_0 (the value revealed from SP0, "
        f"{REVEAL}): {rule}",
        "  flow: aggregate over 20 rows of x.npy -> driver (program output 0, held by node_0, "
        f"{REVEAL}): {rule}"]


def test_check_refuses_a_raw_reveal_and_names_the_rule(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, program = _sum_program(tmp_path, "raw")
    assert main(["check", "--cluster", str(spec), "--node", "node_1", str(program)]) == 1
    out = undigested(capsys.readouterr().out).splitlines()
    policy = spec.parent / "policies" / "node_1.yaml"
    assert out[1:] == [
        f"node_1 ({policy}): REFUSES",
        "  flow: row-wise (raw) values of x.npy -> node_0 (the value revealed from SP0, "
        f"{REVEAL}): REFUSED",
        "  flow: row-wise (raw) values of x.npy -> driver (program output 0, held by node_0, "
        f"{REVEAL}): REFUSED",
        f"  refused: {REVEAL} sends the value revealed from SP0, row-wise (raw) values of "
        f"x.npy, to node_0; {raw_hint('node_0')} in {policy}",
        f"  refused: {REVEAL} sends program output 0, held by node_0, row-wise (raw) values "
        f"of x.npy, to driver; {raw_hint('driver')} in {policy}"]


def test_check_with_a_given_policy_and_the_digest_allow_list(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, program = _sum_program(tmp_path, "raw")
    assert main(["check", "--cluster", str(spec), str(program)]) == 1
    digest = capsys.readouterr().out.split("digest ")[1].split()[0]
    allow = tmp_path / "allow.yaml"
    allow.write_text(f"programs: [{digest}]\n")
    assert main(["check", "--cluster", str(spec), "--policy", str(allow), str(program)]) == 0
    out = capsys.readouterr().out
    assert out.count("allowed: the program digest is allow-listed") == 2, out
    assert "REFUSED" not in out


def test_inputs_from_an_earlier_run_count_as_the_holder_s_raw_data(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """node_1's vector from an earlier run, revealed by a saved program: its worker would
    refuse it (it recorded the vector as row-wise), and so does the check."""
    spec = init_cluster(2, tmp_path / "dev")
    cluster = mp.ClusterSpec.from_yaml(spec)
    roots = {n.name: tmp_path / "data" / n.name for n in cluster.nodes}
    for root in roots.values():
        root.mkdir(parents=True)
        np.save(root / "x.npy", np.arange(20, dtype=np.float32))
    with mp.Simulator(cluster, data_roots=roots) as sim:
        earlier = mp.evaluate(sim, lambda: mp.device("P1")(lambda: tensor.load("x.npy"))())
        program = mp.compile(lambda v: mp.put("P0", v), earlier, cluster=cluster)
    path = tmp_path / "later.mpl"
    program.save(path)
    assert main(["check", "--cluster", str(spec), "--node", "node_1", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[1:3] == [
        f"node_1 ({spec.parent / 'policies' / 'node_1.yaml'}): REFUSES",
        "  note: the program's 1 input(s) come from earlier runs and count as this node's raw "
        "data here; its worker judges them by what they hold"]
    assert any(line.startswith("  refused: ") and "raw of input 0, to " in line
               for line in out), out
    assert main(["check", "--cluster", str(spec), "--node", "node_0", str(path)]) == 0


def test_check_on_the_simulator_s_nodes_without_a_cluster(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--sim``: the nodes of ``mplang run --sim`` for the program's parties, each judging
    by the policy ``mplang init`` writes for it (or DIR/NODE.yaml with ``--policies``);
    ``--data-root`` names the files a node would lack."""
    _, program = _sum_program(tmp_path, "raw")
    assert main(["check", "--sim", "--node", "node_1", str(program)]) == 1
    out = undigested(capsys.readouterr().out).splitlines()
    assert out[1] == "node_1 (the policy `mplang init` writes for node_1): REFUSES"
    assert out[-1].endswith(f"{raw_hint('driver')} in the policy `mplang init` writes for "
                            "node_1"), out
    assert main(["check", "--sim", "--data-root", str(tmp_path / "data"), str(program)]) == 1
    assert "does not hold" not in capsys.readouterr().out
    (tmp_path / "data" / "node_1" / "x.npy").unlink()
    assert main(["check", "--sim", "--data-root", str(tmp_path / "data"), str(program)]) == 1
    assert f"  note: the program loads x.npy, which {tmp_path / 'data' / 'node_1'} does not " \
        "hold" in capsys.readouterr().out.splitlines()
    open_policies = tmp_path / "open"
    open_policies.mkdir()
    (open_policies / "node_1.yaml").write_text("plaintext_to: ['*']\n")
    assert main(["check", "--sim", "--policies", str(open_policies), str(program)]) == 0
    assert f"node_1 ({open_policies / 'node_1.yaml'}): accepts" in capsys.readouterr().out


def test_check_refuses_simulator_options_with_a_cluster(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, program = _sum_program(tmp_path, "sum")
    assert main(["check", "--cluster", str(spec), "--policies", str(tmp_path),
                 str(program)]) == 2
    assert capsys.readouterr().err == (
        "mplang check: --policies and --data-root go with --sim (with --cluster, each node's "
        "policy is policies/NODE.yaml next to the spec)\n")
