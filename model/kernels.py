"""Attention kernels: how softmax(Q K^T / sqrt(d_k)) V is computed.

Every kernel takes q shaped (batch, heads, q_len, head_dim) and k, v shaped
(batch, heads, k_len, head_dim), q_len <= k_len: the queries are the last q_len
positions (all of them in training, the new ones when keys are cached). It
returns q's shape. Layouts (``model.attention``) decide how q, k, v are produced; the
kernel only decides how they are combined, so every layout runs with every
kernel.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from model.registry import lookup

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], torch.Tensor]


def attention_probs(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k)) under the causal mask: the weights every kernel applies to V."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    scores = scores.masked_fill(_future_mask(q.size(-2), k.size(-2), q.device), float("-inf"))
    return F.softmax(scores, dim=-1)


def manual_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, training: bool) -> torch.Tensor:
    """The textbook formula: matmul, causal mask, softmax, dropout, matmul."""
    return F.dropout(attention_probs(q, k), p=dropout, training=training) @ v


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, training: bool) -> torch.Tensor:
    """PyTorch's fused kernel (flash / memory-efficient / math, chosen by torch)."""
    p = dropout if training else 0.0
    q_len, k_len = q.size(-2), k.size(-2)
    if q_len == k_len:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    if q_len == 1:  # one new query after cached keys: it may see all of them
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    # is_causal aligns the mask top-left; cached queries need it bottom-right.
    mask = ~_future_mask(q_len, k_len, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


def _future_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """True where query i (the last q_len of k_len positions) would look at a later key.

    Cached in eager mode: a training run asks for the same mask in every layer of every step.
    Under torch.compile the graph builds it (the compiler ignores an lru_cache, and warns that it does).
    """
    if torch.compiler.is_compiling():
        return _build_future_mask(q_len, k_len, device)
    return _cached_future_mask(q_len, k_len, device)


def _build_future_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).triu(1 + k_len - q_len)


@functools.lru_cache(maxsize=16)
def _cached_future_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    # A mask first built while generating (inference mode) would be an inference tensor, which a later
    # training step could not save for backward: the cached one is always an ordinary tensor.
    with torch.inference_mode(False):
        return _build_future_mask(q_len, k_len, device)


KERNELS: dict[str, Kernel] = {"manual": manual_attention, "sdpa": sdpa_attention}


def get_kernel(name: str) -> Kernel:
    return lookup(KERNELS, "attention kernel", name)
