"""Multi-head latent attention (MLA: DeepSeek-V2, arXiv 2405.04434, section 2.1), ``attention=mla``.

Keys and values are not projected from the input per head: the input is compressed into one latent
``c = RMSNorm(W_DKV x)`` of ``model.kv_latent`` dims per token, and each head's keys and values are
projected back up from it, ``k_h = W_UK,h c`` and ``v_h = W_UV,h c`` (queries as usual, ``q_h = W_Q,h x``; no
query compression, as DeepSeek-V2-Lite). A KV cache then keeps the latent, not the heads' keys and values.

Rotary positions cannot turn the up-projected keys (the rotation would sit between W_UK and the query, and
the cached latent would no longer serve every position), so with ``model.position=rope`` a decoupled rotary
part is added: each head's query gets ``model.rope_head_dim`` more dims, ``RoPE(W_QR x)``, and every head's
key the SAME ``RoPE(W_KR x)``; the scores are over [content; rotary] and scaled by 1/sqrt(head_dim +
rope_head_dim) (the kernels scale by the queries' width). Values stay head_dim wide. The cache keeps the
latent and the rotated shared key: ``kv_latent + rope_head_dim`` numbers per token per layer.

MLA is another function, not another layout of the same one: its weights do not convert to or from the
other layouts (``model.checkpoints.convert`` refuses, naming this). The weights follow DeepSeek's own code:
``wq`` stacks W_Q and W_QR by head ([content; rotary] per head), ``wkv_a`` stacks W_DKV and W_KR,
``kv_norm`` is the latent's RMSNorm, ``wkv_b`` stacks W_UK and W_UV by head ([key; value] per head).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from model import registry
from model.attention.options import check_applied
from model.attention.pipeline import KeyGroup, MultiHeadAttention, Parts, rms_normed
from model.attention.spec import AttentionSpec, check_one_pair
from model.checkpoints.convert import ConvertsToNoOther
from model.registry import MIXERS, register


def positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@register(MIXERS)
class LatentAttention(ConvertsToNoOther, MultiHeadAttention):
    name, colour, marker = "mla", "tab:purple", "D"
    function = "mla"
    computes = "keys and values through a kv_latent-wide latent"
    caches_keys = False  # the latent: the keys are up-projected from it after the cache
    projection_options = frozenset({"kv_latent", "rope_head_dim"})  # a latent and a decoupled rotary key, no kv heads
    cannot_hold = dict.fromkeys(("differential", "lambda_init"), "its heads' keys and values come from one latent, "
                                "and differential attention pairs key/value heads")  # fmt: skip
    QKV_KEY = re.compile(r"(?P<proj>wq|wkv_a|wkv_b)\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "wkv_a"

    @classmethod
    def check_spec(cls, spec: AttentionSpec) -> None:
        if not positive_int(spec.kv_latent):
            raise ValueError(f"attention=mla needs model.kv_latent=<the keys' and values' latent width>, a positive "
                             f"integer, not {spec.kv_latent!r}; e.g. model.kv_latent={4 * spec.head_dim} (4 head "
                             f"dims, DeepSeek-V2's ratio)")  # fmt: skip
        if spec.n_kv_head is not None:
            raise ValueError(f"model.n_kv_head={spec.n_kv_head!r} groups key/value heads, but attention=mla "
                             f"compresses keys and values its own way (model.kv_latent); set "
                             f"model.n_kv_head=null")  # fmt: skip
        if spec.rope_fraction != 1:
            raise ValueError(f"model.rope_fraction={spec.rope_fraction:g}: attention=mla turns a rotary part of its "
                             f"own (model.rope_head_dim) and none of its content dims; leave "
                             f"model.rope_fraction=1")  # fmt: skip
        turns = registry.position(spec.position).turns_queries_keys
        rope = spec.rope_head_dim
        if turns and (not positive_int(rope) or rope % 2):
            raise ValueError(f"attention=mla with model.position={spec.position} needs model.rope_head_dim=<the "
                             f"decoupled rotary key's width>, a positive even integer, not {rope!r}; e.g. "
                             f"model.rope_head_dim={max(2, spec.head_dim // 4 * 2)} (half a head, as "
                             f"DeepSeek-V2)")  # fmt: skip
        if turns:
            check_one_pair(spec, rope, f"model.rope_head_dim={rope}", "a larger model.rope_head_dim")
        if not turns and rope is not None:
            raise ValueError(f"model.rope_head_dim={rope!r} is attention=mla's rotary key width, but "
                             f"model.position={spec.position} turns nothing; set model.rope_head_dim=null, or "
                             f"model.position=rope")  # fmt: skip
        check_applied(cls, spec)  # any option set that it does not apply (``applies``)

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return spec.n_head * (spec.head_dim + (spec.rope_head_dim or 0)), spec.n_head * spec.head_dim

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        """The latent and the shared rotary key: what the cache keeps of keys and values per token per layer."""
        return spec.kv_latent + (spec.rope_head_dim or 0)

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 2  # wq and wkv_a read the block's input

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # wq: each head's [content; rotary] query; wkv_a: the latent and the shared rotary key (no head's); wkv_b: each
        # head's [key; value] from the latent
        H, hd, r, latent = spec.n_head, spec.head_dim, spec.rope_head_dim or 0, spec.kv_latent
        down = [("latent", None, 0, latent), *([("rotary key", None, latent, latent + r)] if r else [])]
        up = [(proj, h, h * 2 * hd + i * hd, h * 2 * hd + (i + 1) * hd)
              for h in range(H) for i, proj in enumerate(("key", "value"))]  # fmt: skip
        return {"wq.weight": [("query", h, h * (hd + r), (h + 1) * (hd + r)) for h in range(H)],
                "wkv_a.weight": down, "wkv_b.weight": up}

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.rope_dim = spec.rope_head_dim or 0
        self.kv_latent = spec.kv_latent
        H, hd, r = spec.n_head, spec.head_dim, self.rope_dim
        # QK-norm on each head's content dims, rotary on its decoupled part (the queries' last rope_head_dim; all of
        # the cached shared key): the pipeline's encodings, on these dims
        self.query_parts = Parts(slice(0, hd), slice(hd, None))
        self.key_parts = Parts(None, slice(None))
        self.wq = nn.Linear(spec.n_embd, H * (hd + r), bias=spec.bias)  # W_Q and W_QR, per head
        self.wkv_a = nn.Linear(spec.n_embd, spec.kv_latent + r, bias=spec.bias)  # W_DKV and W_KR
        self.kv_norm = nn.RMSNorm(spec.kv_latent, eps=1e-6)
        self.wkv_b = nn.Linear(spec.kv_latent, H * 2 * hd, bias=spec.bias)  # W_UK and W_UV, per head

    @classmethod
    def rotary_width(cls, spec: AttentionSpec) -> int:
        return spec.rope_head_dim or 0  # the decoupled part alone (QK-norm acts on the content dims: head_dim)

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """The queries (B, H, T, head_dim + rope_head_dim: [content; rotary] per head) and what the cache keeps: the
        shared rotary key (B, 1, T, rope_head_dim), the keys the encodings turn, and the normalised latent (B, 1, T,
        kv_latent), which ``keys_values`` up-projects (a head axis of size 1, as a key/value head)."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim + self.rope_dim).transpose(1, 2)
        latent, k_rope = self.wkv_a(x).split([self.kv_latent, self.rope_dim], dim=-1)
        return [KeyGroup(0, k_rope.unsqueeze(1), rms_normed(self.kv_norm, latent).unsqueeze(1), [(0, q)])]

    def keys_values(self, k_rope: torch.Tensor, latent: torch.Tensor,
                    positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Cached rotary keys (B, 1, S, rope_head_dim) and latents (B, 1, S, kv_latent) -> each head's keys (B, H, S,
        head_dim + rope_head_dim), the content part up-projected and encoded (QK-norm) by the pipeline, and values
        (B, H, S, head_dim)."""
        B, _, S, _ = latent.shape
        kv = self.wkv_b(latent.squeeze(1)).view(B, S, self.n_head, 2 * self.head_dim).transpose(1, 2)
        k, v = kv.split([self.head_dim, self.head_dim], dim=-1)
        k = self.encode_keys(k, positions, Parts(slice(None), None))
        if self.rotary is not None:
            k = torch.cat((k, k_rope.expand(B, self.n_head, S, self.rope_dim)), dim=-1)  # one key, every head
        return k, v
