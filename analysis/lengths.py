"""Past the trained length: ``evaluate.py lengths=[...]`` results as tables and plots, for one run (evaluate.py)
and for a sweep (compare.py: each run's newest result for each way of reading, seeds of a variant averaged)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from analysis.runs import Run, natural_key
from analysis.tables import pyplot, save_figure


def log_binned(losses: list[float], bins: int = 48) -> tuple[list[float], list[float]]:
    """Mean loss over spans of positions equally wide on a log axis of tokens seen (position + 1): early
    positions stay visible, late ones are averaged. Returns the spans' centres and means."""
    values = np.asarray(losses, dtype=float)
    edges = np.unique(np.geomspace(1, len(values) + 1, bins).astype(int))
    centres, means = [], []
    for low, high in zip(edges[:-1], edges[1:]):
        part = values[low - 1 : high - 1]
        if np.isfinite(part).any():
            centres.append(float(np.sqrt(low * (high - 1)) if high - 1 > low else low))
            means.append(float(np.nanmean(part)))
    return centres, means


def draw_by_position(ax, block: int) -> None:
    """The axes of a loss-by-position plot, the trained length marked."""
    ax.axvline(block, color="grey", linestyle=":", label=f"block_size {block} (trained length)")
    ax.set_xscale("log")
    ax.set_xlabel("tokens seen (a token's position + 1)")
    ax.set_ylabel("mean loss (nats per token)")


def plot_run_by_position(rows: list[dict], block: int, path: Path, title: str) -> Path:
    """One run: loss against position, a line per evaluated length."""
    fig, ax = pyplot().subplots(figsize=(8, 4.5))
    for row in rows:
        ax.plot(*log_binned(row["loss_by_position"]), marker=".", markersize=3,
                label=f"{row['length']} tokens ({row['multiple']:g}x)")  # fmt: skip
    draw_by_position(ax, block)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def setting_of(row: dict) -> str:
    """How a length was read: ``chunks, full`` (, and a rotary scaling: ``yarn x4``)."""
    return ", ".join(filter(None, (row["protocol"], row["past_context"], row.get("rope_scaling"))))


def length_results(run: Run) -> list[dict]:
    """The run's evaluate.py results with ``lengths`` (eval-*.json beside its checkpoints): for each way of
    reading (protocol, past context, rotary scaling), the newest."""
    newest: dict[str, tuple[float, dict]] = {}
    for path in run.path.glob("eval-*.json"):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if result.get("lengths"):
            setting, written = setting_of(result["lengths"][0]), path.stat().st_mtime
            if setting not in newest or written > newest[setting][0]:
                newest[setting] = (written, result)
    return [result for _, result in newest.values()]


def length_curves(runs: list[Run]) -> dict[str, dict]:
    """Per curve (variant; protocol, past context, rope scaling): the mean loss at each length and at each
    position of its longest length over the variant's seeds, how many runs, the trained length, a schedule's
    preset and kinds, and the noise at each length (``noise_band``)."""
    grouped: dict[str, list[tuple[dict, int, Run]]] = defaultdict(list)
    for run in runs:
        for result in length_results(run):
            for row in result["lengths"]:
                grouped[f"{run.variant} ({setting_of(row)})"].append((row, result["block_size"], run))
    curves = {}
    for name, entries in sorted(grouped.items(), key=lambda item: natural_key(item[0])):
        by_length: dict[int, list[tuple[dict, int]]] = defaultdict(list)
        for row, _, run in sorted(entries, key=lambda entry: entry[0]["length"]):
            by_length[row["length"]].append((row, run.seed))
        longest = by_length[max(by_length)]
        bands = {length: noise_band(rows) for length, rows in by_length.items()}
        curves[name] = {
            "block": entries[0][1],
            "schedule": entries[0][2].schedule,
            "loss": {length: float(np.mean([row["loss"] for row, _ in rows])) for length, rows in by_length.items()},
            "seeds": max(len(rows) for rows in by_length.values()),
            "band": {length: band[:2] for length, band in bands.items() if band is not None},
            "noise": next((band[2] for band in bands.values() if band is not None), None),
            "by_position": np.nanmean([row["loss_by_position"] for row, _ in longest], axis=0).tolist(),
            "by_position_seeds": seed_means(longest),
        }
    return curves


