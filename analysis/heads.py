"""Per-head studies of a trained GPT: attention maps, head statistics, head ablation.

All layouts end in the same place: the heads' outputs concatenated (head h in
columns h*head_dim ... (h+1)*head_dim) and fed to the output projection
``c_proj``. Ablating a head zeroes its slice of that input; attention maps are
recomputed from each layout's own projections (``attention_weights``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from tqdm import tqdm

from model import GPT

STATS = ("entropy", "mean_distance", "prev_token", "first_token")
SINK = "sink_weight"  # with model.sinks: the share of each row the sink took (a row of the map sums to 1 - it)
GATE = "gate_mean"  # with model.gate: the mean of each head's sigmoid gate on its output (NaN in a layer without)
# What each statistic measures, in its plot's title (a query's row of the map, averaged over queries and windows).
STAT_UNITS = {
    "entropy": "nats per row", "mean_distance": "tokens back", "prev_token": "weight on the previous token",
    "first_token": "weight on position 0", SINK: "weight the sink took", GATE: "mean sigmoid gate on its output",
}  # fmt: skip


def stats_of(config) -> tuple[str, ...]:
    """The statistics of a model's heads: ``STATS``, the sink's weight for a model with sinks, and the gate's
    mean for a model with an output gate."""
    sinks = (SINK,) if config.in_any_layer("sinks") else ()
    return (*STATS, *sinks, *((GATE,) if gated(config) else ()))


def gated(config) -> bool:
    """Whether some layer has an output gate (``model.gate``)."""
    return any(config.layer_config(i).gate != "none" for i in range(config.n_layer))


@torch.no_grad()
def gate_means(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """(n_layer, n_head): each head's mean output gate, sigmoid(x W_g) over the batch, the positions and (an
    elementwise gate) the head's dims, x each layer's input for the token ids ``idx``; NaN in a layer without
    a gate. Near 1 a head passes its output; near 0 it is shut (the paper's sparse, query-dependent gates)."""
    inputs: list[torch.Tensor] = []
    hooks = [block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
             for block in model.transformer.h]  # fmt: skip
    try:
        model(idx, idx)
    finally:
        for hook in hooks:
            hook.remove()
    n_head = model.config.n_head
    means = torch.full((model.config.n_layer, n_head), float("nan"))
    for layer, (block, x) in enumerate(zip(model.transformer.h, inputs)):
        if block.attn.gate is not None:
            gate = torch.sigmoid(block.attn.gate(x).float())  # (B, T, H) or (B, T, C)
            means[layer] = gate.unflatten(-1, (n_head, -1)).mean(dim=(0, 1, 3)).cpu()
    return means


def check_head(model: GPT, layer: int, head: int) -> None:
    n_layer, n_head = model.config.n_layer, model.config.n_head
    if not 0 <= layer < n_layer:
        raise ValueError(f"layer={layer} is out of range: this model has layers 0..{n_layer - 1}")
    if not 0 <= head < n_head:
        raise ValueError(f"head={head} is out of range: this model has heads 0..{n_head - 1}")


@torch.no_grad()
def attention_maps(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """(n_layer, B, n_head, T, T) attention weights of every head for the token ids ``idx`` (B, T)."""
    inputs: list[torch.Tensor] = []
    hooks = [block.attn.register_forward_pre_hook(lambda module, args: inputs.append(args[0]))
             for block in model.transformer.h]  # fmt: skip
    try:
        model(idx, idx)  # with targets: every position passes through every layer
    finally:
        for hook in hooks:
            hook.remove()
    blocks, sources = model.transformer.h, model.kv_sources  # a layer that reads another's keys: that layer's input
    return torch.stack([block.attn.attention_weights(x, *(() if j is None else ((blocks[j].attn, inputs[j]),)))
                        for block, x, j in zip(blocks, inputs, sources)])  # fmt: skip


def head_statistics(maps: torch.Tensor, sinks: bool = False) -> dict[str, torch.Tensor]:
    """(n_layer, n_head) tensors of each statistic, averaged over batch and query positions.

    ``maps`` is (n_layer, B, n_head, T, T), as ``attention_maps`` returns.

    entropy: nats of each attention row; mean_distance: expected (query - key) offset;
    prev_token: weight on the previous token; first_token: weight on position 0 (the "sink" a model without
    learned sinks makes of its first token). The first and prev/first scores skip query 0, which can only
    attend to itself. With ``sinks`` (model.sinks), also sink_weight: what the learned sink took of each row,
    1 - the row's sum (the other statistics are over the weights the keys got).
    """
    T = maps.size(-1)
    offsets = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # query - key
    entropy = -(maps * maps.clamp_min(1e-12).log()).sum(-1)  # (L, B, H, T)
    distance = (maps * offsets.clamp_min(0)).sum(-1)
    prev = maps.diagonal(offset=-1, dim1=-2, dim2=-1)  # (L, B, H, T-1): weight of query i on key i-1
    first = maps[..., 1:, 0]
    return {
        "entropy": entropy.mean(dim=(1, 3)),
        "mean_distance": distance.mean(dim=(1, 3)),
        "prev_token": prev.mean(dim=(1, 3)) if T > 1 else torch.zeros(maps.shape[0], maps.shape[2]),
        "first_token": first.mean(dim=(1, 3)) if T > 1 else torch.ones(maps.shape[0], maps.shape[2]),
        **({SINK: sink_weight(maps)} if sinks else {}),
    }


def sink_weight(maps: torch.Tensor) -> torch.Tensor:
    """(n_layer, n_head): the mean share of a row the sinks took (1 - the row's sum), over batch and queries."""
    return (1 - maps.sum(-1)).mean(dim=(1, 3))


@contextlib.contextmanager
def heads_removed(model: GPT, removed: list[tuple[int, int]]) -> Iterator[None]:
    """Within the block, the listed (layer, head) outputs are zero where they enter ``c_proj``."""
    head_dim = model.config.n_embd // model.config.n_head
    by_layer: dict[int, list[int]] = {}
    for layer, head in removed:
        check_head(model, layer, head)
        by_layer.setdefault(layer, []).append(head)

    def zero_heads(heads: list[int]):
        def hook(module, args):
            x = args[0].clone()
            for h in heads:
                x[..., h * head_dim : (h + 1) * head_dim] = 0
            return (x,)

        return hook

    hooks = [model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero_heads(heads))
             for layer, heads in by_layer.items()]  # fmt: skip
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@torch.no_grad()
def window_losses(model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int = 32) -> torch.Tensor:
    """(N,) each window's mean loss over its tokens (targets of -1 ignored), in float64: an ablation's increase is
    then paired window by window, and its noise measured (``ablation``)."""
    losses = []
    for i in range(0, len(x), batch_size):
        h = model.transformer.ln_f(model.hidden_states(x[i : i + batch_size]))
        logits = model.lm_head(h)[..., : model.config.vocab_size].double()
        targets = y[i : i + batch_size]
        per_token = F.cross_entropy(logits.transpose(1, 2), targets, ignore_index=-1, reduction="none")
        losses.append(per_token.sum(1) / (targets != -1).sum(1).clamp(min=1))
    return torch.cat(losses)


def mean_loss(model: GPT, x: torch.Tensor, y: torch.Tensor, batch_size: int = 32) -> float:
    return window_losses(model, x, y, batch_size).mean().item()


class Ablation(NamedTuple):
    base: float  # the loss with every head
    increase: torch.Tensor  # (n_layer, n_head): the loss increase when each head alone is removed
    standard_error: torch.Tensor  # (n_layer, n_head): of each increase, paired over the windows
    base_error: float = float("nan")  # the base loss's standard error over the windows (nan for one window)

    def noise(self, layer: int, head: int) -> bool:
        """Whether a head's increase is within 2 standard errors of 0: not a measured effect."""
        return abs(self.increase[layer, head].item()) <= 2 * self.standard_error[layer, head].item()


def ablation(model: GPT, x: torch.Tensor, y: torch.Tensor, progress: bool = True) -> Ablation:
    """The loss with every head, and the loss increase when each head alone is removed, with its standard error
    over the windows (the same windows with and without the head: the difference's spread, not the losses')."""
    base = window_losses(model, x, y)
    L, H = model.config.n_layer, model.config.n_head
    increase, standard_error = torch.zeros(L, H), torch.full((L, H), float("nan"))
    every_head = [(layer, head) for layer in range(L) for head in range(H)]
    for layer, head in tqdm(every_head, desc="ablate heads", disable=not progress):
        with heads_removed(model, [(layer, head)]):
            difference = window_losses(model, x, y) - base
        increase[layer, head] = difference.mean().item()
        if len(difference) > 1:
            standard_error[layer, head] = (difference.std() / len(difference) ** 0.5).item()
    base_error = (base.std() / len(base) ** 0.5).item() if len(base) > 1 else float("nan")
    return Ablation(base.mean().item(), increase, standard_error, base_error)


def greedy_pruning(
    model: GPT, x: torch.Tensor, y: torch.Tensor, progress: bool = True
) -> list[tuple[tuple[int, int] | None, float]]:
    """Remove heads one at a time, each time the one whose removal hurts least.

    Returns [(None, loss with all heads), ((layer, head), loss after removing it too), ...].
    """
    remaining = [(layer, head) for layer in range(model.config.n_layer) for head in range(model.config.n_head)]
    removed: list[tuple[int, int]] = []
    curve: list[tuple[tuple[int, int] | None, float]] = [(None, mean_loss(model, x, y))]
    steps = len(remaining) * (len(remaining) + 1) // 2
    with tqdm(total=steps, desc="greedy pruning", disable=not progress) as bar:
        while remaining:
            losses = {}
            for candidate in remaining:
                with heads_removed(model, [*removed, candidate]):
                    losses[candidate] = mean_loss(model, x, y)
                bar.update()
            best = min(losses, key=losses.get)
            removed.append(best)
            remaining.remove(best)
            curve.append((best, losses[best]))
    return curve
