"""The optimizer (AdamW with GPT-style weight decay groups, or Muon beside AdamW: training/muon.py) and the
learning-rate schedules (warmup, then cosine, warmup-stable-decay or constant)."""

from __future__ import annotations

import math

import torch
from torch import nn

from training.config import OptimConfig
from training.muon import muon_adamw


def make_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device,
                   dtype: torch.dtype = torch.float32) -> torch.optim.Optimizer:  # fmt: skip
    """``optim.name``'s optimizer over ``model``'s parameters, for a run in ``dtype`` (Muon orthogonalises in its
    precision). Each group keeps its schedule's ``peak_lr`` and ``min_lr`` (``set_learning_rates`` reads them)."""
    if cfg.name == "muon":
        return muon_adamw(model, cfg, fused_adamw(device), dtype)
    return adamw(model, cfg, device)


def adamw(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """Decay matmul weights only: biases, LayerNorms and embeddings are left undecayed."""
    embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    decay, no_decay = [], []
    for param in model.parameters():  # unique parameters: the tied LM head is the embedding
        if not param.requires_grad:
            continue
        (decay if param.dim() >= 2 and id(param) not in embeddings else no_decay).append(param)
    schedule = {"peak_lr": cfg.lr, "min_lr": cfg.min_lr}
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay, **schedule},
        {"params": no_decay, "weight_decay": 0.0, **schedule},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused_adamw(device))


def fused_adamw(device: torch.device) -> bool:
    """AdamW's fused kernels (one per group, not ~9 ops per tensor) exist for CUDA and CPU tensors; the
    update equals the unfused one up to float round-off."""
    return device.type in ("cuda", "cpu")


def restore(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """Load a checkpoint's optimizer state (AdamW's moments, Muon's momentum, the steps taken) and keep this run's
    settings: torch's ``load_state_dict`` would take the checkpoint's learning rates, betas, weight decay and Muon's
    options too, and a resume that changes them (``training/reuse.py``: it may) would silently not."""
    mine = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, settings in zip(optimizer.param_groups, mine):
        group.update(settings)


def described(optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int) -> str | None:
    """A run's line about its optimizer and schedule where they are not AdamW and cosine (the defaults say nothing):
    Muon's matrices and parameters, its options, AdamW's share, and the schedule's phases."""
    parts = []
    if cfg.name == "muon":
        muon = next(g for g in optimizer.param_groups if g.get("kind") == "muon")
        rest = sum(p.numel() for g in optimizer.param_groups if g.get("kind") != "muon" for p in g["params"])
        matrices = sum(len(m) for m in optimizer.by_shape.values())
        split = {"as_stored": "as stored", "qkv": "by Q/K/V", "heads": "by head"}[cfg.muon_split]
        parts.append(f"Muon {split} for {matrices} matrices ({sum(p.numel() for p in muon['params']):,} parameters; "
                     f"lr {cfg.muon_lr:g}, momentum {cfg.muon_momentum:g}{', Nesterov' * cfg.muon_nesterov}, "
                     f"{cfg.muon_ns_steps} Newton-Schulz steps in {muon['ns_dtype']}, lr adjusted by shape: "
                     f"{cfg.muon_adjust_lr}, weight decay {cfg.muon_weight_decay:g}), AdamW for the rest ({rest:,}; "
                     f"lr {cfg.lr:g})")  # fmt: skip
    if cfg.schedule == "wsd":
        decay = max(1, round(cfg.decay_fraction * max_steps))
        stable = (f"the peak until step {max_steps - decay}, then" if cfg.warmup_steps <= max_steps - decay else
                  f"which from step {max_steps - decay} meets (the lower of the two)")  # fmt: skip
        parts.append(f"schedule wsd: warmup {cfg.warmup_steps} steps, {stable} a {cfg.decay_shape} decay to "
                     f"{cfg.min_lr:g} at step {max_steps}")  # fmt: skip
    elif cfg.schedule == "constant":
        parts.append(f"schedule constant: warmup {cfg.warmup_steps} steps, then the peak")
    # a short run silently trained at a fraction of its learning rate (wsd's line says where its warmup meets the decay)
    if cfg.warmup_steps >= max_steps and cfg.schedule != "wsd":
        last = lr_at(max_steps - 1, cfg, max_steps)
        parts.append(f"the run ends in its warm-up (optim.warmup_steps={cfg.warmup_steps}, trainer.max_steps="
                     f"{max_steps}): the learning rate ends at {last:.3g}, {last / cfg.lr:.0%} of its peak {cfg.lr:g}, "
                     f"and never decays; set optim.warmup_steps below {max_steps} to reach the peak")  # fmt: skip
    return "optimizer: " + "; ".join(parts) if parts else None


def set_learning_rates(optimizer: torch.optim.Optimizer, step: int, cfg: OptimConfig, max_steps: int) -> dict:
    """Every group's lr for optimizer step ``step + 1`` (0-based ``step``) from its ``peak_lr`` and ``min_lr``; returns
    the metrics: ``lr`` (AdamW's: optim.lr's schedule) and, with Muon, ``lr/muon``."""
    rates = {}
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, cfg, max_steps, group["peak_lr"], group["min_lr"])
        rates.setdefault("lr/muon" if group.get("kind") == "muon" else "lr", group["lr"])
    return rates


def lr_at(step: int, cfg: OptimConfig, max_steps: int, peak: float | None = None, floor: float | None = None) -> float:
    """The learning rate of 0-based ``step`` for a group whose schedule peaks at ``peak`` and ends at ``floor``
    (unset: ``optim.lr`` and ``optim.min_lr``): a linear warmup over ``warmup_steps``, then ``optim.schedule``'s:

    - cosine: cosine decay to ``floor`` at ``max_steps``;
    - wsd: ``peak`` until the final ``decay_fraction`` of the steps, then a decay (linear, or 1 - sqrt of its
      progress) that reaches ``floor`` at the last step. Before the decay nothing depends on ``max_steps``: a
      checkpoint of that phase continued to a larger budget is the run planned for it, exactly (``same_schedule``);
    - constant: ``peak``.
    """
    peak = cfg.lr if peak is None else peak
    floor = cfg.min_lr if floor is None else floor
    warm = peak * (step + 1) / cfg.warmup_steps if step < cfg.warmup_steps else peak
    if cfg.schedule == "constant":
        return warm
    if cfg.schedule == "wsd":
        decay = max(1, round(cfg.decay_fraction * max_steps))
        progress = min(1.0, max(0.0, (step + 1 - (max_steps - decay)) / decay))
        remaining = 1 - (math.sqrt(progress) if cfg.decay_shape == "1-sqrt" else progress)
        return min(warm, floor + remaining * (peak - floor))  # a warmup that reaches into the decay meets it
    if step < cfg.warmup_steps:
        return warm
    progress = (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps)
    return floor + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (peak - floor)


def same_schedule(cfg: OptimConfig, steps: int, before: int, after: int) -> bool:
    """Whether the first ``steps`` steps had the same learning rates planned over ``before`` steps as over ``after``:
    then a checkpoint at ``steps`` continued to ``after`` is the run planned for ``after`` from the start."""
    return all(lr_at(s, cfg, before) == lr_at(s, cfg, after) for s in range(steps))
