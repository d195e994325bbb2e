"""Causal multi-head attention written from its formula, in float64: what every cell of the grid must compute.

    head h reads key/value head g = h // (n_head / n_kv_head)
    scores[i, j] = q_h[i] . k_g[j] / sqrt(head_dim)   for keys j <= i with i - j < window (every j <= i without one)
    out_h = softmax(scores) v_g;  the heads side by side, then the output projection c_proj

It takes a block's live parameters (any layout, read through the layout's conversion to separate q/k/v,
a pure re-arrangement), so gradients flow back to them: a test compares a block's gradients to these.
"""

from __future__ import annotations

import math

import torch

from model import convert_attention_layout


def allowed(q_len: int, k_len: int, window: int | None, device) -> torch.Tensor:
    """(q_len, k_len): True where query i, the position k_len - q_len + i, may look at key j."""
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    return (j <= i) & ((i - j < window) if window else True)


def reference_attention(block: torch.nn.Module, layout: str, x: torch.Tensor, n_head: int, n_kv_head: int,
                        window: int | None) -> torch.Tensor:  # fmt: skip
    """The block's function at ``x`` (B, T, C), in float64, differentiable in ``x`` and the block's parameters."""
    params = {name: p.double() for name, p in block.named_parameters()}
    p = convert_attention_layout(params, layout, "separate_qkv", n_head=n_head)
    x = x.double()
    B, T, C = x.shape
    d = C // n_head

    def heads(name: str, count: int) -> torch.Tensor:
        y = x @ p[f"{name}.weight"].T + (p[f"{name}.bias"] if f"{name}.bias" in p else 0.0)
        return y.view(B, T, count, d).transpose(1, 2)  # (B, count, T, d)

    q, k, v = heads("query", n_head), heads("key", n_kv_head), heads("value", n_kv_head)
    group = torch.arange(n_head, device=x.device) // (n_head // n_kv_head)  # each query head's key/value head
    k, v = k[:, group], v[:, group]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(~allowed(T, T, window, x.device), float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, C)
    return out @ p["c_proj.weight"].T + (p["c_proj.bias"] if "c_proj.bias" in p else 0.0)
