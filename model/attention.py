"""Causal multi-head attention in three layouts that compute the same function.

- ``wrapper``: n_head independent ``CausalAttentionHead`` modules, side by side.
- ``separate_qkv``: three Linear(d, d) projections, reshaped into heads.
- ``fused_qkv``: one Linear(d, 3d) projection, split into q, k, v.

All three concatenate the heads' outputs (head h in columns h*head_dim ...
(h+1)*head_dim) and apply the same output projection ``c_proj``. Each layout
also says how its q/k/v parameters map to and from one common form, full-width
q, k and v matrices (``to_qkv`` / ``from_qkv``), so ``model.convert`` converts
between any two layouts with one generic loop, and a new layout touches this
file only.
"""

from __future__ import annotations

import re
from typing import ClassVar

import torch
from torch import nn

from model.kernels import attention_probs, get_kernel
from model.registry import lookup


class LayerCache:
    """One layer's keys and values for the positions processed so far, in preallocated buffers.

    Slot 0 serves the multi-head layouts, one slot per head the wrapper. Buffers are
    (batch, heads, capacity, head_dim), allocated at the first write; each call writes its
    positions in place (no copy of the past per token) and returns views of all positions so far.
    """

    def __init__(self, owner) -> None:
        self.owner = owner  # the KVCache: how many positions are cached, and the capacity
        self.slots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, slot: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.owner.length
        end = start + k.size(2)
        if slot not in self.slots:
            shape = (k.size(0), k.size(1), self.owner.capacity, k.size(3))
            self.slots[slot] = (k.new_empty(shape), v.new_empty(shape))
        k_all, v_all = self.slots[slot]
        k_all[:, :, start:end] = k
        v_all[:, :, start:end] = v
        return k_all[:, :, :end], v_all[:, :, :end]
# The common form of one attention block's projections: for "weight" and "bias",
# the full-width (q, k, v) tensors, each (n_embd, n_embd) or (n_embd,).
QKV = dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
PROJECTIONS = ("query", "key", "value")


