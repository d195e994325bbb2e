"""Attention kernels: how softmax(Q K^T / sqrt(d_k)) V is computed.

Every kernel takes q, k, v shaped (batch, heads, seq, head_dim) and returns the
same shape. Layouts (``model.attention``) decide how q, k, v are produced; the
kernel only decides how they are combined, so every layout runs with every
kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from model.registry import lookup

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], torch.Tensor]


def manual_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, training: bool
) -> torch.Tensor:
    """The textbook formula: matmul, causal mask, softmax, dropout, matmul."""
    seq_len = q.size(-2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    weights = F.dropout(F.softmax(scores, dim=-1), p=dropout, training=training)
    return weights @ v


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, training: bool
) -> torch.Tensor:
    """PyTorch's fused kernel (flash / memory-efficient / math, chosen by torch)."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout if training else 0.0, is_causal=True)


KERNELS: dict[str, Kernel] = {"manual": manual_attention, "sdpa": sdpa_attention}


def get_kernel(name: str) -> Kernel:
    return lookup(KERNELS, "attention kernel", name)
