"""Markdown tables as text: the trainer's profile summary and the reports (analysis/tables.py writes them)."""

from __future__ import annotations

from collections.abc import Sequence


def format_cell(value, digits: int = 4) -> str:
    """Floats to ``digits`` significant figures (never "-0"), None/NaN as "-", the rest as str."""
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if isinstance(value, float):
        text = f"{value:.{digits}g}"
        return "0" if text in ("-0", "-0.0") else text
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence], right_align: Sequence[bool] | None = None,
                   digits: int = 4) -> str:  # fmt: skip
    """A markdown table; cells that are not strings are formatted with ``format_cell``."""
    right = right_align if right_align is not None else [False] * len(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" ---: " if r else " --- " for r in right) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(v if isinstance(v, str) else format_cell(v, digits) for v in row) + " |")
    return "\n".join(lines)
