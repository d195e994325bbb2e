"""bench.png of --mode block and --mode gpt: time against sequence length, a line per cell, or
a bar per cell where the grid measures one length."""

from __future__ import annotations

import itertools
import math
import textwrap
from pathlib import Path

from analysis.tables import pyplot, save_figure
from common.machine_load import is_busy
from measuring.cells import cell_label, split_kernel, varied
from measuring.noise import BUSY_MARK, ms_text
from measuring.step_table import impossible
from model import registry


def plot(rows: list[dict], path: Path, title: str, step_name: str) -> None:
    save_figure(figure(rows, title, step_name), path)


def figure(rows: list[dict], title: str, step_name: str):
    """Time against sequence length (``line_figure``); where the grid measures one length, a line through one
    point per cell would be a dot per cell: a bar per cell instead (``bar_figure``)."""
    if len({r["seq_len"] for r in rows}) == 1:
        return bar_figure(rows, title, step_name)
    return line_figure(rows, title, step_name)


def timed_rows(rows: list[dict]) -> tuple[str, list[dict], list[str]]:
    """What a figure draws: forward+backward (or a training step) where the device can take it, forward only
    where it cannot (flex on a CPU); the rows that have it, and the labels of those that do not."""
    axes = varied(rows)
    timed = "forward_ms" if all(r["step_ms"] != r["step_ms"] for r in rows) else "step_ms"
    untimed = sorted({cell_label(r, axes) for r in rows if r[timed] != r[timed]})
    invalid = sorted({cell_label(r, axes) for r in rows if timed == "step_ms" and impossible(r)})
    kept = [r for r in rows if r[timed] == r[timed] and not (timed == "step_ms" and impossible(r))]
    return timed, kept, untimed + [f"{label} (invalid: its forward measured slower than its step)"
                                   for label in invalid]  # fmt: skip


def series_colours(rows: list[dict], labels: list[str], axes: list[str]):
    """A colour per cell: its layout's, or one per series (``labels``, spelled with ``axes``) where the grid varies
    more than layout and kernel."""
    from analysis.plots import colour

    palette = pyplot().get_cmap("tab10" if len(labels) <= 10 else "tab20").colors
    by_series = len(labels) > len({(r["layout"], r["kernel"]) for r in rows})
    return lambda r: palette[labels.index(cell_label(r, axes)) % len(palette)] if by_series else colour(r["layout"])


def untimed_note(fig, untimed: list[str]) -> None:
    """A point the device could not time is said under the figure, not drawn at a made-up place."""
    if untimed:
        note = textwrap.fill(f"not shown, forward only on this device or not a timing (see bench.md): "
                             f"{'; '.join(untimed)}", 110)  # fmt: skip
        fig.text(0.01, 0.01, note, fontsize=7, va="bottom")
        fig.set_layout_engine("tight", rect=(0, 0.035 * (note.count("\n") + 2), 1, 1))  # room for the note


