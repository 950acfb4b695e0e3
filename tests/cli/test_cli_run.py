"""``mplang run`` on the simulator, and ``mp.current_context()``.

Scripts are written to a temporary folder and run in this process through
``mplang.cli.main``, except one run of the real ``mplang`` command.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mplang as mp
from mplang.cli import run as cli_run
from mplang.cli.main import main
from mplang.driver.base import SimpDriver
from mplang.edsl.context import set_default_context

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "run_me.py"

SQUARE_PLUS_ONE = """\
import numpy as np
import mplang as mp
from mplang import simp

X = np.array([1, -2, 3, 40], dtype=np.int32)


@mp.function
def prog():
    x = simp.constant((0,), X)
    y = simp.pcall((0,), lambda v: v * v + 1, x)
    return simp.shuffle_static(y, {2: 0})
"""


def script(tmp_path: Path, text: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- scripts that run


def test_script_uses_current_context(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, SQUARE_PLUS_ONE + """
ctx = mp.current_context()
values = mp.fetch(ctx, mp.evaluate(ctx, prog))
print(type(ctx).__name__, ctx.world_size, [None if v is None else v.tolist() for v in values])
""")
    code, out, err = run(capsys, str(path), "--sim", "3")
    assert (code, err) == (0, "")
    kind, world, values = out.split(" ", 2)
    want = np.array([1, -2, 3, 40]) ** 2 + 1
    assert (kind, world) == ("Simulator", "3")
    assert values.strip() == str([None, None, want.tolist()])


def test_main_ctx_is_called_with_the_context(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, SQUARE_PLUS_ONE + """
def main(ctx):
    assert ctx is mp.current_context()
    print(mp.fetch(ctx, mp.evaluate(ctx, prog))[2].tolist())
""")
    code, out, err = run(capsys, "--sim", "3", str(path))
    assert (code, err) == (0, "")
    assert out == f"{(np.array([1, -2, 3, 40]) ** 2 + 1).tolist()}\n"


def test_main_called_by_the_script_runs_once(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, SQUARE_PLUS_ONE + """
def main(ctx):
    print("main ran", mp.fetch(ctx, mp.evaluate(ctx, prog))[2].tolist())


if __name__ == "__main__":
    main(mp.current_context())
""")
    code, out, _ = run(capsys, str(path), "--sim", "3")
    assert code == 0
    assert out.count("main ran") == 1


def test_script_arguments_and_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script(tmp_path, "SCALE = 7\n", name="helper_beside_script.py")
    path = script(tmp_path, """
import json, sys
import numpy as np
import mplang as mp
from mplang import simp
from helper_beside_script import SCALE

