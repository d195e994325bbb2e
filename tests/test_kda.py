"""attention=kda (Kimi Delta Attention, Kimi Linear, arXiv 2510.26692) held to the paper, written here in float64
step by step: the chunked form equals the recurrence at every length, chunk size and chunk boundary, with gradients,
and decays that differ per channel; the whole layer equals the paper's layer; Kimi Linear's 3:1 with NoPE latent
attention decodes as its full forward; each bad value is refused in one line naming kda; it trains. (The generated
grid of test_attention_properties.py holds it too: every length, cached decoding, generation past block_size.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import yaml

from model import GPT, GPTConfig, KVCache, convert_attention_layout
from model.mixers.kda import chunked_kda
from tests.attention_reference import kda_reference, recurrent_kda
from tests.helpers import (
    CONFIGS,
    assert_chunked_form_is_the_recurrence,
    assert_layer_is_its_formula,
    random_linear_layer,
    tiny_run,
    train_losses,
)

LENGTHS = [1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 47, 64, 65]
CHUNKS = [1, 2, 3, 4, 7, 16, 32]
SHAPES = [(1, 1, 4, 4), (2, 3, 8, 6), (3, 2, 6, 8)]  # batch, heads, key and value widths


def kda_inputs(B, H, T, dk, dv, seed, state=True):
    """Random float64 inputs as the layer makes them: unit keys, scaled unit queries, betas in (0, 1), and log decays
    per channel from about -4 (a channel that forgets within a few tokens) to about 0 (one that keeps everything)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, dk, generator=gen, dtype=torch.float64), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(B, H, T, dk, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, T, dv, generator=gen, dtype=torch.float64)
    log_decay = -4 * torch.rand(B, H, T, dk, generator=gen, dtype=torch.float64) ** 3
    beta = torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    s0 = torch.randn(B, H, dk, dv, generator=gen, dtype=torch.float64) if state else None
    return [t.requires_grad_() if t is not None else None for t in (q, k, v, log_decay, beta, s0)]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_chunked_form_is_the_recurrence_at_every_length_and_chunk_with_gradients(chunk):
    for i, T in enumerate(LENGTHS):
        B, H, dk, dv = SHAPES[i % len(SHAPES)]
        inputs = kda_inputs(B, H, T, dk, dv, seed=T * 100 + chunk, state=i % 2 == 0)
        assert_chunked_form_is_the_recurrence(chunked_kda, recurrent_kda, inputs, chunk, f"T={T} chunk={chunk}")


def test_a_decay_per_channel_is_not_one_per_head():
    """The property that makes it Kimi's: the same inputs with each head's channels given their mean decay (Gated
    DeltaNet's one per head) compute another function."""
    q, k, v, g, beta, _ = kda_inputs(1, 2, 12, 8, 8, seed=3, state=False)
    per_head = g.mean(-1, keepdim=True).expand_as(g)
    assert (chunked_kda(q, k, v, g, beta, 4)[0] - chunked_kda(q, k, v, per_head, beta, 4)[0]).abs().max() > 1e-2


def test_a_sequence_in_pieces_carries_the_state_to_the_whole_sequences_result():
    q, k, v, g, beta, _ = kda_inputs(2, 2, 50, 8, 8, seed=7, state=False)
    whole, s_whole = chunked_kda(q, k, v, g, beta, 16)
    state, outs = None, []
    for start, end in ((0, 1), (1, 17), (17, 18), (18, 50)):
        o, state = chunked_kda(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], g[:, :, start:end],
                               beta[:, :, start:end], 16, state)  # fmt: skip
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=2), whole, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(state, s_whole, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n_embd,n_head", [(16, 1), (24, 3), (32, 4)])
def test_the_layer_is_the_papers_formula_at_every_length_with_gradients(n_embd, n_head):
    block = random_linear_layer("kda", n_embd, n_head, seed=n_head)
    assert_layer_is_its_formula(block, lambda b, x: kda_reference(b, "kda", x, {}), (1, 2, 5, 16, 17, 40))


def kimi_linear(**fields) -> GPTConfig:
    """configs/mixing/kimi_linear.yaml at a test's size: three KDA layers to one of latent attention without
    positions."""
    mixing = yaml.safe_load((CONFIGS / "mixing" / "kimi_linear.yaml").read_text())
    return GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=16, **{**mixing, **fields})


