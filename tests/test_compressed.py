"""model.compress_ratio / model.compress_topk / model.compress_window: DeepSeek-V4's compressed attention (its HCA and
CSA layers), each query head attending, in one softmax, a window of keys and compressed entries of blocks.
Held to its float64 formula (tests/attention_reference.py: ``compressed_heads``) in every softmax layout (MLA's too)
and both kernels, at lengths 1 to 17 across entries of 1 to 5 positions (on, one short of and one past a block's
edge), HCA and CSA, with sinks and softcap, with every gradient; cached decoding (eager and static steps, a ring past
block_size, a window, documents, grouped heads, MLA) equal to the full forward from prompt lengths 1 to 19. Every bad
value and conflicting pair is refused in one line.

CSA's choice is a top-k: inputs are drawn where no two of a query's ranking scores lie within float32's round-off."""

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
from model.attention.blocks import block_grid
from model.attention.compressed import COMPRESS_WINDOW
from model.config import attention_label

# (layout, kernel, options): every softmax layout with each kernel, the options the pipeline's other stages bring
# turned through them (sinks and softcap: DeepSeek-V4's attention sink, and the kernel's modifications)
CELLS = [("fused_qkv", "manual", {"position": "rope", "softcap": 3.0, "sinks": True}),
         ("fused_qkv", "sdpa", {"position": "learned", "gate": "headwise", "attention_chunk": 7}),
         ("separate_qkv", "manual", {"position": "learned", "n_kv_head": 2, "window": 6, "qk_norm": True}),
         ("separate_qkv", "sdpa", {"position": "rope", "k_eq_v": True, "n_kv_head": 1, "sinks": True}),
         ("wrapper", "manual", {"position": "learned", "n_kv_head": 1, "query_temperature": 4}),
         ("wrapper", "sdpa", {"position": "rope", "n_kv_head": 2, "sinks": True}),
         ("mla", "manual", {"position": "learned", "kv_latent": 8, "sinks": True}),
         ("mla", "sdpa", {"position": "rope", "kv_latent": 8, "rope_head_dim": 4})]  # fmt: skip
LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 11, 16, 17]
SETTINGS = [(1, None, 2), (2, 2, 3), (3, None, 4), (4, 1, 5), (5, None, 2), (2, 3, 1)]  # (ratio, top-k, window)


def block_of(layout: str, kernel: str, ratio: int, topk: int | None, entry_window: int, seed: int = 0,
             **options):  # fmt: skip
    """A float64 block of width 32, 4 heads, every parameter drawn N(0, 0.5^2): sharp attention, gates and scores."""
    block = build_attention(layout, 32, 4, kernel, block_size=40, compress_ratio=ratio, compress_topk=topk,
                            compress_window=entry_window, **options).double()  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    return block