ctx = mp.current_context()
out = mp.evaluate(ctx, lambda: simp.constant((1,), np.int32(SCALE * len(sys.argv))))
print(json.dumps({"argv": sys.argv, "name": __name__, "value": int(mp.fetch(ctx, out)[1])}))
""")
    argv = ["a", "--flag", "--sim", "x"]
    code, out, err = run(capsys, str(path), "a", "--flag", "--sim", "2", "--", "--sim", "x")
    assert (code, err) == (0, "")
    got = json.loads(out)
    assert got == {"argv": [str(path), *argv], "name": "__main__", "value": 7 * 5}
    assert str(tmp_path) not in sys.path
    assert sys.argv[0] != str(path)


def test_example_run_me(capsys: pytest.CaptureFixture[str],
                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLE.parent.parent)
    code, out, err = run(capsys, "examples/run_me.py", "6", "--sim", "3")
    assert (code, err) == (0, "")
    want = (np.arange(6) + 10 * np.arange(6)).tolist()
    assert out == f"sum on 3 parties, revealed to P0: {want}\n"


def test_mplang_command_runs_the_example() -> None:
    done = subprocess.run([sys.executable, "-m", "mplang.cli", "run", str(EXAMPLE), "--sim", "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"sum on 3 parties, revealed to P0: {(11 * np.arange(4)).tolist()}\n"


def test_context_options_close_and_uninstall(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = script(tmp_path, """
import mplang as mp
import numpy as np
from mplang import simp
ctx = mp.current_context()
mp.evaluate(ctx, lambda: simp.constant((0,), np.int32(1)))
""")
    opened: list[SimpDriver] = []
    real_open = cli_run._open
    monkeypatch.setattr(cli_run, "_open", lambda args: opened.append(real_open(args)) or opened[0])
    assert run(capsys, str(path), "--sim", "2", "--timeout", "1.5")[0] == 0
    (ctx,) = opened
    assert isinstance(ctx, mp.Simulator) and ctx.runs == 1
    assert [w.timeout for w in ctx.mesh.workers] == [1.5, 1.5]
    with pytest.raises(mp.MPLangError, match="this simulator is closed"):
        mp.evaluate(ctx, lambda: mp.simp.constant((0,), np.int32(1)))
    with pytest.raises(mp.MPLangError, match="no MPLang context is active"):
        mp.current_context()


# ---------------------------------------------------------------- bad input


def test_missing_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.py"
    assert run(capsys, str(missing), "--sim", "3") == (
        2, "", f"mplang run: no such script: {missing}\n")


@pytest.mark.parametrize("text", [
    "print('hello')\n",
    "import mplang as mp\nctx = mp.current_context()\n",
    "def main():\n    raise AssertionError('main() takes no context: not called')\n",
])
def test_script_with_no_program(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                text: str) -> None:
    path = script(tmp_path, text)
    code, _, err = run(capsys, str(path), "--sim", "3")
    assert code == 2
    assert err == (
        "mplang run: script.py ran no MPLang program on the simulator mplang run gave it: get "
        "that context with `ctx = mp.current_context()` and run programs with "
        "mp.evaluate(ctx, ...), or define `def main(ctx)`, which mplang run calls\n")


def test_program_on_another_context_does_not_count(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, SQUARE_PLUS_ONE + """
sim = mp.Simulator(3)
mp.evaluate(sim, prog)
sim.close()
""")
    code, _, err = run(capsys, str(path), "--sim", "3")
    assert code == 2 and "ran no MPLang program on the simulator" in err


def test_missing_cluster_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, "print('never runs')\n")
    spec = tmp_path / "cluster.yaml"
    assert run(capsys, str(path), "--cluster", str(spec)) == (
        2, "", f"mplang run: no such cluster spec: {spec} (write a development cluster "
               "with: mplang init --nodes 3 --out dev)\n")


def test_missing_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, "print('never runs')\n")
    assert main(["init", "--nodes", "2", "--out", str(tmp_path / "dev")]) == 0
    capsys.readouterr()
    spec = str(tmp_path / "dev" / "cluster.yaml")
    key = tmp_path / "dev" / "keys" / "nobody.key"
    for argv in (["--key", str(key)], ["--name", "nobody"]):
        code, out, err = run(capsys, str(path), "--cluster", spec, *argv)
        assert (code, out) == (2, "")
        assert err.startswith(f"mplang run: no key file at {key} (make one with: mplang keygen")
        assert err.count("\n") == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["x.py"], "give exactly one of --sim N and --cluster F"),
    (["--sim", "2", "x.py", "--cluster", "c.yaml"], "give exactly one of --sim N and --cluster F"),
    (["x.py", "--sim", "2", "--cluster", "c.yaml"],
     "argument --cluster: not allowed with argument --sim"),
    (["x.py", "--sim", "three"], "argument --sim: invalid int value: 'three'"),
    (["x.py", "--sim", "2", "--key", "k.key"], "--key and --name go with --cluster, not --sim"),
    (["--sim", "2"], "give the script to run: mplang run SCRIPT [ARG ...]"),
    (["x.py", "--sim"], "--sim needs a value"),
    (["x.py", "--sim", "0"], "world size must be a positive int, got 0"),
    (["x.py", "--cluster", "c.yaml", "--data-root", "d"],
     "--data-root goes with --sim: each worker of a cluster reads its own data root (mplang "
     "worker --data-root DIR, mplang up --data-root DIR)"),
    (["x.py", "--sim", "2", "--data-root", "nowhere"],
     "--data-root nowhere: no such folder (it holds a folder per node: nowhere/node_0, ...)"),
    (["x.py", "--sim", "2", "--policies", "nowhere"],
     "--policies nowhere: no such folder (it holds NODE.yaml per node, as `mplang init` "
     "writes in policies/)"),
    (["x.py", "--sim", "2", "--policies", "p", "--open"],
     "argument --open: not allowed with argument --policies"),
    (["x.py", "--cluster", "c.yaml", "--open"],
     "--policies and --open go with --sim: each worker of a cluster reads its own policy "
     "(mplang worker --policy FILE)"),
])
def test_bad_command_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                           monkeypatch: pytest.MonkeyPatch, argv: list[str],
                           message: str) -> None:
    monkeypatch.chdir(tmp_path)
    script(tmp_path, "print('never runs')\n", name="x.py")
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"mplang run: {message}")


# ---------------------------------------------------------------- failing scripts


def test_error_in_program_names_the_script_line(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, """\
import numpy as np
import mplang as mp
from mplang import simp


def bad():
    x = simp.constant((0,), np.int32(1))
    return simp.pcall((1,), lambda v: v + 1, x)


def main(ctx):
    mp.evaluate(ctx, bad)
