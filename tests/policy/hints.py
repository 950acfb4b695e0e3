"""The refusal hints tests expect, with a program's digest written as ``DIGEST``."""

from __future__ import annotations

import re

RAW_HINT = "(row-wise or raw values are never declassified by aggregate or compare rules; "


def raw_hint(receiver: str) -> str:
    """The hint of a refusal to send ``receiver`` raw or row-wise values."""
    return (f"approve this program alone with approve: - {{program: DIGEST}} {RAW_HINT}"
            f"plaintext_to would give {receiver} every row of every program)")


def undigested(message: str) -> str:
    """``message`` with each program digest written as ``DIGEST``."""
    return re.sub(r"\b[0-9a-f]{64}\b", "DIGEST", message)
