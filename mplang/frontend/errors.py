"""The error taxonomy. Every user-facing error derives from `MPLangError`."""

from __future__ import annotations


class MPLangError(Exception):
    """Base class of every error MPLang raises on purpose."""


class MPTypeError(MPLangError, TypeError):
    """A program is ill-typed: an op got values of the wrong type or placement.

    Raised while tracing, before anything runs. The message names the op, the
    types/pmasks it found and what it expected; fix the program accordingly.
    """


class MPTraceError(MPLangError):
    """A Python construct cannot be traced (Python `if` on a traced value,
    returning a function, calling a primitive outside any context). Use the
    structured primitives (`simp.uniform_cond`, `simp.while_loop`) instead.
    """


class MPVerifyError(MPLangError):
    """A graph is malformed (use before definition, a value defined twice, an
    unknown op). Raised by the verifier, naming the offending op."""


class MPSerializationError(MPLangError, ValueError):
    """Serialized program or value bytes are malformed or exceed limits."""


class MPRuntimeError(MPLangError, RuntimeError):
    """An op failed while running. The message names the party and the op."""

    def __init__(self, message: str, *, party: int | None = None, op: str | None = None):
        super().__init__(message)
        self.party = party
        self.op = op


class MPCommunicationError(MPRuntimeError):
    """A message between parties did not arrive in time, or its execution was abandoned."""


__all__ = [
    "MPCommunicationError",
    "MPLangError",
    "MPRuntimeError",
    "MPSerializationError",
    "MPTraceError",
    "MPTypeError",
    "MPVerifyError",
]