""")
    code, out, err = run(capsys, str(path), "--sim", "3")
    assert (code, out) == (1, "")
    first, *trace = err.splitlines()
    assert first.startswith("mplang run: MPTypeError: ") and "script.py:8" in first
    assert trace[0] == "in your script (most recent call last):"
    files = [line.split('"')[1] for line in trace if line.startswith("  File ")]
    assert files == [str(path)] * 2  # main(ctx) and bad(), nothing of MPLang's
    assert "line 12, in main" in err and "line 8, in bad" in err


def test_plain_exception_and_exit_code(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    path = script(tmp_path, "raise ValueError('bad input file')\n")
    code, _, err = run(capsys, str(path), "--sim", "2")
    assert code == 1
    assert err.splitlines()[0] == "mplang run: ValueError: bad input file"
    assert f'File "{path}", line 1, in <module>' in err
    path.write_text("import sys\nsys.exit(3)\n")
    assert run(capsys, str(path), "--sim", "2") == (3, "", "")


# ---------------------------------------------------------------- mp.current_context()


def test_current_context_without_any() -> None:
    with pytest.raises(mp.MPLangError) as info:
        mp.current_context()
    assert str(info.value) == (
        "mp.current_context(): no MPLang context is active. Run the script with "
        "`mplang run SCRIPT --sim 3` (or `--cluster cluster.yaml`), or create a context "
        "yourself: `sim = mp.Simulator(3)` or `mp.Driver('cluster.yaml', "
        "key='keys/driver.key')`, and pass it to mp.evaluate")


def test_with_block_wins_over_the_default() -> None:
    outer, inner = mp.Simulator(2), mp.Simulator(2)
    previous = set_default_context(outer)
    try:
        assert mp.current_context() is outer
        with inner:
            assert mp.current_context() is inner
        assert mp.current_context() is outer
    finally:
        assert set_default_context(previous) is outer
        outer.close()
        inner.close()
    assert previous is None


LOADS = """\
import jax.numpy as jnp
import mplang as mp
from mplang import tensor


@mp.function
def total():
    x = mp.device("P0")(lambda: tensor.load("wealth.npy"))()
    return mp.device("P0")(lambda v: jnp.sum(v))(x)


def main(ctx):
    print("total wealth:", mp.fetch(ctx, mp.evaluate(ctx, total)))
"""


@pytest.fixture
def loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A script that loads node_0's ``wealth.npy``, kept in ``tmp_path/roots/node_0``;
    the working folder is another one."""
    (tmp_path / "roots" / "node_0").mkdir(parents=True)
    np.save(tmp_path / "roots" / "node_0" / "wealth.npy", np.arange(5, dtype=np.int32))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return script(tmp_path, LOADS, name="loads.py")


OPEN_NOTE = ("mplang: Simulator(policies='open'): no party checks any policy; workers with "
             "the policies `mplang init` writes may refuse what runs here\n")


def test_data_root_gives_each_simulated_node_its_folder(
        loader: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """node_0 judges the program by the policy ``mplang init`` writes (a sum of 5 rows is
    too few), as its worker would; ``--open`` judges nothing and says so; ``--policies``
    gives the nodes their policies."""
    code, out, err = run(capsys, str(loader), "--sim", "3", "--data-root", "../roots")
    assert (code, out) == (1, "")
    assert err.startswith("mplang run: PolicyRefusedError: node_0 refuses to send object "), err
    assert "to the driver: it is aggregate over 5 rows of wealth.npy; add a rule {to: " \
        "[driver], when: aggregate, min_rows: 5} to declassify, or approve: - {program: " in err
    assert "in the policy `mplang init` writes for node_0 (or reveal it under a rule) (at " \
        "loads.py:13)" in err, err
    assert run(capsys, str(loader), "--sim", "3", "--data-root", "../roots", "--open") == \
        (0, "total wealth: 10\n", OPEN_NOTE)
    (loader.parent / "policies").mkdir()
    (loader.parent / "policies" / "node_0.yaml").write_text("declassify: [{to: ['*'], "
                                                            "when: aggregate, min_rows: 5}]\n")
    assert run(capsys, str(loader), "--sim", "3", "--data-root", "../roots", "--policies",
               "../policies") == (0, "total wealth: 10\n", "")


def test_without_data_root_the_message_names_the_option(
        loader: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--sim", "3", str(loader))
    assert (code, out) == (1, "")
    assert err.splitlines()[0] == (
        "mplang run: MissingData: tensor.load: node_0 has no file 'wealth.npy' in its data "
        "root; put it there (by default ./data/node_0; mp.Simulator(..., data_roots=...), "
        "`mplang run --sim N --data-root DIR` or `mplang worker --data-root DIR` choose "
        "another) or fix the path (at loads.py:8)")


def test_ir_of_a_program_that_loads_files(loader: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    target = f"{loader}:total"
    assert main(["ir", target, "--data-root", "../roots"]) == 0
    text = capsys.readouterr().out
    assert "tensor.load() {key=None, path='wealth.npy', type=i32[5]} : (i32[5])" in text
    assert text.startswith("func @total() -> (i32[]@{0}) {")
    assert main(["ir", target]) == 1
    assert capsys.readouterr().err.startswith(
        f"mplang ir: {target} failed to trace: MPTypeError: device 'P0' (<lambda>): "
        "tensor.run_jax[<lambda>]: JAX could not trace the function on (): MPTypeError: "
        "tensor.load: the type of 'wealth.npy' cannot be looked up while compiling without a "
        "simulator or driver to ask; pass dtype= and shape=, or compile with one that has the "
        "data (`mplang ir --data-root DIR` or `--cluster F`) (at loads.py:8)")
