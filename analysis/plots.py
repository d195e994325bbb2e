"""PNG plots of a comparison: validation loss against steps and training time, throughput bars.

One colour per layout and one line style per kernel, whatever the number of
runs; the seeds of a variant are aggregated (the mean line, a band from the
lowest to the highest seed) and the throughput bars carry the seeds' spread.
Legends sit outside the data.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from analysis.runs import Run
from analysis.tables import save_figure

LAYOUT_COLOURS = {"wrapper": "tab:blue", "separate_qkv": "tab:orange", "fused_qkv": "tab:green"}
KERNEL_STYLES = {"manual": "--", "sdpa": "-"}


def colour(layout: str) -> str:
    return LAYOUT_COLOURS.get(layout, "tab:gray")


def by_variant(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by variant (its seeds together), in name order."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.variant].append(run)
    return dict(sorted(groups.items()))


def colours(runs: list[Run]) -> dict[str, str]:
    """A colour per variant: its layout's, unless variants of one layout differ in more than the kernel
    (key/value heads, window, SDPA backend): then a colour each."""
    variants = {run.variant: (run.layout, run.kernel) for run in runs}
    if len(variants) == len(set(variants.values())):
        return {variant: colour(layout) for variant, (layout, _) in variants.items()}
    palette = plt.get_cmap("tab10").colors
    return {variant: palette[i % len(palette)] for i, variant in enumerate(sorted(variants))}


def _curve(run: Run, against: str) -> dict[int, tuple[float, float]]:
    at = run.training_seconds()
    return {e["step"]: (e["step"] if against == "step" else at.get(e["step"], float("nan")), e["val/loss"])
            for e in run.evals}  # fmt: skip


def plot_val_loss(runs: list[Run], out: Path, against: str) -> Path:
    """``against``: "step" or "time" (training seconds: evaluation, compilation and warm-up excluded)."""
    path = out / f"val_loss_vs_{against}.png"
    save_figure(val_loss_figure(runs, against), path)
    return path


def val_loss_figure(runs: list[Run], against: str):
    """One line per variant; a sweep in progress draws what its runs evaluated so far (at each step, the
    seeds that reached it)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    means = []
    evaluated = by_variant([run for run in runs if run.evals])
    colour_of = colours(runs)
    for variant, group in evaluated.items():
        kernel = group[0].kernel
        curves = [_curve(run, against) for run in group]
        steps = sorted(set().union(*curves))
        xs = np.array([statistics.fmean(c[s][0] for c in curves if s in c) for s in steps])
        points = [[c[s][1] for c in curves if s in c] for s in steps]
        mean = np.array([statistics.fmean(p) for p in points])
        seeds = f", {len(group)} seeds" if len(group) > 1 else ""
        means.append((xs, mean))
        ax.plot(xs, mean, KERNEL_STYLES.get(kernel, ":"), color=colour_of[variant], marker="o", ms=3,
                label=f"{variant.replace('/', ' / ', 1)}{seeds}")  # fmt: skip
        if len(group) > 1:
            ax.fill_between(xs, [min(p) for p in points], [max(p) for p in points], color=colour_of[variant],
                            alpha=0.15, lw=0)  # fmt: skip
    ax.set_xlabel("step" if against == "step" else "training time (s; evaluation, compilation, warm-up excluded)")
    ax.set_ylabel("validation loss (nats/token)")
    spread = " (line: mean over seeds, band: min-max)" if any(len(g) > 1 for g in evaluated.values()) else ""
    ax.set_title(f"validation loss vs {'steps' if against == 'step' else 'training time'}{spread}", fontsize=10)
    ax.grid(alpha=0.3)
    if not evaluated:
        ax.text(0.5, 0.5, "no run has been evaluated yet", transform=ax.transAxes, ha="center", va="center")
        return fig
    title = "layout / kernel" + (", what else differs" if any(", " in v for v in evaluated) else "")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title, title_fontsize=8)
    if against == "step" and len(means) > 1 and curves_coincide(means):
        # Otherwise the reader sees one line and wonders where the others went.
        ax.text(1.02, 0.02, f"all {len(means)} curves coincide:\nsame initial weights,\nthe same function",
                transform=ax.transAxes, fontsize=8, va="bottom")  # fmt: skip
    return fig


def curves_coincide(curves: list[tuple[np.ndarray, np.ndarray]], tolerance: float = 1e-4) -> bool:
    """True when every (x, y) curve has the same points as the first, within ``tolerance``."""
    xs, ys = curves[0]
    return all(x.shape == xs.shape and np.allclose(x, xs) and np.allclose(y, ys, rtol=0, atol=tolerance)
               for x, y in curves[1:])  # fmt: skip


def plot_throughput(runs: list[Run], rows: list[dict], out: Path) -> Path:
    """Median tokens/s per variant (over its seeds), with the seeds' min-max as error bars."""
    speeds: dict[str, list[float]] = defaultdict(list)
    kernels = {run.variant: run.kernel for run in runs}
    colour_of = colours(runs)
    for run, row in zip(runs, rows):
        if row["tokens_per_sec"] == row["tokens_per_sec"]:  # not NaN: the run has steps
            speeds[run.variant].append(row["tokens_per_sec"])
    variants = sorted(speeds)
    if not variants:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        ax.text(0.5, 0.5, "no run has taken a step yet", transform=ax.transAxes, ha="center", va="center")
        path = out / "throughput.png"
        save_figure(fig, path)
        return path
    mids = [statistics.median(speeds[v]) for v in variants]
    errors = np.array([[m - min(speeds[v]) for v, m in zip(variants, mids)],
                       [max(speeds[v]) - m for v, m in zip(variants, mids)]])  # fmt: skip
    fig, ax = plt.subplots(figsize=(8, 4.2))
    repeated = any(len(speeds[v]) > 1 for v in variants)
    bars = ax.bar(range(len(variants)), mids, color=[colour_of[v] for v in variants],
                  yerr=errors if repeated else None, capsize=4)  # fmt: skip
    for bar, variant in zip(bars, variants):
        bar.set_hatch("//" if kernels[variant] == "manual" else None)
    ax.bar_label(bars, labels=[f"{m:,.0f}" for m in mids], fontsize=8, padding=2)
    ax.set_xticks(range(len(variants)), [v.replace("/", "\n", 1).replace(", ", "\n") for v in variants], fontsize=8)
    n_seeds = max(len(s) for s in speeds.values())
    ax.set_ylabel("tokens/s (median of steady steps)")
    ax.yaxis.set_major_formatter(lambda value, _: f"{value:,.0f}")
    seeds = f"; bars: median of {n_seeds} seeds, whiskers: min-max" if n_seeds > 1 else ""
    hatched = "; hatched: manual kernel" if "manual" in kernels.values() else ""
    ax.set_title(f"training throughput on {runs[0].info.get('device_name', '?')}{seeds}{hatched}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    path = out / "throughput.png"
    save_figure(fig, path)
    return path
