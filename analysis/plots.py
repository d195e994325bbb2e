"""PNG plots of a comparison: validation loss against steps and training time, throughput bars.

One colour per layout (or, where variants of a layout differ in more than the
kernel, one per key/value heads, window or SDPA backend), one marker per layout
and one line style per kernel, whatever the number of runs; the seeds of a
variant are aggregated (the mean line, a band from the lowest to the highest
seed) and the throughput bars carry the seeds' spread. Legends sit outside the
data; curves that lie on each other are named beside the legend.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from analysis.report import SPEED_CAUTION
from analysis.runs import Run, natural_key
from analysis.tables import save_figure
from common.optim_label import LABEL_PARTS as OPTIM_LABEL_PARTS
from model.config import label_parts
from model.registry import KERNELS, MIXERS

Curve = tuple[np.ndarray, np.ndarray]  # a line's (x, y) points

# How pale a curve or bar is drawn whose speed is not its variant's own (the report's SPEED_CAUTION)
NOT_COMPARABLE_ALPHA = 0.4
# Each layout and kernel states its own style (model/attention/layouts.py, model/attention/kernels.py); a run of a
# layout or kernel this checkout does not know is drawn in these.
UNKNOWN_COLOUR, UNKNOWN_MARKER, UNKNOWN_LINE = "tab:gray", "o", ":"


def colour(layout: str) -> str:
    return MIXERS[layout].colour if layout in MIXERS else UNKNOWN_COLOUR


def marker(layout: str) -> str:
    return MIXERS[layout].marker if layout in MIXERS else UNKNOWN_MARKER


def line_style(kernel: str) -> str:
    return KERNELS[kernel].line_style if kernel in KERNELS else UNKNOWN_LINE


def hatch(kernel: str) -> str | None:
    return KERNELS[kernel].hatch if kernel in KERNELS else None


def by_variant(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by variant (its seeds together), in name order (numbers as numbers: kv4 before kv12)."""
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        groups[run.variant].append(run)
    return dict(sorted(groups.items(), key=lambda item: natural_key(item[0])))


def by_curve(runs: list[Run]) -> dict[str, list[Run]]:
    """``by_variant``, but a variant trained on several token budgets (a sweep compared with --force) is a curve
    per budget, named with it (``fused_qkv-sdpa (6,400 tokens)``): a mean over different schedules is no run's."""
    curves: dict[str, list[Run]] = {}
    for variant, group in by_variant(runs).items():
        budgets = sorted({run.token_budget or 0 for run in group})
        for budget in budgets:
            name = variant if len(budgets) == 1 else f"{variant} ({budget:,} tokens)"
            curves[name] = [run for run in group if (run.token_budget or 0) == budget]
    return curves


def colours(runs: list[Run]) -> dict[str, str]:
    """A colour per variant: its layout's, unless variants of one layout differ in more than the kernel
    (key/value heads, window, SDPA backend): then a colour per what follows the layout in the label
    (``sdpa-kv2``), shared by the layouts, whose markers tell them apart."""
    variants = {run.variant: (run.layout, run.kernel) for run in runs}
    if len(variants) == len(set(variants.values())):
        return {variant: colour(layout) for variant, (layout, _) in variants.items()}
    rest = {variant: variant.removeprefix(f"{layout}-") for variant, (layout, _) in variants.items()}
    order = sorted(set(rest.values()), key=natural_key)
    palette = plt.get_cmap("tab10" if len(order) <= 10 else "tab20").colors
    return {variant: palette[order.index(r) % len(palette)] for variant, r in rest.items()}


def _curve(run: Run, against: str) -> dict[int, tuple[float, float]]:
    at = run.training_seconds()
    return {e["step"]: (e["step"] if against == "step" else at.get(e["step"], float("nan")), e["val/loss"])
            for e in run.evals}  # fmt: skip


def plot_val_loss(runs: list[Run], out: Path, against: str, cautioned: Mapping[str, str] = MappingProxyType({})
                  ) -> Path:  # fmt: skip
    """``against``: "step" or "time" (training seconds: evaluation, compilation and warm-up excluded)."""
    path = out / f"val_loss_vs_{against}.png"
    save_figure(val_loss_figure(runs, against, cautioned), path)
    return path


