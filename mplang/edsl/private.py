"""Private attributes: attribute values only some parties may see, and their commitments.

A primitive declares which of its attributes hold private data with
`Primitive.def_private`. Before a program leaves the driver, each private
value is replaced by a `Commitment` (a hash binding the value and a random
nonce, plus the value's type) for every party that may not see it; the
others receive the value and its nonce and check it against the commitment
(`mplang.cluster.commitments`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mplang.edsl.errors import MPTypeError
from mplang.edsl.typing import BaseType, TensorType

DIGEST_BYTES = 32
"""A commitment is a sha256 digest."""


@dataclass(frozen=True)
class Commitment:
    """A committed private attribute: ``sha256(nonce || canonical bytes of the value)``
    and the value's type (None when the op's type rule does not need it)."""

    digest: bytes
    type: BaseType | None

    def __post_init__(self) -> None:
        if not isinstance(self.digest, bytes) or len(self.digest) != DIGEST_BYTES:
            raise ValueError(f"a commitment is a {DIGEST_BYTES}-byte digest")

    def __repr__(self) -> str:
        return f"Commitment({self.digest.hex()[:16]}..., {self.type})"


def value_tensor_type(op: str, value: Any) -> TensorType:
    """The tensor type of a constant attribute: an array's, or the one its commitment
    declares."""
    if isinstance(value, Commitment):
        if not isinstance(value.type, TensorType):
            raise MPTypeError(f"{op}: the committed value declares no tensor type")
        return value.type
    if not isinstance(value, np.ndarray):
        raise MPTypeError(f"{op}: attribute 'value' must be an array, got {type(value).__name__}")
    return TensorType.of(value.dtype, value.shape)
