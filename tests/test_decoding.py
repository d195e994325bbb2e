"""Decoding steps: the static step (what a CUDA graph replays) computes what the eager step does."""

from __future__ import annotations

import pytest
import torch
from helpers import FLEX_ON_CPU_UNAVAILABLE, sharp_gpt
from same_choices import assert_same_choices, record_choices

from model import GPT, KVCache
from model.decoding import StaticStep, choose_decoding
from model.generation import generate, generate_batch


def sharp_model(n_kv=None, window=None, attention="fused_qkv", kernel="sdpa") -> GPT:
    return sharp_gpt(block_size=16, n_layer=2, n_head=4, n_embd=64, n_kv_head=n_kv, window=window,
                     attention=attention, kernel=kernel)  # fmt: skip


# flex's compiled graphs take 10 s of a fresh CPU: the slow tier's (test_attention_properties decodes with flex)
CELLS = [("fused_qkv", "sdpa", None, None), ("wrapper", "manual", 2, 6),
         pytest.param("separate_qkv", "flex", 1, 6, marks=pytest.mark.slow)]


@pytest.mark.parametrize("attention,kernel,n_kv,window", CELLS)
def test_the_static_step_gives_the_logits_of_a_full_recomputation(attention, kernel, n_kv, window):
    if kernel == "flex" and FLEX_ON_CPU_UNAVAILABLE:
        pytest.skip(FLEX_ON_CPU_UNAVAILABLE)
    model = sharp_model(n_kv, window, attention, kernel)
    idx = torch.randint(0, 50, (2, 14))
    with torch.inference_mode():
        full, _ = model(idx, idx)
        cache = KVCache(model.config.n_layer)
        model(idx[:, :4], cache=cache)  # the prompt, then one position at a time at a position given as a tensor
        step = StaticStep(model, cache, 2, torch.device("cpu"))
        for t in range(4, 14):
            torch.testing.assert_close(step(idx[:, t : t + 1], t), full[:, t], rtol=0, atol=1e-5, msg=f"position {t}")
    assert cache.length == 14


def test_compiled_decoding_makes_the_eager_choices_past_the_window_and_the_context(monkeypatch):
    model = sharp_model(n_kv=2, window=6)
    recorder = record_choices(monkeypatch)
    for decoding in ("eager", "compiled"):  # 40 tokens: the context (16) slides and the cache refills in place
        recorder.start()
        list(generate_batch(model, [3, 1, 4], 40, [torch.Generator().manual_seed(i) for i in range(2)], 1.0,
                            decoding=decoding))  # fmt: skip
    assert_same_choices(recorder.traces[1], recorder.traces[0])


def test_generators_may_live_on_the_models_device():
    model = sharp_model()
    on_device = torch.Generator(device="cpu").manual_seed(3)
    assert list(generate(model, [1, 2], 10, 1.0, generator=on_device)) == list(
        generate(model, [1, 2], 10, 1.0, generator=torch.Generator().manual_seed(3)))


def test_decoding_choices_are_checked():
    assert choose_decoding("auto", torch.device("cpu")) == "eager"
    with pytest.raises(ValueError, match="decoding=graph needs a CUDA GPU"):
        choose_decoding("graph", torch.device("cpu"))
    with pytest.raises(ValueError, match="decoding='fast'; choose one of: auto, eager, graph, compiled"):
        choose_decoding("fast", torch.device("cpu"))


def test_the_slots_a_static_step_reads_before_they_are_written_hold_zeros():
    # A static step attends over every slot (masked); 0 x NaN from uninitialised memory would be NaN.
    model = sharp_model()
    cache = KVCache(model.config.n_layer)
    with torch.inference_mode():
        model(torch.randint(0, 50, (2, 4)), cache=cache)
    for layer in cache.layers:
        for buffer in layer.slots[0]:
            assert buffer.size(2) == 16 and (buffer[:, :, 4:] == 0).all()