@pytest.mark.parametrize("static", [False, True])
def test_kimi_linears_hybrid_decodes_as_its_full_forward_past_block_size(static):
    from model.decoding.steps import StaticStep

    torch.manual_seed(0)
    model = GPT(kimi_linear()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)
    assert [type(block.attn).__name__ for block in model.transformer.h][:4] == [
        "KimiDeltaAttention", "KimiDeltaAttention", "KimiDeltaAttention", "LatentAttention"]  # fmt: skip
    idx = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model(idx, idx)[0]
        for prompt in (1, 7, 16, 22):  # the latent layer's keys past block_size: a ring
            cache = KVCache(model.config.n_layer)
            first = model(idx[:, :prompt], cache=cache)[0][:, -1]
            torch.testing.assert_close(first, full[:, prompt - 1], atol=1e-4, rtol=0)
            step = StaticStep(model, cache, 2, torch.device("cpu")) if static else (
                lambda tokens, t, cache=cache: model(tokens, cache=cache)[0][:, -1])  # fmt: skip
            for t in range(prompt, min(30, prompt + 6)):  # past 16: the latent layer's last block_size keys
                torch.testing.assert_close(step(idx[:, t : t + 1], t), full[:, t], atol=1e-4, rtol=0,
                                           msg=f"prompt {prompt}, position {t}")  # fmt: skip


@pytest.mark.parametrize("fields,says", [
    ({"window": 4}, r"^model.window=4 with attention=kda in every layer: its state keeps a decayed summary .*; set "
                    r"model.window=null, or give it to softmax attention"),
    ({"position": "rope"}, r"^model.position=rope with attention=kda in every layer: rotary turns softmax attention"),
    ({"n_kv_head": 1}, r"^model.n_kv_head=1 with attention=kda in every layer: its state is per head"),
    ({"softcap": 30.0}, r"^model.softcap=30.0 with attention=kda in every layer: it is linear attention"),
    ({"linear_chunk": 0}, r"^model.linear_chunk=0 must be a positive number of positions per chunk"),
])  # fmt: skip
def test_each_bad_value_is_refused_in_one_line_naming_kda(fields, says):
    with pytest.raises(ValueError, match=says):
        GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16, attention="kda",
                  **{"position": "none", **fields})  # fmt: skip


def test_the_chunk_changes_the_arithmetic_not_the_function():
    torch.manual_seed(0)
    a = GPT(GPTConfig(vocab_size=64, block_size=40, n_layer=1, n_head=2, n_embd=16, attention="kda",
                      position="none")).eval()  # fmt: skip
    torch.manual_seed(0)
    b = GPT(GPTConfig(vocab_size=64, block_size=40, n_layer=1, n_head=2, n_embd=16, attention="kda",
                      position="none", linear_chunk=5)).eval()  # fmt: skip
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(a(idx, idx)[0], b(idx, idx)[0], rtol=1e-4, atol=1e-5)


def test_its_weights_convert_to_no_other_layout_and_its_heads_have_no_attention_weights():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16, attention="kda",
                          position="none"))  # fmt: skip
    with pytest.raises(ValueError, match="kda"):
        convert_attention_layout(model.state_dict(), "kda", "fused_qkv", 2)
    with pytest.raises(ValueError, match=r"^attention=kda has no attention weights"):
        model.transformer.h[0].attn.queries_keys(torch.zeros(1, 3, 16))


def test_a_short_run_of_kimi_linears_mixing_lowers_the_loss(tmp_path, data_cache):
    run = tiny_run(tmp_path / "run", data_cache, "mixing=kimi_linear", "model.n_layer=4", "trainer.max_steps=30",
                   "trainer.eval_interval=30", "trainer.checkpoint_interval=30")  # fmt: skip
    losses = train_losses(run)
    assert sum(list(losses.values())[-5:]) / 5 < list(losses.values())[0] - 0.3
    assert "KKKM_K.kda.nopos_M.mla" in run.name or "kda" in (run / "run.json").read_text()
