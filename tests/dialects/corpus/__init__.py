"""Each dialect's conformance corpus, one module per dialect, found by name (a new
dialect adds ``tests/dialects/corpus/<dialect>.py``, no list to edit):

- ``<dialect>_corpus()``: a program that uses every primitive of the dialect;
- ``check(result)``: asserts what it returns when run (on `CLUSTER`, in the conformance
  test's simulator);
- ``VALUES`` (optional): a value codec's kind -> a run on that simulator giving values of
  that kind, and a check of the decoded values.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import mplang as mp

CLUSTER = mp.ClusterSpec.simple(3)


def corpora() -> dict[str, ModuleType]:
    """Every corpus module, by name."""
    return {info.name: importlib.import_module(f"{__name__}.{info.name}")
            for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name)}
