"""Llama 4's chunked attention (``model.attention_chunk``): a query at position i sees the key at j iff j <= i and
i // C == j // C. Its cells of the property grid come from the mask registry (test_attention_properties.py); here:
the predicate and its fast paths against brute force, its cache capacity (with a window too), a schedule whose
kinds chunk differently decoding past every wrap of their rings, generation past the context, a linear layer's and
GPT-2's refusals, the label, and flex's block mask."""

from __future__ import annotations

import pytest
import torch
from helpers import FLEX_ON_CPU_UNAVAILABLE
from helpers import tiny_gpt_config as config

from model import GPT, KVCache, build_attention
from model.attention.masks import Causal, Chunked, Window, seen, seen_at, sees_every_key
from model.checkpoints.gpt2_export import what_gpt2_cannot_hold
from model.config import LAYER_FIELDS, attention_label, label_grammar
from model.decoding.steps import StaticStep
from model.registry import MASKS


def brute(q_len: int, k_len: int, chunk: int, window: int | None = None) -> torch.Tensor:
    rows = []
    for i in range(k_len - q_len, k_len):
        rows.append([j <= i and i // chunk == j // chunk and (window is None or i - j < window) for j in range(k_len)])
    return torch.tensor(rows)


def test_the_mask_is_registered_and_its_predicate_is_the_definition():
    assert MASKS["chunked"] is Chunked and Chunked.field == "attention_chunk"
    assert "attention_chunk" in LAYER_FIELDS, "a schedule's layer kind may set it"
    for chunk in (1, 2, 3, 5, 8):
        for q_len, k_len in ((1, 1), (7, 7), (1, 13), (4, 13), (20, 20)):
            masks = ((Causal, True), (Chunked, chunk))
            assert torch.equal(seen(q_len, k_len, masks, torch.device("cpu")), brute(q_len, k_len, chunk))
            both = ((Causal, True), (Window, 2), (Chunked, chunk))
            assert torch.equal(seen(q_len, k_len, both, torch.device("cpu")), brute(q_len, k_len, chunk, 2))


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 7])
def test_the_fast_paths_claim_nothing_a_wrapped_ring_or_keys_in_order_contradict(chunk):
    """sees_whole_cache and narrows_causal, held to brute force at every position: the ring's most recent
    ``capacity`` keys (any query position: a ring that has wrapped), keys in order from 0 (training)."""
    masks = ((Causal, True), (Chunked, chunk))
    for cap in range(1, 3 * chunk):
        for i in range(cap - 1, 5 * chunk):  # the query at i, the cache holding positions i - cap + 1 .. i
            keys = torch.arange(i - cap + 1, i + 1)
            seen = seen_at(torch.tensor([i]), keys, masks)
            if Chunked.sees_whole_cache(chunk, cap):
                assert bool(seen.all()), f"chunk {chunk}, capacity {cap}: position {i} does not see the whole cache"
        if sees_every_key(1, cap, masks):
            assert bool(brute(1, cap, chunk).all())
    for k_len in range(1, 4 * chunk):
        hides = not bool((brute(k_len, k_len, chunk) == torch.ones(k_len, k_len).tril().bool()).all())
        assert Chunked.narrows_causal(chunk, k_len) == hides, f"chunk {chunk}, {k_len} keys"


@pytest.mark.parametrize(("options", "expected"), [
    (dict(attention_chunk=5), 5),
    (dict(attention_chunk=5, window=3), 3),
    (dict(attention_chunk=16), 16),  # the whole context: Llama 4's, cutting only past it
])  # fmt: skip
def test_the_cache_keeps_a_chunk_at_most(options, expected):
    assert config(block_size=16, **options).cache_capacity == expected


@pytest.mark.parametrize("window", [3, 5])
def test_a_window_no_shorter_than_its_chunk_is_refused_as_cutting_nothing(window):
    """A query sees at most its chunk's keys: a window of the chunk's length or more changes nothing (issue 60)."""
    with pytest.raises(ValueError, match=rf"^model.window={window} cuts nothing inside model.attention_chunk=3: a "
                                         rf"query sees at most the 3 keys of its chunk"):  # fmt: skip
        config(block_size=16, attention_chunk=3, window=window)


