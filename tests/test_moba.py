"""model.moba_block / model.moba_topk: Mixture of Block Attention (MoBA, arXiv 2502.13189), each query head attending
its own block and the earlier blocks of highest q . mean(K_block). Held to its float64 formula
(tests/attention_reference.py: ``moba_selection``, then the layer's softmax over the blocks chosen) in every softmax
layout and both kernels that apply it, at lengths 1 to 33 across block sizes 1 to 8 (a length on, one short of and
one past a block's edge; primes), with every gradient; cached decoding (eager and static steps, a ring past
block_size, a window, documents, grouped heads, MLA) equal to the full forward from every prompt length. Every bad
value and conflicting pair is refused in one line.

The blocks run in float64 here, and inputs are drawn where no two gates of a query lie within float32's round-off
(rotary's angles are float32 in the model): the choice is a top-k, which would otherwise trade blocks between two
computations of the same function."""

from __future__ import annotations

import pytest
import torch
from attention_reference import moba_selection, reference
from cell_failures import CellFailures
from helpers import SELECTION_STEPS, assert_decodes_as_the_full_forward, unambiguous_input

from model import GPT, GPTConfig, build_attention
from model.attention.blocks import MOBA_TOPK

LAYERS = [("fused_qkv", {}), ("separate_qkv", {"n_kv_head": 2}), ("wrapper", {"n_kv_head": 1}),
          ("mla", {"kv_latent": 8}), ("fused_qkv", {"differential": True}),
          ("separate_qkv", {"sinks": True, "qk_norm": True, "forget_gate": True, "window": 7}),
          ("fused_qkv", {"attention_chunk": 12, "query_temperature": 4})]  # fmt: skip
# Each layer with one kernel and one position encoding in turn, then the other kernel with rotary
CELLS = [(layout, ("manual", "sdpa")[i % 2], ("learned", "rope")[i // 2 % 2], options)
         for i, (layout, options) in enumerate(LAYERS)] + \
        [(layout, ("sdpa", "manual")[i % 2], "rope", options) for i, (layout, options) in enumerate(LAYERS[:4])]
LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 11, 16, 17, 23, 32, 33]
BLOCKS = [(1, 3), (2, 1), (2, 3), (3, 2), (4, 4), (5, 3), (8, 2), (4, 9)]  # (block, top-k): token-level to dense


def block_of(layout: str, kernel: str, size: int, topk: int, seed: int = 0, **options):
    """A float64 block of width 32, 4 heads, every parameter drawn N(0, 0.5^2): sharp attention and gates."""
    if layout == "mla" and options.get("position") == "rope":
        options = {"rope_head_dim": 4, **options}
    block = build_attention(layout, 32, 4, kernel, block_size=80, moba_block=size, moba_topk=topk,
                            **options).double()  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * (2.0 if name == "sinks" else 0.5))
    return block


