"""Decoding steps: the static step (what a CUDA graph replays) computes what the eager step does."""

from __future__ import annotations

import pytest
import torch
from helpers import FLEX_ON_CPU_UNAVAILABLE, assert_steps_are_a_full_forward, sharp_gpt
from same_choices import assert_same_choices, record_choices

import model.decoding.steps as decoding_module
from model import GPT, KVCache
from model.decoding.generation import generate, generate_batch
from model.decoding.steps import (
    CompiledGraphedStep,
    CompiledStep,
    EagerStep,
    GraphedStep,
    StaticStep,
    choose_decoding,
    step_class,
)


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
    # the prompt, then one position at a time at a position given as a tensor
    cache = assert_steps_are_a_full_forward(
        model, idx, 4, lambda model, cache: StaticStep(model, cache, 2, torch.device("cpu")), atol=1e-5)
    assert cache.length == 14


class WarmedUpStep(StaticStep):
    """Every token computed as a CUDA graph's capture computes its first one: warm-up runs of the same step."""

    def step(self) -> torch.Tensor:
        return self.computed_again(2)


LAYERS = [("fused_qkv", {}), ("gated_deltanet", {}), ("mla", {"kv_latent": 16})]


@pytest.mark.parametrize("attention,fields", LAYERS, ids=[name for name, _ in LAYERS])
def test_a_graphs_warm_up_advances_a_carried_state_by_its_token_once(attention, fields):
    """A graph's warm-up runs its first step twice: a KV cache's slot is written twice with the same keys, but a linear
    layer's state (Gated DeltaNet's, updated in place) would take the token twice, and every later logit would be
    wrong (0.02 apart on a CPU imitation). From the same cache each time, the logits are a full recomputation's."""
    model = sharp_gpt(block_size=16, n_layer=2, n_head=4, n_embd=64, attention=attention, **fields)
    idx = torch.randint(0, 50, (2, 14))
    assert_steps_are_a_full_forward(
        model, idx, 4, lambda model, cache: WarmedUpStep(model, cache, 2, torch.device("cpu")), atol=1e-4)


@pytest.mark.slow  # compiles decode steps of its own (10 s on a fresh 2-core machine)
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


def test_compiled_decoding_on_cuda_is_captured_as_graph_decoding_is():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert step_class("compiled", cuda) is CompiledGraphedStep and issubclass(CompiledGraphedStep, GraphedStep)
    assert step_class("compiled", cpu) is CompiledStep and not issubclass(CompiledStep, GraphedStep)
    assert step_class("graph", cuda) is GraphedStep and step_class("eager", cpu) is EagerStep


@pytest.mark.parametrize("kind", [CompiledStep, CompiledGraphedStep])
def test_the_static_step_is_compiled_without_inductors_cuda_graphs(kind, monkeypatch):
    """Inductor's reduce-overhead mode (CUDA graph trees) recorded a graph per generation (its new cache); the step
    is compiled plain, in one graph of static shapes, and captured by headlab where a GPU captures it."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **settings: compiled.append((fn, settings)) or fn)
    model = sharp_model()
    cache = KVCache(model.config.n_layer)
    with torch.inference_mode():
        model(torch.randint(0, 50, (2, 4)), cache=cache)
    step = kind(model, cache, 2, torch.device("cpu"))  # built on a CPU; only a CUDA step's first call needs a GPU
    [(fn, settings)] = compiled
    assert fn == step.run and step.compute is fn
    assert settings.get("mode") is None and settings["options"]["triton.cudagraphs"] is False
    assert settings["fullgraph"] and settings["dynamic"] is False


ONE_GRAPH_CELLS = [
    ("fused_qkv", {"n_kv_head": 2, "window": 6}),
    ("gated_deltanet", {"position": "none"}),  # its state's step once recompiled per token (a guard on the length)
]  # fmt: skip


@pytest.mark.parametrize("attention,fields", ONE_GRAPH_CELLS)
def test_one_compiled_graph_serves_every_token_and_later_generations(attention, fields, monkeypatch):
    """Each generation builds its step over a new cache; the graph compiled for its first token serves every token
    and the next generations. Dynamo alone (its eager backend) decides that: a new object per generation that the
    step traces (the LM head's sampling forward was one), or a Python number that changes per token, recompiles,
    and with fullgraph the ninth compilation fails torch's recompile limit."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(decoding_module, "COMPILE_SETTINGS", {"backend": "eager", "fullgraph": True, "dynamic": False})
    model = sharp_gpt(block_size=16, n_layer=1, n_head=4, n_embd=64, attention=attention, **fields)
    graphs = [counters["stats"]["unique_graphs"]]
    for seed in range(3):
        list(generate_batch(model, [3, 1, 4], 5, [torch.Generator().manual_seed(seed + i) for i in range(2)], 1.0,
                            decoding="compiled"))  # fmt: skip
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] - graphs[0] <= 1 and graphs[3] == graphs[1], f"graphs compiled, before and after each: {graphs}"
