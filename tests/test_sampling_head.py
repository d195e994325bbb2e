"""The LM head's CPU sampling shortcut lives on the sampling side (model.decoding.packed, installed by generation), not
in the GPT: present while a generation runs, gone after it, never in the way of weights packed for the batch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import sharp_gpt

from model.decoding.generation import generate_batch
from model.decoding.packed import TransposedHead, is_packed, mkl_packing_available, packed_linears, sampling_head


def tiny_model():
    return sharp_gpt(block_size=16, n_layer=2)


def head_forward(model):
    return vars(model.lm_head).get("forward")


def test_a_generation_samples_through_the_transposed_head_and_leaves_the_model_plain():
    model = tiny_model()
    assert head_forward(model) is None, "outside sampling, the GPT's head is a plain Linear"
    steps = generate_batch(model, [3, 1, 4], 10, [torch.Generator().manual_seed(0)])  # one sample: nothing packed
    next(steps)
    assert isinstance(head_forward(model), TransposedHead)
    steps.close()
    assert head_forward(model) is None


def test_every_generation_samples_through_the_same_transposed_head():
    """A compiled decode step traces the head's forward and guards on its identity: one object, or a recompile."""
    model = tiny_model()
    seen = []
    for seed in range(2):
        steps = generate_batch(model, [3, 1, 4], 3, [torch.Generator().manual_seed(seed)])
        next(steps)
        seen.append(head_forward(model))
        steps.close()
    assert isinstance(seen[0], TransposedHead) and seen[1] is seen[0]
    assert head_forward(model) is None and "_transposed_head" not in model.state_dict()


def test_the_transposed_head_gives_the_heads_logits():
    head = tiny_model().lm_head
    h = torch.randn(3, head.in_features)
    with torch.inference_mode():
        torch.testing.assert_close(TransposedHead(head)(h), F.linear(h, head.weight), rtol=1e-5, atol=1e-5)
    trained = TransposedHead(head)(h)  # with autograd: the plain product, through which gradients flow
    assert trained.requires_grad and torch.equal(trained, F.linear(h, head.weight))


@pytest.mark.skipif(not mkl_packing_available(), reason="MKL weight packing (x86 CPU builds of torch)")
def test_weights_packed_for_the_batch_keep_the_head():
    model = tiny_model()
    with packed_linears(model, rows=4) as on, sampling_head(model.lm_head):
        assert on and is_packed(model.lm_head), "the packed product is faster still: left in place"
    assert head_forward(model) is None
