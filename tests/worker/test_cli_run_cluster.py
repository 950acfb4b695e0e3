"""``mplang run --cluster``: a script's program runs on real worker processes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mplang.cli.main import main
from mplang.cluster.local import LocalCluster
from tests.worker.support import free_ports, make_spec, running_cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "run_me.py"


def test_run_example_on_cluster(local_cluster: LocalCluster,
                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["run", str(EXAMPLE), "5", "--cluster", str(local_cluster.spec_path),
                 "--key", str(local_cluster.driver_key), "--timeout", "30"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out == f"sum on 3 parties, revealed to P0: {(11 * np.arange(5)).tolist()}\n"


def test_run_on_cluster_with_driver_name(local_cluster: LocalCluster, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """``--name driver`` finds keys/driver.key next to the spec; the script's context is
    a Driver and ``mp.current_context()`` returns it."""
    script = tmp_path / "on_cluster.py"
    script.write_text(
        "import numpy as np\nimport mplang as mp\nfrom mplang import simp\n"
        "ctx = mp.current_context()\n"
        "out = mp.evaluate(ctx, lambda: simp.pcall((2,), lambda v: v * 3,\n"
        "                                          simp.constant((2,), np.int32(14))))\n"
        "print(type(ctx).__name__, int(mp.fetch(ctx, out)[2]))\n")
    code = main(["run", str(script), "--cluster", str(local_cluster.spec_path),
                 "--name", "driver"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out == "Driver 42\n"


def test_ir_of_a_program_that_loads_files_asks_the_workers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``mplang ir --cluster F``: the workers tell the types of the files (not the data)."""
    (tmp_path / "roots" / "node_0").mkdir(parents=True)
    np.save(tmp_path / "roots" / "node_0" / "wealth.npy", np.zeros((2, 3), np.float32))
    script = tmp_path / "loads.py"
    script.write_text(
        "import mplang as mp\nfrom mplang import tensor\n\n\n"
        "def load():\n    return mp.device('P0')(lambda: tensor.load('wealth.npy'))()\n")
    spec = make_spec(free_ports(3))
    with running_cluster(spec, data_root=tmp_path / "roots") as cluster:
        code = main(["ir", f"{script}:load", "--cluster", str(cluster.spec_path)])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert "tensor.load() {key=None, path='wealth.npy', type=f32[2,3]} : (f32[2,3])" in out
