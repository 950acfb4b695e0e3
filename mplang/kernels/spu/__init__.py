"""The ``spu`` dialect's kernels (`run`) and their helpers: libspu links, kept secure
sessions and per-size compilation."""

from mplang.kernels.spu import run  # noqa: F401  (registers the kernels)
