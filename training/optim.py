"""AdamW with GPT-style weight decay groups, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from training.config import OptimConfig


def make_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """Decay matmul weights only: biases, LayerNorms and embeddings are left undecayed."""
    embeddings = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    decay, no_decay = [], []
    for param in model.parameters():  # unique parameters: the tied LM head is the embedding
        if not param.requires_grad:
            continue
        (decay if param.dim() >= 2 and id(param) not in embeddings else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused_adamw(device))


def fused_adamw(device: torch.device) -> bool:
    """AdamW's fused kernels (one per group, not ~9 ops per tensor) exist for CUDA and CPU tensors; the
    update equals the unfused one up to float round-off."""
    return device.type in ("cuda", "cpu")


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup to ``lr`` over ``warmup_steps``, then cosine decay to ``min_lr`` at ``max_steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (cfg.lr - cfg.min_lr)
