"""Causal multi-head attention written from its formula, in float64: what every cell of the grid must compute.

    head h reads key/value head g = h // (n_head / n_kv_head)
    v_g        <- k_g as projected, before QK-norm and rotary (model.k_eq_v: Gemma 4's attention_k_eq_v, whose
                  value_states are k_proj's output, then k_norm and rotary turn the keys alone)
    q_h, k_g   <- RMSNorm per head dim (model.qk_norm), then rotated by their positions (model.position=rope; the
                  first model.rope_fraction of the dims, the rest unturned)
    scores[i, j] = q_h[i] . k_g[j] / sqrt(head_dim)
                   (model.position=path: q_h[i] . H_i H_{i-1} ... H_{j+1} k_g[j], H_s = I - beta_s w_s w_s^T)
                   -> times 1 + 0.1 ln(1 + floor((i + 1) / N)) (model.query_temperature, Llama 4's)
                   -> times s_h ln n_i, n_i the keys query i sees (model.ssmax: Scalable-Softmax, Nakanishi 2025,
                      arXiv 2501.19399: softmax_j(n^(s z_j)); s_h = the option's value + the block's ssmax_offset)
                   -> c tanh(scores / c) (model.softcap) -> - m_h (i - j) (model.position=alibi)
                   -> + sum_{l=j+1}^{i} log f_l,h, f_l = sigmoid(x_l w_f + b_f) (model.forget_gate)
                   for keys j <= i with i - j < window (every j <= i without one)
    out_h = softmax over the keys and the sink logit s_h (model.sinks; its weight dropped) of the scores, @ v_g;
            (model.differential: heads 2h, 2h+1 one head, (A_2h - lambda A_2h+1) @ [v_2h, v_2h+1], RMSNorm,
            times 1 - lambda_init)
            times sigmoid(x W_g) (model.gate: one gate per head, or one per element of out_h)
    the heads side by side, then the output projection c_proj

Cross-layer KV sharing (model.layer_kinds.S.kv_from=X: CLA, Brandon et al. 2024, arXiv 2405.12981; YOCO; Gemma's
shared-KV layers): a layer i of kind S has no k, v of its own: k_g, v_g are those of layer j, the nearest earlier layer
of kind X, projected from layer j's input by layer j's weights and encoded by layer j's QK-norm and rotary at their
positions; layer i's queries, their encodings and scalings, its scores' options and output are its own
(``gpt_reference``: the whole GPT, in float64).

Each piece is written from its paper, not from headlab's code: rotary positions (Su et al. 2021, RoFormer) as a
complex multiplication of the pairs (i, i + d/2) (GPT-NeoX/Llama's "rotate half" pairing), ALiBi's slopes and
bias (Press et al. 2022), RMSNorm (Zhang & Sennrich 2019; eps 1e-6, as Qwen3/OLMo 2), Gemma 2's logit softcap,
gpt-oss's sinks, the output gate (Qiu et al. 2025, arXiv 2505.06708), the forget gate (Lin et al. 2025, the
Forgetting Transformer, arXiv 2503.02130: D_ij = c_i - c_j, c the cumulative sum of log f), PaTH (Yang et al. 2025,
arXiv 2505.16381: the d x d matrices H_s of the tokens after a key, multiplied in turn). NoPE is the formula with
no position term.

It takes a block's live parameters (any layout, read through the layout's conversion to separate q/k/v,
a pure re-arrangement; QK-norm's scales and the sinks pass through it unchanged), so gradients flow back to
them: a test compares a block's gradients to these.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from model import convert_attention_layout
from model.attention.masks import of_spec as masks_of

RMS_EPS = 1e-6


# Each registered mask (model.registry.MASKS) as its paper or definition states it: whether query position i may
# look at key position j, given the mask's value. A registered mask without one here fails test_attention_properties.
REFERENCED_MASKS = {
    "causal": lambda i, j, value: j <= i,  # no later position
    "window": lambda i, j, value: i - j < value,  # itself and the value - 1 positions before it
    "chunked": lambda i, j, value: i // value == j // value,  # Llama 4: the same chunk of value positions
}


def allowed(q_len: int, k_len: int, window: int | None, device, seen: dict | None = None) -> torch.Tensor:
    """(q_len, k_len): True where query i, the position k_len - q_len + i, may look at key j, under every mask of
    ``seen`` ({mask name: value}; by default causal, and the ``window`` where one is given)."""
    seen = {"causal": True, **({"window": window} if window else {})} if seen is None else seen
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    keep = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    for name, value in seen.items():
        keep = keep & REFERENCED_MASKS[name](i, j, value)
    return keep


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


# The modifications of the attention (model.registry.MODIFICATIONS) this formula writes out: a registered one it
# lacks fails tests/test_score_mods.py (each modification's float64 reference lives here, apart from the model).
REFERENCED_MODS = ("alibi", "qk_norm", "softcap", "sinks", "gate", "forget_gate", "path")


def reference_attention(block: torch.nn.Module, layout: str, x: torch.Tensor, n_head: int, n_kv_head: int,
                        window: int | None, position: str = "learned", rope_theta: float = 10000.0,
                        qk_norm: bool = False, softcap: float | None = None, sinks: bool = False,
                        gate: str = "none", rope_fraction: float = 1.0, forget_gate: bool = False,
                        query_temperature: int | None = None, differential: bool = False, lambda_init: float = 0.8,
                        seen: dict | None = None, selected: torch.Tensor | None = None,
                        ssmax: float | None = None, k_eq_v: bool = False,
                        moba: tuple[int, int] | None = None, nsa: tuple[int, int, int] | None = None,
                        compressed: tuple | None = None, source: tuple | None = None) -> torch.Tensor:  # fmt: skip
    """The block's function at ``x`` (B, T, C) at positions 0..T-1, in float64, differentiable in ``x`` and the
    block's parameters. ``window`` is the keys a query sees at most (a model without a position table caps it at
    its block size: pass that); ``seen``, where given, every mask's value instead ({mask name: value}).
    ``position``: learned (added before attention: nothing here), none, rope or alibi. ``selected`` (B, T, T): the
    keys sparse attention lets each query see (``sparse_selection``), where given; ``moba`` (block, top-k): MoBA's
    blocks (``moba_selection``), each head's from its queries and keys; ``nsa`` (block, top-n, window): NSA's three
    gated branches (``nsa_heads``) in place of the one softmax; ``compressed`` (ratio, top-k, window): DeepSeek-V4's
    softmax over a window and compressed entries (``compressed_heads``). ``source`` (cross-layer KV sharing): the
    block whose keys and values this one reads and that block's input: k and v are projected and encoded there."""
    params = {name: p.double() for name, p in block.named_parameters()}
    p = convert_attention_layout(params, layout, "separate_qkv", n_head=n_head)
    x = x.double()
    B, T, C = x.shape
    d = C // n_head
    positions = torch.arange(T, device=x.device)
    if source is not None:  # the keys' and values' weights (QK-norm's key scale too) and input are the source's
        kp = convert_attention_layout({name: t.double() for name, t in source[0].named_parameters()}, layout,
                                      "separate_qkv", n_head=n_head)  # fmt: skip
        kx = source[1].double()
    else:
        kp, kx = p, x

    def heads(name: str, count: int, p=p, x=x) -> torch.Tensor:
        y = x @ p[f"{name}.weight"].T + (p[f"{name}.bias"] if f"{name}.bias" in p else 0.0)
        return y.view(B, T, count, d).transpose(1, 2)  # (B, count, T, d)

    q, k = heads("query", n_head), heads("key", n_kv_head, kp, kx)
    v = k if k_eq_v else heads("value", n_kv_head, kp, kx)  # keys equal to values: the keys before their encodings
    if qk_norm:
        q, k = rms_norm(q, p["q_norm.weight"]), rms_norm(k, kp["k_norm.weight"])
    if position == "rope":  # the first rope_fraction of each head's dims turn (GPT-NeoX's rotary_pct), the rest pass
        r = round(rope_fraction * d)
        q = torch.cat((rotate(q[..., :r], positions, rope_theta), q[..., r:]), dim=-1)
        k = torch.cat((rotate(k[..., :r], positions, rope_theta), k[..., r:]), dim=-1)
    turned = householder_keys(x, p, k) if position == "path" else None  # (B, kv, T, T, d): key j as query i sees it
    group = torch.arange(n_head, device=x.device) // (n_head // n_kv_head)  # each query head's key/value head
    if differential:  # the paper's grouped form: map c of differential head h reads key/value head 2 g + c of its group
        h = torch.arange(n_head, device=x.device)
        group = 2 * ((h // 2) // (n_head // n_kv_head)) + h % 2
    k, v = k[:, group], v[:, group]
    if nsa is not None:  # its three branches over the queries as the kernel gets them (Llama 4's temperature in)
        if query_temperature is not None:
            q = q * temperature(T, query_temperature, x.device)[:, None]
        heads_out = nsa_heads(q, k, v, x, p, allowed(T, T, window, x.device, seen), softcap, *nsa)
        return output_projection(heads_out.transpose(1, 2).reshape(B, T, C), x, p, gate, n_head)
    if compressed is not None:  # one softmax over the window's keys and the entries (Llama 4's temperature in)
        if query_temperature is not None:
            q = q * temperature(T, query_temperature, x.device)[:, None]
        heads_out = compressed_heads(q, k, v, p, allowed(T, T, window, x.device, seen), softcap,
                                     p["sinks"] if sinks else None, *compressed)  # fmt: skip
        return output_projection(heads_out.transpose(1, 2).reshape(B, T, C), x, p, gate, n_head)
    if moba is not None:  # the gates read the queries and keys as the scores do, before any modification of those
        blocks = moba_selection(q, k, allowed(T, T, window, x.device, seen), *moba)
        selected = blocks if selected is None else blocks & selected[:, None]
    if turned is None:
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    else:
        scores = torch.einsum("bhid,bhijd->bhij", q, turned[:, group]) / math.sqrt(d)
    if query_temperature is not None:
        scores = scores * temperature(T, query_temperature, x.device)[:, None]
    if ssmax is not None:
        scores = scores * scalable(ssmax + p["ssmax_offset"], allowed(T, T, window, x.device, seen), selected)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if position == "alibi":
        slopes = torch.tensor(paper_alibi_slopes(n_head), dtype=torch.float64, device=x.device)
        distance = (positions[:, None] - positions[None, :]).double()  # i - j
        scores = scores - slopes[:, None, None] * distance
    if forget_gate:  # key j seen from i weighs f_{j+1} ... f_i: the log of that product, c_i - c_j
        log_f = torch.log(torch.sigmoid(x @ p["forget.weight"].T + p["forget.bias"])).transpose(1, 2)  # (B, H, T)
        c = log_f.cumsum(dim=-1)
        scores = scores + (c[..., :, None] - c[..., None, :])
    scores = scores.masked_fill(~allowed(T, T, window, x.device, seen), float("-inf"))
    if selected is not None:
        scores = scores.masked_fill(~(selected if selected.dim() == 4 else selected[:, None]), float("-inf"))
    if sinks:  # one more logit per head in the denominator; the weight it takes goes nowhere
        sink = p["sinks"].view(1, n_head, 1, 1).expand(B, n_head, T, 1)
        weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    else:
        weights = torch.softmax(scores, dim=-1)
    if differential:
        out = differential_heads(weights, v, p, lambda_init)
    else:
        out = (weights @ v).transpose(1, 2).reshape(B, T, C)  # (B, H, T, d): the heads side by side
    return output_projection(out, x, p, gate, n_head)


def output_projection(out: torch.Tensor, x: torch.Tensor, p: dict, gate: str, n_head: int) -> torch.Tensor:
    """The heads' outputs side by side (B, T, C) through the output gate (from the block's input ``x``) and c_proj."""
    B, T, C = out.shape
    if gate != "none":  # sigmoid(x W_g): (B, T, H), one per head's d dims; (B, T, C), one per element
        g = torch.sigmoid(x @ p["gate.weight"].T)
        out = (out.view(B, T, n_head, C // n_head) * g[..., None]).view(B, T, C) if gate == "headwise" else out * g
    return out @ p["c_proj.weight"].T + (p["c_proj.bias"] if "c_proj.bias" in p else 0.0)


def nsa_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor, p: dict, shown: torch.Tensor,
              softcap: float | None, size: int, topk: int, window: int) -> torch.Tensor:  # fmt: skip
    """Native Sparse Attention (Yuan et al. 2025, arXiv 2502.11089, eq. 5-12) of each query head's queries ``q`` and
    keys and values ``k``, ``v`` (B, H, T, d, each head its group's), query by query -> (B, H, T, d):
    o_t = g_cmp Attn(q_t, K_cmp, V_cmp) + g_slc Attn(q_t, the chosen blocks' keys) + g_swa Attn(q_t, the last
    ``window`` keys), (g_cmp, g_slc, g_swa) per head = sigmoid(x_t W_g + b_g), rows branch by branch. Block b (keys
    b l .. b l + l - 1, l = ``size``) compressed: K_cmp[b] = W_ck [k_{bl} + p_0; ...; k_{bl+l-1} + p_{l-1}] (the
    keys laid end to end, each plus the learned position embedding of its place in the block), V_cmp alike with its
    own. A block is a candidate for query t where it is earlier than t's own block and t sees all of it (``shown``,
    (T, T)); the compressed branch attends the candidates (none: 0); the selection attends t's own block and the
    topk - 1 candidates of highest q_t . K_cmp[b], equal scores to the later block, each key t sees of them. Each
    softmax is of q . k / sqrt(d), softcapped where ``softcap`` is given."""
    B, H, T, d = q.shape
    blocks = T // size
    g = torch.sigmoid(x @ p["nsa.gates.weight"].T + p["nsa.gates.bias"]).view(B, T, 3, H)

    def compress(t: torch.Tensor, positions: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        laid = [torch.cat([t[:, :, b * size + j] + positions[j] for j in range(size)], dim=-1) for b in range(blocks)]
        return torch.stack(laid, dim=2) @ weight.T if blocks else t[:, :, :0]  # (B, H, blocks, d)

    k_cmp = compress(k, p["nsa.key_positions"], p["nsa.compress_keys.weight"])
    v_cmp = compress(v, p["nsa.value_positions"], p["nsa.compress_values.weight"])

    def softmax_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                          seen: torch.Tensor) -> torch.Tensor:  # fmt: skip
        scores = (query[..., None, :] @ keys.transpose(-1, -2))[..., 0, :] / math.sqrt(d)  # (B, H, keys)
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        weights = torch.softmax(scores.masked_fill(~seen, float("-inf")), dim=-1)
        return (weights[..., None, :] @ values)[..., 0, :]

    rows = []
    for t in range(T):
        own, qt = t // size, q[:, :, t]
        candidates = [b for b in range(own) if bool(shown[t, b * size : (b + 1) * size].all())]
        o_cmp = qt.new_zeros(B, H, v.size(-1))
        if candidates:
            every = torch.ones(len(candidates), dtype=torch.bool, device=q.device)
            o_cmp = softmax_attention(qt, k_cmp[:, :, candidates], v_cmp[:, :, candidates], every)
        ranks = (qt[..., None, :] @ k_cmp.transpose(-1, -2))[..., 0, :].tolist()  # (B, H, blocks): q_t . K_cmp[b]
        chosen = torch.zeros(B, H, T, dtype=torch.bool, device=q.device)
        for i in range(B):
            for h in range(H):
                for b in [own, *sorted(candidates, key=lambda b: (-ranks[i][h][b], -b))[: topk - 1]]:
                    chosen[i, h, b * size : (b + 1) * size] = True
        o_slc = softmax_attention(qt, k, v, chosen & shown[t])
        s = torch.arange(T, device=q.device)
        o_swa = softmax_attention(qt, k, v, (shown[t] & (t - s < window)).expand(B, H, T))
        gt = g[:, t, ..., None]  # (B, 3, H, 1)
        rows.append(gt[:, 0] * o_cmp + gt[:, 1] * o_slc + gt[:, 2] * o_swa)
    return torch.stack(rows, dim=2)


PATH_EPS = 1e-6  # PaTH's L2 norm of w (fla's l2_norm): w / sqrt(|w|^2 + eps)


def householder_keys(x: torch.Tensor, p: dict, k: torch.Tensor) -> torch.Tensor:
    """PaTH (Yang et al. 2025, eq. 2-3): the logit of query i and key j is q_i^T H_i H_{i-1} ... H_{j+1} k_j, each
    token's H_t = I - beta_t w_t w_t^T a d x d matrix, w_t = x_t W_w of the key/value head, L2-normalised, beta_t =
    2 sigmoid(x_t w_b + b_b) (fla's PaTHAttention: in (0, 2), a reflection at 2). Written as the matrices multiplied
    in turn into each key: -> (B, kv, T, T, d), key j as query i sees it (itself for j >= i: the empty product).
    H_i k is taken as k - beta_i w_i (w_i . k), the same matrix's product without forming it (d x d products of
    every key at every token cost the deep sweep minutes a cell)."""
    B, T, _ = x.shape
    w = (x @ p["path_w.weight"].T).view(B, T, k.size(1), k.size(-1)).transpose(1, 2)
    w = w / torch.sqrt(w.pow(2).sum(dim=-1, keepdim=True) + PATH_EPS)
    beta = 2 * torch.sigmoid(x @ p["path_beta.weight"].T + p["path_beta.bias"]).transpose(1, 2)  # (B, kv, T)
    before = torch.arange(T, device=x.device)[:, None]  # key j, compared with the token i that turns it
    carried, seen = k, []  # carried: key j times H_i ... H_{j+1}, through token i
    for i in range(T):
        w_i = w[:, :, i, None]  # (B, kv, 1, d)
        turned = carried - beta[:, :, i, None, None] * w_i * (carried * w_i).sum(dim=-1, keepdim=True)  # H_i k
        carried = torch.where(before < i, turned, carried)  # only the keys before token i
        seen.append(carried)
    return torch.stack(seen, dim=2)


def differential_heads(weights: torch.Tensor, v: torch.Tensor, p: dict, lambda_init: float) -> torch.Tensor:
    """The Diff Transformer's heads (Ye et al. 2024, arXiv 2410.05258, eq. 1-3), from the n_head softmax maps
    ``weights`` (B, H, T, T) and each query head's values ``v`` (B, H, T, d): head h weighs the keys by the maps'
    difference, A_2h - lambda A_2h+1, with lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, over the pair's
    values [v_2h, v_2h+1] (with grouped heads, its group's pair of value heads, 2d wide: the paper's code); then
    RMSNorm (no scale; eps 1e-5) and (1 - lambda_init). -> (B, T, C), heads side by side."""
    lam = (torch.exp(p["diff.lambda_q1"] @ p["diff.lambda_k1"]) - torch.exp(p["diff.lambda_q2"] @ p["diff.lambda_k2"])
           + lambda_init)  # fmt: skip
    heads = []
    for h in range(weights.size(1) // 2):
        o = (weights[:, 2 * h] - lam * weights[:, 2 * h + 1]) @ torch.cat((v[:, 2 * h], v[:, 2 * h + 1]), dim=-1)
        heads.append(o / torch.sqrt(o.pow(2).mean(dim=-1, keepdim=True) + 1e-5) * (1 - lambda_init))
    return torch.cat(heads, dim=-1)


def scalable(s: torch.Tensor, shown: torch.Tensor, selected: torch.Tensor | None) -> torch.Tensor:
    """Scalable-Softmax's factor of the scores (Nakanishi 2025, eq. 2: softmax over z_j (s log n)), (B or 1, H, T, 1):
    s_h (H,) times ln n_i, n_i the size of query i's softmax input, the keys it sees: those ``shown`` (T, T) by its
    masks and, with sparse attention, ``selected`` (B, T, T) among them."""
    n = (shown if selected is None else shown & selected).sum(dim=-1).double()  # (T,) or (B, T)
    return s.view(1, -1, 1, 1) * n.log().view(-1, 1, n.size(-1), 1)


def temperature(T: int, steps: int, device) -> torch.Tensor:
    """Llama 4's temperature of the query at each position i < T (float64): 1 + 0.1 ln(1 + floor((i + 1) / steps)),
    its scores (equally, its query) scaled by it."""
    return torch.tensor([1 + 0.1 * math.log(1 + (i + 1) // steps) for i in range(T)], dtype=torch.float64,
                        device=device)  # fmt: skip


def layer_norm(t: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * g + b over the last dimension (the biased variance)."""
    mean = t.mean(dim=-1, keepdim=True)
    return (t - mean) / torch.sqrt((t - mean).pow(2).mean(dim=-1, keepdim=True) + eps) * weight + bias


def index_scores(block, x: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3.2's lightning indexer (its paper, eq. 1) from the block's weights, float64, (B, T, T): query t's
    score of key s, I[t, s] = sum_j w[t, j] ReLU(q[t, j] . k[s]); q[t, j] = W_q x_t's head j, k[s] = LayerNorm(W_k
    x_s) (eps 1e-6), with rotary positions both turned by RoFormer's rotation at their positions in their first
    qk_rope_head_dim dims (the block's rotary width: its decoupled key's under MLA, its heads' rotary part else; at
    most the indexer's width), the rest passing; w[t, j] = (W_w x_t)_j / sqrt(heads x dim), transformers'
    DeepseekV32Indexer's scale."""
    spec = block.spec
    p = {name.removeprefix("indexer."): t.double() for name, t in block.named_parameters()
         if name.startswith("indexer.")}  # fmt: skip
    x = x.double()
    B, T, _ = x.shape
    H, d = spec.indexer_heads, spec.indexer_dim
    positions = torch.arange(T, device=x.device)
    q = (x @ p["wq.weight"].T).view(B, T, H, d).transpose(1, 2)  # (B, H, T, d)
    k = layer_norm(x @ p["wk.weight"].T, p["k_norm.weight"], p["k_norm.bias"], eps=1e-6)  # (B, T, d); V3.2's eps
    if spec.position == "rope":  # the first dims, as many as the block's rotary part turns, at that width's frequencies
        r = min(spec.rope_head_dim if spec.rope_head_dim is not None else round(spec.rope_fraction * spec.head_dim), d)
        q = torch.cat((rotate(q[..., :r], positions, spec.rope_theta), q[..., r:]), dim=-1)
        k = torch.cat((rotate(k[..., :r], positions, spec.rope_theta), k[..., r:]), dim=-1)
    w = (x @ p["weights_proj.weight"].T) / math.sqrt(H * d)  # (B, T, H)
    scores = torch.zeros(B, T, T, dtype=torch.float64, device=x.device)
    for j in range(H):
        scores = scores + w[:, :, j, None] * torch.relu(q[:, j] @ k.transpose(-1, -2))
    return scores


def moba_selection(q: torch.Tensor, k: torch.Tensor, shown: torch.Tensor, size: int, topk: int) -> torch.Tensor:
    """(B, H, T, T): True where query t of head h attends key s under MoBA (Lu et al. 2025, arXiv 2502.13189, sec.
    2.2): the keys cut into blocks of ``size`` positions, the query attends its own block (causal) and the topk - 1
    earlier blocks b of highest gate q_t . mean_{j in b} k_j (its head's queries ``q`` and keys ``k``, (B, H, T, d)),
    equal gates to the later block; a block is a candidate only where the query sees every key of it (``shown``,
    (T, T)), and of the blocks chosen it attends the keys it sees."""
    B, H, T, _ = q.shape
    blocks = -(-T // size)
    means = torch.stack([k[:, :, b * size : (b + 1) * size].mean(dim=2) for b in range(blocks)], dim=2)
    gates = (q @ means.transpose(-1, -2)).tolist()  # (B, H, T, blocks)
    selected = torch.zeros(B, H, T, T, dtype=torch.bool, device=q.device)
    for t in range(T):
        own = t // size
        candidates = [b for b in range(own) if bool(shown[t, b * size : (b + 1) * size].all())]
        for i in range(B):
            for h in range(H):
                row = gates[i][h][t]
                for b in [own, *sorted(candidates, key=lambda b: (-row[b], -b))[: topk - 1]]:
                    selected[i, h, t, b * size : (b + 1) * size] = True
    return selected & shown


def compressed_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: dict, shown: torch.Tensor,
                     softcap: float | None, sinks: torch.Tensor | None, ratio: int, topk: int | None,
                     window: int) -> torch.Tensor:  # fmt: skip
    """DeepSeek-V4's compressed attention (its CSA and HCA layers) of each query head's queries ``q`` and keys and
    values ``k``, ``v`` (B, H, T, d, each head its group's), query by query -> (B, H, T, d). Block b (keys b m .. b m
    + m - 1, m = ``ratio``) pooled per dimension: K_cmp[b] = sum_j softmax_j(k_{bm+j} W_k + a_j) * k_{bm+j}, V_cmp
    alike with W_v and c_j. A block is a candidate for query t where it is earlier than t's own block and t sees all
    of it (``shown``, (T, T)); t attends, in one softmax of q . key / sqrt(d) (softcapped where ``softcap`` is given,
    with one more logit per head where ``sinks`` (H,) are), the keys it sees among the last ``window`` and the
    entries: every candidate (HCA, ``topk`` None), or the ``topk`` candidates of highest q_t . K_cmp[b], equal scores
    to the later block (CSA)."""
    B, H, T, d = q.shape
    blocks = T // ratio

    def pool(t: torch.Tensor, gate: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        entries = []
        for b in range(blocks):
            block = t[:, :, b * ratio : (b + 1) * ratio]  # (B, H, m, d)
            weights = torch.softmax(block @ gate.T + positions, dim=-2)  # per dim, over the block's positions
            entries.append((weights * block).sum(dim=-2))
        return torch.stack(entries, dim=2) if blocks else t[:, :, :0]  # (B, H, blocks, d)

    k_cmp = pool(k, p["compressor.key_gate.weight"], p["compressor.key_positions"])
    v_cmp = pool(v, p["compressor.value_gate.weight"], p["compressor.value_positions"])
    rows = []
    for t in range(T):
        qt, s = q[:, :, t], torch.arange(T, device=q.device)
        candidates = [b for b in range(t // ratio) if bool(shown[t, b * ratio : (b + 1) * ratio].all())]
        ranks = (qt[..., None, :] @ k_cmp.transpose(-1, -2))[..., 0, :].tolist()  # (B, H, blocks)
        row = qt.new_zeros(B, H, v.size(-1))
        for i in range(B):
            for h in range(H):
                chosen = candidates if topk is None else sorted(candidates, key=lambda b: (-ranks[i][h][b], -b))[:topk]
                near = [j for j in range(T) if shown[t, j] and t - s[j] < window]
                keys = torch.cat((k[i, h, near], k_cmp[i, h, chosen]), dim=0)
                values = torch.cat((v[i, h, near], v_cmp[i, h, chosen]), dim=0)
                logits = keys @ qt[i, h] / math.sqrt(d)
                if softcap is not None:
                    logits = softcap * torch.tanh(logits / softcap)
                if sinks is not None:
                    logits = torch.cat((logits, sinks[h : h + 1]))
                weights = torch.softmax(logits, dim=0)[: keys.size(0)]
                row[i, h] = weights @ values
        rows.append(row)
    return torch.stack(rows, dim=2)


def compressed_of(spec) -> tuple | None:
    """DeepSeek-V4's compressed attention's (ratio, top-k, window) of a block's spec, or None where it has none."""
    ratio = getattr(spec, "compress_ratio", None)
    return None if ratio is None else (ratio, spec.compress_topk, spec.compress_window)


def nsa_of(spec) -> tuple[int, int, int] | None:
    """NSA's (block, top-n, window) of a block's spec, or None where it has none."""
    size = getattr(spec, "nsa_block", None)
    return None if size is None else (size, spec.nsa_topk, spec.nsa_window)


def moba_of(spec) -> tuple[int, int] | None:
    """MoBA's (block, top-k) of a block's spec, or None where it has none."""
    size = getattr(spec, "moba_block", None)
    return None if size is None else (size, spec.moba_topk)


def sparse_selection(block, x: torch.Tensor, seen: dict) -> torch.Tensor | None:
    """(B, T, T): True where query t attends key s under DeepSeek's sparse attention: among the keys its masks show
    (``seen``), the ``sparse_topk`` of highest index score, equal scores to the later key; None for a dense block, or
    one whose indexer is warming up (dense attention while it learns)."""
    k = getattr(block.spec, "sparse_topk", None)
    if k is None or not block.indexer.selecting:
        return None
    scores, shown = index_scores(block, x), allowed(x.size(1), x.size(1), None, x.device, seen)
    B, T, _ = scores.shape
    selected = torch.zeros(B, T, T, dtype=torch.bool, device=x.device)
    for b in range(B):
        for t in range(T):
            candidates = [s for s in range(T) if shown[t, s]]
            for s in sorted(candidates, key=lambda s: (-scores[b, t, s].item(), -s))[:k]:
                selected[b, t, s] = True
    return selected


# ------------------------------------------------------------------ every function's formula, from its block


def mask_values(spec) -> dict:
    """Each registered mask's value for a block of ``spec`` ({mask name: value}, as ``model.attention.masks`` reads
    the spec: the window past its block size for a model without a position table), for the predicates above."""
    return {mask.name: value for mask, value in masks_of(spec)}


def softmax_reference(block, layout: str, x: torch.Tensor, seen: dict) -> torch.Tensor:
    """Multi-head attention (GPT-2's function and its options), ``reference_attention`` at the block's spec."""
    spec = block.spec
    return reference_attention(block, layout, x, spec.n_head, spec.kv_heads, None, spec.position, spec.rope_theta,
                               spec.qk_norm, spec.softcap, spec.sinks, spec.gate, spec.rope_fraction,
                               spec.forget_gate, spec.query_temperature, spec.differential, spec.lambda_init,
                               seen=seen, selected=sparse_selection(block, x, seen), ssmax=spec.ssmax,
                               k_eq_v=spec.k_eq_v, moba=moba_of(spec), nsa=nsa_of(spec),
                               compressed=compressed_of(spec))  # fmt: skip


def gpt_reference(model, idx: torch.Tensor) -> torch.Tensor:
    """A GPT's logits (B, T, V) at token ids ``idx`` in float64, written from its definition: embeddings (and the
    learned position table), each layer x + attn(LN(x)), x + MLP(LN(x)) (GPT-2's tanh GELU), the final LN, the tied
    head; a layer that reads another's keys and values (``model.kv_sources``) attends with them as projected and
    encoded by that layer at its input (``reference_attention``'s ``source``). Softmax attention's layouts only."""
    cfg, T = model.config, idx.size(1)
    x = model.transformer.wte.weight.double()[idx]
    if cfg.position == "learned":
        x = x + model.transformer.wpe.weight.double()[:T]
    inputs = []
    for i, block in enumerate(model.transformer.h):
        ln = block.ln_1
        a = layer_norm(x, ln.weight.double(), ln.bias.double() if ln.bias is not None else torch.zeros_like(ln.weight))
        inputs.append(a)
        j, spec = model.kv_sources[i], block.attn.spec
        x = x + reference_attention(block.attn, cfg.attention, a, spec.n_head, spec.kv_heads, None, spec.position,
                                    spec.rope_theta, spec.qk_norm, spec.softcap, spec.sinks, spec.gate,
                                    spec.rope_fraction, seen=mask_values(spec), k_eq_v=spec.k_eq_v,
                                    source=None if j is None else (model.transformer.h[j].attn, inputs[j]))  # fmt: skip
        ln, mlp = block.ln_2, block.mlp
        h = layer_norm(x, ln.weight.double(), ln.bias.double() if ln.bias is not None else torch.zeros_like(ln.weight))
        h = h @ mlp.c_fc.weight.double().T + (mlp.c_fc.bias.double() if mlp.c_fc.bias is not None else 0.0)
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))  # GPT-2's GELU
        x = x + h @ mlp.c_proj.weight.double().T + (mlp.c_proj.bias.double() if mlp.c_proj.bias is not None else 0.0)
    ln = model.transformer.ln_f
    x = layer_norm(x, ln.weight.double(), ln.bias.double() if ln.bias is not None else torch.zeros_like(ln.weight))
    return (x @ model.lm_head.weight.double().T)[..., : cfg.vocab_size]


def latent_reference(block, layout: str, x: torch.Tensor, seen: dict, rotation=None, weights_too: bool = False):
    """DeepSeek-V2's multi-head latent attention, equations (9)-(19), head by head, in float64 from the block's
    weights: c = RMSNorm(W_DKV x); k_h = W_UK,h c; v_h = W_UV,h c; q_h = W_Q,h x; with rope, q_h gets RoPE(W_QR,h x)
    and every head's key the one RoPE(W_KR x); scores / sqrt(head_dim + rope_head_dim), then the modifications
    (softcap, ALiBi, the forget gate), the masks, the softmax (and sink). ``rotation``: the rotary formula (default
    ``rotate``, float64 angles); ``weights_too``: also each head's attention weights, (B, H, T, T)."""
    spec = block.spec
    rotation = rotation or (lambda t, positions: rotate(t, positions, spec.rope_theta))
    heads, L, R = spec.n_head, spec.kv_latent, spec.rope_head_dim or 0
    B, T, C = x.shape
    d = C // heads
    p = {k: v.double() for k, v in block.named_parameters()}
    x = x.double()
    positions = torch.arange(T, device=x.device)

    def linear(t, name, rows=slice(None)):
        return t @ p[f"{name}.weight"][rows].T + (p[f"{name}.bias"][rows] if f"{name}.bias" in p else 0.0)

    down = linear(x, "wkv_a")
    c = rms_norm(down[..., :L], p["kv_norm.weight"])  # (B, T, L): the latent
    k_rope = rotation(down[..., L:], positions) if R else None  # (B, T, R): one key for every head
    seen_mask = allowed(T, T, None, x.device, seen)
    selected = sparse_selection(block, x, seen)
    seen_mask = seen_mask if selected is None else seen_mask & selected  # (B, T, T) with sparse attention
    slopes = torch.tensor(paper_alibi_slopes(heads), dtype=torch.float64) if spec.position == "alibi" else None
    forgotten = None  # the forget gate's c_i - c_j per head, c the cumulative sum of log f (reference_attention's)
    if spec.forget_gate:
        through = torch.log(torch.sigmoid(linear(x, "forget"))).cumsum(dim=1)  # (B, T, H)
        forgotten = through[:, :, None, :] - through[:, None, :, :]  # (B, T, T, H)
    i, j = positions[:, None], positions[None, :]
    ssmax = None if spec.ssmax is None else scalable(spec.ssmax + p["ssmax_offset"], seen_mask, None)  # (.., H, T, 1)
    outputs, every, nsa_parts = [], [], []
    for h in range(heads):
        q = linear(x, "wq", slice(h * (d + R), h * (d + R) + d))
        k = linear(c, "wkv_b", slice(2 * h * d, 2 * h * d + d))
        v = linear(c, "wkv_b", slice(2 * h * d + d, 2 * (h + 1) * d))
        if spec.qk_norm:
            q, k = rms_norm(q, p["q_norm.weight"]), rms_norm(k, p["k_norm.weight"])
        scores = q @ k.transpose(-1, -2)
        head_seen = seen_mask
        if R:
            q_rope = rotation(linear(x, "wq", slice(h * (d + R) + d, (h + 1) * (d + R))), positions)
            scores = scores + q_rope @ k_rope.transpose(-1, -2)
        if moba_of(spec) is not None:  # this head's gates: its whole queries and keys, the rotary part's too
            whole_q = torch.cat((q, q_rope), dim=-1) if R else q
            whole_k = torch.cat((k, k_rope.expand(B, T, R)), dim=-1) if R else k
            shown = allowed(T, T, None, x.device, seen)
            head_seen = seen_mask & moba_selection(whole_q[:, None], whole_k[:, None], shown, *moba_of(spec))[:, 0]
        if nsa_of(spec) is not None or compressed_of(spec) is not None:  # each head's whole queries and keys (the
            # rotary part's too): NSA's branches, the compressed entries
            nsa_parts.append((torch.cat((q, q_rope), dim=-1) if R else q,
                              torch.cat((k, k_rope.expand(B, T, R)), dim=-1) if R else k, v))  # fmt: skip
            continue
        scores = scores / math.sqrt(d + R)
        if spec.query_temperature is not None:
            scores = scores * temperature(T, spec.query_temperature, x.device)[:, None]
        if ssmax is not None:
            scores = scores * ssmax[:, h]
        if spec.softcap is not None:
            scores = spec.softcap * torch.tanh(scores / spec.softcap)
        if slopes is not None:
            scores = scores - slopes[h] * (i - j)
        if forgotten is not None:
            scores = scores + forgotten[..., h]
        scores = scores.masked_fill(~head_seen, float("-inf"))
        if spec.sinks:
            weights = torch.softmax(torch.cat((scores, p["sinks"][h].expand(B, T, 1)), dim=-1), dim=-1)[..., :-1]
        else:
            weights = torch.softmax(scores, dim=-1)
        outputs.append(weights @ v)
        every.append(weights)
    if nsa_parts:  # NSA (``nsa_heads``), or the compressed entries (``compressed_heads``), over every head's whole
        # queries, keys and values, Llama 4's temperature in
        q, k, v = (torch.stack(parts, dim=1) for parts in zip(*nsa_parts))
        if spec.query_temperature is not None:
            q = q * temperature(T, spec.query_temperature, x.device)[:, None]
        shown = allowed(T, T, None, x.device, seen)
        if nsa_of(spec) is not None:
            outputs = [nsa_heads(q, k, v, x, p, shown, spec.softcap, *nsa_of(spec)).transpose(1, 2).flatten(2)]
        else:
            outputs = [compressed_heads(q, k, v, p, shown, spec.softcap, p["sinks"] if spec.sinks else None,
                                        *compressed_of(spec)).transpose(1, 2).flatten(2)]  # fmt: skip
    y = torch.cat(outputs, dim=-1)
    if spec.gate != "none":
        g = torch.sigmoid(x @ p["gate.weight"].T)
        y = y * (g.repeat_interleave(d, dim=-1) if spec.gate == "headwise" else g)
    out = linear(y, "c_proj")
    return (out, torch.stack(every, dim=1)) if weights_too else out


def recurrent_delta_rule(q, k, v, log_decay, beta, state=None):
    """The gated delta rule one token at a time (Gated DeltaNet, arXiv 2412.06464, eq. 10): decay the state, erase
    what it holds for k_t and write v_t there by beta_t, read it with q_t."""
    B, H, T, dk = q.shape
    S = torch.zeros(B, H, dk, v.size(-1), dtype=q.dtype, device=q.device) if state is None else state
    out = []
    for t in range(T):
        S = S * log_decay[:, :, t].exp()[..., None, None]
        erase_write = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k[:, :, t], S))
        S = S + k[:, :, t, :, None] * erase_write[:, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(out, dim=2), S


def convolved_qkv(weight: torch.Tensor, mixed: torch.Tensor, H: int, hd: int):
    """The delta rule layers' queries, keys and values, (B, H, T, hd) each: the causal depthwise convolution of
    ``mixed`` (B, T, 3C) written tap by tap (tap i reads the input CONV_SIZE - 1 - i positions back), a SiLU, then
    queries and keys L2-normalised per head, the queries scaled by 1/sqrt(hd)."""
    import torch.nn.functional as F

    from model.mixers.deltanet import CONV_SIZE

    B, T, _ = mixed.shape
    w = weight[:, 0]  # (3C, CONV_SIZE)
    conv = torch.stack([sum(w[:, i] * mixed[:, t - (CONV_SIZE - 1) + i] for i in range(CONV_SIZE)
                            if t - (CONV_SIZE - 1) + i >= 0) for t in range(T)], dim=1)  # fmt: skip
    q, k, v = F.silu(conv).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
    return l2_norm(q) / math.sqrt(hd), l2_norm(k), v


def l2_norm(t: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """t / sqrt(|t|^2 + eps) over the last dimension: Qwen3-Next's, Kimi Linear's and fla's L2 norm."""
    return t / torch.sqrt(t.pow(2).sum(dim=-1, keepdim=True) + eps)


def beta_of(block, b: torch.Tensor) -> torch.Tensor:
    """The delta rules' beta from its inputs ``b`` (B, T, H) -> (B, H, T): sigmoid(b) in (0, 1), or with
    model.negative_eigenvalues 2 sigmoid(b) in (0, 2), the transition I - beta k k^T's eigenvalue 1 - beta in (-1, 1)
    (Grazzi et al. 2025, arXiv 2411.12537; OLMo Hybrid's, fla's allow_neg_eigval)."""
    return (2.0 if block.spec.negative_eigenvalues else 1.0) * torch.sigmoid(b).transpose(1, 2)


def deltanet_reference(block, layout: str, x: torch.Tensor, seen: dict) -> torch.Tensor:
    """Gated DeltaNet's layer (arXiv 2412.06464) from the block's weights, step by step in float64: projections, the
    causal depthwise convolution and SiLU, L2-normalised queries (scaled) and keys, beta and the decay, the
    recurrence, the output's RMSNorm gated by SiLU, c_proj. It has no masks: its state is its memory."""
    import torch.nn.functional as F


    p = {k: v.double() for k, v in block.named_parameters()}
    x = x.double()
    B, T, C = x.shape
    H, hd = block.n_head, block.head_dim
    mixed, gate, b, a = (x @ p["in_proj.weight"].T).split([3 * C, C, H, H], dim=-1)
    q, k, v = convolved_qkv(p["conv_weight"], mixed, H, hd)
    beta = beta_of(block, b)
    log_decay = (-torch.exp(p["A_log"]) * F.softplus(a + p["dt_bias"])).transpose(1, 2)
    o, _ = recurrent_delta_rule(q, k, v, log_decay, beta)
    o = o.transpose(1, 2)
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + block.o_norm.eps) * p["o_norm.weight"]
    y = (o * F.silu(gate.view(B, T, H, hd))).reshape(B, T, C)
    return y @ p["c_proj.weight"].T + (p["c_proj.bias"] if "c_proj.bias" in p else 0.0)


def recurrent_kda(q, k, v, log_decay, beta, state=None):
    """Kimi Delta Attention's rule one token at a time (Kimi Linear, arXiv 2510.26692, eq. 1): decay each key
    channel's row of the state by its own alpha_t, erase what it holds for k_t and write v_t there by beta_t, read it
    with q_t. ``log_decay`` is (B, H, T, dk)."""
    B, H, T, dk = q.shape
    S = torch.zeros(B, H, dk, v.size(-1), dtype=q.dtype, device=q.device) if state is None else state
    out = []
    for t in range(T):
        S = S * log_decay[:, :, t].exp()[..., :, None]
        erase_write = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhk,bhkv->bhv", k[:, :, t], S))
        S = S + k[:, :, t, :, None] * erase_write[:, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    return torch.stack(out, dim=2), S


def kda_reference(block, layout: str, x: torch.Tensor, seen: dict) -> torch.Tensor:
    """Kimi Delta Attention's layer (arXiv 2510.26692) from the block's weights, step by step in float64: the
    projections, the causal depthwise convolution and SiLU, L2-normalised queries (scaled) and keys, beta, the
    decays per channel from the low-rank projection (alpha = exp(-A softplus(f + dt_bias)), A per head), the
    recurrence, the output's RMSNorm gated by a sigmoid of the second low-rank projection, c_proj."""
    import torch.nn.functional as F


    p = {k: v.double() for k, v in block.named_parameters()}
    x = x.double()
    B, T, C = x.shape
    H, hd = block.n_head, block.head_dim
    mixed, b = (x @ p["qkvb_proj.weight"].T).split([3 * C, H], dim=-1)
    q, k, v = convolved_qkv(p["conv_weight"], mixed, H, hd)
    beta = beta_of(block, b)
    f = x @ p["decay_down.weight"].T @ p["decay_up.weight"].T + p["dt_bias"]  # (B, T, C): a decay per channel
    A = torch.exp(p["A_log"]).repeat_interleave(hd)
    log_decay = (-A * F.softplus(f)).view(B, T, H, hd).transpose(1, 2)
    o, _ = recurrent_kda(q, k, v, log_decay, beta)
    o = o.transpose(1, 2)
    o = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + block.o_norm.eps) * p["o_norm.weight"]
    g = x @ p["gate_down.weight"].T @ p["gate_up.weight"].T + p["gate_up.bias"]
    y = (o * torch.sigmoid(g.view(B, T, H, hd))).reshape(B, T, C)
    return y @ p["c_proj.weight"].T + (p["c_proj.bias"] if "c_proj.bias" in p else 0.0)


@dataclass(frozen=True)
class Tolerance:
    """How far a float32 block may lie from its float64 formula, element by element: |got - want| <= atol (1 + scale)
    + rtol |want|, ``scale`` the largest |want| of the tensor (of every gradient at once, for a gradient: some are
    zero in exact arithmetic and keep in float32 the round-off of the terms that cancel). Round-off, relative to the
    values' size: a wrong mask or head moves values by their own size."""

    atol: float = 2e-5
    rtol: float = 1e-4

    def bounds(self, scale: float) -> tuple[float, float]:
        """(atol, rtol) for tensors whose largest |value| is ``scale``."""
        return self.atol * (1.0 + scale), self.rtol

    def __str__(self) -> str:
        return f"|got - want| <= {self.atol:g} (1 + scale) + {self.rtol:g} |want|"


@dataclass(frozen=True)
class Formula:
    """A function's float64 formula, (block, layout, x, keys seen) -> the block's output, and how far a float32 block
    may lie from it: its outputs and its gradients. A layer whose math amplifies round-off (a norm of a near-zero
    vector) states its own tolerance here, beside its formula, instead of loosening every function's."""

    compute: Callable[..., torch.Tensor]
    outputs: Tolerance = Tolerance()
    gradients: Tolerance = Tolerance()

    def __call__(self, block, layout: str, x: torch.Tensor, seen: dict) -> torch.Tensor:
        return self.compute(block, layout, x, seen)


# Every function a registered layer computes (its layout class's ``function``) -> its float64 formula, written from
# its paper, and its tolerances. A registered function without one fails test_attention_properties.py: a new layer
# is held to its formula by the grid, with no test of its own to write.
REFERENCES = {"mha": Formula(softmax_reference), "mla": Formula(latent_reference),
              # Gated DeltaNet's gradients through a recurrence of reflections (model.negative_eigenvalues: beta near 2)
              # gather float32 round-off: the deep sweep's cell at T=29 was 1.57e-2 off on 2 of 768 conv-weight
              # gradients (scale 304) where 2e-5 (1 + scale) allowed 6.1e-3. The same block in float64 is this formula
              # to 6.7e-12 there (2.2e-14 of the scale; tests/test_deltanet.py holds it to 1e-9 across chunk edges), so
              # the margin is float32's, not a wrong step; outputs keep float32's round-off
              "gated_deltanet": Formula(deltanet_reference, gradients=Tolerance(atol=6e-5)),
              "kda": Formula(kda_reference)}


def formula_of(block) -> Formula:
    """The formula of the block's function (``REFERENCES``), with its tolerances."""
    return REFERENCES[type(block).function]


def reference(block, x: torch.Tensor, seen: dict | None = None) -> torch.Tensor:
    """The block's function at ``x`` by its function's formula (``REFERENCES``), its options read from its spec."""
    return formula_of(block)(block, type(block).name, x, mask_values(block.spec) if seen is None else seen)
