"""model.nsa_block / model.nsa_topk / model.nsa_window: Native Sparse Attention (NSA, arXiv 2502.11089), each query head
adding, gated, its attention over compressed blocks, over the blocks those rank highest and over a sliding window.
Held to its float64 formula (tests/attention_reference.py: ``nsa_heads``) in every softmax layout (MLA's too) and both
kernels, at lengths 1 to 17 across blocks of 1 to 5 (on, one short of and one past a block's edge), with every
gradient; cached decoding (eager and static steps, a ring past block_size, a window, documents, grouped heads,
MLA) equal to the full forward from prompt lengths 1 to 19. Every bad value and conflicting pair is refused in one line.

The blocks run in float64, and inputs are drawn where no two selection scores of a query lie within float32's
round-off (rotary's angles are float32 in the model): the choice is a top-n, which would otherwise trade blocks
between two computations of the same function."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from attention_reference import reference
from cell_failures import CellFailures
from helpers import (
    SELECTION_STEPS,
    assert_decodes_as_the_full_forward,
    compare_output_and_gradients,
    unambiguous_input,
)

from model import GPT, GPTConfig, build_attention
from model.attention.nsa import NSA_TOPK, NSA_WINDOW
from model.config import attention_label

# (layout, kernel, options): every softmax layout with each kernel, the options the pipeline's other stages bring
# turned through them
CELLS = [("fused_qkv", "manual", {"position": "rope", "softcap": 3.0}),
         ("fused_qkv", "sdpa", {"position": "learned", "gate": "headwise", "attention_chunk": 7}),
         ("separate_qkv", "manual", {"position": "learned", "n_kv_head": 2, "window": 6, "qk_norm": True}),
         ("separate_qkv", "sdpa", {"position": "rope", "k_eq_v": True, "query_temperature": 4}),
         ("wrapper", "manual", {"position": "learned", "n_kv_head": 1}),
         ("wrapper", "sdpa", {"position": "rope", "n_kv_head": 2}),
         ("mla", "manual", {"position": "learned", "kv_latent": 8}),
         ("mla", "sdpa", {"position": "rope", "kv_latent": 8, "rope_head_dim": 4})]  # fmt: skip
LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 11, 16, 17]
SETTINGS = [(1, 3, 2), (2, 2, 3), (3, 2, 4), (4, 3, 5), (5, 1, 2), (2, 4, 1)]  # (block, top-n, window)


def block_of(layout: str, kernel: str, size: int, topk: int, nsa_window: int, seed: int = 0, **options):
    """A float64 block of width 32, 4 heads, every parameter drawn N(0, 0.5^2): sharp attention, gates and scores."""
    block = build_attention(layout, 32, 4, kernel, block_size=40, nsa_block=size, nsa_topk=topk, nsa_window=nsa_window,
                            **options).double()  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    return block


def smallest_gap(block, x: torch.Tensor) -> float:
    """The smallest difference between two selection scores q_t . K_cmp[b] a query ranks, relative to the largest."""
    q, k = block.queries_keys(x)
    T, size = x.size(1), block.spec.nsa_block
    if T // size < 2:
        return float("inf")
    held = torch.arange(T)
    from model.attention.blocks import block_grid

    grid = block_grid(torch.ones(T, T).tril().bool(), held, held, size)
    nsa = block.nsa
    scores = q @ nsa.compressed(k, held, grid, nsa.key_positions, nsa.compress_keys).transpose(-1, -2)
    gaps = [(ranked[..., 1:] - ranked[..., :-1]).min() for t in range(2 * size, T)
            for ranked in [scores[..., t, : t // size].sort(dim=-1).values]]  # fmt: skip
    return (min(gaps) / scores.abs().max()).item() if gaps else float("inf")


@pytest.mark.parametrize("layout,kernel,options", CELLS, ids=[f"{c[0]}-{c[1]}-{'.'.join(c[2])}" for c in CELLS])
def test_every_layout_is_its_formula_at_every_length_and_block_boundary(layout, kernel, options):
    """The block against its float64 formula in training mode, output and the gradients of the input and every
    parameter (the compressors' and gates' among them), at each length with two (block, top-n, window) settings in
    turn. Every length is checked: the cell fails once, naming each that failed."""
    gen = torch.Generator().manual_seed(1)
    failures = CellFailures(f"{layout} x {kernel} with {options} against NSA's formula of "
                            "tests/attention_reference.py", counted="lengths and settings", key="T/block/n/w")
    for i, T in enumerate(LENGTHS):
        for size, topk, window in (SETTINGS[i % len(SETTINGS)], SETTINGS[(i + 3) % len(SETTINGS)]):
            with failures.at(f"{T}/{size}/{topk}/{window}", f"T={T}, block {size}, top-n {topk}, window {window}"):
                block = block_of(layout, kernel, size, topk, window, seed=T, **options)
                x = unambiguous_input(block, (1 + i % 2, T, 32), gen, smallest_gap, "selection scores")
                compare_output_and_gradients(failures, block, x, reference(block, x), gen)
    failures.raise_any()


def test_the_heads_maps_are_the_gated_branches_and_before_a_block_only_two():
    """heads.py's maps: each row a distribution over the keys (the gated branches' weights over the gates of those a
    query has); before any complete block the compressed branch adds nothing, after it it does."""
    block = block_of("fused_qkv", "manual", 3, 2, 2)
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    maps = block.attention_weights(x)
    torch.testing.assert_close(maps.sum(dim=-1), torch.ones(2, 4, 10, dtype=torch.float64))
    assert not maps.triu(1).any(), "a weight on a later key"
    # query 4 (block 1): window {3, 4}, own block {3, 4}; block 0 is its only complete one, compressed into keys 0-2
    assert (maps[:, :, 4, :3] > 0).all() and (maps[:, :, 1, 2:] == 0).all()


def decode_model(layout: str, kernel: str, size: int, topk: int, nsa_window: int, **options) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, block_size=20, n_layer=2, n_head=4, n_embd=32, attention=layout,
                       kernel=kernel, position="rope", nsa_block=size, nsa_topk=topk, nsa_window=nsa_window,
                       **options)  # fmt: skip
    gpt = GPT(config).double().eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
            if p.dim() == 1 and not p.any():
                p.normal_(0.0, 1.0)  # the gates' biases: gates away from one half
    return gpt


DECODES = [("fused_qkv", "sdpa", 3, 2, 4, {}), ("wrapper", "manual", 4, 3, 5, {"n_kv_head": 2}),
           ("separate_qkv", "manual", 2, 2, 3, {"window": 7}),
           ("mla", "sdpa", 2, 3, 4, {"kv_latent": 8, "rope_head_dim": 4}),
           ("fused_qkv", "sdpa", 3, 3, 2, {"document_masking": True, "document_end": 0})]  # fmt: skip


@pytest.mark.parametrize("static", SELECTION_STEPS, ids=["eager step", "static step"])
@pytest.mark.parametrize("layout,kernel,size,topk,window,options", DECODES,
                         ids=[f"{d[0]}-{d[1]}-nsa{d[2]}k{d[3]}w{d[4]}-{'.'.join(d[5])}" for d in DECODES])
def test_cached_decoding_is_the_full_forward_from_every_prompt_length(layout, kernel, size, topk, window, options,
                                                                      static):  # fmt: skip
    """The compressed blocks from the cache's keys: each decoded position's logits are the full forward's, from prompt
    lengths 1 to 19 (every third; every sixth for static steps) to past block_size (a ring of 20, the window's of 7: a
    block the query sees in part is no candidate, on both sides), in batches of 1-3."""
    gpt = decode_model(layout, kernel, size, topk, window, **options)
    assert_decodes_as_the_full_forward(gpt, static)


def test_the_plan_counts_three_attentions_and_the_compressor_and_caches_nothing_more():
    base = dict(vocab_size=50, block_size=64, n_layer=2, n_head=4, n_embd=32)
    dense, nsa = GPTConfig(**base), GPTConfig(**base, nsa_block=8, nsa_topk=3, nsa_window=16)
    assert nsa.cache_widths == dense.cache_widths, "the compressed blocks are recomputed from the cached keys"
    gpt_dense, gpt_nsa = GPT(dense), GPT(nsa)
    # per layer: two compressors (8 keys of 8 dims -> 8, and their position embeddings), gates 32 -> 3 x 4 heads
    own = 2 * (8 * 8 * 8 + 8 * 8) + 32 * 12 + 12
    assert gpt_nsa.num_params() - gpt_dense.num_params() == 2 * own
    # per layer: the score and value matmuls (2 x 32 wide) over 3 x 8 selected keys, 16 in the window and 64 / 8
    # compressed blocks, not 64 keys; the compressor once per block of 8 per key/value head, where 6 x its weights
    # counted it once per token; the gates' and position embeddings' weights as 6 x weights
    attention = 6 * 64 * (24 + 16 + 8) + 6 * (4 - 8) * (8 * 8 + 8 * 8)
    dense_attention = 6 * 64 * 64
    assert gpt_nsa.flops_per_token() - gpt_dense.flops_per_token() == 2 * (6 * own + attention - dense_attention)


def test_the_label_spells_the_block_the_top_n_and_the_window():
    base = dict(vocab_size=50, block_size=64, n_layer=2, n_head=4, n_embd=32, position="rope")
    label = f"fused_qkv-sdpa-rope-nsa16k{NSA_TOPK}w{NSA_WINDOW}"
    assert attention_label(asdict(GPTConfig(**base, nsa_block=16))) == label
    assert attention_label(asdict(GPTConfig(**base, nsa_block=8, nsa_topk=2, nsa_window=4))) == \
        "fused_qkv-sdpa-rope-nsa8k2w4"  # fmt: skip
    assert attention_label(asdict(GPTConfig(**base)), show=["nsa_block"]) == "fused_qkv-sdpa-rope-nonsa"


@pytest.mark.parametrize(
    "fields,message",
    [(dict(nsa_block=0), "model.nsa_block=0 must be a positive number of positions per block"),
     (dict(nsa_block=2.5), "model.nsa_block=2.5 must be a positive number of positions per block"),
     (dict(nsa_block=4, nsa_topk=0, nsa_window=8), "model.nsa_topk=0 must be a positive number of blocks"),
     (dict(nsa_block=4, nsa_window=True), "model.nsa_window=True must be a positive number of keys"),
     (dict(nsa_topk=2), "model.nsa_topk=2 is NSA's, but model.nsa_block=null"),
     (dict(nsa_window=8), "model.nsa_window=8 is NSA's, but model.nsa_block=null"),
     (dict(nsa_block=16, nsa_window=8), "model.nsa_block=16 is at least the context (model.block_size=16)"),
     (dict(nsa_block=4, nsa_window=8, position="alibi"), "model.position=alibi and model.nsa_block=4 cannot both"),
     (dict(nsa_block=4, nsa_window=8, moba_block=4), "model.moba_block=4 and model.nsa_block=4 cannot both be set"),
     (dict(nsa_block=4, nsa_window=8, sinks=True), "model.nsa_block=4 and model.sinks=true cannot both be set"),
     (dict(nsa_block=4, nsa_window=8, kernel="flex"), "model.nsa_block=4 selects the blocks each query attends, "
                                                      "which kernel=flex cannot do; use kernel=manual or sdpa"),
     (dict(nsa_block=4, nsa_window=8, attention="gated_deltanet", position="none"),
      "model.nsa_block=4 with attention=gated_deltanet in every layer: it is an option of ")],
)  # fmt: skip
def test_every_bad_value_is_refused_in_one_line(fields, message):
    with pytest.raises(ValueError) as refused:
        GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=4, n_embd=32, **fields)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
