"""The built-in extensions: importing a module registers its dialect, backend or device kind.

Third-party extensions register the same way from their own modules, loaded with
`mplang.frontend.plugins.load_plugin` (``mplang worker --plugin NAME``).
"""

import importlib

MODULES = (
    "mplang.dialects.func",
    "mplang.dialects.simp",
    "mplang.dialects.tensor",
    "mplang.dialects.spu",
    "mplang.backends.func_impl",
    "mplang.backends.tensor_impl",
    "mplang.backends.simp_worker.ops",
    "mplang.backends.simp_driver.ops",
    "mplang.backends.spu_impl",
    "mplang.device.ppu",
    "mplang.device.spu",
)
"""Modules of the built-in extensions, in registration order."""


def load() -> None:
    """Import every built-in extension module (idempotent)."""
    for name in MODULES:
        importlib.import_module(name)