def test_a_chunk_of_its_own_in_each_kind_and_a_window_decode_past_every_wrap_of_their_rings():
    torch.manual_seed(0)
    model = GPT(config(block_size=16, n_layer=3, n_head=2, n_embd=32, vocab_size=64, position="rope",
                       kernel="manual", attention_chunk=4, layer_pattern="ABC",
                       layer_kinds={"A": {}, "B": {"attention_chunk": 6, "window": 4}, "C": {"attention_chunk": None}}))
    assert model.config.cache_capacities == [4, 4, 16]
    assert attention_label(vars(model.config)) == "fused_qkv-manual-chunked4-rope-ABC_A_B.window4.chunked6_C.nochunked"
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    gen = torch.Generator().manual_seed(1)
    for static in (False, True):
        for prompt in (1, 3, 5, 9, 17):
            idx = torch.randint(0, 64, (2, 40), generator=gen)
            with torch.inference_mode():
                full = model.eval()(idx, idx)[0]
                cache = KVCache(model.config.n_layer)
                first = model(idx[:, :prompt], cache=cache)[0][:, -1]
                torch.testing.assert_close(first, full[:, prompt - 1], atol=1e-4, rtol=0)
                held = [{t.size(2) for pair in layer.slots.values() for t in pair} for layer in cache.layers]
                assert held == [{4}, {4}, {16}], "each layer's ring holds its own capacity"
                step = StaticStep(model, cache, 2, torch.device("cpu")) if static else None
                for t in range(prompt, 40):
                    logits = step(idx[:, t : t + 1], t) if static else model(idx[:, t : t + 1], cache=cache)[0][:, -1]
                    torch.testing.assert_close(logits, full[:, t], atol=1e-4, rtol=0, msg=f"prompt {prompt}, {t}")


@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
def test_chunks_cut_the_function_as_their_definition_does(kernel):
    """Every key of an earlier chunk is invisible: changing the tokens before a chunk leaves its outputs alone,
    and a query at a chunk's first position sees itself only."""
    torch.manual_seed(0)
    block = build_attention("fused_qkv", 32, 4, kernel, attention_chunk=5).eval()
    x = torch.randn(1, 15, 32)
    y = x.clone()
    y[:, :10] = torch.randn(1, 10, 32)
    with torch.no_grad():
        assert torch.allclose(block(x)[:, 10:], block(y)[:, 10:], atol=1e-6)
        assert not torch.allclose(block(x)[:, 9], block(y)[:, 9])
        first = block(x[:, 10:11])  # position 0 of a sequence of one: itself only, as position 10 of a chunk
        assert torch.allclose(block(x)[:, 10], first[:, 0], atol=1e-6)


def test_gated_deltanet_refuses_it_alone_and_in_a_hybrid_kind():
    with pytest.raises(ValueError, match=r"model.attention_chunk=4 .*attention=gated_deltanet"):
        config(attention="gated_deltanet", attention_chunk=4)
    with pytest.raises(ValueError, match=r"model.attention_chunk=4 reaches layer kind D \(layer 0\).*not a chunk"):
        config(n_layer=2, attention_chunk=4, layer_pattern="DG",
               layer_kinds={"D": {"attention": "gated_deltanet"}, "G": {}})
    hybrid = config(n_layer=2, layer_pattern="DG",
                    layer_kinds={"D": {"attention": "gated_deltanet"}, "G": {"attention_chunk": 4}})
    assert hybrid.cache_capacities[1] == 4


def test_a_bad_chunk_is_refused_and_gpt2_refuses_a_chunked_model():
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="model.attention_chunk=.* must be a positive number"):
            config(attention_chunk=bad)
    for bad in (17, 100):
        with pytest.raises(ValueError, match=f"model.attention_chunk={bad} is longer than the context .*at most 16"):
            config(block_size=16, attention_chunk=bad)
    with pytest.raises(ValueError, match="model.attention_chunk=17 is longer than the context"):
        config(block_size=16, n_layer=2, layer_pattern="LG", layer_kinds={"L": {"attention_chunk": 17}, "G": {}})
    assert any("model.attention_chunk=4" in p for p in what_gpt2_cannot_hold(config(attention_chunk=4)))
    assert "[-chunked<positions>]" in label_grammar()


@pytest.mark.skipif(FLEX_ON_CPU_UNAVAILABLE is not None, reason=str(FLEX_ON_CPU_UNAVAILABLE))
@pytest.mark.slow  # flex compiles graphs of its own (12-16 s on a fresh 2-core machine)
def test_flex_chunks_in_its_block_mask_as_the_manual_kernel_does():
    torch.manual_seed(0)
    flex = build_attention("fused_qkv", 32, 4, "flex", attention_chunk=5, window=3).eval()
    manual = build_attention("fused_qkv", 32, 4, "manual", attention_chunk=5, window=3).eval()
    manual.load_state_dict(flex.state_dict())
    x = torch.randn(2, 23, 32)
    with torch.no_grad():
        torch.testing.assert_close(flex(x), manual(x), atol=1e-5, rtol=0)


def test_the_plan_counts_a_chunks_keys_in_the_flops_and_the_cache():
    plain, chunked = GPT(config(block_size=16, vocab_size=64)), GPT(config(block_size=16, vocab_size=64,
                                                                          attention_chunk=4))  # fmt: skip
    assert chunked.flops_per_token(16) < plain.flops_per_token(16), "a query sees at most 4 keys, not 16"
    assert chunked.flops_per_token(4) == plain.flops_per_token(4), "within one chunk: the same keys"
    assert chunked.config.cache_capacity == 4
