"""Attention kernels: how softmax(Q K^T / sqrt(d_k)) V is computed.

Every kernel takes q shaped (batch, heads, q_len, head_dim) and k, v shaped (batch, kv_heads, k_len,
head_dim), q_len <= k_len: the queries are the last q_len positions (all of them in training, the new
ones when keys are cached). ``kv_heads`` divides ``heads``: query head h uses key/value head
h // (heads / kv_heads) (grouped-query attention; one key/value head is multi-query; as many as query
heads, multi-head). It returns q's shape. Layouts (``model.attention``) decide how q, k, v are produced;
the kernel only decides how they are combined, so every layout runs with every kernel.

A kernel is built for a block (``get_kernel``): its masks (``model.attention.masks``: causal, a sliding window, ...,
predicates over the queries' and keys' positions), and for ``sdpa`` the implementation PyTorch may use. Keys are
in position order from 0 (training, a cache that has not wrapped) unless the cache gives their positions
(``keys``: a ``HeldKeys``): a ring that has wrapped, or a static decode step's whole preallocated cache
(``model.decoding.steps``), whose empty slots sit at negative positions.

Each kernel is a class (``AttentionKernel``) registered in ``model.registry.KERNELS``: its function and its
facts (whether it keeps the score matrices, has dropout, trains on a CPU, compiles, takes an SDPA backend,
its plot style), which the plan, plots, bench, loading and the scripts ask instead of matching its name. A
fourth kernel is one more class here.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable
from typing import ClassVar

import torch
import torch.nn.functional as F

from model.attention.masks import (
    HeldKeys,
    Masks,
    hidden,
    of_spec,
    ordinary_tensors,
    seen,
    seen_at,
    sees,
    sees_every_key,
    within_documents,
)
from model.attention.masks import options_set as masks_set
from model.attention.modifications import ScoreMods, softmax_with_sinks
from model.registry import KERNELS, MASKS, register
from model.registry import kernel as kernel_class

Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, bool], torch.Tensor]

# model.sdpa_backend -> PyTorch's backend (torch.nn.attention.SDPBackend); auto lets PyTorch choose.
SDPA_BACKENDS = {"auto": None, "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "cudnn": "CUDNN_ATTENTION", "math": "MATH"}  # fmt: skip


def repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, kv_heads, T, hd) -> (B, heads, T, hd): each key/value head serves its group of query heads."""
    return t if t.size(1) == heads else t.repeat_interleave(heads // t.size(1), dim=1)


def attention_probs(q: torch.Tensor, k: torch.Tensor, masks: Masks = (), keys: HeldKeys | None = None,
                    mods: ScoreMods | None = None, positions: torch.Tensor | None = None,
                    document_starts: torch.Tensor | None = None, selected: torch.Tensor | None = None,
                    ) -> torch.Tensor:  # fmt: skip
    """softmax(Q K^T / sqrt(d_k)) under the block's ``masks`` (keys in position order, or at the positions ``keys``
    gives) and within each query's document (``document_starts``), with its score modifications
    (``model.attention.modifications``; ``positions`` are the queries', for ALiBi): the weights every kernel applies
    to V. ``selected`` (B, 1, q_len, k_len), sparse attention's keys (``model.attention.sparse``), replaces the masks
    where given: it is chosen among the keys they show."""
    k = repeat_kv(k, q.size(1))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    q_len, k_len = q.size(-2), k.size(-2)
    if mods is not None:
        scores = mods.modify(scores, *positions_of(q_len, k_len, keys, positions, q.device))
    if selected is not None:
        masked = ~selected
    elif keys is None and document_starts is None:
        masked = hidden(q_len, k_len, masks, q.device)  # cached, as the mask it negates
    else:
        masked = ~seen_keys(q_len, k_len, masks, keys, positions, document_starts, q.device)
    return softmax_with_sinks(scores.masked_fill(masked, float("-inf")), mods)


_last_seen: list = [None]  # ((document_starts, keys, key), mask): the documents' mask the last forward's layers shared


def forget_forward_masks() -> None:
    """Drop the masks the last forward's layers shared (``score_bias``'s, ``seen_in_documents``'): a finished job leaves
    no tensor of its own held here."""
    _last_bias[0] = _last_seen[0] = None


def seen_in_documents(q_len: int, k_len: int, masks: Masks, keys: HeldKeys | None, positions: torch.Tensor | None,
              document_starts: torch.Tensor | None, device: torch.device) -> torch.Tensor:  # fmt: skip
    """True where a query sees a key: under the masks, (q_len, k_len), and within its document with
    ``document_starts``, (B, 1, q_len, k_len). Keys in position order or at the positions ``keys`` gives.

    With documents, every layer (and every head of the wrapper) of a forward asks for the same (B, 1, q_len, k_len)
    mask: in eager mode it is built once and kept while the forward's own starts tensor comes back, as
    ``score_bias`` keeps its float mask (a forward's starts are made once and never written)."""
    remembered = document_starts is not None and not torch.compiler.is_compiling()
    key = (q_len, k_len, masks, device)
    last = _last_seen[0]
    if remembered and last is not None and last[0][0] is document_starts and last[0][1] is keys and last[0][2] == key:
        return last[1]
    queries, held = positions_of(q_len, k_len, keys, positions, device)
    keep = seen(q_len, k_len, masks, device) if keys is None else seen_at(queries, held, masks)
    keep = within_documents(keep, document_starts, held)
    if remembered:
        _last_seen[0] = ((document_starts, keys, key), keep)
    return keep


def seen_keys(q_len: int, k_len: int, masks: Masks, keys: HeldKeys | None, positions: torch.Tensor | None,
              document_starts: torch.Tensor | None, device: torch.device) -> torch.Tensor:  # fmt: skip
    """True where a query sees a key under the masks, (q_len, k_len), and within its document with
    ``document_starts``, (B, 1, q_len, k_len); keys in position order or at the positions ``keys`` gives."""
    if document_starts is not None:
        return seen_in_documents(q_len, k_len, masks, keys, positions, document_starts, device)
    if keys is None:
        return seen(q_len, k_len, masks, device)
    return seen_at(query_positions(positions, q_len, k_len, device), keys.positions, masks)


def query_positions(positions: torch.Tensor | None, q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """The queries' positions: as given, or (none given: keys in position order) the last q_len of k_len."""
    return torch.arange(k_len - q_len, k_len, device=device) if positions is None else positions


def positions_of(q_len: int, k_len: int, keys: HeldKeys | None, positions: torch.Tensor | None,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(the queries' positions, the keys'): as the cache gives them, or keys in position order from 0."""
    held = torch.arange(k_len, device=device) if keys is None else keys.positions
    return query_positions(positions, q_len, k_len, device), held


def manual_attention(q, k, v, dropout: float, training: bool, masks: Masks = (), keys: HeldKeys | None = None,
                     mods: ScoreMods | None = None, positions: torch.Tensor | None = None,
                     document_starts: torch.Tensor | None = None, selected: torch.Tensor | None = None,
                     ) -> torch.Tensor:  # fmt: skip
    """The textbook formula: matmul, (score modifications,) the masks and documents (or the keys sparse attention
    selected among them), softmax, dropout, matmul."""
    probs = attention_probs(q, k, masks, keys, mods, positions, document_starts, selected)
    if dropout and training:  # a call that would return its input costs a small block a few percent
        probs = F.dropout(probs, p=dropout)
    return probs @ repeat_kv(v, q.size(1))


def sdpa_attention(q, k, v, dropout: float, training: bool, masks: Masks = (), keys: HeldKeys | None = None,
                   mods: ScoreMods | None = None, positions: torch.Tensor | None = None,
                   document_starts: torch.Tensor | None = None, backend: str = "auto",
                   selected: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """PyTorch's fused kernel (flash / memory-efficient / cuDNN / math: chosen by torch, or by ``backend``).

    ALiBi, the token biases and sinks go in as a float mask (the biases, -inf where a key is
    hidden; a sink is one more key of zeros, with the sink's logit as its bias and zeros as its value): a float mask
    rules out the flash implementation, so PyTorch picks the memory-efficient one on a GPU (which computes the
    gradient of a token bias through its mask). It cannot cap scores (softcap).
    Without a modification, the masks choose the fast path: causal alone (no mask narrows it among these keys)
    is ``is_causal``; a new query that sees every key needs no mask; else a boolean mask from the masks. Documents
    (``document_starts``) take no fast path: a (B, 1, q_len, k_len) mask, per row."""
    p = dropout if training else 0.0
    q_len, k_len = q.size(-2), k.size(-2)
    gqa = k.size(1) != q.size(1)
    with sdpa_backend(backend):
        if mods is not None and mods.needs_float_mask:
            bias = score_bias(q_len, k_len, masks, keys, mods, positions, q.dtype, q.device, document_starts)
            if selected is not None:
                bias = bias.masked_fill(~selected, float("-inf"))
            if mods.sinks is not None:
                bias = bias.expand(*q.shape[:2], q_len, k_len)
                bias = torch.cat((mods.sink_logits(q), bias), dim=-1)
                k, v = (F.pad(t, (0, 0, 1, 0)) for t in (k, v))  # the sink's key and value: zeros
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=p, enable_gqa=gqa)
        if selected is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=selected, dropout_p=p, enable_gqa=gqa)
        if document_starts is not None:
            keep = seen_in_documents(q_len, k_len, masks, keys, positions, document_starts, q.device)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p, enable_gqa=gqa)
        if keys is not None:  # a ring that has wrapped, or a static step's whole cache
            if sees_every_key(q_len, k_len, masks, keys.full):
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=gqa)
            keep = seen_at(query_positions(positions, q_len, k_len, q.device), keys.positions, masks)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, dropout_p=p, enable_gqa=gqa)
        if q_len == k_len and not any(mask.narrows_causal(value, k_len) for mask, value in masks):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=gqa)
        if sees_every_key(q_len, k_len, masks):
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, enable_gqa=gqa)
        # is_causal aligns the mask top-left; cached queries need it bottom-right, and a window bands it.
        mask = seen(q_len, k_len, masks, q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, enable_gqa=gqa)


_last_bias: list = [None]  # ((positions, keys, key), bias): the float mask the last forward's layers shared


def score_bias(q_len: int, k_len: int, masks: Masks, keys: HeldKeys | None, mods: ScoreMods,
               positions: torch.Tensor | None, dtype: torch.dtype, device: torch.device,
               document_starts: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """SDPA's float mask: 0 where a query sees a key, -inf where it does not, plus ALiBi's bias; (H, q_len,
    k_len), or (q_len, k_len) without ALiBi.

    Every layer of a forward asks for the same one (its positions tensor, held keys, lengths, masks and biases), so
    in eager mode it is built once per forward and kept while the same positions tensor comes back, as Rotary
    keeps its angles (a forward's positions tensor is made once and never written)."""
    known = (not mods.biased or mods.bias_key is not None) and not mods.token_biased  # a token bias: each layer its own
    remembered = positions is not None and known and not torch.compiler.is_compiling() and document_starts is None
    key = (k_len, masks, dtype, device, mods.bias_key if mods.biased else None, mods.bias_dtypes())
    last = _last_bias[0]
    if remembered and last is not None and last[0][0] is positions and last[0][1] is keys and last[0][2] == key:
        return last[1]
    queries, held = positions_of(q_len, k_len, keys, positions, device)
    keep = seen_in_documents(q_len, k_len, masks, keys, positions, document_starts, device)
    bias = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))
    biases = mods.bias(queries, held)
    bias = bias if biases is None else bias + biases.to(dtype)  # (H, q_len, k_len), (B, H, ...) or broadcastable
    if remembered:  # one forward's (a training step's layers save the one tensor for backward, not one each)
        _last_bias[0] = ((positions, keys, key), bias)
    return bias


def sdpa_backend(name: str):
    """Within the block, SDPA uses only the named implementation (``auto``: PyTorch chooses)."""
    if SDPA_BACKENDS.get(name) is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, SDPA_BACKENDS[name])])


