"""Markdown tables: the one formatting of numbers and tables shared by ``cpr score``, the evaluation
reports and the ablation tables (imports nothing from cpr)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_value", "markdown_table", "summary_table"]


def format_value(value: Any, decimals: int) -> str:
    """``value`` with ``decimals`` decimals; ``"-"`` for ``None``."""
    return "-" if value is None else f"{float(value):.{decimals}f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table (header row, separator, rows); ``|`` inside cells is escaped."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *(line(r) for r in rows)])


def summary_table(label_titles: Sequence[str], rows: Sequence[tuple[Sequence[str], Mapping[str, Any]]],
                  columns: Sequence[tuple[str, str, int]], *, n: bool = True) -> str:
    """Table with label columns, ``n`` (``-`` for a summary without it, e.g. paper rows) unless
    ``n=False``, then ``columns`` ``(title, key, decimals)`` of each summary."""
    header = [*label_titles, *(["n"] if n else []), *(title for title, _, _ in columns)]
    body = []
    for labels, summary in rows:
        count = ["-" if summary.get("n") is None else str(int(summary["n"]))] if n else []
        body.append([*labels, *count, *(format_value(summary.get(key), dec) for _, key, dec in columns)])
    return markdown_table(header, body)
