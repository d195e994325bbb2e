"""torch.compile traces the GPT in one graph and matches eager mode."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_gpt_config

from model import ATTENTION_LAYOUTS, GPT


def small_gpt(layout: str) -> GPT:
    torch.manual_seed(0)
    return GPT(tiny_gpt_config(vocab_size=64, block_size=16, n_embd=32, attention=layout)).eval()


@pytest.mark.parametrize("layout", sorted(ATTENTION_LAYOUTS))
def test_dynamo_finds_no_graph_breaks(layout):
    torch._dynamo.reset()
    model = small_gpt(layout)
    idx = torch.randint(0, 64, (2, 16))
    explanation = torch._dynamo.explain(model)(idx, idx)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("layout", ["separate_qkv", "fused_qkv"])
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
