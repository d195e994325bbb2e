"""Mixture of Block Attention (MoBA, Moonshot AI, arXiv 2502.13189): ``model.moba_block=B``, ``model.moba_topk=k``.

The keys are cut into blocks of B positions (0..B-1, B..2B-1, ...; absolute positions, so a cache in any order cuts
them alike). Each query head h chooses, for each query t, k blocks: its own block always (causal within it), and the
k - 1 earlier blocks of highest gate

    s[t, b] = q_h[t] . mean(K_h[block b])

(the mean-pooled keys of the block, as the kernel gets them: encoded, rotary turned; MoBA's ``moba_topk`` counts the
own block, as its code does). Equal gates go to the later block, so the choice is one function of the gates in every
cache order. The query then attends, by softmax, the keys it sees in the blocks chosen. A block is a candidate only
where the query sees every key of it (a complete earlier block; under a window, a chunk, a document or a model's
context past ``block_size``, a block the query sees only in part is not one): its mean is then the same from a full
forward and from a KV cache, which holds exactly the keys a query sees. Every head chooses its own blocks (MoBA's gate
is per head); a query head of a key/value group gates with its group's keys.

The selection is a top-k, which passes no gradient: the gates learn nothing of their own (MoBA has no parameter);
the queries and keys learn through the attention over the blocks chosen, as in the paper.

Nothing is cached beyond the keys and values: the block means are recomputed from the keys the cache holds. On a
CPU, and with the manual or SDPA kernel anywhere, nothing is saved: the kernel computes every query's scores over
every key, then masks the blocks not chosen (a block-sparse kernel, FlexAttention's or MoBA's own, would skip them).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from model.attention.kernels import positions_of, seen_keys
from model.attention.masks import HeldKeys
from model.attention.selection import KeySelection
from model.attention.sparse import widened  # a gate's order under autocast is not bf16's
from model.registry import SELECTIONS, register

MOBA_TOPK = 3  # model.moba_topk by default: the own block and the two earlier ones of highest gate (MoBA's code)


@register(SELECTIONS)
class BlockSelection(KeySelection):
    """One layer's MoBA: the keys each query head attends (``select_heads``), from each kernel call's queries and keys
    (the pipeline's key selection, ``model.attention.selection``). No parameters."""

    name, field, attribute, per_call = "moba", "moba_block", "blocks", True
    does = "selects the blocks each query attends"

    def __init__(self, spec) -> None:
        self.size, self.topk, self.masks = spec.moba_block, spec.moba_topk, spec.masks

    @classmethod
    def build(cls, spec, rotary_width: int | None, widths: tuple[int, int]) -> BlockSelection:
        return cls(spec)

    @classmethod
    def check(cls, spec) -> None:
        check_blocks(spec)

    @classmethod
    def attended(cls, spec, keys: int) -> int:
        return min(spec.moba_topk * spec.moba_block, keys)  # the keys of the blocks it attends, at most

    @classmethod
    def flops(cls, spec, keys: int, widths: tuple[int, int]) -> int:
        return block_flops(spec, keys)  # its gates over every block

    def select_heads(self, q: torch.Tensor, k: torch.Tensor, keys: HeldKeys | None, positions: torch.Tensor | None,
               document_starts: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """(B, h, T, S): True where each query head attends each key, from the queries (B, h, T, d) and each query
        head's keys (B, h, S, d), held at the positions ``keys`` gives (else in order from 0)."""
        T, S = q.size(-2), k.size(-2)
        keep = seen_keys(T, S, self.masks, keys, positions, document_starts, q.device)  # (T, S) or (B, 1, T, S)
        queries, held = positions_of(T, S, keys, positions, q.device)
        return chosen_blocks(q, k, keep, queries, held, self.size, self.topk)


class BlockGrid(NamedTuple):
    """The blocks of ``size`` positions that held keys fall in, as columns from the first held block: ``member`` (S,
    blocks), each key's block (float32, 0 or 1); ``column`` (S,), each key's (an empty slot's: ``blocks``, cut off);
    ``own`` (T, 1), each query's own block; ``candidate`` ((T, blocks) or (B, 1, T, blocks)): the complete earlier
    blocks the query sees every key of, the only ones a gate may rank; ``first``, the block of column 0."""

    member: torch.Tensor
    column: torch.Tensor
    own: torch.Tensor
    candidate: torch.Tensor
    first: torch.Tensor


def block_grid(keep: torch.Tensor, queries: torch.Tensor, held: torch.Tensor, size: int) -> BlockGrid:
    """The blocks (``BlockGrid``) of keys at ``held`` (S,; an empty slot of a static step's cache at a negative
    position) for queries at ``queries`` (T,), among the keys ``keep`` ((T, S) or (B, 1, T, S)) shows each query."""
    S = held.size(0)
    width = S // size + 2  # the blocks that S consecutive positions touch, at most: columns from the first held
    valid = held >= 0
    block = torch.div(held, size, rounding_mode="floor")
    first = block.masked_fill(~valid, torch.iinfo(block.dtype).max).min()
    column = torch.where(valid, block - first, width)  # an empty slot: a column of no block, cut off
    member = F.one_hot(column, width + 1)[:, :width].to(torch.float32)  # (S, blocks): each key's block
    whole = keep.to(torch.float32) @ member == size  # a block the query sees every key of (counts exact in float32)
    own = (torch.div(queries, size, rounding_mode="floor") - first)[:, None]  # (T, 1): the query's own block
    columns = torch.arange(width, device=queries.device)
    return BlockGrid(member, column, own, whole & (columns < own), first)  # complete, earlier, wholly seen


def laid_out(t: torch.Tensor, held: torch.Tensor, grid: BlockGrid, size: int) -> torch.Tensor:
    """The keys (or values) ``t`` (B, kv, S, d) held at ``held`` (S,), block by block in position order -> (B, kv,
    blocks, size, d): what a compressor reads (NSA's, DeepSeek-V4's). A slot of a block not held whole holds the
    first key (no query reads that block: not a candidate)."""
    width = grid.member.size(1)
    index = grid.column * size + held.remainder(size)  # where each key lies among the blocks' slots
    slots = torch.zeros((width + 1) * size, dtype=torch.long, device=t.device)
    slots = slots.scatter(0, index, torch.arange(held.size(0), device=t.device))[: width * size]
    return t[:, :, slots].unflatten(2, (width, size))


def chosen_blocks(q: torch.Tensor, k: torch.Tensor, keep: torch.Tensor, queries: torch.Tensor, held: torch.Tensor,
                  size: int, topk: int) -> torch.Tensor:  # fmt: skip
    """MoBA's selection (the module's docstring) of queries (B, h, T, d) at positions ``queries`` (T,) over keys
    (B, h, S, d) at ``held`` (S,; an empty slot of a static step's cache at a negative position), among the keys
    ``keep`` ((T, S) or (B, 1, T, S)) shows each query -> (B, h, T, S)."""
    grid = block_grid(keep, queries, held, size)
    means = grid.member.to(widened(k).dtype).transpose(0, 1) @ widened(k) / size  # (B, h, blocks, d); read where whole
    return top_blocks(widened(q) @ means.transpose(-1, -2), grid, keep, topk)


def top_blocks(gates: torch.Tensor, grid: BlockGrid, keep: torch.Tensor, topk: int) -> torch.Tensor:
    """The keys of the blocks each query chose by its ``gates`` (B, h, T, blocks), read only where a block is a
    candidate (``grid``): its own block always, and the topk - 1 candidates of highest gate, equal gates to the later
    block; of those, the keys ``keep`` shows it -> (B, h, T, S)."""
    width = gates.size(-1)
    columns = torch.arange(width, device=gates.device)
    candidate, own = grid.candidate, columns == grid.own
    gates = gates.masked_fill(~candidate, float("-inf")).masked_fill(own, float("inf"))  # the own block always
    # latest first, then a stable sort by gate: among equal gates the later block keeps its place ahead
    ranked = torch.sort(gates.flip(-1), dim=-1, descending=True, stable=True).indices[..., : min(topk, width)]
    picked = torch.zeros_like(gates, dtype=torch.bool).scatter_(-1, width - 1 - ranked, True)
    picked = picked & (candidate | own)
    return (picked.to(torch.float32) @ grid.member.transpose(0, 1) > 0) & keep


def block_flops(spec, keys: int) -> int:
    """Training FLOPs per token of MoBA's gates over ``keys`` keys: each query head's product with each block's mean
    (the means are one pass over the keys, shared by a block's queries)."""
    return 6 * spec.n_head * spec.head_dim * -(-keys // spec.moba_block)


def check_blocks(spec) -> None:
    """Refuse a block size or top-k that is not a positive whole number, or a top-k without blocks, in one line."""
    size, topk = spec.moba_block, spec.moba_topk
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise ValueError(f"model.moba_block={size!r} must be a positive number of positions per block (MoBA's 512 "
                         f"to 4096), or null (no block selection)")  # fmt: skip
    if not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
        raise ValueError(f"model.moba_topk={topk!r} must be a positive number of blocks each query attends, its own "
                         f"included ({MOBA_TOPK} by default: its own and the two earlier ones of highest gate)")
    if topk != MOBA_TOPK and size is None:
        raise ValueError(f"model.moba_topk={topk} counts MoBA's blocks, but model.moba_block=null; set "
                         f"model.moba_block=<positions per block>, or leave model.moba_topk at {MOBA_TOPK}")
    if size is not None and spec.block_size is not None and size >= spec.block_size:
        raise ValueError(f"model.moba_block={size} is at least the context (model.block_size={spec.block_size}): "
                         f"within it every key lies in its query's own block (dense attention); choose a block "
                         f"shorter than {spec.block_size} positions, or model.moba_block=null")  # fmt: skip
