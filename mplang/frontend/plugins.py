"""Plugins: extensions installed as Python packages and found through an entry-point group.

A plugin package declares, in its ``pyproject.toml``::

    [project.entry-points."mplang.plugins"]
    cms = "mplang_cms"

Importing the named module registers its dialect, backend, codecs and device
kinds. Nothing is loaded automatically: a program's author imports the plugin
(or calls `load_plugin`), and a worker loads only what its operator names
(``mplang worker --plugin cms``), so no received program can pull code in.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from mplang.edsl.errors import MPLangError

GROUP = "mplang.plugins"


def discover() -> dict[str, str]:
    """Installed plugins: entry-point name -> module name."""
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def load_plugin(name: str) -> ModuleType:
    """Import the plugin registered under entry-point ``name``, or the module ``name``."""
    module_name = discover().get(name, name)
    try:
        return importlib.import_module(module_name)
    except Exception as e:  # an import error, or a registration the plugin got wrong
        known = ", ".join(sorted(discover())) or "none installed"
        raise MPLangError(f"cannot load plugin {name!r} ({module_name}): "
                          f"{type(e).__name__}: {e}; installed plugins: {known}") from e


def load_plugins() -> list[str]:
    """Import every installed plugin; returns their names."""
    names = sorted(discover())
    for name in names:
        load_plugin(name)
    return names
