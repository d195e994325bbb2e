"""Causal multi-head attention written from its formula, in float64: what every cell of the grid must compute.

    head h reads key/value head g = h // (n_head / n_kv_head)
    q_h, k_g   <- RMSNorm per head dim (model.qk_norm), then rotated by their positions (model.position=rope; the
                  first model.rope_fraction of the dims, the rest unturned)
    scores[i, j] = q_h[i] . k_g[j] / sqrt(head_dim)
                   -> c tanh(scores / c) (model.softcap) -> - m_h (i - j) (model.position=alibi)
                   for keys j <= i with i - j < window (every j <= i without one)
    out_h = softmax over the keys and the sink logit s_h (model.sinks; its weight dropped) of the scores, @ v_g;
            times sigmoid(x W_g) (model.gate: one gate per head, or one per element of out_h)
    the heads side by side, then the output projection c_proj

Each piece is written from its paper, not from headlab's code: rotary positions (Su et al. 2021, RoFormer) as a
complex multiplication of the pairs (i, i + d/2) (GPT-NeoX/Llama's "rotate half" pairing), ALiBi's slopes and
bias (Press et al. 2022), RMSNorm (Zhang & Sennrich 2019; eps 1e-6, as Qwen3/OLMo 2), Gemma 2's logit softcap,
gpt-oss's sinks, the output gate (Qiu et al. 2025, arXiv 2505.06708). NoPE is the formula with no position term.

It takes a block's live parameters (any layout, read through the layout's conversion to separate q/k/v,
a pure re-arrangement; QK-norm's scales and the sinks pass through it unchanged), so gradients flow back to
them: a test compares a block's gradients to these.
"""

from __future__ import annotations

import math

import torch

from model import convert_attention_layout

RMS_EPS = 1e-6


def allowed(q_len: int, k_len: int, window: int | None, device) -> torch.Tensor:
    """(q_len, k_len): True where query i, the position k_len - q_len + i, may look at key j."""
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    return (j <= i) & ((i - j < window) if window else True)


def rms_norm(t: torch.Tensor, scale: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    """x / rms(x) * g over the last (head) dimension: rms(x) = sqrt(mean(x^2) + eps)."""
    return t / torch.sqrt(t.pow(2).mean(dim=-1, keepdim=True) + eps) * scale


def rotate(t: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoFormer's rotation of (..., T, d) at ``positions`` (T,): pair i, the complex number t[i] + 1j t[i + d/2],
    times e^(1j * position * theta^(-2i/d)), i = 0 .. d/2 - 1 (float64 angles)."""
    half = t.size(-1) // 2
    z = torch.complex(t[..., :half].double(), t[..., half:].double())
    freqs = float(theta) ** (-2.0 * torch.arange(half, dtype=torch.float64, device=t.device) / t.size(-1))
    angles = positions.double()[:, None] * freqs[None, :]  # (T, d/2)
    z = z * torch.polar(torch.ones_like(angles), angles)
    return torch.cat((z.real, z.imag), dim=-1)


def paper_alibi_slopes(n_head: int) -> list[float]:
    """ALiBi's slopes as Press et al. define them: for n heads, n a power of two, the geometric sequence that
    starts at 2^(-8/n) with that ratio (8 heads: 1/2, 1/4, ..., 1/256); for other n, the slopes of the closest
    lower power of two 2^k, then every other slope of 2^(k+1) heads (1st, 3rd, ...) until n (the paper's rule)."""
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    lower = 1 << (n_head.bit_length() - 1)
    if lower == n_head:
        return geometric(n_head)
    return geometric(lower) + geometric(2 * lower)[0::2][: n_head - lower]


# The modifications of the attention (model.registry.SCORE_MODS) this formula writes out: a registered one it
# lacks fails tests/test_score_mods.py (each modification's float64 reference lives here, apart from the model).
REFERENCED_MODS = ("alibi", "qk_norm", "softcap", "sinks", "gate")


def reference_attention(block: torch.nn.Module, layout: str, x: torch.Tensor, n_head: int, n_kv_head: int,
                        window: int | None, position: str = "learned", rope_theta: float = 10000.0,
                        qk_norm: bool = False, softcap: float | None = None, sinks: bool = False,
                        gate: str = "none", rope_fraction: float = 1.0) -> torch.Tensor:  # fmt: skip
    """The block's function at ``x`` (B, T, C) at positions 0..T-1, in float64, differentiable in ``x`` and the
    block's parameters. ``window`` is the keys a query sees at most (a model without a position table caps it at
    its block size: pass that). ``position``: learned (added before attention: nothing here), none, rope or alibi."""
    params = {name: p.double() for name, p in block.named_parameters()}
    p = convert_attention_layout(params, layout, "separate_qkv", n_head=n_head)
    x = x.double()
    B, T, C = x.shape
    d = C // n_head
    positions = torch.arange(T, device=x.device)

    def heads(name: str, count: int) -> torch.Tensor:
        y = x @ p[f"{name}.weight"].T + (p[f"{name}.bias"] if f"{name}.bias" in p else 0.0)
        return y.view(B, T, count, d).transpose(1, 2)  # (B, count, T, d)

    q, k, v = heads("query", n_head), heads("key", n_kv_head), heads("value", n_kv_head)
    if qk_norm:
        q, k = rms_norm(q, p["q_norm.weight"]), rms_norm(k, p["k_norm.weight"])
    if position == "rope":  # the first rope_fraction of each head's dims turn (GPT-NeoX's rotary_pct), the rest pass
        r = round(rope_fraction * d)
        q = torch.cat((rotate(q[..., :r], positions, rope_theta), q[..., r:]), dim=-1)
        k = torch.cat((rotate(k[..., :r], positions, rope_theta), k[..., r:]), dim=-1)
    group = torch.arange(n_head, device=x.device) // (n_head // n_kv_head)  # each query head's key/value head
    k, v = k[:, group], v[:, group]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if position == "alibi":
        slopes = torch.tensor(paper_alibi_slopes(n_head), dtype=torch.float64, device=x.device)
        distance = (positions[:, None] - positions[None, :]).double()  # i - j
        scores = scores - slopes[:, None, None] * distance
    scores = scores.masked_fill(~allowed(T, T, window, x.device), float("-inf"))
    if sinks:  # one more logit per head in the denominator; the weight it takes goes nowhere
        sink = p["sinks"].view(1, n_head, 1, 1).expand(B, n_head, T, 1)
        weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    out = weights @ v  # (B, H, T, d)
    if gate != "none":  # sigmoid(x W_g): (B, T, H), one per head; (B, T, C), one per element of each head
        g = torch.sigmoid(x @ p["gate.weight"].T)
        out = out * (g.transpose(1, 2)[..., None] if gate == "headwise" else g.view(B, T, n_head, d).transpose(1, 2))
    out = out.transpose(1, 2).reshape(B, T, C)
    return out @ p["c_proj.weight"].T + (p["c_proj.bias"] if "c_proj.bias" in p else 0.0)