def flex_attention(q, k, v, dropout: float, training: bool, masks: Masks = (), keys: HeldKeys | None = None,
                   mods: ScoreMods | None = None, positions: torch.Tensor | None = None,
                   document_starts: torch.Tensor | None = None, selected: torch.Tensor | None = None,
                   ) -> torch.Tensor:  # fmt: skip
    """torch.nn.attention.flex_attention with the block's masks in a block mask, compiled as flex requires.

    No attention dropout (the config refuses it); a CPU runs its forward only (no backward in torch 2.13).
    Keys at positions of the cache's (a ring, a static step) and a decoding step that sees every cached key have
    no mask for flex to exploit: they are the same function as SDPA with that mask (or none), and run there instead
    of compiling flex for every cache length (with score modifications, as the manual kernel: SDPA cannot cap
    scores).

    Score modifications: softcap and ALiBi in flex's ``score_mod``; a token bias as a (B, H,
    q_len, k_len) tensor the score_mod reads; a sink as one more key of zeros, first, whose score the score_mod sets
    to the sink's logit (flex returns no log-sum-exp on a CPU).

    On a CPU, torch's compiled FlexAttention is wrong at some lengths (torch 2.13 with AVX2: NaN or wrong
    rows at every length of 8 mod 16, e.g. 8 and 40), so there queries and keys are padded to a multiple of
    flex's block size and the padding is masked: the padded rows are cut off, the padded keys never seen.
    The mask reads the lengths from tensors, so one compiled graph serves every length (no recompile per
    prompt length).
    """
    if selected is not None:  # the config refuses sparse attention with flex (``AttentionSpec.kernel_effects``)
        raise ValueError("kernel=flex cannot attend the keys sparse attention selects; use kernel=manual or sdpa")
    q_len, k_len = q.size(-2), k.size(-2)
    if keys is not None or (document_starts is None and sees_every_key(q_len, k_len, masks)):
        if mods is not None:
            return manual_attention(q, k, v, 0.0, False, masks, keys, mods, positions, document_starts)
        return sdpa_attention(q, k, v, 0.0, False, masks, keys, positions=positions, document_starts=document_starts)
    check_flex_runs_on(q.device)
    sink = mods is not None and mods.sinks is not None
    if sink:  # the sink is key 0: zeros (it attends to nothing), seen by every query
        k, v = (F.pad(t, (0, 0, 1, 0)) for t in (k, v))
    # Documents in the block mask (blocks wholly in other documents skipped): a GPU's. torch 2.13's CPU flex fails
    # to compile a mask_mod that reads a tensor (a C++ error in its template), so there the score_mod hides them
    in_block_mask = document_starts is not None and q.device.type != "cpu"
    if in_block_mask:  # the rows' documents: a block mask of this batch's own
        block_mask = _build_block_mask(q_len, k_len, masks, q.device, sink, document_starts)
    else:
        block_mask = _block_mask(q_len, k_len, masks, q.device, sink)
    q_pad, k_pad = block_mask.seq_lengths
    if (q_pad, k_pad) != (q_len, k.size(-2)):
        q = F.pad(q, (0, 0, 0, q_pad - q_len))
        k, v = (F.pad(t, (0, 0, 0, k_pad - t.size(-2))) for t in (k, v))
    gqa = k.size(1) != q.size(1)
    score_mod = None if mods is None else _score_mod(mods, q_len, k_len, q_pad, k_pad)
    if document_starts is not None and not in_block_mask:
        score_mod = _within_documents(score_mod, F.pad(document_starts, (0, q_pad - q_len)), int(sink))
    if q.device.type != "cpu" or torch.compiler.is_compiling():  # inside a compiled model, its compilation decides
        # A GPU: with a score_mod one graph per shape, else a second shape compiles a graph for every later one
        flex = _compiled_flex(dynamic=False if score_mod is not None else None)
        return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)[..., :q_len, :]
    # A CPU: one memory layout whatever the layout's projection gave, and one graph for every size; with a
    # score_mod, one for every batch size (torch 2.13 fails to build some CPU graphs of a score_mod whose lengths
    # are dynamic), so one per multiple of FLEX_BLOCK.
    # Inference tensors copied into ordinary ones (a CPU's flex runs no backward, so nothing is lost): a graph
    # compiled for an evaluation under no_grad then serves sampling under inference_mode, whose tensors carry other
    # dispatch keys (one graph of seconds instead of two).
    with ordinary_tensors():
        # .view: the canonical strides, also of a dimension of size 1 (one key/value head, a batch of one), which
        # contiguous() leaves as the projection made them; dynamo guards on them (one more graph of seconds)
        q, k, v = ((t.clone(memory_format=torch.contiguous_format) if t.is_inference() else t.contiguous())
                   .view(t.shape) for t in (q, k, v))  # fmt: skip
        batch_only = contextlib.nullcontext()
        if score_mod is not None:
            for t in (q, k, v):
                torch._dynamo.mark_dynamic(t, 0)
            batch_only = torch._dynamo.config.patch(automatic_dynamic_shapes=False)
        with _sizes_of_one_in_general(), batch_only:
            flex = _compiled_flex(dynamic=None if score_mod is not None else True)
            return flex(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)[..., :q_len, :]


