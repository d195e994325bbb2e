"""The layouts of GPT-2's function, each a projection the one pipeline runs (``model.attention.pipeline``).

- ``wrapper``: n_head single-head modules side by side (their projections; the pipeline runs each head's attention).
- ``separate_qkv``: three Linear projections, reshaped into heads.
- ``fused_qkv``: one Linear projection, split into q, k, v.

With ``model.k_eq_v`` (keys equal to values, Gemma 4's ``attention_k_eq_v``) each layout projects no values: a key/value
head's values are its keys as projected, before QK-norm and rotary turn the keys (Gemma 4's order). The wrapper's heads
and separate_qkv have no ``value`` Linear, fused_qkv's ``c_attn_qk`` stacks [query; key]; in the common form the values
are None (``QKV``: the keys serve as values), so layouts convert exactly. Where the encodings leave the keys as
projected (no QK-norm, no rotary) the KV cache keeps the keys alone (``keys_only``), and the plan counts one tensor.

A layer that reads an earlier layer's keys and values (cross-layer KV sharing, ``model.layer_kinds.S.kv_from``)
projects queries alone: the wrapper's heads own only ``query``, separate_qkv has ``query`` alone, fused_qkv's
``c_attn_q`` is the queries; in the common form its keys and values are None, so it converts exactly too.

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

from model import registry
from model.attention.differential import DifferentialHeads
from model.attention.pipeline import PROJECTIONS, QKV, KeyGroup, MultiHeadAttention
from model.attention.spec import AttentionSpec
from model.registry import MIXERS, register


def keys_only(spec: AttentionSpec) -> bool:
    """Whether a KV cache keeps the keys alone: keys equal to values, and the encodings leave the keys as projected
    (no QK-norm, no rotary, no PaTH turning the held keys), so the cached keys are the values. Under QK-norm or
    rotary the values are the keys before them (Gemma 4's), which the cached keys no longer are: the cache keeps both
    (as Gemma 4's does)."""
    position = registry.position(spec.position)  # rotary turns the keys before the cache, PaTH the held ones
    return spec.k_eq_v and not spec.qk_norm and not (position.turns_queries_keys or position.transforms_keys)


def kv_tensors(spec: AttentionSpec) -> int:
    """The tensors a KV cache keeps per key/value head: keys and values, or the keys alone (``keys_only``)."""
    return 1 if keys_only(spec) else 2


def key_group(slot: int, k: torch.Tensor, v: torch.Tensor | None, calls: list, keys_alone: bool,
              qk: torch.Tensor | None = None) -> KeyGroup:  # fmt: skip
    """A projection's key group; ``v`` None: the values are the keys as projected (model.k_eq_v), and where the cache
    keeps the keys alone (``keys_alone``) they go to it as a zero-wide tensor (``keys_values`` reads the keys back)."""
    if v is None:
        v = k[..., :0] if keys_alone else k
    return KeyGroup(slot, k, v, calls, qk)


def values_read_from_keys(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A layout's ``keys_values``: a zero-wide value (``key_group``) says the cached keys are the values."""
    return (k, k) if v.size(-1) == 0 else (k, v)


class CausalAttentionHead(nn.Module):
    """ONE causal attention head's projections, d_model -> head_dim: the wrapper's building block (the pipeline runs
    its attention, as every layout's, one head at a time).

    The first head of each key/value group owns the group's key and value projections (its notes);
    the other heads of the group own only a query and read the group's keys and values.
    """

    def __init__(self, n_embd: int, head_dim: int, bias: bool, owns_kv: bool = True, k_eq_v: bool = False) -> None:
        super().__init__()
        self.query = nn.Linear(n_embd, head_dim, bias=bias)
        self.value = None  # keys equal to values: the keys serve
        if owns_kv:
            self.key = nn.Linear(n_embd, head_dim, bias=bias)
            if not k_eq_v:
                self.value = nn.Linear(n_embd, head_dim, bias=bias)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """This head's queries, (B, 1, T, hd): a head axis of size 1 lets every kernel serve single heads too."""
        return self.query(x).unsqueeze(1)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This head's group's keys and values, (B, 1, T, hd) each; values None where they are the keys."""
        return self.key(x).unsqueeze(1), None if self.value is None else self.value(x).unsqueeze(1)


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
    shares_kv = True  # its heads can project queries alone (model.layer_kinds.S.kv_from)
    QKV_KEY = re.compile(r"heads\.(?P<head>\d+)\.(?P<proj>query|key|value)\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "heads.N.query"
    projection_options = frozenset({"n_kv_head", "k_eq_v"})  # key/value heads, keys equal to values
    # Its heads attend one by one: differential attention combines a pair's two maps, which one call must hold
    cannot_hold = dict.fromkeys(("differential", "lambda_init"), "its heads attend one at a time, and differential "
                                "attention combines a pair of heads' maps")  # fmt: skip

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return spec.n_embd, spec.n_embd

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        return kv_tensors(spec) * spec.kv_heads * spec.head_dim  # a key and a value per key/value group (or the key)

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return n_head + 2 * kv_heads  # a query per head, a key and a value per group

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        group, own = spec.n_head // spec.kv_heads, spec.kv_from is None  # a layer that reads another's: queries alone
        self.heads = nn.ModuleList(
            CausalAttentionHead(spec.n_embd, spec.head_dim, spec.bias, owns_kv=own and h % group == 0,
                                k_eq_v=spec.k_eq_v)
            for h in range(spec.n_head)
        )
        self.keys_alone = keys_only(spec)

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """Each key/value group's notes (its first head's keys and values), read by each of its heads alone."""
        group, heads = self.n_head // self.n_kv_head, list(self.heads)  # not heads[h]: slow
        if self.reads_kv:  # another layer's keys and values: each group's queries alone
            return [KeyGroup(g, None, None, [(h, heads[h].queries(x)) for h in range(g * group, (g + 1) * group)])
                    for g in range(self.n_kv_head)]  # fmt: skip
        return [key_group(g, *heads[g * group].keys_values(x),
                          [(h, heads[h].queries(x)) for h in range(g * group, (g + 1) * group)], self.keys_alone)
                for g in range(self.n_kv_head)]  # fmt: skip

    def keys_values(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return values_read_from_keys(k, v)

    @classmethod
    def to_qkv(cls, params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        # Query head h's rows are rows h*head_dim ... (h+1)*head_dim of the full-width q; the key/value of
        # group g (owned by its first head) are rows g*head_dim ... of the full-width k and v.
        per_head: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
        for name, tensor in params.items():
            m = cls.QKV_KEY.match(name)
            per_head.setdefault((m["kind"], m["proj"]), {})[int(m["head"])] = tensor
        qkv = {}
        k_eq_v = not any(proj == "value" for _, proj in per_head)  # no values anywhere: the keys serve (model.k_eq_v)
        no_kv = not any(proj == "key" for _, proj in per_head)  # queries alone: it reads another layer's (kv_from)
        for kind in sorted({kind for kind, _ in per_head}):
            parts = []
            for proj in PROJECTIONS[:1] if no_kv else PROJECTIONS[:2] if k_eq_v else PROJECTIONS:
                heads = per_head.get((kind, proj))
                if heads is None:
                    raise ValueError(f"the attention has no heads.*.{proj}.{kind}; the state dict is incomplete")
                if proj == "query" and sorted(heads) != list(range(len(heads))):
                    raise ValueError(f"heads.*.{proj}.{kind}: head indices {sorted(heads)} are not 0..{len(heads) - 1}")
                parts.append(torch.cat([heads[h] for h in sorted(heads)], dim=0))
            qkv[kind] = (*parts, None, None) if no_kv else (*parts, None) if k_eq_v else tuple(parts)
        return qkv

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # each head's query, and each key/value group's key and value (owned by its first head), a matrix apiece
        group, hd = spec.n_head // spec.kv_heads, spec.head_dim
        rows = {f"heads.{h}.query.weight": [("query", h, 0, hd)] for h in range(spec.n_head)}
        for proj in () if spec.kv_from else ("key",) if spec.k_eq_v else ("key", "value"):
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
        no_kv = next(iter(qkv.values()))[1] is None  # queries alone (a layer that reads another's keys)
        n_kv = n_head if no_kv else kv_heads_of(qkv, n_head)
        group = n_head // n_kv
        out = {}
        for kind, (q, k, v) in qkv.items():
            if q.size(0) % n_head != 0:
                raise ValueError(f"attention width {q.size(0)} is not divisible by n_head={n_head}")
            for h, part in enumerate(q.chunk(n_head, dim=0)):
                out[f"heads.{h}.query.{kind}"] = part.clone()
            for proj, full in (("key", k), ("value", v)):
                if full is None:  # keys equal to values: no value projection
                    continue
                for g, part in enumerate(full.chunk(n_kv, dim=0)):
                    out[f"heads.{g * group}.{proj}.{kind}"] = part.clone()
        return out


class SplitHeadsAttention(MultiHeadAttention):
    """Layouts that project full-width q, k, v, then split them into heads for one kernel call."""

    projection_options = frozenset({"n_kv_head", "k_eq_v"})  # key/value heads, keys equal to values
    shares_kv = True  # its projection can make queries alone (model.layer_kinds.S.kv_from)

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.kv_width = spec.kv_heads * spec.head_dim
        self.k_eq_v, self.keys_alone = spec.k_eq_v, keys_only(spec)

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return spec.n_embd, spec.n_embd * (2 if spec.differential else 1)  # each map reads its pair's values

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        return kv_tensors(spec) * spec.kv_heads * spec.head_dim  # a key and a value per key/value head (or the key)

    @staticmethod
    def initial_tensor(name: str, template: torch.Tensor) -> torch.Tensor | None:
        """Its own initial draws (``GPT.reset_parameters``): differential attention's lambda vectors."""
        return DifferentialHeads.initial(name, template)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """q (B, T, C), k and v (B, T, kv_width); v None where the keys are the values (model.k_eq_v)."""
        raise NotImplementedError

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """Full-width q, k, v, split into heads: one key group, one call of every head."""
        q, k, v = self.projections(x)
        if k is None:  # queries alone: the keys and values are another layer's (kv_from)
            return [KeyGroup(0, None, None, [(0, self.split_heads(q, self.n_head))])]
        return [key_group(0, self.split_heads(k, self.n_kv_head), None if v is None else self.split_heads(
            v, self.n_kv_head), [(0, self.split_heads(q, self.n_head))], self.keys_alone)]  # fmt: skip

    def keys_values(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return values_read_from_keys(k, v)

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
            none = (name == "value" and spec.k_eq_v) or (name != "query" and spec.kv_from is not None)
            setattr(self, name, None if none else nn.Linear(spec.n_embd, width, bias=spec.bias))

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        q, k, v = (getattr(self, name) for name in self.LINEARS)
        return q(x), None if k is None else k(x), None if v is None else v(x)

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 3

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        kv = 0 if spec.kv_from else spec.kv_heads  # a layer that reads another's keys: queries alone
        hd, heads = spec.head_dim, (spec.n_head, kv, 0 if spec.k_eq_v else kv)
        return {f"{linear}.weight": [(proj, h, h * hd, (h + 1) * hd) for h in range(n)]
                for linear, proj, n in zip(cls.LINEARS, PROJECTIONS, heads) if n}  # fmt: skip

    @classmethod
    def to_qkv(cls, params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        kinds = sorted({name.split(".")[1] for name in params})
        k_eq_v = not any(name.startswith(f"{cls.LINEARS[2]}.") for name in params)  # no values: the keys serve
        no_kv = not any(name.startswith(f"{cls.LINEARS[1]}.") for name in params)  # queries alone (kv_from)
        linears = cls.LINEARS[:1] if no_kv else cls.LINEARS[:2] if k_eq_v else cls.LINEARS
        for kind in kinds:
            missing = [p for p in linears if f"{p}.{kind}" not in params]
            if missing:
                raise ValueError(f"the attention has no {missing} {kind}; the state dict is incomplete")
        return {kind: (*(params[f"{p}.{kind}"] for p in linears), *(None,) * (3 - len(linears))) for kind in kinds}

    @classmethod
    def from_qkv(cls, qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        return {f"{p}.{kind}": t.clone() for kind, tensors in qkv.items() for p, t in zip(cls.LINEARS, tensors)
                if t is not None}  # fmt: skip


@register(MIXERS)
class FusedQKVAttention(SplitHeadsAttention):
    name, colour, marker = "fused_qkv", "tab:green", "^"
    # c_attn stacks [query; key; value]; with keys equal to values, c_attn_qk stacks [query; key]; a layer that reads
    # another's keys (kv_from) has c_attn_q, the queries alone (the name says which)
    QKV_KEY = re.compile(r"c_attn(?P<parts>_qk|_q)?\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "c_attn"
    canonical = True  # GPT-2's own form

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 1

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # c_attn stacks [query; key; value] by rows, each by head (c_attn_qk [query; key])
        hd, starts = spec.head_dim, (0, spec.n_embd, spec.n_embd + spec.kv_heads * spec.head_dim)
        kv = 0 if spec.kv_from else spec.kv_heads  # a layer that reads another's keys: queries alone
        heads = (spec.n_head, kv, 0 if spec.k_eq_v else kv)
        return {FUSED_NAMES[fused_parts(spec)] + ".weight": [(proj, h, start + h * hd, start + (h + 1) * hd)
                                                          for proj, start, n in zip(PROJECTIONS, starts, heads)
                                                          for h in range(n)]}  # fmt: skip

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.parts = fused_parts(spec)  # key/value parts after the queries: 2, 1 (keys equal to values), 0 (kv_from)
        self.fused = FUSED_NAMES[self.parts]  # the Linear's name: c_attn, c_attn_qk without values, c_attn_q
        setattr(self, self.fused, nn.Linear(spec.n_embd, spec.n_embd + self.parts * self.kv_width, bias=spec.bias))

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        q, *kv = getattr(self, self.fused)(x).split([x.size(-1), *[self.kv_width] * self.parts], dim=-1)
        return q, *kv, *(None,) * (2 - len(kv))

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """As every layout that splits heads, with its queries and keys side by side in c_attn's output, as one
        tensor of heads, time-major (B, T, H + kv, d): the encodings turn them in one call."""
        if self.reads_kv:  # queries alone (SplitHeadsAttention's)
            return super().project(x)
        B, T, C = x.shape
        qk, *v = getattr(self, self.fused)(x).split([C + self.kv_width, *[self.kv_width] * (not self.k_eq_v)], dim=-1)
        qk = qk.view(B, T, self.n_head + self.n_kv_head, self.head_dim)
        q, k = qk.transpose(1, 2).split([self.n_head, self.n_kv_head], dim=1)
        v = self.split_heads(v[0], self.n_kv_head) if v else None
        return [key_group(0, k, v, [(0, q)], self.keys_alone, qk)]

    @staticmethod
    def to_qkv(params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        # c_attn stacks [query; key; value] by rows: n_embd rows of queries, then two equal parts; c_attn_qk
        # [query; key], the keys also the values (None in the common form)
        out = {}
        for name, t in params.items():
            rows, module = t.size(0), name.split(".")[0]
            parts = FUSED_NAMES.index(module) if module in FUSED_NAMES else 2
            width = t.size(1) if t.dim() == 2 else None
            if width is None:  # a bias: its weight says how wide the queries are
                weight = params.get(name.replace("bias", "weight"))
                width = weight.size(1) if weight is not None else rows // (parts + 1)
            kv = (rows - width) // max(parts, 1)
            if width + parts * kv != rows:
                raise ValueError(f"{module} has {rows} rows for width {width}: not queries and {parts} equal "
                                 f"key/value parts")  # fmt: skip
            split = t.split([width, *[kv] * parts], dim=0)
            out[name.split(".")[1]] = (*split, *(None,) * (2 - parts))
        return out

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        return {f"{FUSED_NAMES[sum(t is not None for t in tensors[1:])]}.{kind}":
                torch.cat([t for t in tensors if t is not None], dim=0) for kind, tensors in qkv.items()}  # fmt: skip


# fused_qkv's Linear by the key/value parts it stacks after the queries: ``c_attn_q`` the queries alone (a layer that
# reads another's keys, kv_from), ``c_attn_qk`` [query; key] (keys equal to values), ``c_attn`` [query; key; value]:
# the name says which, so a state dict converts without its config.
FUSED_NAMES = ("c_attn_q", "c_attn_qk", "c_attn")


def fused_parts(spec: AttentionSpec) -> int:
    """The key/value parts fused_qkv's projection stacks after the queries: none (kv_from), the keys alone (k_eq_v),
    or keys and values."""
    return 0 if spec.kv_from is not None else 1 if spec.k_eq_v else 2
