"""HTML tables for notebooks: what Jupyter shows of reports (`_repr_html_`)."""

from __future__ import annotations

import html
from collections.abc import Sequence


def html_table(header: Sequence[str], rows: Sequence[Sequence[object]],
               caption: str | None = None) -> str:
    """A ``<table>`` of ``rows`` under ``header`` (every cell escaped)."""
    def cells(tag: str, row: Sequence[object]) -> str:
        return "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in row)

    head = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return (f"<table>{head}<thead><tr>{cells('th', header)}</tr></thead>"
            f"<tbody>{body}</tbody></table>")
