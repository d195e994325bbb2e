"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, arXiv 2412.06464), ``attention=gated_deltanet``: linear
attention with the delta rule, the layer Qwen3-Next and Qwen3.5 mix 3:1 with full attention.

Each head keeps a matrix state S (head_dim x head_dim) instead of a KV cache. At each token it decays the state
by a_t, erases what the state holds for the key k_t and writes the value v_t there, by the share beta_t:

    S_t = a_t S_{t-1} + beta_t k_t (v_t - a_t S_{t-1}^T k_t)^T,        o_t = S_t^T q_t

(the paper's eq. 10; the erased value is read from the decayed state). Before it, the queries, keys and values
pass a short causal depthwise convolution and a SiLU, and queries and keys are L2-normalised per head (the
queries then scaled by 1/sqrt(head_dim)); beta_t = sigmoid(W_b x_t) (2 sigmoid(W_b x_t) with
``model.negative_eigenvalues``: the transition I - beta_t k_t k_t^T may then reflect, as fla's allow_neg_eigval
does) and the decay a_t = exp(-A softplus(W_a x_t
+ dt_bias)) per head, A and dt drawn as Mamba-2 draws them. After it, each head's output passes an RMSNorm
gated by SiLU(W_g x_t), then ``c_proj``.

Training runs the chunked form (``chunked_delta_rule``: the WY representation, one triangular solve per chunk
and a loop over chunks; plain PyTorch): it equals the recurrence (``tests/test_deltanet.py`` holds both to a
float64 step-by-step reference). Decoding carries the state and the convolution's last inputs in the cache:
memory constant in the length.

It is another function than softmax attention: its weights convert to no other layout (refused, naming this).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from model import registry
from model.attention.modifications import spelled
from model.attention.options import check_applied, stage_options
from model.attention.pipeline import MultiHeadAttention
from model.attention.spec import AttentionSpec
from model.checkpoints.convert import ConvertsToNoOther
from model.registry import MIXERS, MODIFICATIONS, register

if TYPE_CHECKING:
    from model.decoding.kv_cache import LayerCache

CONV_SIZE = 4  # the short convolution's width (the paper's, Qwen3-Next's)
L2_EPS = 1e-6  # the queries' and keys' L2 norm: x / sqrt(|x|^2 + eps), Qwen3-Next's, Kimi Linear's and fla's
# The attention fields a Gated DeltaNet layer has a mechanism of its own for: the values that leave each off, and why.
# The delta rule's options (``option(stage="delta rule")``): every mixer that runs it applies them
DELTA_RULE = stage_options("delta rule", AttentionSpec)
OWN_FIELDS = {
    "window": ((None,), "its state keeps a decayed summary of every earlier token, not a window"),
    "attention_chunk": ((None,), "its state keeps a decayed summary of every earlier token, not a chunk's keys"),
    "n_kv_head": ((None,), "its state is per head; keys and values are not grouped"),
    "qk_norm": ((False,), "it L2-normalises its queries and keys itself"),
    "gate": (("none",), "it gates its output through its own gated RMSNorm"),
    "document_masking": ((False,), "its state carries every earlier token past a document's end (it would have to "
                                   "restart at each one)"),
}


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                       beta: torch.Tensor, chunk: int, state: torch.Tensor | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The gated delta rule over (B, H, T, d) queries, keys, values, (B, H, T) log decays (log a_t <= 0) and
    betas, from ``state`` (B, H, dk, dv; None: zeros), in chunks of ``chunk`` positions -> the outputs (B, H, T,
    dv) and the state after the last position.

    Within a chunk, with G_i the cumulative log decay and gamma_i = exp(G_i), the state after position i is
    gamma_i S_0 + sum_{j<=i} (gamma_i / gamma_j) k_j u_j^T, where the pseudo-values u solve the unit lower
    triangular system (I + A) U = beta V - beta gamma K S_0, A_ij = beta_i (gamma_i / gamma_j) k_i.k_j for j < i.
    So each chunk is matmuls and one triangular solve; only the chunk-to-chunk state is sequential. A length
    that is not a multiple of ``chunk`` is padded with positions that change nothing (k = v = 0, a = 1).
    """
    return run_rule(_one_step, _chunked, q, k, v, log_decay, beta, chunk, state)


def run_rule(one_step, chunked, q, k, v, log_decay, beta, chunk: int, state):
    """A delta rule's forms run in at least float32 with autocast off (the solve and the state's sums): one position
    by ``one_step`` (the recurrence itself, a decode step), more by ``chunked``; the outputs in the values' dtype."""
    work = torch.promote_types(q.dtype, torch.float32)
    with torch.autocast(q.device.type, enabled=False):
        inputs = [t.to(work) for t in (q, k, v, log_decay, beta)]
        state = None if state is None else state.to(work)
        o, state = one_step(*inputs, state) if q.size(2) == 1 else chunked(*inputs, chunk, state)
    return o.to(v.dtype), state


