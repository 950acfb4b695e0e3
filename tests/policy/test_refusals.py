"""Every refusal of a party's policy reaches the simulator's caller as an
`mp.MPRefusedError` (never an `MPRuntimeError`) naming the party and the op: a
program refused when it is accepted, when it runs on stored data, a fetch, and a
write into the data root that ``writes`` does not allow (which writes nothing)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects import simp, table, tensor
from mplang.policy import PolicyRefusedError
from mplang.runtime.options import Mode

X = np.arange(10, dtype=np.float32)
INPUT_CSV = "a\n1\n2\n"
POLICY = ("declassify:\n  - {to: ['*'], when: aggregate, min_rows: 5}\n"
          "writes: [out/*.csv]\n")
"""node_0's policy; node_1's also lets its plaintext go to the driver."""


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for i, node in enumerate(("node_0", "node_1")):
        (tmp_path / node / "in").mkdir(parents=True)
        np.save(tmp_path / node / "x.npy", X + i)
        (tmp_path / node / "in" / "x.csv").write_text(INPUT_CSV)
        out[node] = tmp_path / node
    return out


@pytest.fixture
def policies(tmp_path: Path) -> dict[str, Path]:
    (tmp_path / "node_0.yaml").write_text(POLICY)
    (tmp_path / "node_1.yaml").write_text(POLICY + "plaintext_to: [driver]\n")
    return {n: tmp_path / f"{n}.yaml" for n in ("node_0", "node_1")}


@pytest.fixture
def sim(roots: dict[str, Path], policies: dict[str, Path]) -> Iterator[mp.Simulator]:
    s = mp.Simulator(2, data_roots=roots, policies={n: str(p) for n, p in policies.items()})
    yield s
    s.close()


def refused(run: Any) -> mp.MPRefusedError:
    """The `MPRefusedError` ``run()`` raises (not an `MPRuntimeError` in disguise)."""
    with pytest.raises(mp.MPRefusedError) as caught:
        run()
    assert not isinstance(caught.value, mp.MPRuntimeError)
    return caught.value


def loaded(party: int) -> mp.MPObject:
    return simp.pcall((party,), lambda: tensor.load("x.npy"))


def test_a_program_revealing_raw_data_is_refused_at_accept(sim: mp.Simulator) -> None:
    def steal() -> Any:
        return mp.put("P0", mp.device("SP0")(lambda a, b: b)(loaded(0), loaded(1)))

    error = refused(lambda: mp.evaluate(sim, steal))
    assert str(error).startswith("node_1 refuses the program: op spu.reveal at "
                                 "test_refusals.py:"), error
    assert "x.npy, to node_0; approve this program alone with approve: - {program: " in str(error)
    assert error.status == 403


def solved(x: Any) -> Any:
    """Two rows of ``x`` stacked into a matrix (the rows' values, as they are) and solved."""
    return jnp.linalg.solve(jnp.stack([x[:2], x[2:4]]) + 100 * jnp.eye(2), jnp.ones(2))


@pytest.mark.parametrize("device", ["SP0", "P1"])
def test_a_refusal_names_the_op_that_made_the_value_raw(sim: mp.Simulator,
                                                        device: str) -> None:
    """A device function whose value became raw where rows were stacked (not in the solve
    after it): the refusal names that StableHLO op, the line inside the function that
    traced it and the line that traced the function, on a secure device and on the
    party's own."""
    error = refused(lambda: mp.evaluate(sim, lambda: mp.put(  # @solve
        "P0", mp.device(device)(solved)(loaded(1)))))
    lines = Path(__file__).read_text().splitlines()
    call = next(i for i, text in enumerate(lines, 1) if text.endswith("# @solve"))
    stack = next(i for i, text in enumerate(lines, 1) if "jnp.linalg.solve(jnp.stack" in text)
    assert str(error).startswith("node_1 refuses the program: op "), error
    assert "x.npy, to node_0; approve this program alone with approve: - {program: " \
        in str(error)
    assert str(error).endswith(f" (it became raw at stablehlo.concatenate at "
                               f"test_refusals.py:{stack} in the function traced at "
                               f"test_refusals.py:{call + 1})"), error


def test_stored_raw_data_sent_on_is_refused_when_it_would_run(sim: mp.Simulator) -> None:
    """node_1 lets the driver have its data, not node_0: standard mode runs the shuffle
    as a program of its own, which node_1 refuses once it sees the stored input's label."""
    x = mp.evaluate(sim, lambda: loaded(1))
    np.testing.assert_array_equal(mp.fetch(sim, x)[1], X + 1)
    error = refused(lambda: mp.evaluate(sim, lambda v: simp.shuffle_static(v, {0: 1}), x,
                                        mode="standard"))
    assert str(error).startswith("node_1 refuses the program: op simp.shuffle_static at "
                                 "test_refusals.py:"), error
    assert "x.npy, to node_0; approve this program alone with approve: - {program: " in str(error)


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_the_driver_never_gets_a_party_s_raw_data(sim: mp.Simulator, mode: Mode) -> None:
    """Refused when node_0 accepts the program (its output would reach the driver) or
    when the driver fetches the output; either way an `MPRefusedError` of node_0."""
    error = refused(lambda: mp.fetch(sim, mp.evaluate(sim, lambda: loaded(0), mode=mode)))
    assert str(error).startswith(("node_0 refuses the program: op simp.pcall at "
                                  "test_refusals.py:", "node_0 refuses")), error
    assert "x.npy" in str(error) and "plaintext_to would give driver every row" in str(error)
    total = mp.evaluate(sim, lambda: simp.pcall((0,), jnp.sum, loaded(0)))
    assert float(mp.fetch(sim, total)[0]) == float(np.sum(X))  # an aggregate may go


def test_a_secret_share_is_refused_at_fetch(sim: mp.Simulator) -> None:
    shared = mp.evaluate(sim, lambda: mp.put("SP0", mp.put("P0", np.float32(2.5))))
    error = refused(lambda: sim.fetch_object(shared))
    assert re.match(r"party ([01]): object mem://party\1/", str(error)), error
    assert "is a secret share, which leaves this party only inside its protocol" in str(error)


def test_a_refused_predicate_names_the_op_that_needed_it(
        sim: mp.Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Standard mode fetches a ``uniform_cond`` predicate to the driver: a party refusing
    that fetch is reported with the op that asked for it."""
    guard = sim.mesh.workers[1].guard
    assert guard is not None

    def refuse(uri: str) -> None:
        raise PolicyRefusedError(f"node_1 refuses to send object {uri} to the driver")

    monkeypatch.setattr(guard, "check_fetch", refuse)

    def branch() -> Any:
        pred = simp.constant((0, 1), True)
        return simp.uniform_cond(pred, lambda: simp.constant((0, 1), 1),
                                 lambda: simp.constant((0, 1), 0))

    error = refused(lambda: mp.evaluate(sim, branch, mode="standard"))
    assert str(error).startswith("op simp.uniform_cond at test_refusals.py:"), error
    assert "(standard mode: the driver fetches its predicate): node_1 refuses to send " \
           "object mem://party1/" in str(error)
    out = mp.evaluate(sim, branch)  # launch mode: the parties choose the branch themselves
    monkeypatch.undo()
    assert mp.fetch(sim, out) == [1, 1]


def write(path: str) -> Any:
    def prog() -> Any:
        t = simp.pcall((1,), lambda: table.constant({"a": np.array([7, 8], np.int64)}))
        return simp.pcall((1,), lambda u: table.write_csv(u, path), t)

    return prog


WRITE_LINE = write.__code__.co_firstlineno + 3
"""The line of `write`'s ``table.write_csv``."""


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file()}


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_a_write_writes_allows_runs(sim: mp.Simulator, roots: dict[str, Path],
                                    mode: Mode) -> None:
    mp.evaluate(sim, write("out/r.csv"), mode=mode)
    assert (roots["node_1"] / "out" / "r.csv").read_text() == '"a"\n7\n8\n'


@pytest.mark.parametrize("path", ["in/x.csv", "out/sub/r.csv", "r.csv"])
def test_a_write_writes_does_not_allow_is_refused_and_writes_nothing(
        sim: mp.Simulator, roots: dict[str, Path], policies: dict[str, Path],
        path: str) -> None:
    before = files(roots["node_1"])
    error = refused(lambda: mp.evaluate(sim, write(path)))
    message = str(error)
    assert message.startswith("node_1 refuses "), message
    assert re.search(rf"op table\.write(_csv)? at test_refusals\.py:{WRITE_LINE} writ", message)
    assert f"{path!r} into " in message
    assert f"writes: [out/*.csv] in {policies['node_1']} does not allow" in message
    assert files(roots["node_1"]) == before


def test_a_write_through_a_link_is_judged_where_it_leads(
        sim: mp.Simulator, roots: dict[str, Path], policies: dict[str, Path]) -> None:
    """out/x.csv is allowed, but ``out`` links to ``in``: the worker refuses the write
    when it finds where the path leads, and the input stays as it was."""
    (roots["node_1"] / "out").symlink_to("in")
    error = refused(lambda: mp.evaluate(sim, write("out/x.csv")))
    assert str(error) == (
        f"node_1 refuses op table.write_csv at test_refusals.py:{WRITE_LINE} "
        "writing 'out/x.csv' (which leads to 'in/x.csv') into its data root: writes: "
        f"[out/*.csv] in {policies['node_1']} does not allow 'in/x.csv'; add it (or a "
        "pattern matching it) to writes")
    assert (roots["node_1"] / "in" / "x.csv").read_text() == INPUT_CSV


def test_with_open_policies_writes_stay_allowed(roots: dict[str, Path]) -> None:
    """A Simulator's nodes judge by the policy `mplang init` writes (``writes: []``)
    unless ``policies="open"``: then no node judges, and the write runs."""
    with mp.Simulator(2, data_roots=roots) as default:
        error = refused(lambda: mp.evaluate(default, write("in/x.csv")))
    assert "writes: [] in the policy `mplang init` writes for node_1 does not allow" \
        in str(error)
    assert (roots["node_1"] / "in" / "x.csv").read_text() == INPUT_CSV
    with mp.Simulator(2, data_roots=roots, policies="open") as free:
        mp.evaluate(free, write("in/x.csv"))
    assert (roots["node_1"] / "in" / "x.csv").read_text() == '"a"\n7\n8\n'
