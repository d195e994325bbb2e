"""Generation: the KV cache changes nothing but speed; sampling filters hold."""

from __future__ import annotations

import pytest
import torch
from helpers import CPU_KERNELS, sharp_gpt
from same_choices import assert_same_choices, record_choices

from model import GPT, KVCache, generate, same_function_layouts, sample_next
from model.decoding.generation import generate_batch

LAYOUTS, KERNEL_NAMES = same_function_layouts("fused_qkv"), CPU_KERNELS


def tiny_gpt(layout="fused_qkv", kernel="sdpa", block_size=16, seed=1) -> GPT:
    return sharp_gpt(seed, block_size=block_size, n_layer=2, attention=layout, kernel=kernel)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_logits_equal_full_recomputation(layout, kernel):
    model = tiny_gpt(layout, kernel)
    idx = torch.randint(0, 50, (2, 12))
    full, _ = model(idx, idx)
    cache = KVCache(model.config.n_layer)
    pieces = [model(idx[:, :5], cache=cache)[0]]  # prefill 5, then one position at a time
    for t in range(5, 12):
        pieces.append(model(idx[:, t : t + 1], cache=cache)[0])
    assert cache.length == 12
    torch.testing.assert_close(pieces[0][:, -1], full[:, 4], rtol=0, atol=1e-5)
    for t, logits in zip(range(5, 12), pieces[1:]):
        torch.testing.assert_close(logits[:, -1], full[:, t], rtol=0, atol=1e-5)


