"""Kimi Delta Attention (Kimi Linear, arXiv 2510.26692), ``attention=kda``: the gated delta rule with a decay per
key channel instead of per head, the linear layer Kimi Linear mixes 3:1 with latent attention that has no positions.

Each head keeps a matrix state S (head_dim x head_dim). At each token it decays each key channel of the state by
its own alpha_t, erases what the state holds for the key k_t and writes the value v_t there, by the share beta_t:

    S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T,        o_t = S_t^T q_t

(the paper's eq. 1). alpha_t = exp(-A softplus(f_t + dt_bias)), with A one rate per head and f_t from a low-rank
projection of the input (width -> head_dim -> width: one decay per channel of every head). As in Gated DeltaNet,
queries, keys and values pass a short causal depthwise convolution and a SiLU, queries and keys are L2-normalised
(the queries then scaled by 1/sqrt(head_dim)) and beta_t = sigmoid(W_b x_t) (twice that with
``model.negative_eigenvalues``); each head's output passes an RMSNorm
gated by sigmoid(g_t), g_t from a second low-rank projection, then ``c_proj``.

Training runs the chunked form (``chunked_kda``): within a chunk every decay between two positions is
exp(G_i - G_j) per channel, G the cumulative log decay, never above 1, so the chunk's pairwise products are taken
channel by channel (a chunk x chunk x head_dim tensor: hence a default chunk of 16) and one triangular solve per
chunk gives the delta rule's pseudo-values; only the chunk-to-chunk state is sequential. It equals the recurrence
(``tests/test_kda.py`` holds both to a float64 step-by-step reference). Decoding carries the state and the
convolution's last inputs in the cache, as Gated DeltaNet's does.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn

from model.attention.spec import AttentionSpec
from model.mixers.deltanet import CONV_SIZE, DELTA_RULE, GatedDeltaNet, causal_conv, delta_step, l2_normed, run_rule
from model.registry import MIXERS, register


def chunked_kda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, beta: torch.Tensor,
                chunk: int, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The delta rule with a decay per key channel over (B, H, T, d) queries, keys, values, (B, H, T, dk) log decays
    (<= 0) and (B, H, T) betas, from ``state`` (B, H, dk, dv; None: zeros), in chunks of ``chunk`` positions -> the
    outputs (B, H, T, dv) and the state after the last position.

    Within a chunk, with G_i the cumulative log decays (a vector) and gamma_i = exp(G_i), the state after position i
    is diag(gamma_i) S_0 + sum_{j<=i} diag(gamma_i / gamma_j) k_j u_j^T, where the pseudo-values u solve the unit
    lower triangular system (I + A) U = beta V - beta (K * gamma) S_0, A_ij = beta_i sum_c k_ic k_jc exp(G_ic - G_jc)
    for j < i. A length that is not a multiple of ``chunk`` is padded with positions that change nothing (k = v = 0,
    alpha = 1).
    """
    return run_rule(_one_step, _chunked, q, k, v, log_decay, beta, chunk, state)


def _one_step(q, k, v, log_decay, beta, S):
    """One position (a decode step): the recurrence itself."""
    return delta_step(q, k, v, log_decay.exp().transpose(-1, -2), beta, S)  # (B, H, dk, 1): a decay per key channel


def _chunked(q, k, v, log_decay, beta, chunk, state):
    B, H, T, dk = q.shape
    dv = v.size(-1)
    pad = -T % chunk
    if pad:
        q, k, v, log_decay = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, log_decay))
        beta = F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    q, k, v, G = (t.reshape(B, H, n, chunk, -1) for t in (q, k, v, log_decay))
    G = G.cumsum(-2)  # (B, H, n, chunk, dk)
    beta = beta.reshape(B, H, n, chunk, 1)
    i = torch.arange(chunk, device=q.device)
    causal, earlier = i[:, None] >= i[None, :], i[:, None] > i[None, :]
    # exp(G_i - G_j) per channel for j <= i (masked before exp: above the diagonal it could overflow)
    decay = (G.unsqueeze(-2) - G.unsqueeze(-3)).masked_fill(~causal[..., None], -math.inf).exp()
    A = (beta * torch.einsum("...ic,...jc,...ijc->...ij", k, k, decay)).masked_fill(~earlier, 0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    inverse = torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False, unitriangular=True)
    w = inverse @ (k * beta * G.exp())  # U = u - w S_0
    u = inverse @ (v * beta)
    scores = torch.einsum("...ic,...jc,...ijc->...ij", q, k, decay)  # 0 above the diagonal: decay is 0 there
    decay_to_end = (G[..., -1:, :] - G).exp()  # gamma_C / gamma_j, per channel
    S = q.new_zeros(B, H, dk, dv) if state is None else state
    out = []
    for c in range(n):
        u_c = u[:, :, c] - w[:, :, c] @ S
        out.append((q[:, :, c] * G[:, :, c].exp()) @ S + scores[:, :, c] @ u_c)
        S = S * G[:, :, c, -1].exp().unsqueeze(-1) + (k[:, :, c] * decay_to_end[:, :, c]).transpose(-1, -2) @ u_c
    return torch.stack(out, dim=2).reshape(B, H, n * chunk, dv)[:, :, :T], S


