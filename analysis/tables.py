"""The reporting toolkit shared by compare.py, bench.py and heads.py: tables (markdown, CSV) and figures.

Every file is written under a temporary name and renamed into place, so a
report is never half-written.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from common.run_files import write_atomically
from common.run_files import write_text as write_text  # re-exported: the reports' writer


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


def write_csv(path: Path, header: Sequence[str], rows: Sequence[Sequence]) -> Path:
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *rows])
    return write_text(path, buffer.getvalue())


def write_table(stem: Path, header: Sequence[str], rows: Sequence[Sequence], digits: int = 4) -> str:
    """``<stem>.csv`` (full precision) and ``<stem>.md``; returns the markdown."""
    write_csv(stem.with_suffix(".csv"), header, rows)
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(header))]
    table = markdown_table(header, rows, numeric, digits)
    write_text(stem.with_suffix(".md"), table + "\n")
    return table


def pyplot():
    """matplotlib's pyplot, drawing to files only (the Agg backend: no display needed); imported on first use,
    so that commands which draw nothing do not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """Lay out, save (atomically) and close a matplotlib figure."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=dpi, bbox_inches="tight"), keep_suffix=True)
    pyplot().close(fig)
    return path
