"""The layouts of GPT-2's function, each a projection the one pipeline runs (``model.attention.pipeline``).

- ``wrapper``: n_head single-head modules side by side (their projections; the pipeline runs each head's attention).
- ``separate_qkv``: three Linear projections, reshaped into heads.
- ``fused_qkv``: one Linear projection, split into q, k, v.

Queries have ``n_head`` heads; keys and values ``n_kv_head`` (grouped-query attention: each group of
n_head / n_kv_head query heads shares one key/value head; 1 is multi-query; n_head, the default, is
multi-head). All three concatenate the query heads' outputs (head h in columns h*head_dim ... (h+1)*head_dim) and
apply the same output projection ``c_proj``. Each layout also says how its q/k/v parameters map to and from one
common form, the full-width q, k and v matrices (``to_qkv`` / ``from_qkv``), so ``model.checkpoints.convert``
converts between any two layouts with one generic loop, and states its other facts (the copies of its input it
keeps under autocast, for the plan; its plot style; what converting it needs). Each registers itself in
``model.registry.MIXERS``: a new layout is one class here (or in a module of its own in this package),
plus its configs file.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from model.attention.differential import DifferentialHeads
from model.attention.pipeline import PROJECTIONS, QKV, KeyGroup, MultiHeadAttention
from model.attention.spec import AttentionSpec
from model.registry import MIXERS, register


class CausalAttentionHead(nn.Module):
    """ONE causal attention head's projections, d_model -> head_dim: the wrapper's building block (the pipeline runs
    its attention, as every layout's, one head at a time).

    The first head of each key/value group owns the group's key and value projections (its notes);
    the other heads of the group own only a query and read the group's keys and values.
    """

    def __init__(self, n_embd: int, head_dim: int, bias: bool, owns_kv: bool = True) -> None:
        super().__init__()
        self.query = nn.Linear(n_embd, head_dim, bias=bias)
        if owns_kv:
            self.key = nn.Linear(n_embd, head_dim, bias=bias)
            self.value = nn.Linear(n_embd, head_dim, bias=bias)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """This head's queries, (B, 1, T, hd): a head axis of size 1 lets every kernel serve single heads too."""
        return self.query(x).unsqueeze(1)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This head's group's keys and values, (B, 1, T, hd) each."""
        return self.key(x).unsqueeze(1), self.value(x).unsqueeze(1)


def kv_heads_of(qkv: QKV, n_head: int) -> int:
    """Key/value heads in the common form: the key's width over the head width the queries give."""
    q, k, _ = next(iter(qkv.values()))
    head_dim = q.size(0) // n_head
    if q.size(0) % n_head or k.size(0) % head_dim or n_head % (k.size(0) // head_dim):
        raise ValueError(f"q/k widths {q.size(0)}/{k.size(0)} do not make n_head={n_head} heads with whole "
                         f"key/value groups")  # fmt: skip
    return k.size(0) // head_dim


@register(MIXERS)
class WrapperAttention(MultiHeadAttention):
    """n_head single-head modules side by side: the committee, literally (with grouped-query heads, the
    members of a group share the notes of its first member)."""

    name, colour, marker = "wrapper", "tab:blue", "o"
    QKV_KEY = re.compile(r"heads\.(?P<head>\d+)\.(?P<proj>query|key|value)\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "heads.N.query"
    # Its heads attend one by one: differential attention combines a pair's two maps, which one call must hold
    cannot_hold = dict.fromkeys(("differential", "lambda_init"), "its heads attend one at a time, and differential "
                                "attention combines a pair of heads' maps")  # fmt: skip

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return spec.n_embd, spec.n_embd

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        return 2 * spec.kv_heads * spec.head_dim  # a key and a value per key/value group

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return n_head + 2 * kv_heads  # a query per head, a key and a value per group

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        group = spec.n_head // spec.kv_heads
        self.heads = nn.ModuleList(
            CausalAttentionHead(spec.n_embd, spec.head_dim, spec.bias, owns_kv=h % group == 0)
            for h in range(spec.n_head)
        )

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """Each key/value group's notes (its first head's keys and values), read by each of its heads alone."""
        group, heads = self.n_head // self.n_kv_head, list(self.heads)  # not heads[h]: slow
        return [KeyGroup(g, *heads[g * group].keys_values(x),
                         [(h, heads[h].queries(x)) for h in range(g * group, (g + 1) * group)])
                for g in range(self.n_kv_head)]  # fmt: skip

    @classmethod
    def to_qkv(cls, params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        # Query head h's rows are rows h*head_dim ... (h+1)*head_dim of the full-width q; the key/value of
        # group g (owned by its first head) are rows g*head_dim ... of the full-width k and v.
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
                if proj == "query" and sorted(heads) != list(range(len(heads))):
                    raise ValueError(f"heads.*.{proj}.{kind}: head indices {sorted(heads)} are not 0..{len(heads) - 1}")
                parts.append(torch.cat([heads[h] for h in sorted(heads)], dim=0))
            qkv[kind] = tuple(parts)
        return qkv

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # each head's query, and each key/value group's key and value (owned by its first head), a matrix apiece
        group, hd = spec.n_head // spec.kv_heads, spec.head_dim
        rows = {f"heads.{h}.query.weight": [("query", h, 0, hd)] for h in range(spec.n_head)}
        for proj in ("key", "value"):
            rows.update({f"heads.{g * group}.{proj}.weight": [(proj, g, 0, hd)] for g in range(spec.kv_heads)})
        return rows

    @classmethod
    def heads_in(cls, params: dict[str, torch.Tensor]) -> int:
        """Query heads in a wrapper state dict."""
        matches = (cls.QKV_KEY.match(name) for name in params)
        return len({m["head"] for m in matches if m and m["proj"] == "query"})

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        if n_head is None:
            raise ValueError("converting to 'wrapper' needs n_head=<number of heads> to split the heads")
        n_kv = kv_heads_of(qkv, n_head)
        group = n_head // n_kv
        out = {}
        for kind, (q, k, v) in qkv.items():
            if q.size(0) % n_head != 0:
                raise ValueError(f"attention width {q.size(0)} is not divisible by n_head={n_head}")
            for h, part in enumerate(q.chunk(n_head, dim=0)):
                out[f"heads.{h}.query.{kind}"] = part.clone()
            for proj, full in (("key", k), ("value", v)):
                for g, part in enumerate(full.chunk(n_kv, dim=0)):
                    out[f"heads.{g * group}.{proj}.{kind}"] = part.clone()
        return out


class SplitHeadsAttention(MultiHeadAttention):
    """Layouts that project full-width q, k, v, then split them into heads for one kernel call."""

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.kv_width = spec.kv_heads * spec.head_dim

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return spec.n_embd, spec.n_embd * (2 if spec.differential else 1)  # each map reads its pair's values

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        return 2 * spec.kv_heads * spec.head_dim  # a key and a value per key/value head

    @staticmethod
    def initial_tensor(name: str, template: torch.Tensor) -> torch.Tensor | None:
        """Its own initial draws (``GPT.reset_parameters``): differential attention's lambda vectors."""
        return DifferentialHeads.initial(name, template)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, T, C), k and v (B, T, kv_width)."""
        raise NotImplementedError

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """Full-width q, k, v, split into heads: one key group, one call of every head."""
        q, k, v = self.projections(x)
        return [KeyGroup(0, self.split_heads(k, self.n_kv_head), self.split_heads(v, self.n_kv_head),
                         [(0, self.split_heads(q, self.n_head))])]  # fmt: skip

    def split_heads(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, heads, self.head_dim).transpose(1, 2)  # (B, T, heads*hd) -> (B, heads, T, hd)


@register(MIXERS)
class SeparateQKVAttention(SplitHeadsAttention):
    name, colour, marker = "separate_qkv", "tab:orange", "s"
    QKV_KEY = re.compile(r"(?P<proj>query|key|value)\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "query"
    LINEARS = PROJECTIONS  # the q, k, v Linear modules' names

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        for name, width in zip(self.LINEARS, (spec.n_embd, self.kv_width, self.kv_width)):
            setattr(self, name, nn.Linear(spec.n_embd, width, bias=spec.bias))

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = (getattr(self, name) for name in self.LINEARS)
        return q(x), k(x), v(x)

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 3

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        hd, heads = spec.head_dim, (spec.n_head, spec.kv_heads, spec.kv_heads)
        return {f"{linear}.weight": [(proj, h, h * hd, (h + 1) * hd) for h in range(n)]
                for linear, proj, n in zip(cls.LINEARS, PROJECTIONS, heads)}  # fmt: skip

    @classmethod
    def to_qkv(cls, params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        kinds = sorted({name.split(".")[1] for name in params})
        for kind in kinds:
            missing = [p for p in cls.LINEARS if f"{p}.{kind}" not in params]
            if missing:
                raise ValueError(f"the attention has no {missing} {kind}; the state dict is incomplete")
        return {kind: tuple(params[f"{p}.{kind}"] for p in cls.LINEARS) for kind in kinds}

    @classmethod
    def from_qkv(cls, qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        return {f"{p}.{kind}": t.clone() for kind, tensors in qkv.items() for p, t in zip(cls.LINEARS, tensors)}


@register(MIXERS)
class FusedQKVAttention(SplitHeadsAttention):
    name, colour, marker = "fused_qkv", "tab:green", "^"
    QKV_KEY = re.compile(r"c_attn\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "c_attn"
    canonical = True  # GPT-2's own form

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 1

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # c_attn stacks [query; key; value] by rows, each by head
        hd, starts = spec.head_dim, (0, spec.n_embd, spec.n_embd + spec.kv_heads * spec.head_dim)
        heads = (spec.n_head, spec.kv_heads, spec.kv_heads)
        return {"c_attn.weight": [(proj, h, start + h * hd, start + (h + 1) * hd)
                                  for proj, start, n in zip(PROJECTIONS, starts, heads) for h in range(n)]}

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.c_attn = nn.Linear(spec.n_embd, spec.n_embd + 2 * self.kv_width, bias=spec.bias)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.c_attn(x).split([x.size(-1), self.kv_width, self.kv_width], dim=-1)

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """As every layout that splits heads, with its queries and keys side by side in c_attn's output, as one
        tensor of heads, time-major (B, T, H + kv, d): the encodings turn them in one call."""
        B, T, C = x.shape
        qk, v = self.c_attn(x).split([C + self.kv_width, self.kv_width], dim=-1)
        qk = qk.view(B, T, self.n_head + self.n_kv_head, self.head_dim)
        q, k = qk.transpose(1, 2).split([self.n_head, self.n_kv_head], dim=1)
        return [KeyGroup(0, k, self.split_heads(v, self.n_kv_head), [(0, q)], qk)]

    @staticmethod
    def to_qkv(params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        # c_attn stacks [query; key; value] by rows: n_embd rows of queries, then two equal parts.
        out = {}
        for name, t in params.items():
            rows = t.size(0)
            width = t.size(1) if t.dim() == 2 else None
            if width is None:  # a bias: its weight says how wide the queries are
                weight = params.get(name.replace("bias", "weight"))
                width = weight.size(1) if weight is not None else rows // 3
            kv = (rows - width) // 2
            if width + 2 * kv != rows:
                raise ValueError(f"c_attn has {rows} rows for width {width}: not queries and two equal key/value parts")
            out[name.split(".")[1]] = tuple(t.split([width, kv, kv], dim=0))
        return out

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        return {f"c_attn.{kind}": torch.cat(tensors, dim=0) for kind, tensors in qkv.items()}
