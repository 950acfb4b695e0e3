"""The ``psi`` dialect's kernels (`join`, `join_n`, `unbalanced`) and their helpers."""

from mplang.kernels.psi import join, join_n, unbalanced  # noqa: F401  (register the kernels)