def _sizes_of_one_in_general():
    """Compile flex on a CPU for sizes in general, those of 1 (a batch, a key/value head, one block) included:
    torch would otherwise compile one more graph for each size that is 1 (about 6 s each on a 2-core CPU: a test
    of every attention cell compiled 49 graphs, where this compiles 15). No duck sizing: sizes that happen to be
    equal at the first call (a batch of 2 and 2 key/value heads) are not assumed equal later, which would compile
    a second graph, then a third."""
    import torch.fx.experimental._config as shapes_config

    return shapes_config.patch(backed_size_oblivious=True, use_duck_shape=False)


def _score_mod(mods: ScoreMods, q_len: int, k_len: int, q_pad: int, k_pad: int):
    """flex's score_mod: the block's modifications of one score (``ScoreMods.flex_score``: the transforms, then the
    biases, keys in position order: query i is position k_len - q_len + i); with sinks, key 0 is the sink (a key of
    zeros whose score is the sink's logit) and key j + 1 is key j. The offset is a tensor, so one compiled graph serves
    every length. A token bias (the tokens' own, not a function of positions) is read from its (B, H, q, k) tensor,
    padded as the queries and keys are (to ``q_pad`` x ``k_pad``, the sink's column first)."""
    sinks = mods.sinks
    device = next((v.device for _, v in mods.used if isinstance(v, torch.Tensor)), None)
    with ordinary_tensors():  # one graph for both modes
        shift, first = torch.tensor(k_len - q_len, device=device), int(sinks is not None)
    tokens = mods.token_biases(torch.arange(k_len - q_len, k_len, device=device), torch.arange(k_len, device=device))
    if tokens is not None:
        tokens = F.pad(tokens, (first, k_pad - first - k_len, 0, q_pad - q_len))

    def score_mod(score, b, h, q_idx, kv_idx):
        score = mods.flex_score(score, h, q_idx + shift, kv_idx - first)
        if tokens is not None:
            score = score + tokens[b, h, q_idx, kv_idx].to(score.dtype)
        if sinks is not None:
            score = torch.where(kv_idx == 0, sinks[h].to(score.dtype), score)
        return score

    return score_mod


