"""model.sparse_topk: DeepSeek Sparse Attention (DeepSeek-V3.2), a lightning indexer that picks the keys each query
attends. Held to its float64 formula (tests/attention_reference.py: the paper's index scores, the top-k with equal
scores to the later key, then the layer's softmax over those keys) in every softmax layout and both kernels that
apply it, at lengths 1 to 65 and top-k from 1 to past the length, with every gradient; dense attention exactly where
a query sees no more keys than it selects; the indexer's KL, the loss it joins without changing its value, and the
warm-up; cached decoding (the indexer keys cached, eager and static steps, a ring past block_size, documents) equal to
the full forward from prompt lengths 1 to 19. Every bad value is refused in one line.

The blocks run in float64 here: the selection is a top-k, so two keys whose scores differ by float32's round-off may
trade places between two computations of the same function (a cached step against a full forward). In float64 no
such near-tie occurs at these sizes, and equal scores (a ReLU at zero for every indexer head) are broken by the rule
both sides share."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from attention_reference import index_scores, reference, sparse_selection
from attention_reference import mask_values as reference_masks
from cell_failures import CellFailures
from helpers import (
    SELECTION_STEPS,
    TINY,
    assert_decodes_as_the_full_forward,
    compose_train,
    read_metrics,
    run_script,
    tiny_run,
)

from model import GPT, GPTConfig, KVCache, build_attention
from training.loop import train

LAYERS = [("fused_qkv", {}), ("separate_qkv", {"n_kv_head": 2}), ("wrapper", {"n_kv_head": 1}),
          ("mla", {"kv_latent": 8}), ("fused_qkv", {"differential": True, "position": "rope"}),
          ("fused_qkv", {"sinks": True, "qk_norm": True, "forget_gate": True, "window": 7})]  # fmt: skip


def block_of(layout: str, kernel: str, topk: int | None, seed: int = 0, **options):
    """A float64 block of width 32, 4 heads, every parameter drawn N(0, 0.5^2): sharp attention and index scores."""
    if layout == "mla" and options.get("position") == "rope":
        options = {"rope_head_dim": 4, **options}
    block = build_attention(layout, 32, 4, kernel, block_size=80, sparse_topk=topk, indexer_heads=3, indexer_dim=8,
                            **options).double()  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in block.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * (2.0 if name == "sinks" else 0.5))
    return block


CELLS = [(layout, kernel, position, options) for i, (layout, options) in enumerate(LAYERS)
         for kernel in ("manual", "sdpa") for position in ("learned", "rope")][::2] + \
        [("fused_qkv", "sdpa", "rope", {}), ("mla", "manual", "rope", {"kv_latent": 8})]  # fmt: skip
LENGTHS = [1, 2, 3, 5, 8, 13, 16, 17, 31, 32, 33, 47, 64, 65]


def topks_for(T: int) -> list[int]:
    """The top-k boundaries at length T: one key, two, a prime between, one short of every key, every key, past it."""
    return sorted({1, 2, max(1, T // 3 | 1), max(1, T - 1), T, T + 1})


# Each layer's manual cell and the two rotary cells (one sdpa) in the README's tier; each layer's sdpa cell in the slow
# tier (CI runs both; the deep sweep holds every layer, the kernels in turn, at every length 1-70)
TIERED_CELLS = [pytest.param(*c, marks=pytest.mark.slow) if c[1:3] == ("sdpa", "learned") else c for c in CELLS]


@pytest.mark.parametrize("layout,kernel,position,options", TIERED_CELLS,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{'.'.join(c[3]) or 'plain'}" for c in CELLS])  # fmt: skip
def test_every_layout_is_its_formula_at_every_length_and_topk(layout, kernel, position, options):
    assert_formula_over(layout, kernel, {"position": position, **options}, LENGTHS, topks=3)


# The deep sweep: every layer (kernels and positions in turn) at every length 1 to 70, the top-k boundaries in turn
DEEP_CELLS = [(layout, ("manual", "sdpa")[i % 2], ("learned", "rope")[i // 2 % 2], options)
              for i, (layout, options) in enumerate(LAYERS)]  # fmt: skip


@pytest.mark.deep
@pytest.mark.parametrize("layout,kernel,position,options", DEEP_CELLS,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{'.'.join(c[3]) or 'plain'}" for c in DEEP_CELLS])  # fmt: skip
def test_every_layout_is_its_formula_at_every_length_and_every_topk_deep(layout, kernel, position, options):
    assert_formula_over(layout, kernel, {"position": position, **options}, range(1, 71), topks=1)


def assert_formula_over(layout: str, kernel: str, options: dict, lengths, topks: int) -> None:
    """The block against its float64 formula at each length, in training mode, with the gradients of the input and
    of every parameter but the indexer's (the top-k passes none); at every top-k boundary of a length up to 8, then
    ``topks`` of them a length, in turn over neighbouring lengths (each boundary met). Every length and top-k is
    checked: the cell fails once, naming each that failed and those that hold."""
    gen = torch.Generator().manual_seed(1)
    failures = CellFailures(f"{layout} x {kernel} with {options} against the sparse formula of "
                            "tests/attention_reference.py", counted="lengths and top-ks", key="T/top-k")  # fmt: skip
    for i, T in enumerate(lengths):
        boundaries = topks_for(T)
        for topk in boundaries if T <= 8 else [boundaries[(i * topks + j) % len(boundaries)] for j in range(topks)]:
            with failures.at(f"{T}/{topk}", f"T={T}, top-k {topk}"):
                formula_holds_at(layout, kernel, options, T, topk, (1 + i % 3, T, 32), gen, failures)
    failures.raise_any()


def formula_holds_at(layout: str, kernel: str, options: dict, T: int, topk: int, shape: tuple, gen, failures) -> None:
    """One length and top-k of ``assert_formula_over``: the output and every gradient."""
    block = block_of(layout, kernel, topk, seed=T, **options)
    x = unambiguous_input(block, shape, gen)
    want = reference(block, x)
    got = block.train()(x)
    # one scale: a few parts are float32 by design (the forget gate's states; differential's lambda, whose
    # error the RMSNorm of a small difference of two maps amplifies)
    tolerance = 1e-4 if options.get("differential") else 1e-5
    failures.compare(got, want, tolerance * want.abs().max().item(), 0, "output")
    weights = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    params = [p for name, p in block.named_parameters() if not name.startswith("indexer.")]
    mine = torch.autograd.grad((got * weights).sum(), [x, *params])
    theirs = torch.autograd.grad((want * weights).sum(), [x, *params])
    scale = max(w.abs().max().item() for w in theirs)
    names = ["x", *(name for name, _ in block.named_parameters() if not name.startswith("indexer."))]
    for name, g, w in zip(names, mine, theirs):  # differential's lambda is float32: its vectors' gradients too
        loose = 1e-4 if ".lambda_" in name else tolerance
        failures.compare(g, w, loose * scale, 0, f"d/d{name}")


def unambiguous_input(block, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """A float64 input whose top-k is one set at float32's precision: rotary's angles are float32 in the model, so a
    query whose k-th and (k+1)-th index scores (the formula's) lie within float32's round-off of each other could
    choose either key there; such an input is drawn again (exact ties, ReLU's zeros, are the rule's, not round-off)."""
    for _ in range(10):
        x = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
        scores = index_scores(block, x.detach())
        T, k = shape[1], block.spec.sparse_topk
        shown = torch.ones(T, T).tril().bool()
        if k >= T:
            return x
        ranked = scores.masked_fill(~shown, float("-inf")).sort(dim=-1, descending=True).values
        gaps = (ranked[..., k - 1] - ranked[..., k])[:, k:]  # the queries that see more than k keys
        if not ((gaps > 0) & (gaps < 1e-5 * scores.abs().max())).any():
            return x
    raise AssertionError("no input without a near-tie in 10 draws")


@pytest.mark.parametrize("layout,options", [("mla", dict(kv_latent=16, rope_head_dim=8)), ("fused_qkv", {})],
                         ids=["mla", "fused_qkv"])  # fmt: skip
def test_the_indexer_selects_what_deepseek_v32s_indexer_selects(layout, options):
    """transformers' DeepseekV32Indexer from the same weights (its compressed query input given the block's input):
    the same keys for every query that sees more than top-k, its rotary turning the first qk_rope_head_dim (the
    block's rotary width, 8) of the indexer's 16 dims, half-split, at that width's frequencies; its key norm's eps."""
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer, DeepseekV32RotaryEmbedding

    C, T, topk = 32, 19, 5
    torch.manual_seed(0)
    block = build_attention(layout, C, 4, "manual", position="rope", sparse_topk=topk, indexer_heads=4, indexer_dim=16,
                            block_size=32, **options).double()  # fmt: skip
    config = DeepseekV32Config(hidden_size=C, q_lora_rank=C, qk_rope_head_dim=8, index_head_dim=16, index_n_heads=4,
                               index_topk=topk, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    theirs = DeepseekV32Indexer(config, layer_idx=0).double()
    ours = block.indexer
    with torch.no_grad():
        for mine, their in ((ours.wq, theirs.wq_b), (ours.wk, theirs.wk), (ours.k_norm, theirs.k_norm),
                            (ours.weights_proj, theirs.weights_proj)):  # fmt: skip
            for name, p in mine.named_parameters():
                p.normal_()  # the LayerNorm's scale and shift too
                getattr(their, name).copy_(p)
    assert theirs.k_norm.eps == ours.k_norm.eps == 1e-6
    x = torch.randn(2, T, C, dtype=torch.float64)
    positions = torch.arange(T)
    cos, sin = DeepseekV32RotaryEmbedding(config)(x, positions[None])
    causal = torch.ones(T, T, dtype=torch.bool).tril()[None]
    with torch.no_grad():
        want = theirs(x, x, (cos, sin), causal, positions[None])  # (B, T, topk) key indices
        selected, index = ours(x, positions, None, block.masks, None)
    # Queries that see more than top-k keys, and whose k-th and next scores differ: ReLU leaves many scores exactly 0,
    # and DeepSeek's topk breaks such a tie its own way (headlab's: to the later key)
    ranked = index.masked_fill(~causal, float("-inf")).sort(dim=-1, descending=True).values
    rows = [(b, t) for b in range(2) for t in range(topk, T) if ranked[b, t, topk - 1] > ranked[b, t, topk]]
    assert len(rows) > T, "most rows compared"
    assert [sorted(want[b, t].tolist()) for b, t in rows] == \
        [selected[b, 0, t].nonzero().flatten().tolist() for b, t in rows]  # fmt: skip


def test_the_selection_is_the_papers_top_k_with_ties_to_the_later_key():
    """The indexer's scores are the paper's formula; where several keys score exactly 0 (every head's ReLU at zero)
    the later ones are chosen, the same rule the formula and a cache in any order share."""
    block = block_of("fused_qkv", "sdpa", 3, position="rope")
    x = torch.randn(2, 40, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    q, k, w = block.indexer.project(x, torch.arange(40))
    want = index_scores(block, x)  # rotary's angles are float32 in the model: one scale
    torch.testing.assert_close(block.indexer.scores(q, k, w), want, rtol=0, atol=1e-6 * want.abs().max().item())
    with torch.no_grad():
        block.indexer.weights_proj.weight.zero_()  # every score 0: a tie among every key a query sees
    selected, _ = block.indexer(x, torch.arange(40), None, block.masks, None)
    latest = torch.ones(40, 40).tril().bool() & ~torch.ones(40, 40).tril(-3).bool()  # each query and the two before
    assert torch.equal(selected[:, 0], latest.expand(2, 40, 40))
    assert torch.equal(selected[:, 0], sparse_selection(block, x, reference_masks(block.spec)))


@pytest.mark.parametrize("layout,options", LAYERS, ids=[f"{name}-{'.'.join(o) or 'plain'}" for name, o in LAYERS])
@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
def test_a_topk_at_least_the_keys_a_query_sees_is_dense_attention_exactly(layout, kernel, options):
    """The same weights without an indexer: the same outputs and gradients, bit for bit (the same code path), at a
    top-k of the context, past it, or of the window."""
    window = options.get("window")
    for topk in [24, 100] + ([window] if window else []):
        torch.manual_seed(0)
        extra = {"rope_head_dim": 4} if layout == "mla" else {}
        base = dict(vocab_size=50, block_size=24, n_layer=2, n_head=4, n_embd=32, attention=layout, kernel=kernel,
                    **{"position": "rope", **extra, **options})  # fmt: skip
        dense, sparse = GPT(GPTConfig(**base)), GPT(GPTConfig(**base, sparse_topk=topk))
        sparse.load_state_dict({**sparse.state_dict(), **dense.state_dict()})
        idx = torch.randint(0, 50, (3, 24), generator=torch.Generator().manual_seed(1))
        losses = [gpt(idx, idx.roll(-1, dims=1))[1] for gpt in (dense, sparse)]
        assert torch.equal(losses[0], losses[1]), f"top-k {topk}"
        for loss in losses:
            loss.backward()
        theirs = dict(dense.named_parameters())
        for name, p in sparse.named_parameters():
            if name in theirs:
                assert torch.equal(p.grad, theirs[name].grad), f"top-k {topk}: {name}"


def kl_formula(block, x: torch.Tensor, selected: torch.Tensor | None) -> torch.Tensor:
    """The paper's indexer loss in float64: for each query, KL(p || softmax(I)) over the keys it attends, p the
    layer's attention weights summed over its heads and L1-normalised over them; the mean over queries."""
    _, weights = reference_weights(block, x)
    p = weights.sum(dim=1)  # (B, T, T)
    shown = torch.ones(x.size(1), x.size(1)).tril().bool().expand_as(p) if selected is None else selected
    scores = index_scores(block, x).masked_fill(~shown, float("-inf"))
    p = p.masked_fill(~shown, 0.0)
    p = p / p.sum(dim=-1, keepdim=True)
    log_q = torch.log_softmax(scores, dim=-1)
    terms = torch.where(p > 0, p * (torch.log(p) - log_q), torch.zeros_like(p))
    return terms.sum(dim=-1).mean()


def reference_weights(block, x):
    """The block's output and its heads' attention weights (B, H, T, T) by the latent formula's head-by-head form:
    the layer here is attention=mla, whose reference gives its weights."""
    from attention_reference import latent_reference

    return latent_reference(block, "mla", x, reference_masks(block.spec), weights_too=True)


@pytest.mark.parametrize("selecting", [False, True], ids=["warm-up: over every key", "sparse: over the selected"])
def test_the_indexer_loss_is_the_papers_kl_and_trains_only_the_indexer(selecting):
    block = block_of("mla", "sdpa", 4, kv_latent=8, position="rope").train()
    block.indexer.selecting = selecting
    x = torch.randn(2, 19, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64, requires_grad=True)
    out = block(x)
    got = block.indexer.loss
    selected = sparse_selection(block, x, reference_masks(block.spec)) if selecting else None
    want = kl_formula(block, x.detach(), selected)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)  # rotary's angles: float32 in the model
    assert got > 1e-3, "a KL that tests nothing"
    grads = torch.autograd.grad(got, [x, *block.parameters()], allow_unused=True)
    assert grads[0] is None, "the indexer reads its input detached"
    for (name, _), g in zip(block.named_parameters(), grads[1:]):
        assert (g is not None and g.abs().sum() > 0) == name.startswith("indexer."), name
    assert out.requires_grad


def test_the_loss_keeps_its_value_and_gains_the_kls_gradient_scaled_as_the_loss_is():
    """The loss is the language model's, bit for bit; its gradient is the language model's plus the KLs', scaled as
    the loss is (a micro-step's share, fp16's scaler): the indexers' from the KLs alone, the rest from the loss."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, block_size=24, n_layer=2, n_head=4, n_embd=32, position="rope", sparse_topk=5)
    gpt = GPT(config).train()
    idx = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))
    targets = idx.roll(-1, dims=1)
    hidden = gpt.hidden_states(idx)
    kls = [indexer.loss for indexer in gpt.indexers]  # this forward's, before the loss takes them
    logits, loss = gpt.logits_and_loss(hidden, targets)
    plain = torch.nn.functional.cross_entropy(logits.reshape(-1, 50), targets.reshape(-1))
    assert torch.equal(loss, plain), "the loss's value is the language model's"
    assert all(indexer.loss is None for indexer in gpt.indexers), "each KL is taken once"
    assert torch.allclose(gpt.indexer_kl, sum(kls).detach() / 2)
    indexer_params = [p for name, p in gpt.named_parameters() if ".indexer." in name]
    rest = [p for name, p in gpt.named_parameters() if ".indexer." not in name]
    got = torch.autograd.grad(loss * 0.25, indexer_params + rest, retain_graph=True)
    want = torch.autograd.grad(sum(kls) * 0.25, indexer_params, retain_graph=True)
    want += torch.autograd.grad(plain * 0.25, rest, allow_unused=True)
    for g, w in zip(got, want):
        assert torch.equal(g, torch.zeros_like(g) if w is None else w)


def test_the_warm_up_is_dense_attention_and_then_each_query_attends_its_selection():
    torch.manual_seed(0)
    base = dict(vocab_size=50, block_size=24, n_layer=2, n_head=4, n_embd=32, position="rope")
    dense, sparse = GPT(GPTConfig(**base)), GPT(GPTConfig(**base, sparse_topk=3))
    sparse.load_state_dict({**sparse.state_dict(), **dense.state_dict()})
    idx = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        sparse.select_sparse_keys(False)
        assert torch.equal(sparse(idx, idx)[0], dense(idx, idx)[0])
        sparse.select_sparse_keys(True)
        assert not torch.allclose(sparse(idx, idx)[0], dense(idx, idx)[0], atol=1e-3)


def decode_model(layout: str, kernel: str, topk: int, block_size: int = 20, **options) -> GPT:
    torch.manual_seed(0)
    if layout == "mla":
        options = {"kv_latent": 8, "rope_head_dim": 4, **options}
    config = GPTConfig(vocab_size=50, block_size=block_size, n_layer=2, n_head=4, n_embd=32, attention=layout,
                       kernel=kernel, position="rope", sparse_topk=topk, indexer_heads=3, indexer_dim=8,
                       **options)  # fmt: skip
    gpt = GPT(config).double().eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    return gpt


DECODES = [("fused_qkv", "sdpa", 3, {}), ("wrapper", "manual", 5, {"n_kv_head": 2}), ("mla", "sdpa", 2, {}),
           ("separate_qkv", "manual", 4, {"window": 6}),
           ("fused_qkv", "sdpa", 3, {"document_masking": True, "document_end": 0}),
           ("fused_qkv", "manual", None, {"layer_pattern": "DS", "layer_kinds": {"D": {}, "S": {"sparse_topk": 3}}})]
                                                                                                         # fmt: skip


@pytest.mark.parametrize("static", SELECTION_STEPS, ids=["eager step", "static step"])
@pytest.mark.parametrize("layout,kernel,topk,options", DECODES, ids=[f"{d[0]}-{d[1]}-top{d[2]}-{'.'.join(d[3])}"
                                                                     for d in DECODES])  # fmt: skip
def test_cached_decoding_is_the_full_forward_from_every_prompt_length(layout, kernel, topk, options, static):
    """The indexer keys held in the cache beside the keys: each decoded position's logits are the full forward's,
    from prompt lengths 1 to 19 (every third; every sixth for static steps) to past block_size (a ring of 20, the
    window's of 6), in batches of 1-3 (the block selections' one check, ``assert_decodes_as_the_full_forward``)."""
    assert_decodes_as_the_full_forward(decode_model(layout, kernel, topk, **options), static)


KIMI_LINEAR = dict(vocab_size=50, block_size=16, n_layer=4, n_head=4, n_embd=32, attention="mla", position="none",
                   kv_latent=8, layer_pattern="KKKM", layer_kinds={"K": {"attention": "kda", "kv_latent": None},
                                                                   "M": {}})  # fmt: skip


def test_a_hybrids_softmax_kind_is_sparse_and_the_refusal_of_the_whole_model_names_it():
    """Kimi Linear's KKKM: sparse attention for the whole model reaches its KDA layers, which cannot select keys; the
    refusal names the fix that runs (the latent kind alone), whose layers alone get an indexer of the model's shape."""
    with pytest.raises(ValueError) as refused:
        GPTConfig(**KIMI_LINEAR, sparse_topk=4)
    fix = "set it on the softmax kinds only (model.sparse_topk=null +model.layer_kinds.M.sparse_topk=4)"
    assert fix in str(refused.value) and "\n" not in str(refused.value), str(refused.value)
    with pytest.raises(ValueError, match=r"but no layer is sparse; set \+model.layer_kinds.M.sparse_topk=<keys per "
                                         r"query>, or leave model.indexer_heads at 4$"):  # the kind that takes it
        GPTConfig(**KIMI_LINEAR, indexer_heads=2)
    kinds = {**KIMI_LINEAR["layer_kinds"], "M": {"sparse_topk": 4}}
    gpt = GPT(GPTConfig(**{**KIMI_LINEAR, "layer_kinds": kinds}, indexer_heads=2, indexer_dim=8))
    indexers = [getattr(block.attn, "indexer", None) for block in gpt.transformer.h]
    assert [i is not None for i in indexers] == [False, False, False, True]
    assert (indexers[3].heads, indexers[3].dim, indexers[3].topk) == (2, 8, 4)
    dense = GPTConfig(**KIMI_LINEAR)
    assert gpt.config.cache_widths == [*dense.cache_widths[:3], dense.cache_widths[3] + 8], "its indexer's key cached"


@pytest.mark.slow
def test_the_compiled_static_step_is_the_full_forward():
    """The static step compiled (sample.py's compiled decoding): the indexer's keys, their top-k and the masks in one
    graph, past block_size, from two prompt lengths."""
    from model.decoding.steps import CompiledStep

    gpt = decode_model("fused_qkv", "sdpa", 3, window=12)
    idx = torch.randint(0, 50, (2, 29), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        for prompt in (3, 11):
            cache = KVCache(gpt.config.n_layer)
            gpt(idx[:, :prompt], cache=cache)
            step = CompiledStep(gpt, cache, 2, torch.device("cpu"))
            for t in range(prompt, 29):  # inductor fuses float64 differently from eager: round-off, not a choice
                torch.testing.assert_close(step(idx[:, t : t + 1], t), full_forward_at(gpt, idx[:, : t + 1]),
                                           rtol=1e-6, atol=1e-6, msg=f"prompt {prompt}, position {t}")  # fmt: skip


def full_forward_at(gpt: GPT, idx: torch.Tensor) -> torch.Tensor:
    """The last position's logits of a full forward over ``idx``: each query sees its context's keys (its last
    block_size positions) as a ring holds them."""
    return gpt(idx)[0][:, -1]


def test_the_plan_counts_the_indexer_in_the_cache_and_flops():
    base = dict(vocab_size=50, block_size=64, n_layer=2, n_head=4, n_embd=32)
    dense, sparse = GPTConfig(**base), GPTConfig(**base, sparse_topk=16, indexer_heads=2, indexer_dim=8)
    assert sparse.cache_widths == [w + 8 for w in dense.cache_widths]
    gpt_dense, gpt_sparse = GPT(dense), GPT(sparse)
    indexer_params = gpt_sparse.num_params() - gpt_dense.num_params()
    assert indexer_params == 2 * (32 * 16 + 32 * 8 + 2 * 8 + 32 * 2)
    # attention's two matmuls over 16 keys, not 64; the indexer's over all 64
    scores = 2 * 6 * (2 * 32 * 64 - (2 * 32 * 16 + 2 * 8 * 64))
    assert gpt_dense.flops_per_token() - gpt_sparse.flops_per_token() == scores - 6 * indexer_params


@pytest.mark.parametrize(
    "fields,message",
    [(dict(sparse_topk=0), "model.sparse_topk=0 must be a positive number"),
     (dict(sparse_topk=-3), "model.sparse_topk=-3 must be a positive number"),
     (dict(sparse_topk=True), "model.sparse_topk=True must be a positive number"),
     (dict(sparse_topk=2.5), "model.sparse_topk=2.5 must be a positive number"),
     (dict(sparse_topk=4, indexer_heads=0), "model.indexer_heads=0 must be a positive whole number"),
     (dict(sparse_topk=4, indexer_dim=None), "model.indexer_dim=None must be a positive whole number"),
     (dict(indexer_heads=8), "model.indexer_heads=8 shapes the lightning indexer of sparse attention, but "
                             "model.sparse_topk=null"),
     (dict(sparse_topk=4, indexer_dim=7, position="rope"), "model.indexer_dim=7 is odd"),
     (dict(sparse_topk=4, kernel="flex"), "model.sparse_topk=4 selects the keys each query attends, which "
                                         "kernel=flex cannot do; use kernel=manual or sdpa"),
     (dict(sparse_topk=4, attention="gated_deltanet", position="none"),
      "model.sparse_topk=4 with attention=gated_deltanet in every layer: it is an option of "),
     (dict(sparse_topk=4, attention="kda", position="none"),
      "model.sparse_topk=4 with attention=kda in every layer: it is an option of "),
     (dict(indexer_heads=8, layer_pattern="A", layer_kinds={"A": {"window": 4}}),
      "model.indexer_heads=8 shapes the lightning indexer of sparse attention, but no layer is sparse; set "
      "model.sparse_topk=<keys per query>, or leave model.indexer_heads at 4")],
)  # fmt: skip
def test_every_bad_value_is_refused_in_one_line(fields, message):
    with pytest.raises(ValueError) as refused:
        GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=4, n_embd=32, **fields)
    assert message in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_training_warms_up_dense_then_logs_the_indexer_kl(tmp_path, data_cache, monkeypatch, caplog):
    """A real run: trainer.indexer_warmup steps of dense attention, then sparse; train/indexer_kl in the metrics;
    the run named -top8. A warm-up without sparse attention is refused."""
    run = tmp_path / "run"
    common = [*TINY, "logger=none", "trainer.max_steps=6", "trainer.eval_interval=3", f"data.cache_dir={data_cache}"]
    warmed, original = [], GPT.select_sparse_keys  # each step's call, recorded on its way to the real one
    monkeypatch.setattr(GPT, "select_sparse_keys", lambda self, on: (warmed.append(on), original(self, on))[1])
    train(compose_train(*common, "model.sparse_topk=8", "model.position=rope", "trainer.indexer_warmup=3",
                        f"trainer.run_dir={run}"))  # fmt: skip
    assert warmed[-6:] == [False] * 3 + [True] * 3, warmed
    rows = [row for row in read_metrics(run) if "train/loss" in row]
    assert len(rows) == 6 and all(row["train/indexer_kl"] > 0 for row in rows)
    assert "top8" in json.loads((run / "run.json").read_text())["name"]
    with pytest.raises(ValueError, match=r"trainer.indexer_warmup=3 warms up sparse attention's indexers"):
        train(compose_train(*common, "trainer.indexer_warmup=3", f"trainer.run_dir={tmp_path / 'dense'}"))
    never = tmp_path / "never"  # a preset shortened for a try: it runs, dense throughout, and says so
    with caplog.at_level(logging.WARNING):
        train(compose_train(*common, "model.sparse_topk=8", "trainer.indexer_warmup=6", f"trainer.run_dir={never}"))
    assert "trainer.indexer_warmup=6 covers all 6 steps of the run: its attention stays dense throughout" in caplog.text


def test_a_checkpoint_whose_model_values_serve_one_kind_samples(tmp_path, data_cache):
    """The model's indexer shape and lambda_init serving only the kind that is sparse (differential): sample.py, which
    reads the model's masks from its spec, loads it (it had refused it as 'indexer_heads=2 but sparse_topk=null')."""
    run = tiny_run(tmp_path / "run", data_cache, "trainer.max_steps=2", "model.n_layer=2", "model.layer_pattern=AB",
                   "+model.layer_kinds.A={}", "+model.layer_kinds.B={sparse_topk:8,differential:true}",
                   "model.indexer_heads=2", "model.lambda_init=0.5")  # fmt: skip
    result = run_script("sample.py", f"source={run}", "max_new_tokens=5", "device=cpu", "prompt=def")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("def")


def test_a_run_whose_queries_see_at_most_topk_keys_trains_as_the_dense_run_step_for_step(tmp_path, data_cache):
    """A real run with model.sparse_topk at the context: the same initial weights as the dense run's (the indexers are
    drawn last), the same language-model update (their KL's gradient is clipped apart): the same train/loss and
    val/loss at every step, bit for bit."""
    common = [*TINY, "logger=none", "trainer.max_steps=6", "trainer.eval_interval=3", "model.position=rope",
              f"data.cache_dir={data_cache}"]  # fmt: skip
    train(compose_train(*common, f"trainer.run_dir={tmp_path / 'dense'}"))
    train(compose_train(*common, "model.sparse_topk=32", f"trainer.run_dir={tmp_path / 'top32'}"))
    dense, sparse = (read_metrics(tmp_path / run) for run in ("dense", "top32"))
    for key in ("train/loss", "val/loss"):
        assert [row[key] for row in dense if key in row] == [row[key] for row in sparse if key in row], key


def test_a_checkpoint_saved_within_the_warm_up_is_read_dense_as_it_trained(tmp_path, data_cache):
    from model.checkpoints.checkpoint import load_checkpoint
    from model.checkpoints.load import model_from_checkpoint

    run = tmp_path / "run"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=8", "trainer.stop_at_step=3",
                        "trainer.checkpoint_interval=3", "model.sparse_topk=4", "trainer.indexer_warmup=5",
                        f"data.cache_dir={data_cache}", f"trainer.run_dir={run}"))  # fmt: skip
    within = model_from_checkpoint(load_checkpoint(run))
    assert not any(indexer.selecting for indexer in within.indexers)
    past = load_checkpoint(run)
    past.step = 6
    assert all(indexer.selecting for indexer in model_from_checkpoint(past).indexers)


def test_a_topk_that_covers_every_key_is_said_naming_where_it_is_set():
    from model.config import context_notes

    base = dict(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=32)
    assert [n.split(":")[0] for n in context_notes(GPTConfig(**base, sparse_topk=40))] == [
        "model.sparse_topk=40 is at least the 32 keys a query sees"]
    kinds = {"A": {}, "B": {"window": 8, "sparse_topk": 8}}  # 8 keys seen through the window: dense
    assert [n.split(":")[0] for n in context_notes(GPTConfig(**base, layer_pattern="AB", layer_kinds=kinds))] == [
        "model.layer_kinds.B.sparse_topk=8 is at least the 8 keys a query sees in layer kind B (layer 1)"]
    assert context_notes(GPTConfig(**base, sparse_topk=16)) == [], "16 of 32 keys: sparse, nothing to say"
