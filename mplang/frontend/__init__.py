"""Frontend: op registry, reflection and the error taxonomy (seed 002)."""

from mplang.frontend.errors import (
    MPCommunicationError,
    MPLangError,
    MPRuntimeError,
    MPSerializationError,
    MPTraceError,
    MPTypeError,
    MPVerifyError,
)
from mplang.frontend.registry import OpInfo, describe, list_ops

__all__ = [
    "MPCommunicationError",
    "MPLangError",
    "MPRuntimeError",
    "MPSerializationError",
    "MPTraceError",
    "MPTypeError",
    "MPVerifyError",
    "OpInfo",
    "describe",
    "list_ops",
]