@register(MIXERS)
class KimiDeltaAttention(GatedDeltaNet):
    name, colour, marker = "kda", "tab:brown", "X"
    function = "kda"
    computes = "a linear-attention state per head, updated by the delta rule with a decay per key channel"
    QKV_KEY = re.compile(r"(?P<proj>qkvb_proj)\.(?P<kind>weight|bias)$")  # its own names: a state dict says which
    QKV_EXAMPLE = "qkvb_proj"
    chunk = 16  # the chunked form's positions per chunk by default: its pairwise decays are chunk x chunk x head_dim
    norm_eps = 1e-5  # the output's gated RMSNorm: Kimi Linear's rms_norm_eps
    rule = staticmethod(chunked_kda)
    gate_activation = staticmethod(torch.sigmoid)
    # it runs the delta rule (its options: DELTA_RULE), learned or no positions, output dropout
    applies = DELTA_RULE | {"position", "dropout"}

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 3  # qkvb_proj and the two low-rank projections' first halves read the block's input

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return 0, 0  # no score matrix (``mixing_flops``)

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        return 0  # a state, no keys and values per token

    @classmethod
    def cache_width(cls, spec: AttentionSpec) -> int:
        return 0  # nothing per token: the state is fixed-size (``state_bytes``)

    @classmethod
    def state_bytes(cls, spec: AttentionSpec, dtype_bytes: int) -> int:
        """Each head's head_dim x head_dim state (float32) and the convolution's last CONV_SIZE - 1 inputs of q, k
        and v (in the activations' dtype), whatever the length: Gated DeltaNet's shapes."""
        return 4 * spec.n_head * spec.head_dim**2 + dtype_bytes * (CONV_SIZE - 1) * 3 * spec.n_embd

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # qkvb_proj: [queries; keys; values] by head, then beta's inputs (a row a head); the low-rank decay and gate
        # projections are matrices of their own
        C, H, hd = spec.n_embd, spec.n_head, spec.head_dim
        by_head = [(proj, h, i * C + h * hd, i * C + (h + 1) * hd)
                   for i, proj in enumerate(("query", "key", "value")) for h in range(H)]  # fmt: skip
        return {"qkvb_proj.weight": [*by_head, ("beta", None, 3 * C, 3 * C + H)]}

    @classmethod
    def mixing_flops(cls, spec: AttentionSpec, seq_len: int) -> int:
        """Training FLOPs per token of the chunked form (6 x its multiply-adds): per head, reading, correcting and
        writing the state (3 dk dv), the chunk's products taken channel by channel (chunk x (2 dk + dk + 2 dv):
        the two pairwise sums over channels, the solve's products, the outputs), and the two low-rank projections
        of the decays and the output gate (4 x width x head_dim over the heads)."""
        d, chunk = spec.head_dim, min(spec.linear_chunk or cls.chunk, seq_len)
        return 6 * spec.n_head * (3 * d * d + chunk * (5 * d + 2 * d)) + 6 * 4 * spec.n_embd * d

    @classmethod
    def activation_bytes(cls, spec: AttentionSpec, batch: int, seq_len: int, dtype_bytes: int) -> dict[str, int]:
        """Gated DeltaNet's parts, with the chunk's pairwise decays per channel (two chunk x chunk x head_dim
        tensors per chunk and head, float32: the decays and their products with the keys) and the low-rank
        projections' inputs and outputs (about 3 widths in the activations' dtype)."""
        parts = super().activation_bytes(spec, batch, seq_len, dtype_bytes)
        chunk = min(spec.linear_chunk or cls.chunk, seq_len)
        pairwise = 4 * 2 * batch * spec.n_head * -(-seq_len // chunk) * chunk * chunk * spec.head_dim
        return {"attention projections": parts["attention projections"] + 3 * batch * seq_len * spec.n_embd
                * dtype_bytes, "linear attention chunks": parts["linear attention chunks"] + pairwise}  # fmt: skip

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)  # the convolution, A_log and the output norm; A and dt drawn as Gated DeltaNet's
        C, H, hd = spec.n_embd, spec.n_head, spec.head_dim
        # queries, keys, values and beta's inputs: one matmul of the block's input; the decays and the output gate
        # each from a low-rank projection (width -> head_dim -> width), as Kimi Linear's
        del self.in_proj  # Gated DeltaNet's, which also makes the gate and one decay per head
        self.qkvb_proj = nn.Linear(C, 3 * C + H, bias=False)
        self.decay_down, self.decay_up = nn.Linear(C, hd, bias=False), nn.Linear(hd, C, bias=False)
        self.gate_down, self.gate_up = nn.Linear(C, hd, bias=False), nn.Linear(hd, C, bias=True)
        self.dt_bias = nn.Parameter(torch.zeros(C))  # one per channel of every head

    def inputs(self, x: torch.Tensor, past: torch.Tensor | None):
        """(B, T, C) -> q, k, v (B, H, T, hd), log decays (B, H, T, hd), betas (B, H, T), the gate (B, T, H, hd),
        and the convolution's inputs (B, T, 3C)."""
        B, T, C = x.shape
        H, hd = self.n_head, self.head_dim
        mixed, b = self.qkvb_proj(x).split([3 * C, H], dim=-1)
        q, k, v = F.silu(causal_conv(mixed, self.conv_weight, past)).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
        q, k = l2_normed(q) * hd**-0.5, l2_normed(k)
        rate = self.A_log.exp().repeat_interleave(hd)  # each head's rate over its channels
        log_decay = -rate * F.softplus(self.decay_up(self.decay_down(x)) + self.dt_bias)  # float32 at least: dt_bias
        gate = self.gate_up(self.gate_down(x))
        return (q, k, v, log_decay.view(B, T, H, hd).transpose(1, 2), (b.sigmoid() * self.beta_max).transpose(1, 2),
                gate.view(B, T, H, hd), mixed)  # fmt: skip