def bar_figure(rows: list[dict], title: str, step_name: str):
    """One sequence length: a horizontal bar per cell, named on its tick as training names runs, its median time
    written at its end ("noisy" where bench.md lists the measurement drawn as noisy), the range over passes as
    whiskers, a colour per layout (or series) and the kernel's hatch."""
    plt = pyplot()
    from analysis.plots import hatch
    from analysis.plots import legend_title as variant_parts

    axes = varied(rows)
    timed, rows, untimed = timed_rows(rows)  # in the grid's order, as bench.md lists them
    labels = sorted({cell_label(r, axes) for r in rows})
    tint = series_colours(rows, labels, axes)
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.32 * len(rows)))
    times = [r[timed] for r in rows]
    spread = timed == "step_ms" and any(r.get("step_ms_min", t) != r.get("step_ms_max", t) for r, t in zip(rows, times))
    ends = [r["step_ms_max"] if spread else t for r, t in zip(rows, times)]  # where a bar's whisker ends
    errors = [[t - r["step_ms_min"] for r, t in zip(rows, times)], [end - t for end, t in zip(ends, times)]]
    bars = ax.barh(range(len(rows)), times, color=[tint(r) for r in rows], xerr=errors if spread else None,
                   capsize=3, edgecolor="white")  # fmt: skip
    kernels = [split_kernel(r["kernel"])[0] for r in rows]
    busy = [is_busy(r.get("others_cores")) for r in rows]
    for bar, kernel, pale in zip(bars, kernels, busy):
        bar.set_hatch(hatch(kernel))
        bar.set_alpha(0.35 if pale else 1.0)  # timed on a busy machine: not the cell's own speed, as bench.md marks
    noisy = [timed.removesuffix("_ms") in r.get("noisy", ()) for r in rows]  # the measurement drawn
    room = 0.015 * max(ends, default=1.0)  # (no cell drawn: every one untimed or invalid, as the note says)
    for y, (t, end, n) in enumerate(zip(times, ends, noisy)):  # written past the whisker, not over it
        ax.text(end + room, y, f"{ms_text(t)} ms" + (", noisy" if n else ""), fontsize=7, va="center")
    ax.set_yticks(range(len(rows)), [f"{cell_label(r, axes)}, {r['compile']}" + (f" {BUSY_MARK}" if pale else "")
                                     for r, pale in zip(rows, busy)], fontsize=8)  # fmt: skip
    ax.invert_yaxis()  # the first cell on top, as in bench.md
    ax.set_xlim(0, max(ends, default=1.0) * 1.3)
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    what = step_name if timed == "step_ms" else "forward"
    ax.set_xlabel(f"{what} time (ms, median{'; whiskers: range over passes' if spread else ''}) at sequence length "
                  f"{rows[0]['seq_len'] if rows else '?'}")  # fmt: skip
    ax.set_ylabel(f"{variant_parts(labels)}, compile", fontsize=8)
    hatched = sorted({k for k in kernels if hatch(k)})
    note = f"\nhatched: {' and '.join(hatched)} kernel" if hatched else ""
    note += f"\npale, {BUSY_MARK}: timed on a busy machine, not the cell's own speed" if any(busy) else ""
    ax.set_title(textwrap.fill(title, 80) + note, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    untimed_note(fig, untimed)
    return fig


def line_figure(rows: list[dict], title: str, step_name: str):
    """Time against sequence length: a colour per layout (or per series where the grid varies more than layout
    and kernel), dashed for the manual kernel, solid for sdpa, circles eager, squares compiled."""
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    from analysis.plots import legend_title as variant_parts
    from analysis.plots import line_style

    fig, ax = plt.subplots(figsize=(7, 4.5))
    axes = varied(rows)
    timed, rows, untimed = timed_rows(rows)
    labels = sorted({cell_label(r, axes) for r in rows})
    tint_of = series_colours(rows, labels, axes)
    for (label, compile_mode), group in itertools.groupby(
        sorted(rows, key=lambda r: (cell_label(r, axes), r["compile"], r["seq_len"])),
        key=lambda r: (cell_label(r, axes), r["compile"]),
    ):
        group = list(group)
        marker = "o" if compile_mode == "eager" else "s"
        kernel = split_kernel(group[0]["kernel"])[0]
        ax.plot([r["seq_len"] for r in group], [r[timed] for r in group], line_style(kernel),
                marker=marker, color=tint_of(group[0]), label=f"{label}, {compile_mode}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    seq_lens = sorted({r["seq_len"] for r in rows})
    ax.xaxis.set_major_locator(FixedLocator(seq_lens))  # the lengths measured, whatever powers of 2 they are
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    if rows:
        low, high = ax.get_ylim()
        ax.set_ylim(low, high)
        ax.yaxis.set_major_locator(FixedLocator(readable_log_ticks(low, high)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sequence length")
    ax.set_ylabel(f"{step_name if timed == 'step_ms' else 'forward'} time (ms, median)")
    ax.set_title(textwrap.fill(title, 80), fontsize=8)
    ax.grid(alpha=0.3, which="both")
    legend_title = f"{variant_parts(labels)}, compile"
    kernels = sorted({split_kernel(r["kernel"])[0] for r in rows})
    if len({line_style(k) for k in kernels}) > 1:  # the line styles tell the kernels apart: say which is which
        legend_title += "\n(" + ", ".join(f"{registry.kernel(k).line_name}: {k} kernel" for k in kernels) + ")"
    # Long handles: a dash needs room beside the marker to tell manual (dashed) from sdpa (solid).
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=legend_title, title_fontsize=7,
              handlelength=5)  # fmt: skip
    untimed_note(fig, untimed)
    return fig


def readable_log_ticks(low: float, high: float) -> list[float]:
    """Labelled values for a log axis from ``low`` to ``high``: 1-2-5 in each decade where that labels four or
    more, else evenly spaced round values (a narrow range, which 1-2-5 would label once or twice)."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    ticks = [m * 10.0**d for d in decades for m in (1, 2, 5) if low <= m * 10.0**d <= high]
    if len(ticks) >= 4:
        return ticks
    from matplotlib.ticker import MaxNLocator

    return [float(t) for t in MaxNLocator(6, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high) if low <= t <= high]
