"""trainer.loss_chunk: the LM head and loss a chunk of tokens at a time, gradients made in the forward pass, compute
the plain loss and its gradients (float64 references), train the same run, and leave no (tokens, vocab) logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY, compose_train, read_metrics
from omegaconf import OmegaConf

from model.chunked_loss import head_loss
from training.config import TrainConfig, TrainerConfig, validate
from training.loop import train
from training.plan import make_plan


def reference(hidden, weight, targets, vocab):
    """The plain loss in float64: the cropped logits' mean cross-entropy, -1 ignored."""
    return F.cross_entropy(hidden.double() @ weight[:vocab].double().t(), targets, ignore_index=-1)


@pytest.mark.parametrize("rows", [1, 2, 7, 31, 64, 97])
@pytest.mark.parametrize("chunk", [1, 5, 16, 64, 1000])
def test_the_loss_and_both_gradients_equal_the_plain_losss_at_every_chunk_boundary(rows, chunk):
    gen = torch.Generator().manual_seed(rows * 1000 + chunk)
    vocab, padded, width = 50, 64, 24
    hidden = torch.randn(rows, width, generator=gen).requires_grad_()
    weight = (torch.randn(padded, width, generator=gen) * 0.5).requires_grad_()
    targets = torch.randint(0, vocab, (rows,), generator=gen)
    targets[torch.rand(rows, generator=gen) < 0.2] = -1  # ignored positions (a document's padding)
    expected = reference(hidden, weight, targets, vocab)
    want = torch.autograd.grad(3.0 * expected, (hidden, weight))
    got = head_loss(hidden, weight, targets, vocab, chunk)
    grads = torch.autograd.grad(3.0 * got, (hidden, weight))  # an outer factor (accumulation, a loss scale) passes
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6, equal_nan=True)  # NaN: none counted
    for g, w in zip(grads, want):
        torch.testing.assert_close(g.double(), w.double(), rtol=1e-5, atol=1e-6)
    assert not grads[1][vocab:].any(), "the padding rows of the head get no gradient"
    assert (targets != -1).any() or got.isnan(), "every target ignored: NaN, as the plain loss"
    with torch.no_grad():
        torch.testing.assert_close(head_loss(hidden, weight, targets, vocab, chunk).double(), expected,
                                   rtol=1e-6, atol=1e-6, equal_nan=True)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_the_gradients_keep_their_precision_where_a_token_weighs_little(dtype):
    """16,384 tokens: each gradient is (softmax - one-hot) / 16,384, small enough to round away in float16; the chunks
    divide only after the products, and their gradients stay within a few bf16/fp16 roundings of float64's."""
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(16384, 32, generator=gen).requires_grad_()
    weight = (torch.randn(64, 32, generator=gen) * 0.3).requires_grad_()
    targets = torch.randint(0, 64, (16384,), generator=gen)
    want = torch.autograd.grad(reference(hidden, weight, targets, 64), (hidden, weight))
    with torch.autocast("cpu", dtype=dtype):
        got = torch.autograd.grad(head_loss(hidden, weight, targets, 64, 1000), (hidden, weight))
    for g, w in zip(got, want):
        assert ((g.double() - w).norm() / w.norm()).item() < 1e-2


def test_the_models_token_losses_are_the_plain_per_position_losses():
    from helpers import sharp_gpt

    model = sharp_gpt(1, block_size=16, n_layer=2)
    idx = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 50, (3, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        plain = F.cross_entropy(model(idx, targets)[0].transpose(1, 2), targets, reduction="none")
    for chunk in (0, 5, 48):
        model.loss_chunk = chunk
        torch.testing.assert_close(model.token_losses(idx, targets), plain, rtol=1e-5, atol=1e-6)
        if chunk:
            logits, loss = model(idx, targets)
            assert logits is None, "no logits are kept"
            torch.testing.assert_close(loss, plain.mean(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_run_with_the_loss_in_chunks_trains_as_the_plain_one(tmp_path, data_cache):
    """float32 on the CPU, 6 steps with 2 micro-steps each: the same train and val losses up to round-off."""
    losses = {}
    for chunk in (0, 7):
        run = tmp_path / f"chunk{chunk}"
        train(compose_train(*TINY, "trainer.max_steps=6", "trainer.eval_interval=3", "trainer.micro_batch_size=2",
                            f"trainer.loss_chunk={chunk}", f"trainer.run_dir={run}",
                            f"data.cache_dir={data_cache}"))  # fmt: skip
        losses[chunk] = [(m.get("train/loss"), m.get("val/loss")) for m in read_metrics(run)
                         if "train/loss" in m or "val/loss" in m]  # fmt: skip
    assert len(losses[0]) == len(losses[7]) >= 8
    for (train_a, val_a), (train_b, val_b) in zip(losses[0], losses[7]):
        assert (train_a is None) == (train_b is None) and (val_a is None) == (val_b is None)
        for a, b in ((train_a, train_b), (val_a, val_b)):
            if a is not None:
                assert abs(a - b) <= 1e-5 * abs(a), (a, b)


def test_a_negative_loss_chunk_is_refused_naming_it_and_the_choices():
    with pytest.raises(ValueError, match=r"^trainer.loss_chunk=-1: tokens per chunk of the head and loss, a whole "
                                         r"number >= 1 \(e.g. 4096\), or 0 for the whole logits at once$"):  # fmt: skip
        validate(OmegaConf.to_object(compose_train(*TINY, "trainer.loss_chunk=-1")))


def test_the_plan_keeps_no_whole_logits_and_fits_a_larger_micro_batch():
    from model import GPTConfig

    gpt2 = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    plans = {chunk: make_plan(TrainConfig(model=gpt2, trainer=TrainerConfig(batch_size=32, loss_chunk=chunk)), gpt2, 1,
                              torch.bfloat16) for chunk in (0, 4096)}  # fmt: skip
    whole, chunked = plans[0], plans[4096]
    assert "log-softmax of the logits" in whole.activations and "log-softmax of the logits" not in chunked.activations
    assert chunked.activations["loss gradients (chunked head and loss)"] == 4 * 768 * (32 * 1024 + 50304)
    assert chunked.logits_transient_bytes == 4096 * 50304 * 12, "one chunk: bf16 product, float32 copy and scratch"
    assert whole.peak_bytes - chunked.peak_bytes > 10 * 2**30, "at 32 x 1024 tokens, over 10 GiB of logits"
