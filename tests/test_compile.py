"""torch.compile traces the GPT in one graph and matches eager mode."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_gpt_config
from torch._dynamo.utils import counters

from model import GPT, same_function_layouts
from model.compiling import compile_for_training, eager, is_compiled


def small_gpt(layout: str) -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_gpt_config(vocab_size=64, block_size=16, n_embd=32, attention=layout)).eval()


@pytest.mark.parametrize("layout", same_function_layouts("fused_qkv"))
def test_dynamo_finds_no_graph_breaks(layout):
    torch._dynamo.reset()
    model = small_gpt(layout)
    idx = torch.randint(0, 64, (2, 16))
    explanation = torch._dynamo.explain(model)(idx, idx)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("layout", [pytest.param("separate_qkv", marks=pytest.mark.slow), "fused_qkv"])
def test_compiled_gpt_matches_eager(layout):
    torch._dynamo.reset()
    model = small_gpt(layout)
    idx = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        eager_logits, eager_loss = model(idx, idx)
        compiled = torch.compile(model, fullgraph=True)  # fullgraph: a graph break is an error
        logits, loss = compiled(idx, idx)
    torch.testing.assert_close(logits, eager_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)


def test_the_manual_kernel_traces_without_warnings(recwarn):
    # Its causal mask is cached in eager mode; under the compiler an lru_cache is ignored with a warning.
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = GPT(tiny_gpt_config(vocab_size=64, block_size=16, n_embd=32, kernel="manual")).eval()
    idx = torch.randint(0, 64, (2, 16))
    explanation = torch._dynamo.explain(model)(idx, idx)
    assert explanation.graph_break_count == 0
    assert not [str(w.message) for w in recwarn if "lru_cache" in str(w.message)]


@pytest.mark.slow
def test_regional_compilation_compiles_one_block_for_all_layers_and_trains_like_eager():
    layout = "wrapper"  # the layout whose blocks hold the most modules (3 projections per head)
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = tiny_gpt_config(vocab_size=64, block_size=16, n_embd=32, n_layer=3, attention=layout)
    eager_model, model = GPT(config), GPT(config)
    model.load_state_dict(eager_model.state_dict())
    names = list(model.state_dict())
    idx = torch.randint(0, 64, (2, 16))
    counters.clear()
    run = compile_for_training(model, "block")
    loss = run(idx, idx)[1]
    loss.backward()
    # One graph for the repeated block (used by all 3 layers) and one for the norm, LM head and loss.
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    assert run is model and list(model.state_dict()) == names, "compiled in place: the same parameter names"
    eager_loss = eager_model(idx, idx)[1]
    eager_loss.backward()
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    with eager():  # sampling and evaluation: no new compilation
        model.eval()(idx)
    assert counters["stats"]["unique_graphs"] == 2


def test_a_model_with_compiled_blocks_counts_as_compiled():
    model = small_gpt("fused_qkv")
    assert not is_compiled(model)
    model.transformer.h[0].compile()
    assert is_compiled(model), "packing for batched sampling must stay off"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune-no-cudagraphs"])
def test_a_compile_mode_compiles_the_same_function_with_its_loss_in_chunks(mode):
    """trainer.compile_mode (on a CPU reduce-overhead has no CUDA graphs to replay: the same kernels) with the loss in
    chunks (trainer.loss_chunk) traced in the compiled region: the eager loss and gradients up to round-off."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = tiny_gpt_config(vocab_size=64, block_size=16, n_embd=32, n_layer=2)
    eager_model, model = GPT(config), GPT(config)
    model.load_state_dict(eager_model.state_dict())
    model.loss_chunk = 7
    idx = torch.randint(0, 64, (2, 16))
    loss = compile_for_training(model, "block", mode)(idx, idx)[1]
    loss.backward()
    eager_loss = eager_model(idx, idx)[1]
    eager_loss.backward()
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_an_unknown_compile_mode_is_refused_naming_the_modes():
    with pytest.raises(ValueError, match=r"^compile mode 'fast'; choose one of: default, reduce-overhead, "
                                         r"max-autotune-no-cudagraphs$"):  # fmt: skip
        compile_for_training(small_gpt("fused_qkv"), "block", "fast")
