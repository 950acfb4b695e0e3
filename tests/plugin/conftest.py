"""Fixtures of the plugin tests: the example plugin ``mplang-cms`` (``examples/plugin``),
installed if its entry point is missing, loaded in this process, and a 3-node
`LocalCluster` whose workers load it with ``--plugin cms``.

``.ci/run`` installs the plugin after MPLang; ``cms`` installs it here only when
the entry point cannot be found (a checkout set up with README's command alone).
"""

from __future__ import annotations

import importlib
import importlib.util
import site
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import mplang as mp
from mplang.cluster.local import LocalCluster
from mplang.frontend.plugins import discover, load_plugin
from tests.worker import support

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "examples" / "plugin"
SKETCH = {"width": 64, "depth": 4, "seed": 7}
"""The parameters of every sketch in these tests (and of the CMS device ``C0``)."""


def ensure_installed() -> None:
    """Install ``examples/plugin`` (editable, no dependencies) unless its entry point exists."""
    if "cms" in discover():
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "-e",
                    str(PLUGIN_DIR)], check=True)
    importlib.invalidate_caches()
    if importlib.util.find_spec("mplang_cms") is None:
        # the editable install's .pth file is read at start-up; read it now for this process
        site.addsitedir(sysconfig.get_paths()["purelib"])
    assert "cms" in discover(), "installing examples/plugin registered no 'cms' entry point"


@pytest.fixture(scope="session")
def cms() -> ModuleType:
    """The plugin module, loaded by its entry-point name as a worker loads it."""
    ensure_installed()
    return load_plugin("cms")


def cms_spec_dict(ports: list[int]) -> dict[str, Any]:
    """PPUs ``P0..``, the ABY3 SPU ``SP0`` and the CMS device ``C0`` on ``node_0``."""
    data = support.spec_dict(ports)
    data["devices"]["C0"] = {"kind": "CMS", "members": ["node_0"], "config": dict(SKETCH)}
    return data


@pytest.fixture(scope="session")
def cms_cluster(cms: ModuleType) -> Iterator[LocalCluster]:
    """Three worker processes started with ``--plugin cms``, for the whole session."""
    spec = mp.ClusterSpec.from_dict(cms_spec_dict(support.free_ports(3)))
    with support.running_cluster(spec, plugins=["cms"], timeout=90) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def cms_driver(cms_cluster: LocalCluster) -> Iterator[mp.Driver]:
    with support.connected_driver(cms_cluster) as driver:
        yield driver


@pytest.fixture
def cms_sim(cms: ModuleType) -> Iterator[mp.Simulator]:
    """A simulator of the same kind of spec (created after the plugin is loaded, so its
    parties have the ``cms`` state)."""
    simulator = mp.Simulator(mp.ClusterSpec.from_dict(cms_spec_dict([7101, 7102, 7103])))
    try:
        yield simulator
    finally:
        simulator.close()
