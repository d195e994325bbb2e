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
    position of its longest length over the variant's seeds, how many seeds, the trained length and a schedule's
    preset and kinds."""
    grouped: dict[str, list[tuple[dict, int, Run]]] = defaultdict(list)
    for run in runs:
        for result in length_results(run):
            for row in result["lengths"]:
                grouped[f"{run.variant} ({setting_of(row)})"].append((row, result["block_size"], run))
    curves = {}
    for name, entries in sorted(grouped.items(), key=lambda item: natural_key(item[0])):
        by_length: dict[int, list[dict]] = defaultdict(list)
        for row, _, _ in entries:
            by_length[row["length"]].append(row)
        longest = by_length[max(by_length)]
        curves[name] = {
            "block": entries[0][1],
            "schedule": entries[0][2].schedule,
            "loss": {length: float(np.mean([r["loss"] for r in rows])) for length, rows in sorted(by_length.items())},
            "seeds": max(len(rows) for rows in by_length.values()),
            "by_position": np.nanmean([r["loss_by_position"] for r in longest], axis=0).tolist(),
        }
    return curves


def lengths_table(curves: dict[str, dict]) -> str:
    """Markdown: a row per curve, the mean loss at each evaluated length (x its trained length)."""
    lengths = sorted({length for curve in curves.values() for length in curve["loss"]})
    head = ["variant (protocol, past context, rope scaling)", "seeds", *(f"{length}" for length in lengths)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, curve in curves.items():
        cells = [f"{curve['loss'][length]:.4f}" if length in curve["loss"] else "" for length in lengths]
        lines.append(f"| {name} | {curve['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_loss_vs_length(curves: dict[str, dict], out: Path) -> Path:
    """Loss against evaluation length, a line per curve, each run's trained length marked."""
    fig, ax = pyplot().subplots(figsize=(11, 5))
    for name, curve in curves.items():
        style = curve_style(name, curves)
        ax.plot(list(curve["loss"]), list(curve["loss"].values()), label=shown(name, curve), markersize=4, **style)
    for block in sorted({curve["block"] for curve in curves.values()}):
        ax.axvline(block, color="grey", linestyle=":", label=f"block_size {block} (trained length)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens)")
    ax.set_ylabel("validation loss (nats per token)")
    ax.set_title("Loss past the trained length (evaluate.py lengths=...)", fontsize=10)
    legend(ax, curves)
    return save_figure(fig, out / "loss_vs_length.png")


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


def legend(ax, curves: dict[str, dict]) -> None:
    """Beside the axes: a line per curve, or, where that would be longer than a few and every curve's way of
    reading is a protocol and a past context, a colour per variant, a line style per protocol and a marker per
    past context (a sweep of 6 variants read 4 ways: 12 entries, not 24)."""
    settings = [name.split(" (", 1)[1].rstrip(")") if " (" in name else "" for name in curves]
    if len(curves) <= 6 or any(setting.count(",") != 1 for setting in settings):
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
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
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def plot_sweep_by_position(curves: dict[str, dict], out: Path) -> Path:
    """Loss against position over each curve's longest evaluated length, overlaid."""
    fig, ax = pyplot().subplots(figsize=(11, 5))
    for name, curve in curves.items():
        ax.plot(*log_binned(curve["by_position"]), markersize=3,
                label=shown(f"{name}, {len(curve['by_position'])} tokens", curve),
                **curve_style(name, curves))  # fmt: skip
    draw_by_position(ax, min(curve["block"] for curve in curves.values()))
    ax.set_title("Loss by position over the longest evaluated length", fontsize=10)
    legend(ax, curves)
    return save_figure(fig, out / "loss_by_position.png")