def smallest_gap(block, x: torch.Tensor) -> float:
    """The smallest difference between two gates a query ranks (earlier complete blocks, each head), relative to the
    largest gate: float32's round-off in the model's rotary angles must not reorder them."""
    size = block.spec.moba_block
    q, k = block.queries_keys(x)
    T = x.size(1)
    whole = T // size
    if whole < 2:
        return float("inf")
    means = torch.stack([k[:, :, b * size : (b + 1) * size].mean(dim=2) for b in range(whole)], dim=2)
    gates = q @ means.transpose(-1, -2)  # (B, H, T, blocks)
    gaps = []
    for t in range(2 * size, T):
        ranked = gates[..., t, : t // size].sort(dim=-1).values
        gaps.append((ranked[..., 1:] - ranked[..., :-1]).min())
    return (min(gaps) / gates.abs().max()).item() if gaps else float("inf")


@pytest.mark.parametrize("layout,kernel,position,options", CELLS,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{'.'.join(c[3]) or 'plain'}" for c in CELLS])  # fmt: skip
def test_every_layout_is_its_formula_at_every_length_and_block_boundary(layout, kernel, position, options):
    """The block against its float64 formula in training mode, output and the gradients of the input and every
    parameter, at each length with two (block, top-k) settings in turn (every setting meets lengths on, before and
    past its blocks' edges). Every length is checked: the cell fails once, naming each that failed."""
    gen = torch.Generator().manual_seed(1)
    options = {"position": position, **options}
    failures = CellFailures(f"{layout} x {kernel} with {options} against MoBA's formula of "
                            "tests/attention_reference.py", counted="lengths and blocks", key="T/block/top-k")
    for i, T in enumerate(LENGTHS):
        for size, topk in (BLOCKS[i % len(BLOCKS)], BLOCKS[(i + 3) % len(BLOCKS)]):
            with failures.at(f"{T}/{size}/{topk}", f"T={T}, block {size}, top-k {topk}"):
                block = block_of(layout, kernel, size, topk, seed=T, **options)
                x = unambiguous_input(block, (1 + i % 2, T, 32), gen, smallest_gap, "gates")
                want = reference(block, x)
                got = block.train()(x)
                tolerance = 1e-4 if options.get("differential") else 1e-5
                failures.compare(got, want, tolerance * want.abs().max().item(), 0, "output")
                weights = torch.randn(got.shape, generator=gen, dtype=torch.float64)
                params = list(block.parameters())
                mine = torch.autograd.grad((got * weights).sum(), [x, *params])
                theirs = torch.autograd.grad((want * weights).sum(), [x, *params])
                scale = max(w.abs().max().item() for w in theirs)
                names = ["x", *(name for name, _ in block.named_parameters())]
                for name, g, w in zip(names, mine, theirs):
                    loose = 1e-4 if ".lambda_" in name else tolerance  # differential's lambda is float32
                    failures.compare(g, w, loose * scale, 0, f"d/d{name}")
    failures.raise_any()


def test_the_choice_is_each_heads_own_with_equal_gates_to_the_later_block():
    """Every gate 0 (queries of zeros): each query attends its own block and the latest earlier ones; and with drawn
    weights the heads choose differently (MoBA's gate is per head), as the formula does."""
    block = block_of("fused_qkv", "manual", 3, 3)
    x = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q, k = block.queries_keys(x)
    chosen = block.blocks.select_heads(q, k, None, torch.arange(20), None)
    shown = torch.ones(20, 20).tril().bool()
    assert torch.equal(chosen, moba_selection(q, k, shown, 3, 3))
    assert not all(torch.equal(chosen[:, 0], chosen[:, h]) for h in range(1, 4)), "every head chose alike"
    zeros = block.blocks.select_heads(torch.zeros_like(q), k, None, torch.arange(20), None)
    t, s = torch.arange(20)[:, None], torch.arange(20)[None, :]
    latest = (s <= t) & (s // 3 >= t // 3 - 2)  # the own block and the two before it
    assert torch.equal(zeros, latest.expand(2, 4, 20, 20))


@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
def test_one_block_per_query_is_llama_4s_chunked_attention(kernel):
    """moba_topk=1: each query attends its own block alone, which is chunked attention with chunks of the block."""
    torch.manual_seed(0)
    moba = build_attention("separate_qkv", 32, 4, kernel, block_size=40, moba_block=5, moba_topk=1, n_kv_head=2)
    chunked = build_attention("separate_qkv", 32, 4, kernel, block_size=40, attention_chunk=5, n_kv_head=2)
    chunked.load_state_dict(moba.state_dict())
    x = torch.randn(2, 23, 32)
    torch.testing.assert_close(moba(x), chunked(x), rtol=1e-5, atol=1e-6)


def decode_model(layout: str, kernel: str, size: int, topk: int, block_size: int = 20, **options) -> GPT:
    torch.manual_seed(0)
    if layout == "mla":
        options = {"kv_latent": 8, "rope_head_dim": 4, **options}
    config = GPTConfig(vocab_size=50, block_size=block_size, n_layer=2, n_head=4, n_embd=32, attention=layout,
                       kernel=kernel, position="rope", moba_block=size, moba_topk=topk, **options)  # fmt: skip
    gpt = GPT(config).double().eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    return gpt


DECODES = [("fused_qkv", "sdpa", 3, 2, {}), ("wrapper", "manual", 4, 3, {"n_kv_head": 2}),
           ("mla", "sdpa", 2, 3, {}), ("separate_qkv", "manual", 2, 2, {"window": 7}),
           ("fused_qkv", "sdpa", 3, 3, {"document_masking": True, "document_end": 0}),
           ("fused_qkv", "manual", 4, 2, {"layer_pattern": "DM", "layer_kinds": {"D": {}, "M": {"moba_block": 5}}})]
                                                                                                         # fmt: skip


@pytest.mark.parametrize("static", SELECTION_STEPS, ids=["eager step", "static step"])
@pytest.mark.parametrize("layout,kernel,size,topk,options", DECODES,
                         ids=[f"{d[0]}-{d[1]}-moba{d[2]}k{d[3]}-{'.'.join(d[4])}" for d in DECODES])  # fmt: skip
def test_cached_decoding_is_the_full_forward_from_every_prompt_length(layout, kernel, size, topk, options, static):
    """The block means from the cache's keys: each decoded position's logits are the full forward's, from every
    prompt length to past block_size (a ring of 20, the window's of 7: a block the query sees in part is no
    candidate, on both sides), in batches of 1-3. The full forward is one over the whole sequence (every position's
    logits; each query sees its last block_size keys, as the ring holds them)."""
    gpt = decode_model(layout, kernel, size, topk, **options)
    assert_decodes_as_the_full_forward(gpt, static)


def test_the_plan_counts_the_blocks_attended_and_the_gates_and_caches_nothing_more():
    base = dict(vocab_size=50, block_size=64, n_layer=2, n_head=4, n_embd=32)
    dense, moba = GPTConfig(**base), GPTConfig(**base, moba_block=8, moba_topk=3)
    assert moba.cache_widths == dense.cache_widths, "the block means are recomputed from the cached keys"
    gpt_dense, gpt_moba = GPT(dense), GPT(moba)
    assert gpt_moba.num_params() == gpt_dense.num_params(), "MoBA has no parameter"
    # per layer: the score and value matmuls over 3 blocks of 8 keys, not 64; the gates, 4 heads x 8 dims x 8 blocks
    fewer = 2 * 6 * (2 * 32 * 64 - (2 * 32 * 24 + 4 * 8 * 8))
    assert gpt_dense.flops_per_token() - gpt_moba.flops_per_token() == fewer


def test_the_label_spells_the_block_and_the_top_k():
    from dataclasses import asdict

    from model.config import attention_label

    base = dict(vocab_size=50, block_size=64, n_layer=2, n_head=4, n_embd=32, position="rope")
    assert attention_label(asdict(GPTConfig(**base, moba_block=8))) == f"fused_qkv-sdpa-rope-moba8k{MOBA_TOPK}"
    assert attention_label(asdict(GPTConfig(**base, moba_block=8, moba_topk=2))) == "fused_qkv-sdpa-rope-moba8k2"
    assert attention_label(asdict(GPTConfig(**base)), show=["moba_block"]) == "fused_qkv-sdpa-rope-nomoba"


@pytest.mark.parametrize(
    "fields,message",
    [(dict(moba_block=0), "model.moba_block=0 must be a positive number of positions per block"),
     (dict(moba_block=2.5), "model.moba_block=2.5 must be a positive number of positions per block"),
     (dict(moba_block=True), "model.moba_block=True must be a positive number of positions per block"),
     (dict(moba_block=4, moba_topk=0), "model.moba_topk=0 must be a positive number of blocks each query attends"),
     (dict(moba_topk=2), "model.moba_topk=2 counts MoBA's blocks, but model.moba_block=null"),
     (dict(moba_block=16), "model.moba_block=16 is at least the context (model.block_size=16)"),
     (dict(moba_block=4, sparse_topk=4), "model.moba_block=4 and model.sparse_topk=4 cannot both be set: both select "
                                         "the keys each query attends"),
     (dict(moba_block=4, kernel="flex"), "model.moba_block=4 selects the blocks each query attends, which "
                                         "kernel=flex cannot do; use kernel=manual or sdpa"),
     (dict(moba_block=4, attention="gated_deltanet", position="none"),
      "model.moba_block=4 with attention=gated_deltanet in every layer: it is an option of ")],
)  # fmt: skip
def test_every_bad_value_is_refused_in_one_line(fields, message):
    with pytest.raises(ValueError) as refused:
        GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=4, n_embd=32, **fields)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
