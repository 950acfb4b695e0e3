"""The built-in extensions: importing a module registers its dialect, backend or device kind.

Third-party extensions register the same way from their own modules, loaded with
`mplang.frontend.plugins.load_plugin` (``mplang worker --plugin NAME``).
"""

import importlib
import pkgutil

import mplang.backends
import mplang.device
import mplang.dialects

SIMP_BACKEND = ("mplang.backends.simp_worker.ops", "mplang.backends.simp_driver.ops")
"""The simp dialect's backend: its worker and driver kernels."""


def _modules() -> list[str]:
    """Every dialect module, every ``*_impl`` backend module, the simp backend and every
    device module (the kinds among them register themselves)."""
    def members(package: object, suffix: str = "") -> list[str]:
        path = package.__path__  # type: ignore[attr-defined]
        prefix = package.__name__ + "."  # type: ignore[attr-defined]
        return sorted(prefix + m.name for m in pkgutil.iter_modules(path)
                      if not m.ispkg and m.name.endswith(suffix))

    return [*members(mplang.dialects), *members(mplang.backends, "_impl"), *SIMP_BACKEND,
            *members(mplang.device)]


MODULES = tuple(_modules())
"""Modules of the built-in extensions."""


def load() -> None:
    """Import every built-in extension module (idempotent)."""
    for name in MODULES:
        importlib.import_module(name)