def smallest_gap(block, x: torch.Tensor) -> float:
    """The smallest difference between two ranking scores q_t . K_cmp[b] a query ranks, relative to the largest
    (CSA's; HCA ranks nothing)."""
    T, ratio = x.size(1), block.spec.compress_ratio
    if block.spec.compress_topk is None or T // ratio < 2:
        return float("inf")
    q, k = block.queries_keys(x)
    held = torch.arange(T)
    grid = block_grid(torch.ones(T, T).tril().bool(), held, held, ratio)
    compressor = block.compressor
    scores = q @ compressor.pooled(k, held, grid, compressor.key_gate, compressor.key_positions).transpose(-1, -2)
    gaps = [(ranked[..., 1:] - ranked[..., :-1]).min() for t in range(2 * ratio, T)
            for ranked in [scores[..., t, : t // ratio].sort(dim=-1).values]]  # fmt: skip
    return (min(gaps) / scores.abs().max()).item() if gaps else float("inf")


@pytest.mark.parametrize("layout,kernel,options", CELLS, ids=[f"{c[0]}-{c[1]}-{'.'.join(c[2])}" for c in CELLS])
def test_every_layout_is_its_formula_at_every_length_and_block_boundary(layout, kernel, options):
    """The block against its float64 formula in training mode, output and the gradients of the input and every
    parameter (the gates' and position biases' among them), at each length with two (ratio, top-k, window) settings
    in turn, HCA and CSA. Every length is checked: the cell fails once, naming each that failed."""
    gen = torch.Generator().manual_seed(1)
    failures = CellFailures(f"{layout} x {kernel} with {options} against compressed attention's formula of "
                            "tests/attention_reference.py", counted="lengths and settings", key="T/ratio/k/w")
    for i, T in enumerate(LENGTHS):
        for ratio, topk, window in (SETTINGS[i % len(SETTINGS)], SETTINGS[(i + 3) % len(SETTINGS)]):
            with failures.at(f"{T}/{ratio}/{topk}/{window}", f"T={T}, ratio {ratio}, top-k {topk}, window {window}"):
                block = block_of(layout, kernel, ratio, topk, window, seed=T, **options)
                x = unambiguous_input(block, (1 + i % 2, T, 32), gen, smallest_gap, "ranking scores")
                compare_output_and_gradients(failures, block, x, reference(block, x), gen)
    failures.raise_any()


def test_with_its_gates_at_zero_an_entry_is_its_blocks_mean():
    """W and the position biases at zero: each entry is the mean of its block's keys (MoBA's pooled key), values
    alike."""
    block = block_of("fused_qkv", "manual", 3, None, 2)
    with torch.no_grad():
        for p in block.compressor.parameters():
            p.zero_()
    k = torch.randn(2, 4, 9, 8, dtype=torch.float64)
    held = torch.arange(9)
    grid = block_grid(torch.ones(9, 9).tril().bool(), held, held, 3)
    c = block.compressor
    entries = c.pooled(k, held, grid, c.key_gate, c.key_positions)
    torch.testing.assert_close(entries[:, :, :3], k.unflatten(2, (3, 3)).mean(dim=3))


def test_the_heads_maps_are_the_window_and_the_entries_spread_over_their_blocks():
    """heads.py's maps: each row a distribution over the keys it reads (the window's, and each entry's weight spread
    over its block's keys); before any complete block only the window's keys."""
    block = block_of("fused_qkv", "manual", 3, None, 2)
    x = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    maps = block.attention_weights(x)
    torch.testing.assert_close(maps.sum(dim=-1), torch.ones(2, 4, 10, dtype=torch.float64))
    assert not maps.triu(1).any(), "a weight on a later key"
    # query 4 (block 1): window {3, 4}, block 0 (keys 0-2) its only entry; query 2: window {1, 2}, no entry
    assert (maps[:, :, 4, :3] > 0).all() and (maps[:, :, 2, 0] == 0).all()


def decode_model(layout: str, kernel: str, ratio: int, topk: int | None, entry_window: int, **options) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, block_size=20, n_layer=2, n_head=4, n_embd=32, attention=layout,
                       kernel=kernel, position="rope", compress_ratio=ratio, compress_topk=topk,
                       compress_window=entry_window, **options)  # fmt: skip
    gpt = GPT(config).double().eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
            if not p.any():
                p.normal_(0.0, 1.0)  # the position biases, the sinks: away from zero
    return gpt


DECODES = [("fused_qkv", "sdpa", 3, 2, 4, {"sinks": True}), ("wrapper", "manual", 4, None, 5, {"n_kv_head": 2}),
           ("separate_qkv", "manual", 2, 2, 3, {"window": 7, "k_eq_v": True}),
           ("mla", "sdpa", 2, None, 4, {"kv_latent": 8, "rope_head_dim": 4}),
           ("fused_qkv", "sdpa", 3, 1, 2, {"document_masking": True, "document_end": 0})]  # fmt: skip


@pytest.mark.parametrize("static", SELECTION_STEPS, ids=["eager step", "static step"])
@pytest.mark.parametrize("layout,kernel,ratio,topk,window,options", DECODES,
                         ids=[f"{d[0]}-{d[1]}-cmp{d[2]}k{d[3]}w{d[4]}-{'.'.join(d[5])}" for d in DECODES])
def test_cached_decoding_is_the_full_forward_from_every_prompt_length(layout, kernel, ratio, topk, window, options,
                                                                      static):  # fmt: skip
    """The entries pooled from the cache's keys: each decoded position's logits are the full forward's, from prompt
    lengths 1 to 19 (every third; every sixth for static steps) to past block_size (a ring of 20, the window's of 7: a
    block the query sees in part is no candidate, on both sides), in batches of 1-3."""
    gpt = decode_model(layout, kernel, ratio, topk, window, **options)
    assert_decodes_as_the_full_forward(gpt, static)


def test_the_plan_counts_the_window_the_entries_and_the_gates_and_caches_nothing_more():
    base = dict(vocab_size=50, block_size=64, n_layer=2, n_head=4, n_embd=32)
    dense = GPTConfig(**base)
    hca = GPTConfig(**base, compress_ratio=8, compress_window=16)
    csa = GPTConfig(**base, compress_ratio=8, compress_topk=3, compress_window=16)
    assert hca.cache_widths == csa.cache_widths == dense.cache_widths, "the entries are pooled from the cached keys"
    gpt_dense, gpt_hca, gpt_csa = GPT(dense), GPT(hca), GPT(csa)
    own = 2 * (8 * 8 + 8 * 8)  # per layer: two gates (8 -> 8 per head) and their position biases (8 positions x 8)
    assert gpt_hca.num_params() - gpt_dense.num_params() == gpt_csa.num_params() - gpt_dense.num_params() == 2 * own
    # per layer: the score and value matmuls (2 x 32 wide) over 16 keys of the window and 64 / 8 entries (HCA) or 3
    # (CSA), not 64 keys; the gates on every key of 4 key/value heads, where 6 x their weights counted them once;
    # CSA's ranking of the 8 entries (forward only)
    gates = 6 * (4 - 1) * (8 * 8 + 8 * 8)
    dense_attention = 6 * 64 * 64
    hca_attention = 6 * 64 * (16 + 8) + gates
    csa_attention = 6 * 64 * (16 + 3) + gates + 2 * 32 * 8
    assert gpt_hca.flops_per_token() - gpt_dense.flops_per_token() == 2 * (6 * own + hca_attention - dense_attention)
    assert gpt_csa.flops_per_token() - gpt_dense.flops_per_token() == 2 * (6 * own + csa_attention - dense_attention)


@pytest.mark.parametrize("layout,kernel,topk,dtype", [("fused_qkv", "manual", None, torch.float32),
                                                      ("wrapper", "sdpa", 2, torch.bfloat16),
                                                      ("mla", "sdpa", None, torch.bfloat16),
                                                      ("separate_qkv", "sdpa", 2, torch.float32)])  # fmt: skip
def test_the_activation_estimate_counts_the_entries_and_the_pooling(layout, kernel, topk, dtype):
    """The plan's term (``CompressedAttention.plan_bytes``) brings the activations within 25% of what autograd saves,
    where the dense terms alone fall short by more than 15%."""
    from test_gpu_readiness import assert_selection_activations

    options = dict(compress_ratio=8, compress_topk=topk, compress_window=16)
    assert_selection_activations(layout, kernel, dtype, options, dense_short_by=0.15)


def test_the_label_spells_the_ratio_the_top_k_and_the_window():
    base = dict(vocab_size=50, block_size=64, n_layer=2, n_head=4, n_embd=32, position="rope")
    assert attention_label(asdict(GPTConfig(**base, compress_ratio=16))) == \
        f"fused_qkv-sdpa-rope-hca16w{COMPRESS_WINDOW}"  # fmt: skip
    assert attention_label(asdict(GPTConfig(**base, compress_ratio=4, compress_topk=8, compress_window=16))) == \
        "fused_qkv-sdpa-rope-csa4k8w16"  # fmt: skip
    assert attention_label(asdict(GPTConfig(**base)), show=["compress_ratio"]) == "fused_qkv-sdpa-rope-nocmp"


@pytest.mark.parametrize(
    "fields,message",
    [(dict(compress_ratio=0), "model.compress_ratio=0 must be a positive number of positions per compressed entry"),
     (dict(compress_ratio=2.5), "model.compress_ratio=2.5 must be a positive number of positions"),
     (dict(compress_ratio=4, compress_topk=0), "model.compress_topk=0 must be a positive number of compressed "
                                               "entries"),
     (dict(compress_ratio=4, compress_window=True), "model.compress_window=True must be a positive number of keys"),
     (dict(compress_topk=2), "model.compress_topk=2 is compressed attention's, but model.compress_ratio=null"),
     (dict(compress_window=8), "model.compress_window=8 is compressed attention's, but model.compress_ratio=null"),
     (dict(compress_ratio=16), "model.compress_ratio=16 is at least the context (model.block_size=16)"),
     (dict(compress_ratio=4, position="alibi"), "model.position=alibi and model.compress_ratio=4 cannot both"),
     (dict(compress_ratio=4, nsa_block=4), "model.compress_ratio=4 and model.nsa_block=4 cannot both be set"),
     (dict(compress_ratio=4, forget_gate=True), "model.compress_ratio=4 and model.forget_gate=true cannot both be set"),
     (dict(compress_ratio=4, kernel="flex"), "model.compress_ratio=4 attends compressed blocks beside a window of "
                                             "keys, which kernel=flex cannot do; use kernel=manual or sdpa"),
     (dict(compress_ratio=4, attention="gated_deltanet", position="none"),
      "model.compress_ratio=4 with attention=gated_deltanet in every layer: it is an option of ")],
)  # fmt: skip
def test_every_bad_value_is_refused_in_one_line(fields, message):
    with pytest.raises(ValueError) as refused:
        GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=4, n_embd=32, **fields)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
