"""Positions are computed once by the GPT and passed explicitly: the position encoding and every block's
attention receive the absolute positions of exactly the tokens they process, in every layout: 0..T-1 in
training, after the cached ones with a KV cache, and a static decode step's own position tensor."""

from __future__ import annotations

import pytest
import torch
from helpers import sharp_gpt

from model import GPT, KVCache, same_function_layouts
from model.decoding.steps import StaticStep
from model.gpt import KVCache as KVCacheFromGPT

LAYOUTS = same_function_layouts("fused_qkv")


class PositionsSeen:
    """Records, per forward of the model, the positions tensor the encoding and each block's attention got."""

    def __init__(self, model: GPT) -> None:
        self.encoding: list[torch.Tensor] = []
        self.attention: list[list[torch.Tensor]] = []
        model.transformer.wpe.register_forward_pre_hook(lambda _, args: self.encoding.append(args[0]))
        self.n_layer = model.config.n_layer
        for block in model.transformer.h:
            block.attn.register_forward_pre_hook(lambda _, args: self.record_attention(args))

    def record_attention(self, args: tuple) -> None:
        x, positions, *_ = args  # and the cache, the documents' starts
        assert positions is not None and positions.shape == (x.size(1),), "one position per token processed"
        if not self.attention or len(self.attention[-1]) == self.n_layer:
            self.attention.append([])
        self.attention[-1].append(positions)

    def last(self) -> list[int]:
        """The last forward's positions, after checking that the encoding and every block got the one tensor."""
        blocks = self.attention[-1]
        assert len(blocks) == self.n_layer
        assert all(p is self.encoding[-1] for p in blocks), "computed once, the same tensor everywhere"
        return blocks[0].tolist()


def model_of(layout: str) -> GPT:
    return sharp_gpt(block_size=16, n_layer=2, n_head=4, n_embd=32, n_kv_head=2, attention=layout)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_attention_receives_the_positions_of_the_tokens_it_processes(layout):
    model = model_of(layout)
    seen = PositionsSeen(model)
    idx = torch.randint(0, 50, (2, 12))
    with torch.inference_mode():
        model(idx, idx)
        assert seen.last() == list(range(12)), "training: 0..T-1"
        cache = KVCache(model.config.n_layer)
        model(idx[:, :5], cache=cache)
        assert seen.last() == list(range(5)), "a prompt into an empty cache"
        model(idx[:, 5:8], cache=cache)
        assert seen.last() == [5, 6, 7], "after the cached positions"
        model(idx[:, 8:9], cache=cache)
        assert seen.last() == [8] and cache.length == 9
        step = StaticStep(model, cache, 2, torch.device("cpu"))
        for t in (9, 10, 11):
            step(idx[:, t : t + 1], t)
            assert seen.last() == [t], "a static step: its position"
            assert seen.encoding[-1].data_ptr() == step.position.data_ptr(), (
                "the step's own position tensor, not a Python number: one captured step serves every position"
            )
        assert cache.length == 12 and not cache.in_static_step


def test_a_static_step_on_a_windowed_ring_still_gets_absolute_positions():
    # Past the window the cache is a ring (slot = position % capacity); positions stay absolute.
    model = sharp_gpt(block_size=16, n_layer=2, n_head=4, n_embd=32, window=4)
    seen = PositionsSeen(model)
    idx = torch.randint(0, 50, (1, 12))
    with torch.inference_mode():
        cache = KVCache(model.config.n_layer)
        model(idx[:, :3], cache=cache)
        assert cache.capacity == 4, "the cache holds the window"
        step = StaticStep(model, cache, 1, torch.device("cpu"))
        for t in range(3, 12):
            step(idx[:, t : t + 1], t)
            assert seen.last() == [t]


def test_the_kv_cache_is_still_imported_from_where_it_was():
    assert KVCacheFromGPT is KVCache


@pytest.mark.parametrize("T", [1, 3, 5, 16])
def test_paths_widened_queries_and_keys_give_the_same_logits_padded_to_any_width(T):
    """flex compiles a graph per head width, so PaTH's widened queries and keys (d + T dims) are padded with zeros to
    the next power of two there: the kernel's q~ . k~ / sqrt(width) must not change with the width."""
    from model.attention.positions import householder_augmented

    gen = torch.Generator().manual_seed(T)
    B, h, d, S = 2, 2, 8, T + 3
    q, k = torch.randn(B, h, T, d, generator=gen), torch.randn(B, h, S, d, generator=gen)
    w = torch.nn.functional.normalize(torch.randn(B, h, T, d, generator=gen), dim=-1)
    beta = 2 * torch.rand(B, h, T, generator=gen)
    queries, held = torch.arange(3, 3 + T), torch.arange(S)

    def logits(width):
        q_wide, k_wide = householder_augmented(q, k, held, queries, w, beta, w, beta, width)
        assert q_wide.size(-1) == k_wide.size(-1) == (width or d + T)
        return q_wide @ k_wide.transpose(-1, -2) / q_wide.size(-1) ** 0.5

    exact = logits(None)
    for width in (d + T, 32, 64):
        torch.testing.assert_close(logits(width), exact, rtol=1e-5, atol=1e-5)
