"""Causal multi-head attention in three layouts that compute the same function.

- ``wrapper``: n_head independent single-head ``CausalAttention`` modules.
- ``separate_qkv``: three Linear(d, d) projections, reshaped into heads.
- ``fused_qkv``: one Linear(d, 3d) projection, split into q, k, v.

All three concatenate the heads' outputs (head h in columns h*head_dim ...
(h+1)*head_dim) and apply the same output projection ``c_proj``, so weights
convert between them exactly (see ``model.convert``).
"""

from __future__ import annotations

import torch
from torch import nn

from model.kernels import attention_probs, get_kernel
from model.registry import lookup

# One layer's cached keys and values, per slot: slot 0 for the multi-head layouts,
# one slot per head for the wrapper. Tensors are (batch, heads, positions, head_dim).
LayerCache = dict[int, tuple[torch.Tensor, torch.Tensor]]


def remember(
    cache: LayerCache | None, slot: int, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the new positions' k, v to the cache; return all keys and values so far."""
    if cache is None:
        return k, v
    if slot in cache:
        past_k, past_v = cache[slot]
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    cache[slot] = (k, v)
    return k, v


def check_heads(n_embd: int, n_head: int) -> None:
    if n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; choose n_embd as a multiple of n_head")


class CausalAttention(nn.Module):
    """One causal attention head: d_model -> head_dim."""

    def __init__(self, n_embd: int, head_dim: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__()
        self.query = nn.Linear(n_embd, head_dim, bias=bias)
        self.key = nn.Linear(n_embd, head_dim, bias=bias)
        self.value = nn.Linear(n_embd, head_dim, bias=bias)
        self.kernel = get_kernel(kernel)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, slot: int = 0) -> torch.Tensor:
        # A head axis of size 1 lets every kernel serve single heads too.
        q, k, v = (proj(x).unsqueeze(1) for proj in (self.query, self.key, self.value))
        k, v = remember(cache, slot, k, v)
        return self.kernel(q, k, v, self.dropout, self.training).squeeze(1)


class MultiHeadAttention(nn.Module):
    """What every layout shares: heads -> concatenation -> c_proj -> dropout."""

    def __init__(self, n_embd: int, n_head: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__()
        check_heads(n_embd, n_head)
        self.n_head = n_head
        self.kernel = get_kernel(kernel)
        self.dropout = dropout
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        return self.resid_dropout(self.c_proj(self.attend(x, cache)))

    def attend(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        """(B, T, C) -> the heads' outputs concatenated, (B, T, C)."""
        q, k, v = (self.split_heads(t) for t in self.project(x))
        k, v = remember(cache, 0, k, v)
        y = self.kernel(q, k, v, self.dropout, self.training)
        B, H, T, D = y.shape
        return y.transpose(1, 2).contiguous().view(B, T, H * D)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Full-width q, k, v, each (B, T, C)."""
        raise NotImplementedError

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's queries and keys, (B, H, T, head_dim): what its attention weights come from."""
        q, k, _ = self.project(x)
        return self.split_heads(q), self.split_heads(k)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, T) attention weights, computed from this layout's own projections.

        The manual kernel applies exactly these; sdpa fuses the same formula, so
        they describe a model run with either kernel.
        """
        return attention_probs(*self.queries_keys(x))


class WrapperAttention(MultiHeadAttention):
    """n_head single-head modules side by side: the committee, literally."""

    def __init__(self, n_embd: int, n_head: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__(n_embd, n_head, kernel, dropout, bias)
        self.heads = nn.ModuleList(
            CausalAttention(n_embd, n_embd // n_head, kernel, dropout, bias) for _ in range(n_head)
        )

    def attend(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        return torch.cat([head(x, cache, slot) for slot, head in enumerate(self.heads)], dim=-1)

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.stack([head.query(x) for head in self.heads], dim=1),
                torch.stack([head.key(x) for head in self.heads], dim=1))  # fmt: skip


class SeparateQKVAttention(MultiHeadAttention):
    def __init__(self, n_embd: int, n_head: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__(n_embd, n_head, kernel, dropout, bias)
        self.query = nn.Linear(n_embd, n_embd, bias=bias)
        self.key = nn.Linear(n_embd, n_embd, bias=bias)
        self.value = nn.Linear(n_embd, n_embd, bias=bias)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.query(x), self.key(x), self.value(x)


class FusedQKVAttention(MultiHeadAttention):
    def __init__(self, n_embd: int, n_head: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__(n_embd, n_head, kernel, dropout, bias)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.c_attn(x).split(x.size(-1), dim=-1)


ATTENTION_LAYOUTS: dict[str, type[MultiHeadAttention]] = {
    "wrapper": WrapperAttention,
    "separate_qkv": SeparateQKVAttention,
    "fused_qkv": FusedQKVAttention,
}


def build_attention(
    layout: str, n_embd: int, n_head: int, kernel: str, dropout: float = 0.0, bias: bool = True
) -> MultiHeadAttention:
    """Build the attention block of a layout by name (an unknown name lists the valid ones)."""
    return lookup(ATTENTION_LAYOUTS, "attention layout", layout)(n_embd, n_head, kernel, dropout, bias)
