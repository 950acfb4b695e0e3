"""The error taxonomy. Every user-facing error derives from `MPLangError`."""

from __future__ import annotations

from typing import Any


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


class MPConcreteValueError(MPTraceError, TypeError):
    """Python asked for the concrete value of an MPLang value (``if x``, ``int(x)``,
    ``for v in x``, ``np.asarray(x)``), whose data exists only on the parties once the
    program runs. Inside a program, branch and loop with `simp.uniform_cond` /
    `simp.while_loop` and compute inside a device function (``jnp.where``); outside
    one, bring the value to Python with ``mp.fetch(ctx, x)`` first.
    """


class MPVerifyError(MPLangError):
    """A graph is malformed (use before definition, a value defined twice, an
    unknown op). Raised by the verifier, naming the offending op."""


class MPSerializationError(MPLangError, ValueError):
    """Serialized program or value bytes are malformed or exceed limits."""


class MPRuntimeError(MPLangError, RuntimeError):
    """An op failed while running. The message names the party and the op."""

    def __init__(self, message: str, *, party: int | None = None, op: str | None = None,
                 key: str | None = None, loc: str | None = None):
        super().__init__(message)
        self.party = party
        self.op = op
        self.key = key
        """The region path of the op's run (``/0/2/b1/3``: op 0, its op 2, branch 1, op 3)."""
        self.loc = loc
        """``file.py:LINE`` of the user code that traced the op."""


class MPPublicError(MPRuntimeError):
    """An op failed for a reason whose text holds none of a party's data: the program's
    structure or types, keys and their fingerprints, an attestation, a missing package.
    Its message leaves the party as it is; any other failure of an op leaves it only as
    a generic message naming the op, the party and the source line."""


class MPCommunicationError(MPRuntimeError):
    """A message between parties did not arrive in time, or its execution was abandoned
    while a party waited for one (``peer``: the party it waited for, when known), or the
    driver could not reach a party or lost its connection to it (``party``)."""

    def __init__(self, message: str, *, peer: int | None = None, **where: Any):
        super().__init__(message, **where)
        self.peer = peer


class MPTimeoutError(MPCommunicationError):
    """A wait ran out of time: a party's message, a secure device's protocol message, or
    a party's answer to the driver. The message names the party that waited and whom it
    waited for."""


class MPRefusedError(MPLangError):
    """A party refused a request: its policy refuses a program, a fetch or a write
    (the message names the party, the op and the rule to add), or its worker refuses
    an unknown or unauthorized certificate, a body or message over its limits, a
    message no running execution expects. ``status`` is the HTTP status the worker
    answers with (4xx)."""

    def __init__(self, message: str, status: int = 403):
        super().__init__(message)
        self.status = status
        self.party: int | None = None
        """The rank of the refusing party, where a run's refusal says it."""
        self.op: str | None = None
        """The op whose run was refused, where known."""


class FeError(MPLangError):
    """Base of the frontend errors: a frontend op's contract was violated."""


class FeConfigError(FeError, ValueError):
    """A frontend op's configuration is missing or does not fit its schema; the message
    names the op, the field and what the schema expects."""


class FeCapabilityError(FeError, TypeError):
    """A frontend op cannot run on the chosen device (its metadata does not fit the
    device's kind or members); run it on a device its ``targets`` name."""


class FeDeterminismError(FeError):
    """One signature produced different IR in two compilations: the op depends on
    hidden state. Make that state an explicit argument or configuration."""


class FeStateError(FeError):
    """Illegal frontend state: an MPLang object stored in process-wide state, or context
    state asked for without a context. Keep runtime objects in ``ctx`` scope."""


__all__ = [
    "FeCapabilityError",
    "FeConfigError",
    "FeDeterminismError",
    "FeError",
    "FeStateError",
    "MPCommunicationError",
    "MPConcreteValueError",
    "MPLangError",
    "MPRefusedError",
    "MPRuntimeError",
    "MPSerializationError",
    "MPTraceError",
    "MPTypeError",
    "MPVerifyError",
]