def seed_means(rows: list[tuple[dict, int]]) -> list[list[float]]:
    """Each seed's loss by position among ``rows`` (each a result's row and its run's seed; runs repeating a seed
    averaged): the seeds' range around a curve of loss by position."""
    by_seed: dict[int, list] = defaultdict(list)
    for row, seed in rows:
        by_seed[seed].append(row["loss_by_position"])
    return [np.nanmean(positions, axis=0).tolist() for positions in by_seed.values()]


SEED_SPREAD, TEXT_NOISE = "seeds", "text"  # what a curve's band measures


def noise_band(rows: list[tuple[dict, int]]) -> tuple[float, float, str] | None:
    """(low, high, what) around a length's mean loss over ``rows`` (each a result's row and its run's seed): where
    several seeds ran, their lowest and highest loss (SEED_SPREAD: runs repeating a seed averaged first); else the
    mean +- the standard error over the text's sequences that evaluate.py measured (TEXT_NOISE: another stretch of
    text would move the loss so much). None where neither is known (results written before the error was kept)."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    for row, seed in rows:
        by_seed[seed].append(row["loss"])
    if len(by_seed) > 1:
        means = [float(np.mean(losses)) for losses in by_seed.values()]
        return min(means), max(means), SEED_SPREAD
    errors = [row.get("loss_se") for row, _ in rows]
    if any(error is None for error in errors):
        return None
    mean, error = float(np.mean([row["loss"] for row, _ in rows])), float(np.mean(errors))
    return mean - error, mean + error, TEXT_NOISE


def noise_text(curve: dict) -> str:
    """A curve's noise in the table: its band's largest width over its lengths, and what it measures."""
    widths = [high - low for low, high in curve["band"].values()]
    if not widths:
        return "-"
    if curve["noise"] == SEED_SPREAD:
        return f"{max(widths):.4f} (seeds' range)"
    return f"±{max(widths) / 2:.4f} (s.e., text)"


def lengths_table(curves: dict[str, dict]) -> str:
    """Markdown: a row per curve, the mean loss at each evaluated length (x its trained length), and its noise
    (``noise_text``): a difference between rows below it ranks nothing."""
    lengths = sorted({length for curve in curves.values() for length in curve["loss"]})
    head = ["variant (protocol, past context, rope scaling)", "seeds", "noise", *(f"{length}" for length in lengths)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, curve in curves.items():
        cells = [f"{curve['loss'][length]:.4f}" if length in curve["loss"] else "" for length in lengths]
        lines.append(f"| {name} | {curve['seeds']} | {noise_text(curve)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_loss_vs_length(curves: dict[str, dict], out: Path) -> Path:
    """``loss_vs_length.png`` (``loss_vs_length_figure``)."""
    return save_figure(loss_vs_length_figure(curves), out / "loss_vs_length.png")


def loss_vs_length_figure(curves: dict[str, dict]):
    """Loss against evaluation length, a line per curve with its noise as a band (the seeds' range, or the text's
    standard error: ``noise_band``), each run's trained length marked. The band keeps a spread of a few thousandths
    of a nat, which the axis would otherwise fill, from reading as a ranking."""
    fig, ax = pyplot().subplots(figsize=(11, 5))
    for name, curve in curves.items():
        style = curve_style(name, curves)
        ax.plot(list(curve["loss"]), list(curve["loss"].values()), label=shown(name, curve), markersize=4, **style)
        if curve["band"]:
            lengths = list(curve["band"])
            ax.fill_between(lengths, [curve["band"][n][0] for n in lengths], [curve["band"][n][1] for n in lengths],
                            color=style["color"], alpha=BAND_ALPHA, lw=0)  # fmt: skip
    for block in sorted({curve["block"] for curve in curves.values()}):
        ax.axvline(block, color="grey", linestyle=":", label=f"block_size {block} (trained length)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("validation loss (nats per token)")
    ax.set_title("Loss past the trained length (evaluate.py lengths=...)", fontsize=10)
    legend(ax, curves, band_entries({curve["noise"] for curve in curves.values() if curve["band"]}))
    return fig


BAND_ALPHA = 0.2


def band_entries(drawn: set[str]) -> list:
    """The legend's entries that say what the ``drawn`` bands are (SEED_SPREAD, TEXT_NOISE): the seeds' range, and
    the text's standard error with the noise it leaves out (the seed's, which may be the larger)."""
    from matplotlib.patches import Patch

    texts = {SEED_SPREAD: "band: lowest to highest seed",
             TEXT_NOISE: "band: ±1 standard error over the text's\nsequences (another stretch of text); the\n"
                         "seed-to-seed noise, not measured here,\nmay be larger: trainer.seed=1,2,3"}
    return [Patch(color="grey", alpha=BAND_ALPHA, label=texts[what]) for what in (SEED_SPREAD, TEXT_NOISE)
            if what in drawn]  # fmt: skip


def shown(name: str, curve: dict) -> str:
    """A curve's legend entry: its name, under a schedule's preset and kinds (``kimi_linear: KKKM, K=kda,
    M=mla/sdpa``), which its label, led by the model's layout and kernel, does not say."""
    return f"{curve['schedule']}\n{name}" if curve.get("schedule") else name


