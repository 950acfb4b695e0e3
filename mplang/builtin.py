"""The built-in extensions: importing a module registers its dialect, kernels or device kind.

Third-party extensions register the same way from their own modules, loaded with
`mplang.frontend.plugins.load_plugin` (``mplang worker --plugin NAME``).
"""

import importlib
import pkgutil

import mplang.device
import mplang.dialects
import mplang.kernels

SIMP_KERNELS = ("mplang.worker.ops", "mplang.driver.ops")
"""The simp dialect's kernels: on the workers and on the driver."""


def _modules() -> list[str]:
    """Every dialect module, every module and package of `mplang.kernels` (a package
    imports its registering modules), the simp kernels and every device module (the
    kinds among them register themselves)."""
    def members(package: object) -> list[str]:
        path = package.__path__  # type: ignore[attr-defined]
        prefix = package.__name__ + "."  # type: ignore[attr-defined]
        return sorted(prefix + m.name for m in pkgutil.iter_modules(path))

    return [*members(mplang.dialects), *members(mplang.kernels), *SIMP_KERNELS,
            *members(mplang.device)]


MODULES = tuple(_modules())
"""Modules of the built-in extensions."""


def load() -> None:
    """Import every built-in extension module (idempotent)."""
    for name in MODULES:
        importlib.import_module(name)
