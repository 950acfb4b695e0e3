"""Received programs are vetted on the simulator as workers vet theirs: one-byte mutants
of every native payload of a saved program (run_jax module, SPU executable, SPU
StableHLO), loaded with `mp.Program.from_bytes` and run on `mp.Simulator` in a child
process (`tests.security.loaded_mutants`), never crash it: each runs (to the program's
own result, or to another one's when the byte made another valid program) or raises
an `MPLangError`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.loaded_mutants import KINDS

ROOT = Path(__file__).resolve().parents[2]
CI_MUTANTS = 100
"""Mutants of each payload kind in the default run (about 5 s a kind)."""


def run_batch(kind: str, seed: int, start: int, count: int) -> dict[str, int]:
    """Outcome counts of mutants [start, start + count) of ``kind``, run in a child
    process; fails naming the mutant if the child crashes or hangs, or if a mutant raised
    anything but an MPLangError. A mutant may run to another result ("differs"): one
    byte can make another valid program (a sort's comparison direction, say), which no
    check of the payload alone can tell from what the sender meant."""
    cmd = [sys.executable, "-m", "tests.security.loaded_mutants", kind, str(seed), str(start),
           str(count)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, errors="replace",
                              timeout=600,
                              env={**os.environ, "JAX_PLATFORMS": "cpu"})
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{kind} mutants {start}..{start + count - 1} (seed {seed}) hung; "
                    f"last lines: {str(e.stdout)[-300:]}")
    lines = proc.stdout.splitlines()
    started = [line.split()[1] for line in lines if line.startswith("S ")]
    assert lines and lines[-1] == "DONE", (
        f"the child died (exit {proc.returncode}) at {kind} mutant {started[-1:]} "
        f"(seed {seed}); stderr: {proc.stderr[-500:]}")
    outcomes: dict[str, int] = {}
    for line in lines:
        if line.startswith("R "):
            _, index, what, *_ = line.split(" ", 3)
            assert what in ("ran", "differs", "refused"), \
                f"{kind} mutant {index} (seed {seed}): {line}"
            outcomes[what] = outcomes.get(what, 0) + 1
    assert sum(outcomes.values()) == count
    return outcomes


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_mutated_payloads_of_a_loaded_program_never_crash_the_simulator(kind: str) -> None:
    outcomes = run_batch(kind, 0, 0, CI_MUTANTS)
    assert outcomes.get("refused", 0) > CI_MUTANTS // 2  # the check saw most of them
    if kind == "executable":  # every byte of an executable matters: none is harmless
        assert outcomes == {"refused": CI_MUTANTS}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_sixteen_batches_of_mutants_never_crash_the_simulator(kind: str) -> None:
    """The issue's campaign (16 batches of 25, each batch in its own process), per kind."""
    totals: dict[str, int] = {}
    for batch in range(16):
        for what, n in run_batch(kind, 1, 25 * batch, 25).items():
            totals[what] = totals.get(what, 0) + n
    print(kind, totals)
    assert sum(totals.values()) == 400


def test_only_received_programs_are_vetted_and_each_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program of this process's tracer runs unvetted; a received one (and what passes
    make of it) is vetted before its first run only."""
    import mplang as mp
    from mplang.kernels import tensor as tensor_impl
    from mplang.passes import optimize
    from tests.security.loaded_mutants import CLUSTER, EXPECTED, program

    checked: list[bytes] = []
    check = tensor_impl.MODULE_CHECKER.check

    def counted(payload: bytes, where: str) -> None:
        checked.append(payload)
        check(payload, where)

    monkeypatch.setattr(tensor_impl.MODULE_CHECKER, "check", counted)
    traced = program()
    sim = mp.Simulator(CLUSTER)
    assert mp.fetch(sim, mp.evaluate(sim, traced)).tolist() == EXPECTED
    assert checked == []
    received = mp.Program.from_bytes(traced.to_bytes())
    for p in (received, received, optimize(received)):
        assert p.received
        assert mp.fetch(sim, mp.evaluate(sim, p)).tolist() == EXPECTED
    assert len(checked) == 2  # once for the loaded program, once for the optimized one


def test_analyze_and_check_vet_a_received_program_before_parsing_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``mp.analyze`` and ``mplang check`` parse a program's payloads; a received one with a
    tampered SPU executable is refused first, naming the field path, as the simulator
    refuses to run it."""
    import mplang as mp
    from mplang.cli.main import main
    from mplang.cluster.local import init_cluster
    from tests.security.loaded_mutants import mutant, payload_span, program

    traced = program()
    data = traced.to_bytes()
    tampered = mutant(data, payload_span(data, traced, "executable"), "executable", 0, 0)
    assert mp.analyze(mp.Program.from_bytes(data)).name == traced.name
    with pytest.raises(mp.MPSerializationError, match=r"graph\.ops\[\d+\](\.regions\[\d+\]"
                                                      r"\.ops\[\d+\])*\.attrs\.executable"):
        mp.analyze(mp.Program.from_bytes(tampered))
    spec = init_cluster(2, tmp_path / "dev")
    path = tmp_path / "tampered.mpl"
    path.write_bytes(tampered)
    assert main(["check", "--cluster", str(spec), str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mplang check: ") and ".attrs.executable" in err