def test_several_cached_queries_at_once_see_the_right_keys():
    # Two new positions after a cached prefix: the kernel's causal mask must align bottom-right.
    for kernel in KERNEL_NAMES:
        model = tiny_gpt("separate_qkv", kernel)
        idx = torch.randint(0, 50, (1, 9))
        full, _ = model(idx, idx)
        cache = KVCache(model.config.n_layer)
        model(idx[:, :7], cache=cache)
        logits, _ = model(idx[:, 7:], idx[:, 7:], cache=cache)
        torch.testing.assert_close(logits, full[:, 7:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_greedy_with_cache_gives_the_same_tokens_past_block_size(layout, kernel, monkeypatch):
    model = tiny_gpt(layout, kernel, block_size=16)
    prompt = [3, 1, 4, 1, 5]
    recorder = record_choices(monkeypatch)
    recorder.start()
    cached = list(generate(model, prompt, 40, temperature=0))
    recorder.start()
    list(generate(model, prompt, 40, temperature=0, use_cache=False))
    assert len(cached) == 40
    assert_same_choices(*recorder.traces)  # the cache changes round-off at most, never a choice beyond a tie
    assert len(set(cached)) > 3, "a non-degenerate continuation"


def test_prompt_longer_than_the_block_is_cropped_to_its_end():
    model = tiny_gpt(block_size=16)
    long_prompt = list(range(40))
    assert list(generate(model, long_prompt, 5, temperature=0)) == list(
        generate(model, long_prompt[-16:], 5, temperature=0)
    )


def test_sampling_is_reproducible_with_a_seed():
    model = tiny_gpt()

    def draw(seed):
        g = torch.Generator().manual_seed(seed)
        return list(generate(model, [1, 2], 30, temperature=1.0, generator=g))

    assert draw(7) == draw(7)
    assert draw(7) != draw(8)


def test_generation_stops_at_the_stop_token():
    model = tiny_gpt()
    free = list(generate(model, [1], 30, temperature=0))
    stop = free[10]
    stopped = list(generate(model, [1], 30, temperature=0, stop_id=stop))
    assert stopped == free[: free.index(stop) + 1]


def test_each_sample_draws_one_number_per_token_from_its_generator_as_if_drawn_token_by_token(monkeypatch):
    """The numbers are drawn at the start of a generation, and are those the generator gives one call at a time:
    a seed's text does not depend on how many tokens are asked for."""
    model, n = tiny_gpt(), 30
    recorder = record_choices(monkeypatch)
    recorder.start()
    list(generate_batch(model, [1, 2], n, [torch.Generator().manual_seed(5 + i) for i in range(3)], 1.0))
    for i in range(3):
        g = torch.Generator().manual_seed(5 + i)
        one_by_one = torch.stack([torch.rand((), generator=g) for _ in range(n)])
        assert torch.equal(torch.stack([step.u[i] for step in recorder.traces[0].steps]), one_by_one)
    shorter = list(generate(model, [1, 2], 10, temperature=1.0, generator=torch.Generator().manual_seed(5)))
    assert shorter == recorder.traces[0].tokens(0)[:10]


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("position", ["learned", "rope"])  # learned: the window slides and refills; rope: a ring
def test_reading_ahead_gives_the_same_tokens_while_the_next_step_is_already_launched(position, use_cache):
    """A GPU's default, proved on the CPU: the host reads a decode step's tokens only after launching the next step
    (the first token and a refill are read before: they are not held back by a set-up), and stops alike."""
    model = tiny_gpt(block_size=16)
    if position == "rope":
        model = sharp_gpt(1, block_size=16, n_layer=2, position="rope")
    forwards = []
    model.register_forward_hook(lambda *_: forwards.append(1))

    def steps(read_ahead: bool, stop_id: int | None = None) -> list[tuple[list, int]]:
        forwards.clear()
        run = generate_batch(model, [1, 2, 3], 40, [torch.Generator().manual_seed(i) for i in range(3)], 1.0,
                             use_cache=use_cache, stop_id=stop_id, read_ahead=read_ahead)  # fmt: skip
        return [(step, len(forwards)) for step in run]

    plain, ahead = steps(False), steps(True)
    assert [s for s, _ in ahead] == [s for s, _ in plain]
    assert all(calls == i + 1 for i, (_, calls) in enumerate(plain)), "without: a step's tokens before the next"
    launched_first = [i for i, (_, calls) in enumerate(ahead) if calls == i + 2]
    if use_cache:  # every decode step after the first but at a refill (learned positions slide every 8 tokens)
        assert len(launched_first) >= (30 if position == "learned" else 38) and 0 not in launched_first
    else:
        assert not launched_first, "without the cache every step is a full forward: nothing to read ahead of"
    stop = plain[20][0][1]
    stopped_plain, stopped_ahead = steps(False, stop), steps(True, stop)
    assert [s for s, _ in stopped_ahead] == [s for s, _ in stopped_plain]


def test_top_k_and_top_p_never_emit_a_token_outside_the_allowed_set():
    logits = torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0, 0.0, -1.0, -2.0])
    g = torch.Generator().manual_seed(0)
    top_k = {sample_next(logits, 2.0, top_k=3, generator=g) for _ in range(500)}
    assert top_k == {0, 1, 2}
    probs = torch.softmax(logits, -1)  # 0.63, 0.23, 0.09, ...: 0.9 needs the first three
    top_p = {sample_next(logits, 1.0, top_p=0.9, generator=g) for _ in range(500)}
    assert top_p == {0, 1, 2} and probs[:2].sum() < 0.9 <= probs[:3].sum()
    assert {sample_next(logits, 1.0, top_p=0.5, generator=g) for _ in range(100)} == {0}
    assert sample_next(logits, 1.0, top_k=100, generator=g) in range(8), "top_k past the vocabulary"
    assert sample_next(logits, 0.0) == 0


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="the prompt is empty"):
        next(generate(tiny_gpt(), [], 3))


def test_training_after_generation_in_the_same_process_works_with_the_manual_kernel():
    # The manual kernel caches its causal mask; one first built while generating (inference mode)
    # must still serve a training step, which saves it for backward.
    model = tiny_gpt("separate_qkv", "manual", block_size=16)
    prompt = list(range(16))
    list(generate(model, prompt, 2, temperature=0))  # refills and steps build masks under inference mode
    model.train()
    idx = torch.tensor([prompt])
    model(idx, idx)[1].backward()
    assert model.lm_head.weight.grad is not None