def curve_style(name: str, curves: dict[str, dict]) -> dict:
    """A colour per variant; a line style per protocol (chunks solid, sliding dashed), a marker per past context
    (full: circles, ring: squares): a curve is told apart by its three parts, not by the colour cycle."""
    variants = list(dict.fromkeys(curve.split(" (")[0] for curve in curves))
    setting = name.split(" (", 1)[1] if " (" in name else ""
    return {"color": f"C{variants.index(name.split(' (')[0]) % 10}",
            "linestyle": "--" if setting.startswith("sliding") else "-",
            "marker": "s" if ", ring" in setting else "o"}  # fmt: skip


def legend(ax, curves: dict[str, dict], extra: list = ()) -> None:
    """Beside the axes: a line per curve, or, where that would be longer than a few and every curve's way of
    reading is a protocol and a past context, a colour per variant, a line style per protocol and a marker per
    past context (a sweep of 6 variants read 4 ways: 12 entries, not 24)."""
    settings = [name.split(" (", 1)[1].rstrip(")") if " (" in name else "" for name in curves]
    if len(curves) <= 6 or any(setting.count(",") != 1 for setting in settings):
        ax.legend(handles=[*ax.get_legend_handles_labels()[0], *extra], fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0))  # fmt: skip
        return
    from matplotlib.lines import Line2D

    variants = list(dict.fromkeys(name.split(" (")[0] for name in curves))
    protocols = list(dict.fromkeys(setting.split(", ")[0] for setting in settings))
    contexts = list(dict.fromkeys(setting.split(", ")[1] for setting in settings))
    schedules = {name.split(" (")[0]: curve.get("schedule") for name, curve in curves.items()}
    handles = [Line2D([], [], color=f"C{i % 10}", label=shown(variant, {"schedule": schedules[variant]}))
               for i, variant in enumerate(variants)]  # fmt: skip
    handles += [Line2D([], [], color="grey", linestyle="--" if p == "sliding" else "-", label=f"protocol={p}")
                for p in protocols]  # fmt: skip
    handles += [Line2D([], [], color="grey", linestyle="", marker="s" if c == "ring" else "o",
                       label=f"past_context={c}") for c in contexts]  # fmt: skip
    handles += [h for h in ax.get_legend_handles_labels()[0] if h.get_label().startswith("block_size")]
    ax.legend(handles=[*handles, *extra], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot_sweep_by_position(curves: dict[str, dict], out: Path) -> Path:
    """``loss_by_position.png`` (``sweep_by_position_figure``)."""
    return save_figure(sweep_by_position_figure(curves), out / "loss_by_position.png")


def sweep_by_position_figure(curves: dict[str, dict]):
    """Loss against position over each curve's longest evaluated length, overlaid; where several seeds ran, their
    range as a band (as ``loss_vs_length.png``'s: what differs within it ranks nothing)."""
    fig, ax = pyplot().subplots(figsize=(11, 5))
    for name, curve in curves.items():
        style = curve_style(name, curves)
        ax.plot(*log_binned(curve["by_position"]), markersize=3,
                label=shown(f"{name}, {len(curve['by_position'])} tokens", curve), **style)  # fmt: skip
        seeds = curve.get("by_position_seeds") or []
        if len(seeds) > 1:
            centres, binned = log_binned(seeds[0])[0], [log_binned(seed)[1] for seed in seeds]
            ax.fill_between(centres, np.min(binned, axis=0), np.max(binned, axis=0), color=style["color"],
                            alpha=BAND_ALPHA, lw=0)  # fmt: skip
    draw_by_position(ax, min(curve["block"] for curve in curves.values()))
    ax.set_title("Loss by position over the longest evaluated length", fontsize=10)
    seeded = any(len(curve.get("by_position_seeds") or []) > 1 for curve in curves.values())
    legend(ax, curves, band_entries({SEED_SPREAD} if seeded else set()))
    return fig
