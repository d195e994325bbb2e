"""The three layouts compute the same function, with either kernel, given converted weights."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import CPU_KERNELS, tiny_gpt_config

from model import (
    GPT,
    GPTConfig,
    build_attention,
    convert_attention_layout,
    same_function_layouts,
)

LAYOUTS = same_function_layouts("fused_qkv")
KERNEL_NAMES = CPU_KERNELS
LAYOUT_PAIRS = list(itertools.permutations(LAYOUTS, 2))
TOL = dict(rtol=0, atol=1e-5)
N_EMBD, N_HEAD, SEQ = 48, 4, 12


def tiny_config(**overrides) -> GPTConfig:
    return tiny_gpt_config(**{"vocab_size": 97, "block_size": 16, "n_layer": 2, "n_head": N_HEAD, "n_embd": N_EMBD,
                              **overrides})


def grads_of(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    # Tied parameters appear once in named_parameters, so list every state-dict name.
    params = dict(module.named_parameters(remove_duplicate=False))
    return {name: params[name].grad for name in module.state_dict() if name in params}


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Give every parameter (biases, LayerNorms included) non-trivial values."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def transplant(src_module, src_layout, dst_module, dst_layout):
    """Load src_module's weights into dst_module through the layout conversion."""
    sd = convert_attention_layout(src_module.state_dict(), src_layout, dst_layout, n_head=N_HEAD)
    dst_module.load_state_dict(sd)


def run_block(block, x):
    x = x.clone().requires_grad_(True)
    out = block(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return out.detach(), x.grad


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("src,dst", LAYOUT_PAIRS)
def test_attention_block_outputs_and_gradients_match(src, dst, kernel):
    torch.manual_seed(0)
    a = build_attention(src, N_EMBD, N_HEAD, kernel, dropout=0.0, bias=True)
    b = build_attention(dst, N_EMBD, N_HEAD, kernel, dropout=0.0, bias=True)
    randomize_(a, seed=1)
    transplant(a, src, b, dst)
    x = torch.randn(3, SEQ, N_EMBD)

    out_a, dx_a = run_block(a, x)
    out_b, dx_b = run_block(b, x)

    torch.testing.assert_close(out_b, out_a, **TOL)
    torch.testing.assert_close(dx_b, dx_a, **TOL)
    # Conversion is a re-arrangement, so it maps gradients exactly like weights.
    grads_a_as_b = convert_attention_layout(grads_of(a), src, dst, n_head=N_HEAD)
    grads_b = grads_of(b)
    assert grads_a_as_b.keys() == grads_b.keys()
    for name in grads_b:
        torch.testing.assert_close(grads_b[name], grads_a_as_b[name], **TOL, msg=name)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kernels_agree_for_each_layout(layout):
    torch.manual_seed(0)
    blocks = {k: build_attention(layout, N_EMBD, N_HEAD, k) for k in KERNEL_NAMES}
    first = blocks[KERNEL_NAMES[0]]
    randomize_(first, seed=2)
    for block in blocks.values():
        block.load_state_dict(first.state_dict())
    x = torch.randn(2, SEQ, N_EMBD)
    results = {k: run_block(block, x) for k, block in blocks.items()}
    ref_out, ref_dx = results[KERNEL_NAMES[0]]
    for out, dx in results.values():
        torch.testing.assert_close(out, ref_out, **TOL)
        torch.testing.assert_close(dx, ref_dx, **TOL)


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("src,dst", LAYOUT_PAIRS)
def test_whole_gpt_logits_loss_and_gradients_match(src, dst, kernel):
    torch.manual_seed(0)
    a = GPT(tiny_config(attention=src, kernel=kernel))
    b = GPT(tiny_config(attention=dst, kernel=kernel))
    randomize_(a, seed=3)
    b.load_weights(a.state_dict())  # converts src -> dst on the way in
    idx = torch.randint(0, 97, (2, SEQ))
    targets = torch.randint(0, 97, (2, SEQ))

    logits_a, loss_a = a(idx, targets)
    logits_b, loss_b = b(idx, targets)
    loss_a.backward()
    loss_b.backward()

    torch.testing.assert_close(logits_b, logits_a, **TOL)
    torch.testing.assert_close(loss_b, loss_a, **TOL)
    grads_a_as_b = convert_attention_layout(grads_of(a), src, dst, n_head=N_HEAD)
    for name, grad in grads_of(b).items():
        torch.testing.assert_close(grad, grads_a_as_b[name], **TOL, msg=name)


@pytest.mark.parametrize("src,dst", LAYOUT_PAIRS)
def test_conversion_round_trip_is_exact(src, dst):
    model = GPT(tiny_config(attention=src))
    there = convert_attention_layout(model.state_dict(), src, dst, n_head=N_HEAD)
    back = convert_attention_layout(there, dst, src, n_head=N_HEAD)
    original = model.state_dict()
    assert back.keys() == original.keys()
    for name, tensor in original.items():
        assert torch.equal(back[name], tensor), name


def test_all_layouts_have_the_same_parameter_count():
    counts = {
        layout: (
            GPT(tiny_config(attention=layout)).num_params(),
            GPT(tiny_config(attention=layout, bias=False)).num_params(),
        )
        for layout in LAYOUTS
    }
    assert len(set(counts.values())) == 1, counts
    # And the count is the closed form of the architecture (bias=True).
    V, T, C, L = 128, 16, N_EMBD, 2  # 97 padded to 128
    per_block = (3 * C * C + 3 * C) + (C * C + C) + (8 * C * C + 5 * C) + 4 * C
    assert counts["wrapper"][0] == V * C + T * C + L * per_block + 2 * C


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_causality_future_tokens_never_change_the_past(layout, kernel):
    torch.manual_seed(0)
    model = GPT(tiny_config(attention=layout, kernel=kernel)).eval()
    idx = torch.randint(0, 97, (2, 16))
    full, _ = model(idx, idx)
    for t in (0, 5, 14):
        changed = idx.clone()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 1 + torch.arange(15 - t)) % 97
        logits, _ = model(changed, changed)
        # Up to round-off (two forward passes need not take the same kernel path); a leak is far larger.
        torch.testing.assert_close(logits[:, : t + 1], full[:, : t + 1], rtol=1e-6, atol=1e-6,
                                   msg=f"changing the tokens after position {t} changed the logits up to it")
        assert not torch.allclose(logits[:, t + 1 :], full[:, t + 1 :], rtol=1e-3, atol=1e-3)


def test_inference_returns_only_the_last_position():
    model = GPT(tiny_config()).eval()
    idx = torch.randint(0, 97, (2, 10))
    full, _ = model(idx, idx)
    last, loss = model(idx)
    assert loss is None and last.shape == (2, 1, 97)
    torch.testing.assert_close(last[:, 0], full[:, -1])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_dropout_applies_in_training_only_for_every_kernel(layout):
    torch.manual_seed(0)
    blocks = {k: build_attention(layout, N_EMBD, N_HEAD, k, dropout=0.3) for k in KERNEL_NAMES}
    state = blocks["manual"].state_dict()
    x = torch.randn(2, SEQ, N_EMBD)
    for block in blocks.values():
        block.load_state_dict(state)
        block.train()
        assert not torch.allclose(block(x), block(x)), "dropout had no effect in training"
        block.eval()
    torch.testing.assert_close(blocks["sdpa"](x), blocks["manual"](x), **TOL)
