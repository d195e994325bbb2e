"""PNG plots of a comparison: validation loss against steps and wall time, throughput bars."""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from analysis.runs import Run
from analysis.tables import save_figure


def label(run: Run) -> str:
    return f"{run.layout}/{run.kernel} seed {run.seed}"


def plot_val_loss(runs: list[Run], out: Path, against: str) -> Path:
    """``against``: "step" or "time" (training seconds, evaluation excluded)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = itertools.cycle(["-", "--", ":", "-."])
    for run in runs:
        at = run.training_seconds()
        xs = [e["step"] if against == "step" else at.get(e["step"], float("nan")) for e in run.evals]
        ax.plot(xs, [e["val/loss"] for e in run.evals], next(styles), marker="o", ms=3, label=label(run))
    ax.set_xlabel("step" if against == "step" else "training time (s; compile and warm-up steps excluded)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.set_title(f"validation loss vs {'steps' if against == 'step' else 'wall time'}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    path = out / f"val_loss_vs_{against}.png"
    save_figure(fig, path)
    return path


def plot_throughput(runs: list[Run], rows: list[dict], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    names = [label(r) for r in runs]
    values = [row["tokens_per_sec"] for row in rows]
    bars = ax.bar(range(len(names)), values, color=["C0" if r.kernel == "sdpa" else "C1" for r in runs])
    ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s (median after warm-up)")
    ax.legend(handles=[Patch(color="C0", label="sdpa kernel"), Patch(color="C1", label="manual kernel")], fontsize=8)
    ax.set_title(f"training throughput ({runs[0].info.get('device_name', '?')})", fontsize=9)
    path = out / "throughput.png"
    save_figure(fig, path)
    return path