def val_loss_figure(runs: list[Run], against: str, cautioned: Mapping[str, str] = MappingProxyType({})):
    """One line per variant; a sweep in progress draws what its runs evaluated so far (at each step, the
    seeds that reached it). Curves that lie on each other are named in a note (identical initial weights make
    every layout the same function); where only some do, they are drawn as rims of decreasing width. Against
    time, a variant whose speed is not its own (``cautioned``: the variant and why, ``speed_cautions``) is pale,
    as its throughput bar is, and its legend entry carries the mark and says why: its place on the time axis
    ranks nothing. A schedule's entry says its preset and kinds above its label."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    evaluated = by_curve([run for run in runs if run.evals])
    colour_of = colours(runs)
    lines = {}
    for variant, group in evaluated.items():
        curves = [_curve(run, against) for run in group]
        steps = sorted(set().union(*curves))
        xs = np.array([statistics.fmean(c[s][0] for c in curves if s in c) for s in steps])
        points = [[c[s][1] for c in curves if s in c] for s in steps]
        lines[variant] = (xs, np.array([statistics.fmean(p) for p in points]), points)
    groups = coinciding_groups({v: (xs, mean) for v, (xs, mean, _) in lines.items()})
    halo = {} if len(groups) == 1 and len(groups[0]) == len(lines) else halo_widths(groups)  # all alike: the note
    pale = {variant for variant, group in evaluated.items() if against == "time" and group[0].variant in cautioned}
    for variant, (xs, mean, points) in lines.items():
        group = evaluated[variant]
        mark = f" {SPEED_CAUTION} {cautioned[group[0].variant]}" if variant in pale else ""
        alpha = NOT_COMPARABLE_ALPHA if variant in pale else None
        ax.plot(xs, mean, line_style(group[0].kernel), color=colour_of[group[0].variant],
                marker=marker(group[0].layout), ms=4 + halo.get(variant, 0), lw=1.5 + halo.get(variant, 0),
                alpha=alpha, label=legend_name(f"{variant}{runs_note(group)}{mark}", group[0]))  # fmt: skip
        if len(group) > 1:
            ax.fill_between(xs, [min(p) for p in points], [max(p) for p in points], color=colour_of[group[0].variant],
                            alpha=0.15 * (alpha or 1), lw=0)  # fmt: skip
    ax.set_xlabel("step" if against == "step" else "training time (s; evaluation, compilation, warm-up excluded)")
    if against == "step":  # a short run's few evaluations would otherwise be spaced at steps 2.25, 2.5, ...
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("validation loss (nats/token)")
    spread = " (line: mean over runs, band: min-max)" if any(len(g) > 1 for g in evaluated.values()) else ""
    caution = (f"\n{SPEED_CAUTION} pale: not the variant's own speed, so its place in time ranks nothing (why: "
               f"in its legend entry; the report's flag in full)" if pale else "")  # fmt: skip
    ax.set_title(f"validation loss vs {'steps' if against == 'step' else 'training time'}{spread}{caution}",
                 fontsize=10)  # fmt: skip
    ax.grid(alpha=0.3)
    if not evaluated:
        ax.text(0.5, 0.5, "no run has been evaluated yet", transform=ax.transAxes, ha="center", va="center")
        return fig
    legend = ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                       title=legend_title(map(label_of, evaluated)) + SCHEDULE_TITLE * any(
                           group[0].schedule for group in evaluated.values()),
                       title_fontsize=8, handlelength=3.5)  # fmt: skip
    note = coincide_note(groups, len(lines))
    if note:  # otherwise the reader counts the legend's entries, sees fewer lines, and wonders where they went
        ax.text(1.02, 0.0, note, transform=ax.transAxes, fontsize=8, va="bottom")
    # The figure widened by the legend's width: long labels (a schedule's, DDDG_D.gated_deltanet.nopos_G) would
    # otherwise squeeze the plot to a third of its width.
    fig.canvas.draw()
    fig.set_size_inches(fig.get_figwidth() + legend.get_window_extent().width / fig.dpi, fig.get_figheight())
    return fig


def legend_name(name: str, run: Run) -> str:
    """A curve's legend entry: its name; a schedule's is its preset and kinds (``kimi_linear: KKKM, K=kda,
    M=mla/sdpa``), which its label, led by the model's layout and kernel, does not say, above the label's parts
    that line does not say already (``beside_schedule``)."""
    if not run.schedule:
        return name
    label = re.match(r"[^ ,]+", name).group()  # then a token budget, the runs it averages, a mark
    rest = beside_schedule(label)
    return f"{run.schedule}{chr(10) if rest else ''}{rest}{name[len(label):]}"


SCHEDULE_PART = r"[A-Z]+(_[A-Z][\w.]*)+"  # a label's schedule part: KKKM_K.kda_M.mla
KIND_START = r"_(?=[A-Z](?:[._]|$))"  # the underscores before a kind's letter, not those inside a value


def beside_schedule(variant: str) -> str:
    """A schedule's label less what its preset-and-kinds line says (the layout and kernel it leads with, the
    pattern, each kind's layout), so a legend entry or a bar does not say them twice: ``latent64-nopos`` under
    ``kimi_linear: KKKM, K=kda, M=mla/sdpa`` for ``mla-sdpa-latent64-nopos-KKKM_K.kda_M.mla``; what a kind sets
    besides its layout stays (``K.window128``)."""
    layouts = "|".join(sorted(map(re.escape, MIXERS), key=len, reverse=True))
    kept = []
    for part in variant.split("-")[2:]:
        if not re.fullmatch(SCHEDULE_PART, part):
            kept.append(part)
            continue
        for kind in re.split(KIND_START, part)[1:]:
            rest = re.sub(rf"^([A-Z])\.(?:{layouts})(?=\.|$)", r"\1", kind)
            if rest != kind[0]:
                kept.append(rest)
    return "-".join(kept)


def runs_note(group: list[Run]) -> str:
    """What a legend entry's line averages: its distinct seeds (``, 3 seeds``), and its runs where some repeat a
    seed (``, 3 runs of seed 1``; ``, 4 runs, 2 seeds``); "" for one run."""
    seeds = sorted({run.seed for run in group})
    if len(group) == 1:
        return ""
    if len(seeds) == len(group):
        return f", {len(seeds)} seeds"
    if len(seeds) == 1:
        return f", {len(group)} runs of seed {seeds[0]}"
    return f", {len(group)} runs, {len(seeds)} seeds"


def seeds_only(runs: list[Run]) -> bool:
    """Whether every run of a variant has a seed of its own (no run repeats another's seed)."""
    return all(len({run.seed for run in group}) == len(group) for group in by_variant(runs).values())


def halo_widths(groups: list[list[str]]) -> dict[str, float]:
    """Extra line width for each curve that coinciding curves are drawn over: the first drawn is the widest,
    so that each shows as a rim around the next."""
    widths = {}
    for group in groups:
        step = min(2.5, 5.0 / (len(group) - 1))
        widths.update({v: step * (len(group) - 1 - i) for i, v in enumerate(group)})
    return widths


def label_of(curve: str) -> str:
    """The run label a curve's name starts with (``by_curve`` may add the token budget after a space)."""
    return curve.split(" ", 1)[0]


# A legend's title where a curve is a schedule's: what the line above its label says (legend_name)
SCHEDULE_TITLE = "\na schedule: [<preset>: ]<pattern>, <kind>=<layout>[/<kernel>] above its label's other parts"


def legend_title(variants) -> str:
    """What a label's parts are: ``layout-kernel``, then those the variants have: ``-kv<key/value heads>``,
    ``-latent<dims>``, ``-window<positions>``, ``-<position>``, ``-qknorm``, ``-softcap<cap>``, ``-sinks``; then the
    optimizer's and the schedule's where not AdamW and cosine (``-<optimizer>``, ``-<lr schedule>``)."""
    parts = [part for variant in variants for part in variant.split("-")[2:]]
    return "layout-kernel" + "".join(title for pattern, title in (*label_parts(), *OPTIM_LABEL_PARTS)
                                     if any(re.fullmatch(pattern, p) for p in parts))  # fmt: skip


def coinciding_groups(curves: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[list[str]]:
    """The sets of (two or more) curves that lie on each other, in drawing order: each point of one is a point of
    another (a run that stopped early or is still going lies on a longer curve up to where it got)."""
    groups: list[list[str]] = []
    for name, curve in curves.items():
        match = next((g for g in groups
                      if any(lies_on(curve, curves[m]) or lies_on(curves[m], curve) for m in g)), None)  # fmt: skip
        if match is None:
            groups.append([name])
        else:
            match.append(name)
    return [g for g in groups if len(g) > 1]


def lies_on(curve: Curve, other: Curve, tolerance: float = 1e-4) -> bool:
    """True when every (x, y) point of ``curve`` is a point of ``other`` (y within ``tolerance``): drawn after it,
    ``other`` hides ``curve`` entirely."""
    (xs, ys), (other_xs, other_ys) = curve, other
    if len(xs) == 0 or len(xs) > len(other_xs):
        return False
    for x, y in zip(xs, ys):
        at = np.flatnonzero(np.isclose(other_xs, x))
        if len(at) == 0 or not abs(other_ys[at[0]] - y) <= tolerance:
            return False
    return True


def coincide_note(groups: list[list[str]], n_curves: int) -> str:
    """The note beside the legend that says which curves lie on each other ("" when none do), and why: layouts
    of the same options compute the same function; variants whose options differ (a softcap no score reached)
    computed the same numbers here, but are not the same function."""
    if not groups:
        return ""
    same = all(len({tuple(label_of(v).split("-")[2:]) for v in g}) == 1 for g in groups)
    why = "the same function" if same else "options that changed\nnothing in these runs"
    if len(groups) == 1 and len(groups[0]) == n_curves:
        return f"all {n_curves} curves coincide:\nsame initial weights,\n{why}"
    pairs = "\n".join(" = ".join(g) for g in groups)
    return f"curves that coincide (same initial\nweights, {why}),\ndrawn on each other:\n{pairs}"


def curves_coincide(curves: list[tuple[np.ndarray, np.ndarray]], tolerance: float = 1e-4) -> bool:
    """True when every (x, y) curve has the same points as the first, within ``tolerance``."""
    xs, ys = curves[0]
    return all(x.shape == xs.shape and np.allclose(x, xs) and np.allclose(y, ys, rtol=0, atol=tolerance)
               for x, y in curves[1:])  # fmt: skip


def plot_throughput(runs: list[Run], rows: list[dict], out: Path) -> Path:
    """Median tokens/s per variant (over its seeds), with the seeds' min-max as error bars."""
    path = out / "throughput.png"
    save_figure(throughput_figure(runs, rows), path)
    return path


def tick_label(variant: str, schedule: str | None = None) -> str:
    """A label's parts a line each, and a schedule's kinds each on a line of its own (``DDDG_D.gated_deltanet_G``:
    three lines), so that long labels side by side do not run into each other. A schedule's preset and kinds
    (``kimi_linear: KKKM, K=kda, M=mla/sdpa``) take the place of the layout and kernel its label leads with."""
    parts = variant.split("-")
    if schedule:  # the label's other parts, as a legend entry gives them (``beside_schedule``)
        return "\n".join([*schedule.split(", "), *filter(None, beside_schedule(variant).split("-"))])
    return "\n".join(re.sub(KIND_START, "\n", p) if re.fullmatch(SCHEDULE_PART, p) else p for p in parts)


def throughput_figure(runs: list[Run], rows: list[dict]):
    """A bar per variant; a variant with a run whose speed is not its own (``speed_caution`` in its row: it shared
    its machine, a busy machine, another split of the batch) is pale and its figure carries the table's mark."""
    speeds: dict[str, list[float]] = defaultdict(list)
    kernels = {run.variant: run.kernel for run in runs}
    colour_of = colours(runs)
    shared = {run.variant for run, row in zip(runs, rows) if row.get("speed_caution")}
    for run, row in zip(runs, rows):
        if row["tokens_per_sec"] == row["tokens_per_sec"]:  # not NaN: the run has steps
            speeds[run.variant].append(row["tokens_per_sec"])
    variants = sorted(speeds, key=natural_key)
    if not variants:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        ax.text(0.5, 0.5, "no run has taken a step yet", transform=ax.transAxes, ha="center", va="center")
        return fig
    mids = [statistics.median(speeds[v]) for v in variants]
    errors = np.array([[m - min(speeds[v]) for v, m in zip(variants, mids)],
                       [max(speeds[v]) - m for v, m in zip(variants, mids)]])  # fmt: skip
    schedules = {run.variant: run.schedule for run in runs}
    ticks = [tick_label(v, schedules[v]) for v in variants]
    # taller for ticks of many lines (a schedule's), so that the bars keep their height
    fig, ax = plt.subplots(figsize=(8, 4.2 + 0.12 * max(0, max(t.count("\n") for t in ticks) - 3)))
    repeated = any(len(speeds[v]) > 1 for v in variants)
    bars = ax.bar(range(len(variants)), mids, color=[colour_of[v] for v in variants],
                  yerr=errors if repeated else None, capsize=4)  # fmt: skip
    for bar, variant in zip(bars, variants):
        bar.set_hatch(hatch(kernels[variant]))
        bar.set_alpha(NOT_COMPARABLE_ALPHA if variant in shared else 1.0)
    marks = [f" {SPEED_CAUTION}" if v in shared else "" for v in variants]
    ax.bar_label(bars, labels=[f"{m:,.0f}{mark}" for m, mark in zip(mids, marks)], fontsize=8, padding=2)
    ax.set_xticks(range(len(variants)), ticks, fontsize=8)
    ax.set_ylabel("tokens/s (median of steady steps)")
    ax.margins(y=0.12)  # room above the tallest bar for its figure
    ax.yaxis.set_major_formatter(lambda value, _: f"{value:,.0f}")
    counts = f"; bars: median of each variant's {'seeds' if seeds_only(runs) else 'runs'}, whiskers: min-max"
    hatched_kernels = sorted({k for k in kernels.values() if hatch(k)})
    plural = "s" if len(hatched_kernels) > 1 else ""
    hatched = f"; hatched: {' and '.join(hatched_kernels)} kernel{plural}" if hatched_kernels else ""
    caution = (f"\n{SPEED_CAUTION} pale: not the variant's own speed (the report's flag says why: another run or a "
               f"busy machine shared the cores, another split of the batch)" if shared else "")  # fmt: skip
    ax.set_title(f"training throughput on {runs[0].info.get('device_name', '?')}{counts if repeated else ''}"
                 f"{hatched}{caution}", fontsize=9)  # fmt: skip
    ax.grid(axis="y", alpha=0.3)
    return fig
