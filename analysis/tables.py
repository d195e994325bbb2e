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
from common.tables import format_cell as format_cell  # re-exported: the reports' cells
from common.tables import markdown_table


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