def _within_documents(score_mod, starts: torch.Tensor, first: int):
    """``score_mod`` (or none) with every key before its query's document start (``starts``, (B, padded queries)
    absolute positions) at -inf: document masking in flex's score_mod, where its block mask cannot hold it. Key j is
    position j - ``first`` (a sink first)."""

    def within(score, b, h, q_idx, kv_idx):
        score = score if score_mod is None else score_mod(score, b, h, q_idx, kv_idx)
        hidden = (kv_idx - first < starts[b, q_idx]) & (kv_idx >= first)
        return torch.where(hidden, torch.full_like(score, float("-inf")), score)

    return within


FLEX_BLOCK = 128  # FlexAttention's block size (its default): what CPU lengths are padded to


def flex_unavailable(device: torch.device) -> str | None:
    """Why FlexAttention cannot run on ``device``, or None: torch compiles it for a CPU only with vector
    instructions (AVX2 or AVX-512)."""
    if device.type != "cpu":  # asked first: inside a compiled model, asking the CPU's capability breaks the graph
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return (f"torch compiles FlexAttention only with AVX2 or AVX-512, and this process runs at CPU capability "
                f"{capability} (ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')})")  # fmt: skip
    return None


def check_flex_runs_on(device: torch.device) -> None:
    reason = flex_unavailable(device)
    if reason:
        raise ValueError(f"kernel=flex cannot run on this CPU: {reason}; use kernel=sdpa or kernel=manual "
                         f"(the same function)")  # fmt: skip