def remember(
    cache: LayerCache | None, slot: int, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Add the new positions' k, v to the cache; return all keys and values so far."""
    return (k, v) if cache is None else cache.update(slot, k, v)


def check_heads(n_embd: int, n_head: int) -> None:
    if n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; choose n_embd as a multiple of n_head")


class CausalAttentionHead(nn.Module):
    """ONE causal attention head, d_model -> head_dim: the wrapper's building block."""

    def __init__(self, n_embd: int, head_dim: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__()
        self.query = nn.Linear(n_embd, head_dim, bias=bias)
        self.key = nn.Linear(n_embd, head_dim, bias=bias)
        self.value = nn.Linear(n_embd, head_dim, bias=bias)
        self.kernel = get_kernel(kernel)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None, slot: int = 0) -> torch.Tensor:
        # A head axis of size 1 lets every kernel serve single heads too.
        q, k, v = (proj(x).unsqueeze(1) for proj in (self.query, self.key, self.value))  # (B, 1, T, hd)
        k, v = remember(cache, slot, k, v)
        return self.kernel(q, k, v, self.dropout, self.training).squeeze(1)  # (B, T, hd)


class MultiHeadAttention(nn.Module):
    """What every layout shares: the heads' outputs, concatenated -> c_proj -> dropout.

    A layout implements ``attend`` (the concatenated heads), ``queries_keys``
    (for attention maps) and the state-dict mapping ``to_qkv`` / ``from_qkv``.
    """

    # Matches this layout's q/k/v parameter names, relative to the attention module.
    QKV_KEY: ClassVar[re.Pattern]

    def __init__(self, n_embd: int, n_head: int, dropout: float, bias: bool) -> None:
        super().__init__()
        check_heads(n_embd, n_head)
        self.n_head = n_head
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        return self.resid_dropout(self.c_proj(self.attend(x, cache)))

    def attend(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        """(B, T, C) -> the heads' outputs concatenated, (B, T, C)."""
        raise NotImplementedError

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each head's queries and keys, (B, H, T, head_dim): what its attention weights come from."""
        raise NotImplementedError

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, T) attention weights, computed from this layout's own projections.

        The manual kernel applies exactly these; sdpa fuses the same formula, so
        they describe a model run with either kernel.
        """
        return attention_probs(*self.queries_keys(x))

    @staticmethod
    def to_qkv(params: dict[str, torch.Tensor]) -> QKV:
        """This layout's q/k/v parameters (names relative to the module) -> the common form."""
        raise NotImplementedError

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        """The common form -> this layout's q/k/v parameters (names relative to the module)."""
        raise NotImplementedError


class WrapperAttention(MultiHeadAttention):
    """n_head single-head modules side by side: the committee, literally."""

    QKV_KEY = re.compile(r"heads\.(?P<head>\d+)\.(?P<proj>query|key|value)\.(?P<kind>weight|bias)$")

    def __init__(self, n_embd: int, n_head: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__(n_embd, n_head, dropout, bias)
        self.heads = nn.ModuleList(
            CausalAttentionHead(n_embd, n_embd // n_head, kernel, dropout, bias) for _ in range(n_head)
        )

    def attend(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        return torch.cat([head(x, cache, slot) for slot, head in enumerate(self.heads)], dim=-1)

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.stack([head.query(x) for head in self.heads], dim=1),
                torch.stack([head.key(x) for head in self.heads], dim=1))  # fmt: skip

    @classmethod
    def to_qkv(cls, params: dict[str, torch.Tensor]) -> QKV:
        # Head h's rows are rows h*head_dim ... (h+1)*head_dim of the full-width matrix.
        per_head: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
        for name, tensor in params.items():
            m = cls.QKV_KEY.match(name)
            per_head.setdefault((m["kind"], m["proj"]), {})[int(m["head"])] = tensor
        qkv = {}
        for kind in sorted({kind for kind, _ in per_head}):
            parts = []
            for proj in PROJECTIONS:
                heads = per_head.get((kind, proj))
                if heads is None:
                    raise ValueError(f"the attention has no heads.*.{proj}.{kind}; the state dict is incomplete")
                if sorted(heads) != list(range(len(heads))):
                    raise ValueError(f"heads.*.{proj}.{kind}: head indices {sorted(heads)} are not 0..{len(heads) - 1}")
                parts.append(torch.cat([heads[h] for h in range(len(heads))], dim=0))
            qkv[kind] = tuple(parts)
        return qkv

    @staticmethod
    def heads_in(params: dict[str, torch.Tensor]) -> int:
        return len({m["head"] for name in params if (m := WrapperAttention.QKV_KEY.match(name))})

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        if n_head is None:
            raise ValueError("converting to 'wrapper' needs n_head=<number of heads> to split the heads")
        out = {}
        for kind, tensors in qkv.items():
            width = tensors[0].size(0)
            if width % n_head != 0:
                raise ValueError(f"attention width {width} is not divisible by n_head={n_head}")
            for proj, full in zip(PROJECTIONS, tensors):
                for h, part in enumerate(full.chunk(n_head, dim=0)):
                    out[f"heads.{h}.{proj}.{kind}"] = part.clone()
        return out


class SplitHeadsAttention(MultiHeadAttention):
    """Layouts that project full-width q, k, v, then split them into heads for one kernel call."""

    def __init__(self, n_embd: int, n_head: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__(n_embd, n_head, dropout, bias)
        self.kernel = get_kernel(kernel)
        self.dropout = dropout

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Full-width q, k, v, each (B, T, C)."""
        raise NotImplementedError

    def attend(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (self.split_heads(t) for t in self.project(x))  # (B, H, T, hd) each
        k, v = remember(cache, 0, k, v)  # (B, H, past + T, hd)
        y = self.kernel(q, k, v, self.dropout, self.training)  # (B, H, T, hd)
        return y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side: (B, T, H * hd)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        B, T, C = t.shape
        return t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, T, C) -> (B, H, T, hd)

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, _ = self.project(x)
        return self.split_heads(q), self.split_heads(k)


class SeparateQKVAttention(SplitHeadsAttention):
    QKV_KEY = re.compile(r"(?P<proj>query|key|value)\.(?P<kind>weight|bias)$")

    def __init__(self, n_embd: int, n_head: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__(n_embd, n_head, kernel, dropout, bias)
        self.query = nn.Linear(n_embd, n_embd, bias=bias)
        self.key = nn.Linear(n_embd, n_embd, bias=bias)
        self.value = nn.Linear(n_embd, n_embd, bias=bias)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.query(x), self.key(x), self.value(x)

    @staticmethod
    def to_qkv(params: dict[str, torch.Tensor]) -> QKV:
        kinds = sorted({name.split(".")[1] for name in params})
        for kind in kinds:
            missing = [p for p in PROJECTIONS if f"{p}.{kind}" not in params]
            if missing:
                raise ValueError(f"the attention has no {missing} {kind}; the state dict is incomplete")
        return {kind: tuple(params[f"{p}.{kind}"] for p in PROJECTIONS) for kind in kinds}

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        return {f"{p}.{kind}": t.clone() for kind, tensors in qkv.items() for p, t in zip(PROJECTIONS, tensors)}


class FusedQKVAttention(SplitHeadsAttention):
    QKV_KEY = re.compile(r"c_attn\.(?P<kind>weight|bias)$")

    def __init__(self, n_embd: int, n_head: int, kernel: str, dropout: float, bias: bool) -> None:
        super().__init__(n_embd, n_head, kernel, dropout, bias)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.c_attn(x).split(x.size(-1), dim=-1)

    @staticmethod
    def to_qkv(params: dict[str, torch.Tensor]) -> QKV:
        # c_attn stacks [query; key; value] by rows.
        return {name.split(".")[1]: tuple(t.chunk(3, dim=0)) for name, t in params.items()}

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        return {f"c_attn.{kind}": torch.cat(tensors, dim=0) for kind, tensors in qkv.items()}


# Also the order in which state-dict keys are matched: "heads.0.query" must be seen as
# the wrapper's before "query" could claim it.
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
