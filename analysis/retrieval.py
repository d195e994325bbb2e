"""Retrieval accuracy (``evaluate.py retrieval=[passkey,mqar]``) as a table and a heatmap: depth against length,
one panel per task."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis.tables import pyplot, save_figure


def grid(rows: list[dict], task: str) -> tuple[list[int], list[float], np.ndarray]:
    """A task's lengths, depths, and accuracy[depth, length] (NaN where not evaluated)."""
    mine = [row for row in rows if row["task"] == task]
    lengths = sorted({row["length"] for row in mine})
    depths = sorted({row["depth"] for row in mine})
    cells = np.full((len(depths), len(lengths)), np.nan)
    for row in mine:
        cells[depths.index(row["depth"]), lengths.index(row["length"])] = row["accuracy"]
    return lengths, depths, cells


def tasks_of(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["task"] for row in rows))


def retrieval_table(rows: list[dict], block: int) -> str:
    """Per task, the accuracy (%) at each depth (rows) and length (columns)."""
    lines = []
    for task in tasks_of(rows):
        lengths, depths, cells = grid(rows, task)
        asked = {row["asked"] for row in rows if row["task"] == task}
        lines += [f"{task}: accuracy (%), {'/'.join(map(str, sorted(asked)))} answers per cell", ""]
        lines.append("| depth | " + " | ".join(f"{n} ({n / block:g}x)" for n in lengths) + " |")
        lines.append("|" + " --- |" * (len(lengths) + 1))
        for i, depth in enumerate(depths):
            lines.append(f"| {depth:g} | " + " | ".join(f"{100 * v:.0f}" for v in cells[i]) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


def plot_retrieval(rows: list[dict], block: int, path: Path, title: str) -> Path:
    """A heatmap per task: accuracy by depth (rows, 0 at the top) and length (columns), the trained length's
    column edge marked."""
    tasks = tasks_of(rows)
    fig, axes = pyplot().subplots(1, len(tasks), figsize=(1.6 + 4.2 * len(tasks), 3.8), squeeze=False,
                                   layout="constrained")  # fmt: skip
    for ax, task in zip(axes[0], tasks):
        lengths, depths, cells = grid(rows, task)
        percent = 100 * cells
        image = ax.imshow(percent, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        for (i, j), value in np.ndenumerate(percent):
            if value == value:
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=8,
                        color="black" if value > 60 else "white")  # fmt: skip
        ax.set_xticks(range(len(lengths)), [f"{n}\n{n / block:g}x" for n in lengths], fontsize=8)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=8)
        trained = sum(n <= block for n in lengths)
        if 0 < trained < len(lengths):
            ax.axvline(trained - 0.5, color="white", linestyle="--", linewidth=1.5)
        ax.set_xlabel(f"sequence length in tokens (dashed: past block_size {block})", fontsize=9)
        if ax is axes[0][0]:
            ax.set_ylabel("depth of the fact (0: start, 1: just before the question)", fontsize=8)
        ax.set_title(task, fontsize=10)
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy (%)", fraction=0.04)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path)
