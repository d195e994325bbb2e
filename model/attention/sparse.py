"""DeepSeek Sparse Attention (DeepSeek-V3.2): ``model.sparse_topk=k``.

A lightning indexer scores every key a query may see, and the attention then sees only the k keys it scores highest.
Query token t's score of key s is

    I[t, s] = sum_j w[t, j] relu(q[t, j] . k[s])

over ``model.indexer_heads`` small heads j of ``model.indexer_dim`` dims: q[t, j] and the weights w[t, j] from the
query's input, one key k[s] per token shared by the heads (LayerNorm'd, eps 1e-6), w scaled by 1 / sqrt(heads x
dim) as transformers' ``DeepseekV32Indexer``; with rotary positions, q and k turn in their first dims, as many as
the block's rotary part turns (DeepSeek-V3.2: its qk_rope_head_dim, 64 of 128), at that width's frequencies. Every
head of the layer attends over the same selected keys.

Which keys: the k of highest score among those the query sees (its masks, its document); equal scores go to the
later key, so the choice is one function of the scores on every device and in every cache order (a ring, a static
step). Where a query sees at most k keys (k at least the context, or a window no longer than k) nothing is chosen:
the layer is dense attention exactly, the same code path.

Training (the paper's two stages, ``trainer.indexer_warmup``): the indexer learns the main attention's distribution,
summed over the heads and L1-normalised, through KL(p || softmax(I)): first over every key a query sees while the
attention stays dense (the warm-up), then over the selected keys only while the attention is sparse. The indexer
reads its input detached and the target is taken without gradients, so the KL trains the indexer alone and the
language-model loss the rest (the selection, a top-k, passes no gradient to the indexer). The model adds the KL's
gradient to the loss's without changing the loss's value (``GPT.with_indexer_loss``): the loss logged is the
language model's. From scratch the rest of the model trains during the warm-up too (the paper warms up from a dense
checkpoint with the rest frozen).

Decoding keeps each token's indexer key in the KV cache beside its keys and values (``INDEXER_SLOT``: ``dim`` numbers
per token per layer), so a new query scores every held key without recomputing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from model import registry
from model.attention.kernels import attention_probs, seen_keys
from model.attention.masks import HeldKeys, Masks
from model.attention.masks import capacity as mask_capacity
from model.attention.selection import KeySelection
from model.registry import SELECTIONS, register

if TYPE_CHECKING:
    from model.decoding.kv_cache import LayerCache

INDEXER_HEADS, INDEXER_DIM = 4, 32  # model.indexer_heads / indexer_dim by default (DeepSeek-V3.2: 64 x 128)
INDEXER_SHAPE = {"indexer_heads": INDEXER_HEADS, "indexer_dim": INDEXER_DIM}  # the model's, for every sparse layer
KEY_NORM_EPS = 1e-6  # the indexer key's LayerNorm: DeepSeek-V3.2's
INDEXER_SLOT = -2  # a layer cache's slot of the indexer keys (the token biases' states: -1; keys and values: 0, 1, ...)


@register(SELECTIONS)
class LightningIndexer(nn.Module, KeySelection):
    """One layer's indexer: its projections, the keys it selects (``forward``), and in training its KL to the
    layer's attention (``loss``, taken by the GPT with the language-model loss). The pipeline's key selection
    (``model.attention.selection``), from the block's input for every head."""

    name, field, attribute, per_call, plan_part = "sparse", "sparse_topk", "indexer", False, "sparse indexer"

    @classmethod
    def build(cls, spec, rotary_width: int | None, widths: tuple[int, int]) -> LightningIndexer:
        return cls(spec, rotary_width)

    @classmethod
    def check(cls, spec) -> None:
        check_sparse(spec)

    @classmethod
    def attended(cls, spec, keys: int) -> int:
        return min(spec.sparse_topk, keys)

    @classmethod
    def flops(cls, spec, keys: int, widths: tuple[int, int]) -> int:
        return index_flops(spec, keys)

    @classmethod
    def cache_width(cls, spec) -> int:
        return spec.indexer_dim  # its key per token (INDEXER_SLOT)

    @classmethod
    def plan_bytes(cls, spec, batch: int, length: int, dtype_bytes: int) -> int:
        # its queries and keys, its heads' ReLU'd products over every key (float32, and at the matmuls' dtype first
        # under autocast), its KL's log-softmax, target and masks (measured within 15%)
        B, T, a, heads, dim = batch, length, dtype_bytes, spec.indexer_heads, spec.indexer_dim
        return B * T * (heads + 2) * dim * a + B * heads * T * T * (4 + (a if a < 4 else 0)) + B * T * T * 10

    def select_input(self, block, x: torch.Tensor, positions: torch.Tensor | None, cache: LayerCache | None,
                     documents: torch.Tensor | None) -> torch.Tensor | None:  # fmt: skip
        """The keys each query attends (``forward``); in a training forward with gradients and no cache, its KL to
        the block's attention weights is kept in ``loss`` (``kl_to``)."""
        selected, index = self(x, positions, cache, block.masks, documents)
        if self.training and torch.is_grad_enabled() and cache is None:
            self.loss = self.kl_to(block, x, index, selected, positions, documents)
        return selected

    def kl_to(self, block, x: torch.Tensor, index: torch.Tensor, selected: torch.Tensor | None,
              positions: torch.Tensor | None, documents: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """The KL (``kl``) of scores ``index`` to ``block``'s attention weights at ``x``, summed over its heads: over
        the ``selected`` keys, or (dense: the warm-up) every key a query sees. The weights are taken without gradients,
        from the queries and keys projected again (``queries_keys``)."""
        with torch.no_grad():
            q, k = block.queries_keys(x, documents, selected)
            probs = attention_probs(q, k, block.masks, mods=block.score_mods(x), positions=positions,
                                    document_starts=documents, selected=selected)  # fmt: skip
        return self.kl(index, probs.to(index.dtype).sum(dim=1), selected, block.masks, positions, documents)

    def __init__(self, spec, rotary_width: int | None = None) -> None:
        super().__init__()
        self.topk, self.heads, self.dim = spec.sparse_topk, spec.indexer_heads, spec.indexer_dim
        self.wq = nn.Linear(spec.n_embd, self.heads * self.dim, bias=False)
        self.wk = nn.Linear(spec.n_embd, self.dim, bias=False)
        self.k_norm = nn.LayerNorm(self.dim, eps=KEY_NORM_EPS)
        self.weights_proj = nn.Linear(spec.n_embd, self.heads, bias=False)
        # DeepSeek-V3.2 turns the first qk_rope_head_dim dims of its indexer's queries and keys, at that width's
        # frequencies, as its attention turns its rotary part: here the block's rotary width (at most the indexer's)
        self.rotary = spec.rotary(min(rotary_width or self.dim, self.dim))
        self.selecting = True  # False during the warm-up: the attention stays dense while the indexer learns
        self.loss: torch.Tensor | None = None  # the last training forward's KL, until the GPT takes it

    @classmethod
    def matrix_rows(cls, spec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        """As the attention layers' (``MultiHeadAttention.matrix_rows``), named relative to the indexer: its queries by
        head; its one key and the heads' weights are matrices of their own."""
        dim = spec.indexer_dim
        return {"wq.weight": [("indexer query", j, j * dim, (j + 1) * dim) for j in range(spec.indexer_heads)]}

    def project(self, x: torch.Tensor, positions: torch.Tensor | None):
        """(B, T, C) -> the queries (B, T, heads, dim), the keys (B, T, dim) and the heads' weights (B, T, heads)."""
        B, T, _ = x.shape
        q, k = self.wq(x).view(B, T, self.heads, self.dim), self.k_norm(self.wk(x))
        if self.rotary is not None:
            q, k = self.rotary(q, positions, time_dim=-3), self.rotary(k, positions)
        return q, k, widened(self.weights_proj(x)) * (self.heads * self.dim) ** -0.5

    @staticmethod
    def scores(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """I = sum_j w_j relu(q_j . k), (B, T, S) float32 (or wider), of queries (B, T, heads, dim) over keys (B, S,
        dim): a top-k's order under autocast is not bf16's."""
        products = widened(torch.einsum("bthd,bsd->bths", q, k.to(q.dtype)).relu())
        return torch.einsum("bths,bth->bts", products, w)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None, cache: LayerCache | None, masks: Masks,
                document_starts: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor]:  # fmt: skip
        """The keys each query of ``x`` attends, (B, 1, T, S) True where selected (within its masks and document),
        or None where every key it sees is (dense); and the index scores (B, T, S) with their gradients (training)."""
        q, k, w = self.project(x.detach(), positions)
        keys: HeldKeys | None = None
        if cache is not None:
            held, keys = cache.update(INDEXER_SLOT, k.unsqueeze(1))
            k = held[:, 0]
        index = self.scores(q, k, w)
        T, S = index.shape[-2:]
        if not self.selecting or self.topk >= mask_capacity(masks, S):
            return None, index
        keep = seen_keys(T, S, masks, keys, positions, document_starts, x.device)
        return top_keys(index, keep, self.topk, keys), index

    def kl(self, index: torch.Tensor, probs: torch.Tensor, selected: torch.Tensor | None, masks: Masks,
           positions: torch.Tensor | None, document_starts: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """The indexer's loss (``indexer_kl``) of its scores ``index`` against the attention weights ``probs``
        (B, T, S), summed over the heads: over the ``selected`` keys, or (dense: the warm-up) every key a query sees."""
        T, S = index.shape[-2:]
        return indexer_kl(index, probs, allowed_keys(selected, T, S, masks, positions, document_starts, index.device))


def widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or float64 where it is: a score's precision is never below float32's."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def top_keys(index: torch.Tensor, keep: torch.Tensor, topk: int, keys: HeldKeys | None) -> torch.Tensor:
    """(B, 1, T, S): the ``topk`` keys of highest ``index`` (B, T, S) among those ``keep`` ((T, S) or (B, 1, T, S))
    shows each query, equal scores to the later key (positions from ``keys``; else in order from 0)."""
    keep = per_query(keep)
    S = index.size(-1)
    scores = index.masked_fill(~keep, float("-inf"))
    # latest first, then a stable sort by score: among equal scores the later key keeps its place ahead
    latest_first = (torch.arange(S - 1, -1, -1, device=index.device) if keys is None
                    else keys.positions.argsort(descending=True, stable=True))  # fmt: skip
    ranked = torch.sort(scores[..., latest_first], dim=-1, descending=True, stable=True).indices[..., : min(topk, S)]
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, latest_first[ranked], True)
    return (chosen & keep).unsqueeze(1)


def indexer_kl(index: torch.Tensor, probs: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """The mean over queries of KL(p || softmax(I)) over the keys ``allowed`` ((T, S) or (B, T, S)): p the attention
    weights ``probs`` (B, T, S), summed over heads, renormalised over those keys."""
    log_q = index.masked_fill(~allowed, float("-inf")).log_softmax(dim=-1).masked_fill(~allowed, 0.0)
    p = probs.masked_fill(~allowed, 0.0)
    p = p / p.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)
    return (torch.xlogy(p, p) - p * log_q).sum(dim=-1).mean()


def allowed_keys(selected: torch.Tensor | None, T: int, S: int, masks: Masks, positions: torch.Tensor | None,
                 document_starts: torch.Tensor | None, device: torch.device) -> torch.Tensor:  # fmt: skip
    """The keys the indexer's KL runs over: those selected, or (dense: the warm-up) every key a query sees;
    (T, S) or (B, T, S)."""
    if selected is not None:
        return selected[:, 0]
    return per_query(seen_keys(T, S, masks, None, positions, document_starts, device))


def per_query(keep: torch.Tensor) -> torch.Tensor:
    """``seen_keys``' mask without its head axis: (T, S), or (B, T, S) with documents (B, 1, T, S)."""
    return keep[:, 0] if keep.dim() == 4 else keep


def index_flops(spec, keys: int) -> int:
    """Training FLOPs per token of the indexer's scores over ``keys`` keys (its projections are parameters)."""
    return 6 * spec.indexer_heads * spec.indexer_dim * keys


def check_sparse(spec) -> None:
    """Refuse a top-k, indexer heads or indexer width that is not a positive whole number, or indexer settings without
    a top-k, in one line naming the value."""
    topk = spec.sparse_topk
    if topk is not None and (not isinstance(topk, int) or isinstance(topk, bool) or topk < 1):
        raise ValueError(f"model.sparse_topk={topk!r} must be a positive number of keys each query attends (DeepSeek-"
                         f"V3.2's 2048), or null (dense attention)")  # fmt: skip
    for name, default in INDEXER_SHAPE.items():
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"model.{name}={value!r} must be a positive whole number (the indexer's "
                             f"{'heads' if name == 'indexer_heads' else 'width per head'}; {default} by default)")
                                                                                                         # fmt: skip
        if value != default and topk is None:
            raise ValueError(f"model.{name}={value} shapes the lightning indexer of sparse attention, but "
                             f"model.sparse_topk=null; set model.sparse_topk=<keys per query>, or leave "
                             f"model.{name} at {default}")  # fmt: skip
    turns = registry.position(spec.position).turns_queries_keys
    if topk is not None and turns and spec.indexer_dim % 2:
        raise ValueError(f"model.indexer_dim={spec.indexer_dim} is odd, but model.position={spec.position} turns pairs "
                         f"of the indexer's dims; choose an even model.indexer_dim")  # fmt: skip
