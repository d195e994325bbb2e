"""DeepSeek-V4's compressed attention (DeepSeek-AI 2026; transformers' ``DeepseekV4Attention``):
``model.compress_ratio=m``, ``model.compress_topk=k``, ``model.compress_window=w``.

Each query head attends, in one softmax, two kinds of keys: the last w keys it sees, and compressed entries, one for
each complete block of m positions (0..m-1, m..2m-1, ...; absolute, as MoBA's and NSA's, ``model.attention.blocks``).
A block's entry pools its keys (its values alike) with a softmax gate per dimension over the block's positions:

    K_cmp[b] = sum_{j<m} softmax_j(k_{bm+j} W_k + a_j) * k_{bm+j}        (each of the d dims its own softmax over j)
    V_cmp[b] = sum_{j<m} softmax_j(v_{bm+j} W_v + c_j) * v_{bm+j}

W_k, W_v (d x d) and the learned position biases a_j, c_j are shared by the key/value heads (V4's ``wgate`` and
``ape``); with W and the biases at zero the entry is the block's mean, MoBA's pooled key.

- **HCA** (heavily compressed attention, ``compress_topk=null``): the query attends every entry that is a candidate.
- **CSA** (compressed sparse attention, ``compress_topk=k``): it attends the k candidates of highest q_t . K_cmp[b],
  per query head, equal scores to the later block. The top-k passes no gradient: the gates learn through the entries
  attended.

A candidate is a complete block earlier than the query's own and seen whole under its masks (MoBA's and NSA's rule:
the same from a full forward and from a KV cache; a window, a chunk or a document hides a block it cuts); the window's
keys cover the query's own block. The softmax is the layer's kernel (manual or SDPA) over the window's keys and the
chosen entries side by side, each entry placed at its block's last position, with the layer's score modifications:
softcap, and sinks (V4's attention sink). Every softmax layout takes it, MLA too (its keys and values as up-projected
per head, the rotary key's dims in each key); V4's one shared key/value head is ``model.n_kv_head=1``, its keys
equal to values ``model.k_eq_v=true``.

What differs from DeepSeek-V4's layer (each a choice of this module, said where a reader compares):
- the entries pool the layer's encoded keys and values (as the cache holds them, rotary turned), gated from those;
  V4 pools its own projections of the hidden state (``wkv``, ``wgate``), RMS-normalises the entry and turns it at its
  block's position;
- CSA's ranking is the layer's own q . K_cmp per query head (NSA's rule), not V4's lightning indexer over index keys
  compressed apart (``model.attention.sparse``'s indexer ranks tokens); V4's CSA blocks overlap (windows of 2m at
  stride m): not built;
- nothing is cached beyond the keys and values: a decode step pools the complete blocks again from the keys the cache
  holds. V4 keeps only the window and the entries, its point at a million tokens: here the cache is full attention's,
  and on a CPU, and with the manual or SDPA kernel anywhere, the kernel computes every key's score and masks those
  outside the window.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from model import registry
from model.attention.blocks import BlockGrid, block_grid, laid_out
from model.attention.kernels import attention_probs, positions_of, seen_keys
from model.attention.label_parts import LabelPart
from model.attention.masks import HeldKeys
from model.attention.selection import KeySelection
from model.attention.sparse import widened  # a top-k's order under autocast is not bf16's
from model.registry import SELECTIONS, register

COMPRESS_WINDOW = 32  # model.compress_window by default: the keys each query attends as they are (V4's 128)


def label(model: Mapping, show) -> str | None:
    """``csa<ratio>k<entries>w<window>`` (a top-k: compressed sparse attention), ``hca<ratio>w<window>`` (every entry:
    heavily compressed attention), or ``nocmp`` where a sweep varies it and it is off."""
    ratio = model.get("compress_ratio")
    if ratio is None:
        return "nocmp" if "compress_ratio" in show else None
    window, topk = model.get("compress_window", COMPRESS_WINDOW), model.get("compress_topk")
    return f"hca{ratio}w{window}" if topk is None else f"csa{ratio}k{topk}w{window}"


COMPRESSED = LabelPart("cmp", "", label, ((r"csa\d+k\d+w\d+|hca\d+w\d+|nocmp",
                                          "-csa<positions per entry>k<entries>w<window> or -hca<positions per entry>"
                                          "w<window> (DeepSeek-V4's compressed attention)"),),
                       fields=("compress_topk", "compress_window"))  # fmt: skip


@register(SELECTIONS)
class CompressedAttention(nn.Module, KeySelection):
    """One layer's compressed attention: its gates, and the one softmax over a window's keys and the compressed
    entries (``attend``), in place of its kernel call. A key selection (``model.attention.selection``) per kernel call
    that attends its own way (``attends``), in one branch."""

    name, field, attribute, per_call, attends = "compressed", "compress_ratio", "compressor", True, True
    plan_part = "compressed entries"
    does = "attends compressed blocks beside a window of keys"

    @classmethod
    def build(cls, spec, rotary_width: int | None, widths: tuple[int, int]) -> CompressedAttention:
        return cls(spec, *(width // spec.n_head for width in widths))  # per head as wide as the scores and values

    @classmethod
    def check(cls, spec) -> None:
        check_compressed(spec)

    @classmethod
    def attended(cls, spec, keys: int) -> int:
        """The window's keys and the entries attended: every complete block's (HCA), or the top-k (CSA)."""
        entries = keys // spec.compress_ratio
        chosen = entries if spec.compress_topk is None else min(spec.compress_topk, entries)
        return min(spec.compress_window, keys) + chosen

    @classmethod
    def flops(cls, spec, keys: int, widths: tuple[int, int]) -> int:
        """The gates, applied to every key and value of each key/value head, where 6 x their weights
        (``GPT.flops_per_token``) counted them once per token: the difference; and CSA's ranking of every entry
        (forward only: the top-k passes no gradient)."""
        dq, dv = (width // spec.n_head for width in widths)
        ranking = 0 if spec.compress_topk is None else 2 * widths[0] * (keys // spec.compress_ratio)
        return 6 * (spec.kv_heads - 1) * (dq * dq + dv * dv) + ranking

    @classmethod
    def plan_bytes(cls, spec, batch: int, length: int, dtype_bytes: int) -> int:
        """What it keeps for backward beyond the one kernel call the plan counts for every softmax layer (measured on a
        CPU, float32 and bf16 autocast, within 25% of the whole by tests/test_gpu_readiness.py): the keys and values
        with the entries beside them (the kernel's inputs, copies), the pooling's blocks, gate logits and weights, at
        the matmuls' dtype; and the kernel's own over the entries: the weights where it keeps them (manual), else
        (SDPA) its mask as a float bias, one per query head for CSA's choice per head (a boolean mask is not counted,
        as the dense call's is not)."""
        B, T, a, H = batch, length, dtype_bytes, spec.n_head
        kv = B * T * spec.n_embd * spec.kv_heads / H  # one tensor of keys (or values), every key/value head
        entries = T // spec.compress_ratio
        if registry.kernel(spec.kernel).keeps_scores(spec.sdpa_backend):
            return int(6 * kv * a + B * H * T * entries * a)
        heads = 1 if spec.compress_topk is None else H
        return int(7 * kv * a + B * heads * T * (T + entries) * a)

    def __init__(self, spec, key_dim: int, value_dim: int) -> None:
        super().__init__()
        self.ratio, self.topk, self.window = spec.compress_ratio, spec.compress_topk, spec.compress_window
        self.masks = spec.masks
        self.key_gate = nn.Linear(key_dim, key_dim, bias=False)  # W_k
        self.value_gate = nn.Linear(value_dim, value_dim, bias=False)  # W_v
        self.key_positions = nn.Parameter(torch.zeros(self.ratio, key_dim))  # a_j, j the position in the block
        self.value_positions = nn.Parameter(torch.zeros(self.ratio, value_dim))  # c_j

    def pooled(self, t: torch.Tensor, held: torch.Tensor, grid: BlockGrid, gate: nn.Linear,
               positions: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Each block's entry from the keys (or values) ``t`` (B, kv, S, d) held at ``held`` (S,): the softmax over
        the block's positions of its gate, per dimension, weighing its keys -> (B, kv, blocks, d), in ``t``'s dtype; a
        block not held whole gets a number from the keys that are (no query reads it: not a candidate)."""
        blocks = laid_out(t, held, grid, self.ratio)  # (B, kv, blocks, m, d)
        weights = torch.softmax(gate(blocks) + positions.to(blocks.dtype), dim=-2)
        return (weights * blocks).sum(dim=-2).to(t.dtype)

    def chosen(self, q: torch.Tensor, k_cmp: torch.Tensor, grid: BlockGrid) -> torch.Tensor:
        """The entries each query attends, ((T, blocks), (B, 1, T, blocks) or CSA's (B, h, T, blocks)): every candidate
        (HCA), or the ``topk`` candidates of highest q . K_cmp (CSA; ``k_cmp`` per query head), equal scores to the
        later block."""
        if self.topk is None:
            return grid.candidate
        with torch.no_grad():  # a top-k passes no gradient; its order at float32's precision at least (autocast)
            ranks = widened(q) @ widened(k_cmp).transpose(-1, -2)  # (B, h, T, blocks)
            ranks = ranks.masked_fill(~grid.candidate, float("-inf"))
            width = ranks.size(-1)
            # latest first, then a stable sort by score: among equal scores the later block keeps its place ahead
            order = torch.sort(ranks.flip(-1), dim=-1, descending=True, stable=True).indices
            order = order[..., : min(self.topk, width)]
            picked = torch.zeros_like(ranks, dtype=torch.bool).scatter_(-1, width - 1 - order, True)
        return picked & grid.candidate

    def entries(self, q: torch.Tensor, k: torch.Tensor, keys: HeldKeys | None, positions: torch.Tensor | None,
                documents: torch.Tensor | None, heads: int, block=None):  # fmt: skip
        """The held keys' positions, the block grid, the keys' entries (per key/value head; per query head too where
        ``block`` is given, for CSA's ranking), and what each query attends of the keys and the entries side by side
        (B or 1, h or 1, T, S + blocks); the entries' positions (each block's last) in ``HeldKeys`` with the keys'."""
        T, S = q.size(-2), k.size(-2)
        keep = seen_keys(T, S, self.masks, keys, positions, documents, q.device)  # (T, S) or (B, 1, T, S)
        queries, held = positions_of(T, S, keys, positions, q.device)
        grid = block_grid(keep, queries, held, self.ratio)
        k_cmp = self.pooled(k, held, grid, self.key_gate, self.key_positions)
        # each query head's entries, for CSA's ranking alone (HCA ranks nothing: no copy per query head)
        per_query = k_cmp if block is None or self.topk is None else block.keys_per_query(k_cmp, heads)
        chosen = self.chosen(q, per_query, grid)
        near = keep & (queries[:, None] - held[None, :] < self.window)  # the last w keys the query sees
        near, chosen = (t if t.dim() == 4 else t[None, None] for t in (near, chosen))
        lead = torch.broadcast_shapes(near.shape[:2], chosen.shape[:2])
        selected = torch.cat((near.expand(*lead, -1, -1), chosen.expand(*lead, -1, -1)), dim=-1)
        ends = (torch.arange(grid.member.size(1), device=q.device) + grid.first) * self.ratio + self.ratio - 1
        return held, grid, k_cmp, selected, HeldKeys(torch.cat((held, ends)), full=False)

    def select_heads(self, q: torch.Tensor, k: torch.Tensor, keys, positions: torch.Tensor | None,
                     documents: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """The keys each query head reads, (B or 1, h or 1, T, S): the window's, and those of each entry it attends
        (pooled), from each query head's keys (B, h, S, d)."""
        _, grid, _, selected, _ = self.entries(q, k, keys, positions, documents, q.size(1))
        S = k.size(-2)
        return selected[..., :S] | (selected[..., S:].to(torch.float32) @ grid.member.T > 0)

    def attend(self, block, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys, mods, positions: torch.Tensor,
               documents: torch.Tensor | None, gates: None) -> torch.Tensor:  # fmt: skip
        """The one softmax of query heads ``q`` (B, h, T, dq) over the window's keys and the chosen entries of their
        key group's keys and values (B, kv, S, d), held where ``keys`` says -> (B, h, T, dv). ``block``: the attention
        block (its kernel, dropout, key/value heads per query head)."""
        held, grid, k_cmp, selected, both = self.entries(q, k, keys, positions, documents, q.size(1), block)
        v_cmp = self.pooled(v, held, grid, self.value_gate, self.value_positions)
        values = torch.cat((v, v_cmp), dim=2)
        pad = q.size(-1) - v.size(-1) if block.pad_values else 0  # MLA's narrower values (``attend_heads``)
        y = block.kernel(q, torch.cat((k, k_cmp), dim=2), F.pad(values, (0, pad)) if pad else values, block.dropout,
                         block.training, keys=both, mods=mods, positions=positions, document_starts=documents,
                         selected=selected)  # fmt: skip
        return y[..., : v.size(-1)] if pad else y

    @torch.no_grad()
    def weights(self, block, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Each head's weights over the keys, (B, H, T, T), from its queries and keys (B, H, T, d) at positions 0..T-1
        (the maps ``heads.py`` studies): the window's keys' weights, and each entry's spread evenly over its block's
        keys (with sinks a row sums to less than 1, as every sink's does)."""
        T = q.size(-2)
        positions = torch.arange(T, device=q.device)
        _, grid, k_cmp, selected, both = self.entries(q, k, None, positions, None, q.size(1))
        probs = attention_probs(q, torch.cat((k, k_cmp), dim=2), keys=both, mods=block.score_mods(x),
                                positions=positions, selected=selected)  # fmt: skip
        return probs[..., :T] + probs[..., T:] @ grid.member.T.to(probs.dtype) / self.ratio


def check_compressed(spec) -> None:
    """Refuse a ratio, top-k or window that is not a positive whole number, one set without a ratio, a ratio as long as
    the context, and a position encoding an entry cannot hold, in one line. (A window as long as the context is taken:
    the layer is then full attention with entries beside it.)"""
    ratio, topk, window = spec.compress_ratio, spec.compress_topk, spec.compress_window
    if ratio is not None and (not isinstance(ratio, int) or isinstance(ratio, bool) or ratio < 1):
        raise ValueError(f"model.compress_ratio={ratio!r} must be a positive number of positions per compressed entry "
                         f"(DeepSeek-V4's 4 for CSA, 128 for HCA), or null (no compression)")  # fmt: skip
    if topk is not None and (not isinstance(topk, int) or isinstance(topk, bool) or topk < 1):
        raise ValueError(f"model.compress_topk={topk!r} must be a positive number of compressed entries each query "
                         f"attends (CSA; DeepSeek-V4's 512), or null (HCA: every entry)")  # fmt: skip
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"model.compress_window={window!r} must be a positive number of keys each query attends "
                         f"beside the entries ({COMPRESS_WINDOW} by default; DeepSeek-V4's 128)")  # fmt: skip
    for name, value, default in (("compress_topk", topk, None), ("compress_window", window, COMPRESS_WINDOW)):
        if value != default and ratio is None:
            raise ValueError(f"model.{name}={value} is compressed attention's, but model.compress_ratio=null; set "
                             f"model.compress_ratio=<positions per entry>, or leave model.{name} at "
                             f"{'null' if default is None else default}")  # fmt: skip
    if ratio is None:
        return
    if spec.block_size is not None and ratio >= spec.block_size:
        raise ValueError(f"model.compress_ratio={ratio} is at least the context (model.block_size={spec.block_size}): "
                         f"no query would see a complete earlier block; choose a ratio below {spec.block_size}, or "
                         f"model.compress_ratio=null")  # fmt: skip
    position = registry.position(spec.position)
    if position.biases_scores or position.transforms_keys:
        raise ValueError(f"model.position={spec.position} and model.compress_ratio={ratio} cannot both be set: a "
                         f"compressed entry has no one position to bias or turn by; use model.position=rope, learned "
                         f"or none, or model.compress_ratio=null")  # fmt: skip
