"""Native Sparse Attention (NSA, DeepSeek, Yuan et al. 2025, arXiv 2502.11089): ``model.nsa_block=l``,
``model.nsa_topk=n``, ``model.nsa_window=w``.

Each query head h attends three ways, and adds them, gated per head from the block's input x_t (eq. 5):

    o_t = g_cmp Attn(q_t, K_cmp, V_cmp) + g_slc Attn(q_t, the keys of the n blocks chosen) + g_swa Attn(q_t, the last w)
    (g_cmp, g_slc, g_swa) = sigmoid(x_t W_g + b_g), W_g (n_embd, 3 n_head)

- **compression**: the keys (values alike) are cut into blocks of l positions (0..l-1, l..2l-1, ...; absolute, as
  MoBA's, ``model.attention.blocks``), and each block b becomes one key, phi(k_{bl..bl+l-1}) = W_c [k_{bl} + p_0; ...;
  k_{bl+l-1} + p_{l-1}]: a learned linear map of the block's l keys laid end to end, each plus a learned intra-block
  position embedding p_j (the paper's phi is "an MLP with intra-block position encoding": here one linear layer,
  no hidden layer); one compressor for the keys and one for the values, shared by the key/value heads. The stride is
  the block (the paper's d = l; its blocks of 32 overlap at stride 16: not built). A query attends, by softmax, the
  compressed blocks that are candidates: complete, earlier than its own block and seen whole under its masks (MoBA's
  rule: the same from a full forward and a KV cache); before any, the branch adds nothing.
- **selection**: the selection blocks are the compression blocks (the paper's l' = l case; its 64 over 32 is not
  built), ranked by the compressed attention's own scores q_t . phi(K_b) (the paper's p_cmp, of the same order), per
  query head (not summed over a key/value group: the paper's GQA-shared choice is not built). The query attends its
  own block (causal) and the n - 1 candidates of highest score, equal scores to the later block (MoBA's
  ``top_blocks``; the paper always adds the first block and two local ones: not built, the window branch sees the
  local keys). The top-n passes no gradient (as in the paper): the compressor learns through the compressed branch.
- **sliding window**: the query attends the last w keys it sees (itself included).

The selection and the window are the layer's kernel (manual or SDPA) over the keys they keep, with the block's score
modifications (softcap); the compressed branch is the textbook softmax here (a few keys per query). Every softmax
layout takes it, MLA too (its keys and values as up-projected per head, the rotary key's dims in each key).

Nothing is cached beyond the keys and values: a decode step compresses the complete blocks again from the keys the
cache holds. On a CPU, and with the manual or SDPA kernel anywhere, nothing is saved: each branch's kernel computes
every query's scores over every key, then masks the ones its branch does not keep (three attentions over every key
instead of one; the paper's kernel loads only the blocks chosen).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model import registry
from model.attention.blocks import BlockGrid, block_grid, laid_out, top_blocks
from model.attention.kernels import positions_of, seen_keys
from model.attention.selection import KeySelection
from model.attention.sparse import widened  # a gate's order under autocast is not bf16's
from model.registry import SELECTIONS, register

NSA_TOPK = 4  # model.nsa_topk by default: blocks each query selects, its own included (the paper's 16 at 64k)
NSA_WINDOW = 32  # model.nsa_window by default: the sliding branch's keys (the paper's 512 at 64k)
BRANCHES = ("compressed", "selected", "sliding")  # the gates' order, per head: W_g's rows branch by branch


@register(SELECTIONS)
class NativeSparseAttention(nn.Module, KeySelection):
    """One layer's NSA: its compressors, its gates, and its three branches over a kernel call's heads (``attend``).
    A key selection (``model.attention.selection``) per kernel call, its blocks ranked by q . compressed keys
    (``select_heads``), that attends its own way (``attends``): the block asks it in place of its kernel call."""

    name, field, attribute, per_call, attends, plan_part = "nsa", "nsa_block", "nsa", True, True, "NSA branches"
    branches = BRANCHES
    does = "selects the blocks each query attends"

    @classmethod
    def build(cls, spec, rotary_width: int | None, widths: tuple[int, int]) -> NativeSparseAttention:
        return cls(spec, *(width // spec.n_head for width in widths))  # per head as wide as the scores and values

    @classmethod
    def check(cls, spec) -> None:
        check_nsa(spec)

    @classmethod
    def attended(cls, spec, keys: int) -> int:
        """The keys of its three branches: the selected blocks', the window's and the compressed blocks (whose scores
        rank the selection: counted once)."""
        return min(spec.nsa_topk * spec.nsa_block, keys) + min(spec.nsa_window, keys) + keys // spec.nsa_block

    @classmethod
    def flops(cls, spec, keys: int, widths: tuple[int, int]) -> int:
        """The compressor's, once per block of l tokens for each key/value head, where 6 x its weights
        (``GPT.flops_per_token``) counted it once per token: the difference."""
        dq, dv = (w // spec.n_head for w in widths)
        return 6 * (spec.kv_heads - spec.nsa_block) * (dq * dq + dv * dv)

    @classmethod
    def plan_bytes(cls, spec, batch: int, length: int, dtype_bytes: int) -> int:
        """What its branches keep for backward beyond the one kernel call the plan counts for every softmax layer: a
        second kernel call (its queries, keys and values, and what the kernel keeps: the weights, or SDPA's
        log-sum-exp and the selection as its mask, one per query head, and the window's), the three branch outputs the
        gates multiply, the compressors' inputs (every key and value laid end to end), the compressed branch's scores
        and weights (three per query and block) and the gates (float32). Measured within 25% by
        tests/test_gpu_readiness.py."""
        B, T, a, H = batch, length, dtype_bytes, spec.n_head
        N, kv_share = B * T * spec.n_embd, spec.kv_heads / H
        scores = B * H * T * T
        if registry.kernel(spec.kernel).keeps_scores(spec.sdpa_backend):
            kernel = scores * a  # the weights, at the matmuls' dtype (measured: under autocast, no float32 copy)
        else:
            kernel = B * H * T * 4 + (scores + T * T) * a  # the log-sum-exp, the selection's mask and the window's
        inputs = (1 + 2 * kv_share) * N * a + 3 * N * a  # the second call's queries, keys, values; three outputs
        compressed = 2 * kv_share * N * a + 3 * B * H * T * math.ceil(T / spec.nsa_block) * 4 + 3 * B * H * T * 4
        return int(kernel + inputs + compressed)

    def __init__(self, spec, key_dim: int, value_dim: int) -> None:
        super().__init__()
        self.size, self.topk, self.window = spec.nsa_block, spec.nsa_topk, spec.nsa_window
        self.masks, self.softcap = spec.masks, spec.softcap
        self.key_positions = nn.Parameter(torch.zeros(self.size, key_dim))  # p_j, j the position in the block
        self.value_positions = nn.Parameter(torch.zeros(self.size, value_dim))
        self.compress_keys = nn.Linear(self.size * key_dim, key_dim, bias=False)
        self.compress_values = nn.Linear(self.size * value_dim, value_dim, bias=False)
        self.gates = nn.Linear(spec.n_embd, len(BRANCHES) * spec.n_head)

    def branch_gates(self, x: torch.Tensor) -> torch.Tensor:
        """The block's input (B, T, C) -> each branch's gate per head, (3, B, H, T, 1)."""
        g = torch.sigmoid(self.gates(x))  # (B, T, 3 H)
        if self.alone is not None:  # one branch alone (``KeySelection.alone``): its gate 1, the others' 0
            g = torch.cat([torch.full_like(part, float(name == self.alone)) for name, part in
                           zip(BRANCHES, g.chunk(len(BRANCHES), dim=-1))], dim=-1)  # fmt: skip
        return g.unflatten(-1, (len(BRANCHES), -1)).permute(2, 0, 3, 1)[..., None]

    def compressed(self, t: torch.Tensor, held: torch.Tensor, grid: BlockGrid, positions: torch.Tensor,
                   compress: nn.Linear) -> torch.Tensor:  # fmt: skip
        """Each block's one key (or value) from the keys ``t`` (B, kv, S, d) held at ``held`` (S,): its keys in
        position order, each plus its position's embedding, laid end to end, through ``compress`` -> (B, kv, blocks,
        d); a block not held whole gets a number from the keys that are (no query reads it: not a candidate)."""
        blocks = laid_out(t, held, grid, self.size) + positions.to(t.dtype)  # (B, kv, blocks, l, d)
        return compress(blocks.flatten(-2))

    def ranked(self, q: torch.Tensor, k: torch.Tensor, keys, positions: torch.Tensor | None,
               documents: torch.Tensor | None, heads: int, block=None):  # fmt: skip
        """The keys ``keep`` each query sees, their positions, the block grid, the compressed keys (per query head
        where ``block`` is given, else ``k``'s own heads), their scores and the selection's choice (``top_blocks``)."""
        T, S = q.size(-2), k.size(-2)
        keep = seen_keys(T, S, self.masks, keys, positions, documents, q.device)  # (T, S) or (B, 1, T, S)
        queries, held = positions_of(T, S, keys, positions, q.device)
        grid = block_grid(keep, queries, held, self.size)
        k_cmp = self.compressed(k, held, grid, self.key_positions, self.compress_keys)
        k_cmp = k_cmp if block is None else block.keys_per_query(k_cmp, heads)
        scores = q @ k_cmp.transpose(-1, -2)  # (B, h, T, blocks): the compressed attention's and the selection's
        # the selection's order from the scores at float32's precision at least (under autocast: not bf16's products)
        ranks = scores if widened(scores) is scores else widened(q) @ widened(k_cmp).transpose(-1, -2)
        return keep, queries, held, grid, scores, top_blocks(ranks, grid, keep, self.topk)

    def select_heads(self, q: torch.Tensor, k: torch.Tensor, keys, positions: torch.Tensor | None,
                     documents: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """The selection branch's keys (B, h, T, S): each query head's own block and the nsa_topk - 1 candidates its
        q . compressed keys rank highest, from each query head's keys (B, h, S, d)."""
        return self.ranked(q, k, keys, positions, documents, q.size(1))[-1]

    def attend(self, block, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys, mods, positions: torch.Tensor,
               documents: torch.Tensor | None, gates: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """The three branches of query heads ``q`` (B, h, T, dq) over their key group's keys and values (B, kv, S, d)
        held where ``keys`` says, gated by ``gates`` (3, B, h, T, 1) and added -> (B, h, T, dv). ``block``: the
        attention block (its kernel, dropout, key/value heads per query head)."""
        heads = q.size(1)
        keep, queries, held, grid, scores, chosen = self.ranked(q, k, keys, positions, documents, heads, block)
        v_cmp = block.keys_per_query(self.compressed(v, held, grid, self.value_positions, self.compress_values), heads)
        o_cmp = self.compressed_attention(scores, grid.candidate, v_cmp, q.size(-1), block)
        near = keep & (queries[:, None] - held[None, :] < self.window)  # the last w keys the query sees
        near = near if near.dim() == 4 else near[None, None]

        pad = q.size(-1) - v.size(-1) if block.pad_values else 0  # MLA's narrower values (``attend_heads``)

        def kernel(selected: torch.Tensor) -> torch.Tensor:
            y = block.kernel(q, k, F.pad(v, (0, pad)) if pad else v, block.dropout, block.training, keys=keys,
                             mods=mods, positions=positions, document_starts=documents, selected=selected)
            return y[..., : v.size(-1)] if pad else y

        return gates[0] * o_cmp + gates[1] * kernel(chosen) + gates[2] * kernel(near)

    def compressed_attention(self, scores: torch.Tensor, candidate: torch.Tensor, v_cmp: torch.Tensor, dq: int,
                             block) -> torch.Tensor:  # fmt: skip
        """softmax(q . K_cmp / sqrt(dq)) V_cmp over each query's candidate blocks (softcapped as the kernel's
        scores are); a query with none gets zeros."""
        weights = self.compressed_weights(scores, candidate, dq)
        if block.dropout and block.training:
            weights = F.dropout(weights, block.dropout)
        return weights.to(v_cmp.dtype) @ v_cmp

    def compressed_weights(self, scores: torch.Tensor, candidate: torch.Tensor, dq: int) -> torch.Tensor:
        scores = scores / math.sqrt(dq)
        if self.softcap is not None:
            scores = self.softcap * torch.tanh(scores / self.softcap)
        none = ~candidate.any(dim=-1, keepdim=True)  # before any complete block: zeros, not a softmax of nothing
        scores = scores.masked_fill(~candidate, float("-inf")).masked_fill(none, 0.0)
        return torch.softmax(scores, dim=-1) * candidate

    @torch.no_grad()
    def weights(self, block, q: torch.Tensor, k: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Each head's weights over the keys, (B, H, T, T), from its queries and keys (B, H, T, d) at positions 0..T-1
        (no values: the maps ``heads.py`` studies): the gated branches' weights added and divided by the gates' sum,
        a compressed block's weight spread evenly over its keys (rows sum to 1; before a complete block, the
        compressed branch adds nothing and its gate is left out)."""
        T = q.size(-2)
        keep = seen_keys(T, T, self.masks, None, None, None, q.device)
        queries = held = torch.arange(T, device=q.device)
        grid = block_grid(keep, queries, held, self.size)
        scores = q @ self.compressed(k, held, grid, self.key_positions, self.compress_keys).transpose(-1, -2)
        spread = self.compressed_weights(scores, grid.candidate, q.size(-1)) @ grid.member.T.to(q.dtype) / self.size
        maps = [spread]
        near = keep & (queries[:, None] - held[None, :] < self.window)
        for selected in (top_blocks(widened(scores), grid, keep, self.topk), near.expand_as(maps[0])):
            scores_t = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
            if self.softcap is not None:
                scores_t = self.softcap * torch.tanh(scores_t / self.softcap)
            maps.append(torch.softmax(scores_t.masked_fill(~selected, float("-inf")), dim=-1))
        mixed = sum(g * m for g, m in zip(self.branch_gates(x).to(q.dtype), maps))
        return mixed / mixed.sum(dim=-1, keepdim=True)  # over the gates of the branches a query has


def check_nsa(spec) -> None:
    """Refuse a block, top-n or window that is not a positive whole number, one set without blocks, a block as long as
    the context, and a position encoding a compressed key cannot hold, in one line. (A window as long as the context
    is taken: the sliding branch is then causal attention over every key, as the paper's 512 is at a short length.)"""
    size, topk, window = spec.nsa_block, spec.nsa_topk, spec.nsa_window
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise ValueError(f"model.nsa_block={size!r} must be a positive number of positions per block (NSA's "
                         f"compression and selection block; the paper's 32 and 64), or null (no NSA)")  # fmt: skip
    for name, value, default, what in (("nsa_topk", topk, NSA_TOPK, "blocks each query selects, its own included"),
                                       ("nsa_window", window, NSA_WINDOW, "keys of the sliding branch")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"model.{name}={value!r} must be a positive number of {what} ({default} by default)")
        if value != default and size is None:
            raise ValueError(f"model.{name}={value} is NSA's, but model.nsa_block=null; set model.nsa_block=<positions"
                             f" per block>, or leave model.{name} at {default}")  # fmt: skip
    if size is None:
        return
    if spec.block_size is not None and size >= spec.block_size:
        raise ValueError(f"model.nsa_block={size} is at least the context (model.block_size={spec.block_size}): no "
                         f"query would see a complete earlier block; choose a block shorter than {spec.block_size} "
                         f"positions, or model.nsa_block=null")  # fmt: skip
    position = registry.position(spec.position)
    if position.biases_scores or position.transforms_keys:
        raise ValueError(f"model.position={spec.position} and model.nsa_block={size} cannot both be set: a compressed "
                         f"key of NSA has no one position to bias or turn by; use model.position=rope, learned or "
                         f"none, or model.nsa_block=null")  # fmt: skip