def _one_step(q, k, v, log_decay, beta, S):
    """One position (a decode step): the recurrence itself, no chunk to solve."""
    return delta_step(q, k, v, log_decay.exp().unsqueeze(-1), beta, S)  # (B, H, 1, 1): one decay per head


def delta_step(q, k, v, decay, beta, S):
    """One position of a delta rule from state ``S`` (None: zeros): decay it (``decay`` broadcast over its rows: one
    per head, or one per key channel), erase what it holds for k and write v there by beta, read it with q."""
    B, H, _, dk = q.shape
    S = q.new_zeros(B, H, dk, v.size(-1)) if S is None else S
    S = S * decay
    k_col = k.transpose(-1, -2)  # (B, H, dk, 1)
    S = S + k_col @ (beta.unsqueeze(-1) * (v - k @ S))
    return q @ S, S


def _chunked(q, k, v, log_decay, beta, chunk, state):
    B, H, T, dk = q.shape
    dv = v.size(-1)
    pad = -T % chunk
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        log_decay, beta = F.pad(log_decay, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // chunk
    q, k, v = (t.reshape(B, H, n, chunk, -1) for t in (q, k, v))
    G = log_decay.reshape(B, H, n, chunk).cumsum(-1)
    beta = beta.reshape(B, H, n, chunk, 1)
    i = torch.arange(chunk, device=q.device)
    causal, earlier = i[:, None] >= i[None, :], i[:, None] > i[None, :]
    # gamma_i / gamma_j for j <= i (masked before exp: G_i - G_j > 0 above the diagonal could overflow)
    decay = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(~causal, -math.inf).exp()
    A = (beta * (k @ k.transpose(-1, -2)) * decay).masked_fill(~earlier, 0)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    inverse = torch.linalg.solve_triangular(A + eye, eye.expand_as(A), upper=False, unitriangular=True)
    w = inverse @ (k * beta * G.exp().unsqueeze(-1))  # U = u - w S_0
    u = inverse @ (v * beta)
    scores = (q @ k.transpose(-1, -2)) * decay
    decay_to_end = (G[..., -1:] - G).exp().unsqueeze(-1)  # gamma_C / gamma_j
    S = q.new_zeros(B, H, dk, dv) if state is None else state
    out = []
    for c in range(n):
        u_c = u[:, :, c] - w[:, :, c] @ S
        out.append((q[:, :, c] * G[:, :, c].exp().unsqueeze(-1)) @ S + scores[:, :, c] @ u_c)
        S = S * G[:, :, c, -1:].exp().unsqueeze(-1) + (k[:, :, c] * decay_to_end[:, :, c]).transpose(-1, -2) @ u_c
    return torch.stack(out, dim=2).reshape(B, H, n * chunk, dv)[:, :, :T], S


def l2_normed(t: torch.Tensor) -> torch.Tensor:
    """``t`` over its last dimension's L2 norm, the eps inside the root (Qwen3-Next's, Kimi Linear's and fla's, not
    F.normalize's max(|x|, eps)): a near-zero query or key is shrunk smoothly, not blown up to unit length."""
    return t * torch.rsqrt(t.pow(2).sum(dim=-1, keepdim=True) + L2_EPS)


def causal_conv(x: torch.Tensor, weight: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor:
    """Depthwise causal convolution of (B, T, D) over time, each output from its input and the CONV_SIZE - 1
    before it: ``past`` (B, CONV_SIZE - 1, D), the inputs before the first (None: zeros)."""
    padded = torch.cat((past, x), dim=1) if past is not None else F.pad(x, (0, 0, CONV_SIZE - 1, 0))
    # CONV_SIZE shifted products, not F.conv1d: the same sums, 0.05 ms a call against oneDNN's depthwise 0.12 ms
    # at a nano decode step's (1, 1, 384) on a 2-core CPU, and 9-19% off the whole step (3 rounds, interleaved)
    T, taps = x.size(1), weight[:, 0].to(x.dtype)
    return sum(taps[:, i] * padded[:, i : i + T] for i in range(CONV_SIZE))


@register(MIXERS)
class GatedDeltaNet(ConvertsToNoOther, MultiHeadAttention):
    name, colour, marker = "gated_deltanet", "tab:olive", "P"
    function = "gated_deltanet"
    computes = "a linear-attention state per head, updated by the gated delta rule"
    QKV_KEY = re.compile(r"(?P<proj>in_proj)\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "in_proj"
    chunk = 64  # the chunked form's positions per chunk by default (fla's); model.linear_chunk sets another
    norm_eps = 1e-6  # the output's gated RMSNorm: Qwen3-Next's rms_norm_eps
    # The delta rule's options (its chunk, beta's range: DELTA_RULE), positions (those it holds: ``positions``), output
    # dropout
    applies = DELTA_RULE | {"position", "dropout"}
    # The position encodings it holds: a table added to the embeddings, or none (it orders tokens by its convolution
    # and state); any other is refused, naming these
    positions: ClassVar[tuple[str, ...]] = ("learned", "none")
    has_attention_maps, takes_kernel = False, False
    rule = staticmethod(chunked_delta_rule)  # its state's update: (q, k, v, log decays, betas, chunk, state)
    gate_activation = staticmethod(F.silu)  # of the output gate over its RMSNorm

    @classmethod
    def check_spec(cls, spec: AttentionSpec) -> None:
        """Refuse what a Gated DeltaNet layer has no place for, naming what it has instead; last, any option set that
        it does not apply (``applies``)."""
        chunk = spec.linear_chunk
        if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
            raise ValueError(f"model.linear_chunk={chunk!r} must be a positive number of positions per chunk of the "
                             f"chunked form (null: {cls.chunk}; 16 to 128 serve)")  # fmt: skip
        unapplied = cls.unapplied(spec)
        if unapplied:
            name, value, offs, why = unapplied[0]
            raise ValueError(f"model.{name}={spelled(value)} with attention={cls.name}: {why}; set "
                             f"model.{name}={' or '.join(map(spelled, offs))}")  # fmt: skip
        if spec.sdpa_backend != "auto":
            raise ValueError(f"model.sdpa_backend={spec.sdpa_backend} chooses softmax attention's implementation; "
                             f"attention={cls.name} runs its own chunked form: set model.sdpa_backend=auto")
        check_applied(cls, spec)

    @classmethod
    def unapplied(cls, spec) -> list[tuple[str, Any, tuple, str]]:
        """Each field set to a value a Gated DeltaNet layer has no place for: (field, value, the values that
        leave it off, why). It reads the fields by name, so a GPTConfig asks it too, naming the model's or a
        layer kind's field before the kernel's checks (a layer that runs no kernel has no scores for one to
        change: the kernel is never the fix)."""
        found = []
        for name, (offs, why) in OWN_FIELDS.items():
            value = getattr(spec, name)
            if value not in offs and not (name == "n_kv_head" and value == spec.n_head):
                found.append((name, value, offs, why))
        tableless = tuple(n for n in registry.POSITIONS if n in cls.positions)
        for mod in MODIFICATIONS.values():  # softcap, sinks, ALiBi: modifications of scores it does not have
            value = getattr(spec, mod.field)
            if mod.field not in OWN_FIELDS and mod.used(value):
                offs = tableless if mod.field == "position" else (mod.off,)
                found.append((mod.field, value, offs, "it is linear attention, with no attention scores or softmax "
                                                      "for it to change"))  # fmt: skip
        if registry.position(spec.position).turns_queries_keys:
            found.append(("position", spec.position, tableless, "rotary turns softmax attention's queries and keys; "
                          "it orders tokens by its convolution and state"))  # fmt: skip
        if spec.position not in cls.positions and "position" not in {name for name, *_ in found}:
            found.append(("position", spec.position, tableless, f"it holds the positions {' or '.join(tableless)} "
                          f"(a table added to the embeddings, or none)"))  # fmt: skip
        named = {name for name, *_ in found}
        return found + [found for found in super().unapplied(spec) if found[0] not in named]

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return 0, 0  # no score matrix: its mixing FLOPs do not grow with the keys (``mixing_flops``)

    @classmethod
    def mixing_flops(cls, spec: AttentionSpec, seq_len: int) -> int:
        """Training FLOPs per token of the chunked form (6 x its multiply-adds): per head, reading, correcting and
        writing the state (3 dk dv) and the chunk's own products (chunk x (3 dk + 2 dv)); none grows with the
        length."""
        d, chunk = spec.head_dim, min(spec.linear_chunk or cls.chunk, seq_len)
        return 6 * spec.n_head * (3 * d * d + chunk * 5 * d)

    @classmethod
    def cache_width(cls, spec: AttentionSpec) -> int:
        return 0  # nothing per token: the state is fixed-size (``state_bytes``)

    @classmethod
    def state_bytes(cls, spec: AttentionSpec, dtype_bytes: int) -> int:
        """Each head's head_dim x head_dim state (float32: the chunked form sums in it) and the convolution's
        last CONV_SIZE - 1 inputs (in the activations' dtype), whatever the length."""
        return 4 * spec.n_head * spec.head_dim**2 + dtype_bytes * (CONV_SIZE - 1) * 3 * spec.n_embd

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 1  # in_proj alone reads the block's input

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        return 0  # no keys and values kept per token: a state (``state_bytes``)

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # in_proj: [queries; keys; values; the output gate] by head, then beta's and the decay's inputs (a row a head)
        C, H, hd = spec.n_embd, spec.n_head, spec.head_dim
        by_head = [(proj, h, i * C + h * hd, i * C + (h + 1) * hd)
                   for i, proj in enumerate(("query", "key", "value", "output gate")) for h in range(H)]  # fmt: skip
        per_token = [("beta", None, 4 * C, 4 * C + H), ("decay", None, 4 * C + H, 4 * C + 2 * H)]
        return {"in_proj.weight": [*by_head, *per_token]}

    @classmethod
    def activation_bytes(cls, spec: AttentionSpec, batch: int, seq_len: int, dtype_bytes: int) -> dict[str, int]:
        """What one layer keeps for backward, in place of softmax attention's parts (the plan's memory), counted
        from what autograd saves: in the activations' dtype, in_proj's input and output and the views of it,
        the convolution's and SiLU's outputs, the normalised queries and keys and the gated norm's inputs (about
        16 widths); in float32, the chunked form's per-position tensors (about 12 widths: q, k, v, the
        pseudo-values, their products) and seven chunk x chunk matrices per chunk and head (decays, k k^T, A, I + A,
        its inverse, q k^T, the masked scores), and a state per chunk."""
        n, H, d = batch * seq_len * spec.n_embd, spec.n_head, spec.head_dim
        chunk = min(spec.linear_chunk or cls.chunk, seq_len)
        chunks = -(-seq_len // chunk)
        inside = 4 * (12 * n + 7 * batch * H * chunks * chunk * chunk + batch * H * chunks * d * d)
        return {"attention projections": 16 * n * dtype_bytes, "linear attention chunks": inside}

    @classmethod
    def initial_tensor(cls, name: str, template: torch.Tensor) -> torch.Tensor | None:
        """Its tensors that GPT-2's rule (N(0, 0.02), norms 1, the rest 0) does not start: the convolution as
        PyTorch's Conv1d draws it, A ~ U(1, 16) and dt ~ logU(0.001, 0.1) as Mamba-2 and the paper draw them."""
        if name.endswith(".conv_weight"):
            bound = 1 / math.sqrt(CONV_SIZE)
            return torch.empty_like(template).uniform_(-bound, bound)
        if name.endswith(".A_log"):
            return torch.empty_like(template).uniform_(1, 16).log()
        if name.endswith(".dt_bias"):
            dt = torch.empty_like(template).uniform_(math.log(1e-3), math.log(0.1)).exp()
            return dt + torch.log(-torch.expm1(-dt))  # softplus's inverse: softplus(dt_bias) = dt
        return None

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        C, H = spec.n_embd, spec.n_head
        # queries, keys, values, the output gate, beta's and the decay's inputs: one matmul of the block's input
        self.in_proj = nn.Linear(C, 4 * C + 2 * H, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(3 * C, 1, CONV_SIZE))  # depthwise, over q, k and v
        self.A_log = nn.Parameter(torch.zeros(H))
        self.dt_bias = nn.Parameter(torch.zeros(H))
        self.o_norm = nn.RMSNorm(spec.head_dim, eps=self.norm_eps)
        self.chunk = spec.linear_chunk or self.chunk
        self.beta_max = 2.0 if spec.negative_eigenvalues else 1.0  # beta in (0, 2): negative eigenvalues; else (0, 1)
        nn.init.uniform_(self.conv_weight, -1 / math.sqrt(CONV_SIZE), 1 / math.sqrt(CONV_SIZE))

    def inputs(self, x: torch.Tensor, past: torch.Tensor | None):
        """(B, T, C) -> q, k, v (B, H, T, hd), log decays and betas (B, H, T), the gate (B, T, H, hd), and the
        convolution's inputs (B, T, 3C) (their last ones are the next step's ``past``)."""
        B, T, C = x.shape
        H, hd = self.n_head, self.head_dim
        mixed, gate, b, a = self.in_proj(x).split([3 * C, C, H, H], dim=-1)
        q, k, v = F.silu(causal_conv(mixed, self.conv_weight, past)).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
        q, k = l2_normed(q) * hd**-0.5, l2_normed(k)
        log_decay = -self.A_log.exp() * F.softplus(a + self.dt_bias)
        beta = b.sigmoid() * self.beta_max
        return q, k, v, log_decay.transpose(1, 2), beta.transpose(1, 2), gate.view(B, T, H, hd), mixed

    def attend(self, x: torch.Tensor, positions: torch.Tensor, cache: LayerCache | None = None,
               document_starts: torch.Tensor | None = None, selected: torch.Tensor | None = None,
               ) -> torch.Tensor:  # fmt: skip
        B, T, C = x.shape
        held = cache.slots.get(0) if cache is not None else None  # (the convolution's last inputs, the state)
        # a cache emptied for reuse (its length 0 outside a decode step) keeps its tensors, not their values; a static
        # step is asked first: its length, a Python number, would be a guard of the compiled step (one graph a token)
        past = held if held is not None and (cache.owner.in_static_step or cache.owner.length) else (None, None)
        q, k, v, log_decay, beta, gate, mixed = self.inputs(x, past[0])
        o, state = self.rule(q, k, v, log_decay, beta, min(self.chunk, T), past[1])
        if cache is not None:
            remember_state(cache, mixed, state, past[0])
        o = F.rms_norm(o.transpose(1, 2), (self.head_dim,), self.o_norm.weight.to(o.dtype), self.o_norm.eps)
        return (o * self.gate_activation(gate)).reshape(B, T, C)

    def queries_keys(self, x: torch.Tensor, documents=None, selected=None) -> tuple[torch.Tensor, torch.Tensor]:
        raise ValueError(f"attention={self.name} has no attention weights: its heads read a state, not a "
                         f"softmax over keys")  # fmt: skip


def remember_state(cache: LayerCache, mixed: torch.Tensor, state: torch.Tensor, past: torch.Tensor | None) -> None:
    """Keep the state and the convolution's last CONV_SIZE - 1 inputs (after ``past``, the ones before this
    call's) in the layer's cache slot (``LayerCache.keep_state``: in place once made)."""
    before = past if past is not None else mixed.new_zeros(mixed.size(0), CONV_SIZE - 1, mixed.size(2))
    cache.keep_state(0, torch.cat((before, mixed), dim=1)[:, -(CONV_SIZE - 1) :], state)
