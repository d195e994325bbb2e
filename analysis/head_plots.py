"""PNG figures of per-head studies: attention-map grids, a single-head zoom, per-head heatmaps."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from analysis.tables import format_cell, save_figure  # noqa: E402

SINGLE_LABELED_TOKENS = 64  # up to this many tokens, the enlarged map's axes carry every token; beyond, every k-th
SPARSE_TICKS = 48  # beyond that, about this many ticks, each the token and its position
GRID_LABELED_TOKENS = 24  # every token on the axes of the small maps of the grid, up to this many


def token_label(text: str) -> str:
    return text.replace("\n", "⏎").replace(" ", "·").replace("\t", "→") or "∅"


def one_line(text: str, limit: int = 100) -> str:
    """A text for a title: line breaks and tabs shown, cut at ``limit`` characters."""
    shown = text.replace("\n", "⏎").replace("\t", "→")
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _label_axes(ax, labels: list[str] | None, fontsize: int, every_token_up_to: int) -> None:
    """Tokens as tick labels on both axes: each of them for a short text, every k-th (with its position) beyond."""
    if labels is None:
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if len(labels) <= every_token_up_to:
        ticks, names = range(len(labels)), labels
    else:
        ticks = range(0, len(labels), math.ceil(len(labels) / SPARSE_TICKS))
        names = [f"{i} {labels[i]}" for i in ticks]
    ax.set_xticks(ticks, names, rotation=90, fontsize=fontsize)
    ax.set_yticks(ticks, names, fontsize=fontsize)


def _wrapped(title: str, width: int) -> str:
    """Each line of ``title`` wrapped at ``width`` characters."""
    return "\n".join(textwrap.fill(line, width) for line in title.split("\n"))


def plot_map_grid(maps: torch.Tensor, labels: list[str] | None, path: Path, title: str,
                  sink_share: torch.Tensor | None = None) -> Path:  # fmt: skip
    """maps: (n_layer, n_head, T, T) for one text; ``sink_share`` (n_layer, n_head), for a model with sinks: the
    mean weight each head's sink took, in the head's title."""
    n_layer, n_head = maps.shape[:2]
    labeled = labels is not None and len(labels) <= GRID_LABELED_TOKENS
    size = 3.0 if labeled else 2.2
    fig, axes = plt.subplots(n_layer, n_head, figsize=(size * n_head + 1.0, size * n_layer + 0.6), squeeze=False,
                             layout="constrained")  # fmt: skip
    image = None
    for layer in range(n_layer):
        for head in range(n_head):
            ax = axes[layer][head]
            image = ax.imshow(maps[layer, head].float().numpy(), cmap="viridis", vmin=0, vmax=1)
            _label_axes(ax, labels if labeled else None, fontsize=5, every_token_up_to=GRID_LABELED_TOKENS)
            sink = f", sink {sink_share[layer, head]:.2f}" if sink_share is not None else ""
            ax.set_title(f"L{layer} H{head}{sink}", fontsize=8)
    for layer in range(n_layer):
        axes[layer][0].set_ylabel("query", fontsize=7)
    for head in range(n_head):
        axes[-1][head].set_xlabel("key", fontsize=7)
    fig.colorbar(image, ax=axes, fraction=0.02, label="attention weight")
    fig.suptitle(_wrapped(title, 110), fontsize=9)
    save_figure(fig, path)
    return path


def plot_single_map(weights: torch.Tensor, labels: list[str] | None, path: Path, title: str) -> Path:
    save_figure(single_map_figure(weights, labels, title), path)
    return path


def single_map_figure(weights: torch.Tensor, labels: list[str] | None, title: str):
    """One head's (T, T) map, large: the tokens on both axes (the figure grows with them), ``title`` above."""
    side = min(13.0, max(6.5, 0.16 * len(weights) + 2.0))
    fig, ax = plt.subplots(figsize=(side, side - 0.5))
    image = ax.imshow(weights.float().numpy(), cmap="viridis", vmin=0, vmax=1)
    _label_axes(ax, labels, fontsize=7, every_token_up_to=SINGLE_LABELED_TOKENS)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query (attending)")
    ax.set_title(_wrapped(title, int(side * 13)), fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046, label="attention weight")
    return fig


def plot_head_heatmaps(values: dict[str, torch.Tensor], path: Path, title: str, cmap: str = "magma") -> Path:
    """One (n_layer x n_head) heatmap per named value, annotated."""
    fig, axes = plt.subplots(1, len(values), figsize=(max(6.0, 3.6 * len(values)), 3.4), squeeze=False)
    for ax, (name, grid) in zip(axes[0], values.items()):
        image = ax.imshow(grid.float().numpy(), cmap=cmap, aspect="auto")
        low, high = grid.min().item(), grid.max().item()
        for layer in range(grid.shape[0]):
            for head in range(grid.shape[1]):
                value = grid[layer, head].item()
                bright = (value - low) / max(high - low, 1e-12) > 0.6  # dark text on the bright end of the map
                ax.text(head, layer, format_cell(value, 3), ha="center", va="center", fontsize=6,
                        color="k" if bright else "w")
        ax.set_xticks(range(grid.shape[1]))
        ax.set_yticks(range(grid.shape[0]))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        # the colours span the values' own range, however narrow: the title says how narrow
        ax.set_title(f"{name}\nrange {format_cell(low, 4)} to {format_cell(high, 4)}", fontsize=9)
        bar = fig.colorbar(image, ax=ax, fraction=0.046)
        bar.formatter.set_useOffset(False)  # whole values on the scale, not "+2.543" and small offsets
        bar.update_ticks()
    fig.suptitle(textwrap.fill(title, 90), fontsize=9)
    save_figure(fig, path)
    return path


def plot_pruning(curve: list[tuple[tuple[int, int] | None, float]], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(len(curve)), [loss for _, loss in curve], marker="o", ms=3)
    ax.set_xlabel("heads removed (greedily, least important first)")
    ax.set_ylabel("validation loss")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    save_figure(fig, path)
    return path