@functools.lru_cache(maxsize=3)
def _compiled_flex(dynamic: bool | None = None):
    from torch.nn.attention.flex_attention import flex_attention as flex

    # None: a second shape compiles a dynamic graph that serves every later one (or only the dimensions marked
    # dynamic); True: dynamic from the first call; False: one graph per shape
    return torch.compile(flex, dynamic=dynamic)


@functools.lru_cache(maxsize=64)
def _block_mask(q_len: int, k_len: int, masks: Masks, device: torch.device, sink: bool = False):
    """The block mask of ``q_len`` queries (the last of ``k_len`` positions) over ``k_len`` keys (after a sink
    key 0 that every query sees, with ``sink``) under ``masks``; on a CPU for lengths padded to a multiple of
    FLEX_BLOCK, with the padded keys masked. Every registered mask is in it, a mask the block does not set at a value
    that hides nothing (``Mask.everything``), its values tensors: one compiled graph serves every model and length."""
    return _build_block_mask(q_len, k_len, masks, device, sink)


def _build_block_mask(q_len: int, k_len: int, masks: Masks, device: torch.device, sink: bool = False,
                      document_starts: torch.Tensor | None = None):  # fmt: skip
    """``_block_mask``, uncached; with ``document_starts`` (B, q_len), one per row of the batch: a query sees no key
    before its document's start."""
    from torch.nn.attention.flex_attention import create_block_mask

    first = int(sink)
    q_pad, k_pad = q_len, k_len + first
    if device.type == "cpu":
        # The queries padded as if they had the sink too: where there are as many as keys (training, evaluation),
        # both take one padded size (a length of 128 with a sink: 256 and 256, not 128 and 256), and a score_mod's
        # graph, compiled per padded shape, serves more lengths; the extra rows are cut off as the others are.
        q_pad, k_pad = (-(-n // FLEX_BLOCK) * FLEX_BLOCK for n in (q_pad + first, k_pad))
    # Kept across training and generation (cached), as the masks above: ordinary tensors, never inference ones.
    with ordinary_tensors():
        # Tensors, not Python numbers: the compiled graph takes them as inputs instead of recompiling for each.
        offset, keys = torch.tensor(k_len - q_len, device=device), torch.tensor(k_len, device=device)
        given = dict(masks)
        every = tuple((mask, torch.tensor(given.get(mask, mask.everything(k_pad + q_pad)), device=device))
                      for mask in MASKS.values())  # fmt: skip

        starts = None if document_starts is None else F.pad(document_starts, (0, q_pad - q_len))  # padded rows: 0

        def mask_mod(b, h, q_idx, kv_idx):
            position, key = q_idx + offset, kv_idx - first  # query i is position offset + i; key j: slot j + first
            seen = sees(every, position, key) & (key < keys) & (key >= 0)
            if starts is not None:
                seen = seen & (key >= starts[b, q_idx])
            return (kv_idx == 0) | seen if sink else seen

        rows = None if starts is None else starts.size(0)
        return create_block_mask(mask_mod, rows, None, q_pad, k_pad, device=device)


class AttentionKernel:
    """A kernel: its function (``attend``, see the module's docstring) and the facts the rest of headlab asks
    of it instead of matching its name (the plan, plots, bench, loading and the scripts)."""

    name: ClassVar[str]
    attend: ClassVar[Callable]  # (q, k, v, dropout, training, masks=(), keys=None, mods=None, positions=None)
    # The effects it applies (model.attention.options): the masks it masks keys with, the modifications of the scores
    # (model.registry.MODIFICATIONS' names) and attention dropout, each kernel its own: a spec that needs another
    # (AttentionSpec.kernel_effects) is refused naming the kernels that apply it, so a new mask or modification is
    # refused by every kernel until the kernel applies it and says so.
    applies: ClassVar[frozenset[str]] = frozenset({"window", "chunked", "documents", "sparse", "dropout"})
    scores_kept: ClassVar[bool] = False  # keeps each head's (T, T) attention matrix for backward (the plan)
    trains_on_cpu: ClassVar[bool] = True  # has a backward on a CPU
    compiles: ClassVar[bool] = False  # compiles itself on its first call (seconds of silence)
    graph_per_head_width: ClassVar[bool] = False  # compiles a graph per query/key width it meets (a new one: seconds)
    backends: ClassVar[tuple[str, ...]] = ()  # the model.sdpa_backend values, besides auto, it can be held to
    line_style: ClassVar[str] = "-"  # its lines in plots (loss curves, bench.png), and the style's name
    line_name: ClassVar[str] = "solid"
    hatch: ClassVar[str | None] = None  # its throughput bars

    @classmethod
    def keeps_scores(cls, backend: str = "auto") -> bool:
        """Whether it keeps the attention matrices for backward, held to ``backend``."""
        return cls.scores_kept

    @classmethod
    def build(cls, masks: Masks = (), backend: str = "auto") -> Kernel:
        """The kernel for a block's masks (and backend): ``(q, k, v, dropout, training, keys=None, ...)``."""
        return functools.partial(cls.attend, masks=masks)

    @classmethod
    def check_runs(cls, config, device: torch.device, dtype: torch.dtype, training: bool) -> None:
        """Refuse, before any work, what the device cannot run (see ``check_kernel_runs``)."""

    @classmethod
    def compiles_for(cls, q_len: int, k_len: int, masks: Masks) -> bool:
        """Whether a pass of ``q_len`` queries over ``k_len`` keys under ``masks`` compiles the kernel (seconds of
        silence that sample.py announces beforehand)."""
        return cls.compiles


@register(KERNELS)
class ManualKernel(AttentionKernel):
    name = "manual"
    attend = staticmethod(manual_attention)
    applies = AttentionKernel.applies | {"alibi", "softcap", "sinks", "forget_gate"}  # literally, before the softmax
    scores_kept = True
    line_style, line_name, hatch = "--", "dashed", "//"


@register(KERNELS)
class SDPAKernel(AttentionKernel):
    name = "sdpa"
    attend = staticmethod(sdpa_attention)
    # a float mask (a bias, a sink's key); no step between the scores and softmax
    applies = AttentionKernel.applies | {"alibi", "sinks", "forget_gate"}
    backends = tuple(b for b in SDPA_BACKENDS if b != "auto")

    @classmethod
    def keeps_scores(cls, backend: str = "auto") -> bool:
        return backend == "math"  # the math implementation is the textbook formula; the fused ones keep none

    @classmethod
    def build(cls, masks: Masks = (), backend: str = "auto") -> Kernel:
        return functools.partial(cls.attend, masks=masks, backend=backend)

    @classmethod
    def check_runs(cls, config, device: torch.device, dtype: torch.dtype, training: bool) -> None:
        """An SDPA backend that cannot take this model's attention is refused, naming those that can."""
        if config.sdpa_backend == "auto":
            return
        error = _sdpa_error(config, device, dtype, training, config.sdpa_backend)
        if error is None:
            return
        can = [b for b in cls.backends if _sdpa_error(config, device, dtype, training, b) is None]
        masks = "".join(f", {mask.name} {value}" for mask, value in masks_set(config))  # as the model sets them
        shape = f"{config.n_head} heads of {config.head_dim}, {config.kv_heads} key/value heads{masks}"
        raise ValueError(
            f"kernel=sdpa_{config.sdpa_backend} (model.sdpa_backend={config.sdpa_backend}) cannot run this model's "
            f"attention on {device.type} ({str(dtype).removeprefix('torch.')}, {shape}): {error}. Backends that "
            f"can: {', '.join(can) or 'none'}; or kernel=sdpa (PyTorch chooses)"
        )


@register(KERNELS)
class FlexKernel(AttentionKernel):
    name = "flex"
    attend = staticmethod(flex_attention)
    # in its block mask (every registered mask) and score_mod (a sink: a key; a token bias: a tensor it reads)
    applies = frozenset({"window", "chunked", "documents", "alibi", "softcap", "sinks", "forget_gate"})
    trains_on_cpu = False
    compiles = graph_per_head_width = True
    line_style, line_name = ":", "dotted"

    @classmethod
    def check_runs(cls, config, device: torch.device, dtype: torch.dtype, training: bool) -> None:
        if training and device.type != "cuda":
            raise ValueError(
                "kernel=flex cannot train on a CPU: torch's FlexAttention has no backward there. Train with "
                "kernel=sdpa or kernel=manual (the same function: the checkpoint then samples and evaluates with "
                "kernel=flex on a CPU), or on a CUDA GPU"
            )

    @classmethod
    def compiles_for(cls, q_len: int, k_len: int, masks: Masks) -> bool:
        return not sees_every_key(q_len, k_len, masks)  # flex_attention runs such a step as SDPA


def get_kernel(name: str, masks: Masks = (), sdpa_backend: str = "auto") -> Kernel:
    """The kernel ``name`` for a block's masks (and, for sdpa, its backend): ``(q, k, v, dropout, training)``."""
    return kernel_class(name).build(masks, sdpa_backend)


def check_kernel_runs(config, device: torch.device, dtype: torch.dtype, training: bool) -> None:
    """Refuse, before any work, a kernel the device cannot run: FlexAttention's training on a CPU (torch 2.13
    has no flex backward there), or an SDPA backend that cannot take this model's attention (naming those
    that can). ``config`` is a GPTConfig; ``dtype`` the compute dtype (autocast's)."""
    kernel_class(config.kernel).check_runs(config, device, dtype, training)


def _sdpa_error(config, device: torch.device, dtype: torch.dtype, training: bool, backend: str) -> str | None:
    """Why SDPA's ``backend`` cannot run a small attention of this model's shape, or None if it can."""
    t = min(config.block_size, 64)
    shape = [(1, config.n_head, t, config.head_dim), *[(1, config.kv_heads, t, config.head_dim)] * 2]
    q, k, v = (torch.randn(s, device=device, dtype=dtype, requires_grad=training) for s in shape)
    try:
        out = sdpa_attention(q, k, v, config.dropout, training, of_spec(config.attention_spec), backend=backend)
        if training:
            out.float().sum().backward()
    except RuntimeError as err:
        # torch's first line, without its guess (both kinds of kernel turned off), which is not the cause here
        return str(err).strip().splitlines()[0].split(" This is likely due to")[0].rstrip(".")
    return None
