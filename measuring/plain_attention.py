"""The plainest implementation of each layout x kernel, written from the formula in a from-scratch course's style (a
single-head module and a wrapper of them; multi-head attention with separate Q/K/V projections; one combined QKV
projection; torch's SDPA with is_causal): what headlab's own block must not be slower than
(``python bench.py --mode plain``). Each holds the very nn.Linear modules of a headlab block (``plain_twin``), so both
compute one function from one set of weights."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# The layouts and kernels a plain implementation exists for.
PLAIN_LAYOUTS = ("wrapper", "separate_qkv", "fused_qkv")
PLAIN_KERNELS = ("manual", "sdpa")


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str, hidden: torch.Tensor):
    """softmax(q k^T / sqrt(d), causal) v: written out (manual), or torch's SDPA with is_causal (a single head's
    (B, T, hd) as (B, 1, T, hd): a CPU's fused SDPA takes 4-d tensors; 3-d ones run its unfused math)."""
    if kernel == "sdpa":
        if q.dim() == 3:
            return F.scaled_dot_product_attention(*(t.unsqueeze(1) for t in (q, k, v)), is_causal=True).squeeze(1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)).masked_fill(hidden[:T, :T], float("-inf"))
    return torch.softmax(scores / math.sqrt(q.size(-1)), dim=-1) @ v


class PlainHead(nn.Module):
    """One causal attention head, d_model -> head_dim."""

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear, kernel: str, hidden: torch.Tensor):
        super().__init__()
        self.query, self.key, self.value, self.kernel = query, key, value, kernel
        self.register_buffer("hidden", hidden, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return plain_attention(self.query(x), self.key(x), self.value(x), self.kernel, self.hidden)


class PlainWrapper(nn.Module):
    """Single heads side by side, concatenated, then the output projection."""

    def __init__(self, heads: list[PlainHead], proj: nn.Linear):
        super().__init__()
        self.heads, self.proj = nn.ModuleList(heads), proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([head(x) for head in self.heads], dim=-1))


class PlainMultiHead(nn.Module):
    """Q, K and V from separate projections (or one combined projection split in three), reshaped into heads."""

    def __init__(self, projections: list[nn.Linear], proj: nn.Linear, n_head: int, kernel: str,
                 hidden: torch.Tensor):  # fmt: skip
        super().__init__()
        self.projections, self.proj, self.n_head, self.kernel = nn.ModuleList(projections), proj, n_head, kernel
        self.register_buffer("hidden", hidden, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        if len(self.projections) == 1:
            q, k, v = self.projections[0](x).split(C, dim=-1)
        else:
            q, k, v = (projection(x) for projection in self.projections)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = plain_attention(q, k, v, self.kernel, self.hidden)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


def plain_twin(block: nn.Module, layout: str, kernel: str, seq_len: int) -> nn.Module:
    """The plain reference of a headlab attention block (multi-head, learned positions, no score modifications),
    holding the block's own projections."""
    hidden = torch.ones(seq_len, seq_len, dtype=torch.bool, device=block.c_proj.weight.device).triu(1)
    if layout == "wrapper":
        heads = [PlainHead(h.query, h.key, h.value, kernel, hidden) for h in block.heads]
        return PlainWrapper(heads, block.c_proj)
    projections = [block.c_attn] if layout == "fused_qkv" else [block.query, block.key, block.value]
    return PlainMultiHead(projections, block.c_proj, block.n_head, kernel, hidden)
