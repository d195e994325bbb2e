"""Per-head studies: a hand-built previous-token head is found; ablation is exact; the command runs."""

from __future__ import annotations

import csv
import re

import pytest
import torch
from helpers import CPU_KERNELS

import heads
from analysis.heads import ablation, attention_maps, head_statistics, heads_removed, mean_loss, window_losses
from data.config import DataConfig
from model import GPT, GPTConfig, convert_attention_layout, same_function_layouts

T, C, H = 8, 32, 2  # positions, width, heads (head_dim 16)
PNG = b"\x89PNG\r\n\x1a\n"


def committee(layout: str, kernel: str) -> GPT:
    """Layer 0 head 0 attends only to the previous token; head 1 attends uniformly.

    Tokens carry no information (wte = 0); position i is the one-hot e_i, so after
    LayerNorm x_i = a * e_i - b. Head 0's keys read x_j and its queries read x_i shifted
    one slot down, scaled up: score(i, j) = big * [j == i - 1] + the same constant for all j.
    Head 1's queries and keys are zero: every allowed key gets the same weight.
    """
    config = GPTConfig(vocab_size=10, block_size=T, n_layer=1, n_head=H, n_embd=C, attention="separate_qkv")
    model = GPT(config).eval()
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
        model.transformer.wpe.weight.copy_(torch.eye(T, C) * 3.0)
        attn = model.transformer.h[0].attn
        for proj in (attn.query, attn.key):
            proj.weight.zero_()
            proj.bias.zero_()
        shift = torch.zeros(16, C)
        for i in range(1, T):
            shift[i - 1, i] = 1.0  # query of position i points at slot i - 1
        attn.query.weight[:16] = 60.0 * shift
        attn.key.weight[:16, :16] = torch.eye(16)
    sd = convert_attention_layout(model.state_dict(), "separate_qkv", layout, n_head=H)
    built = GPT(GPTConfig(**{**vars(config), "attention": layout, "kernel": kernel})).eval()
    built.load_weights(sd)
    return built


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize("layout", same_function_layouts("fused_qkv"))
def test_statistics_identify_the_previous_token_head(layout, kernel):
    model = committee(layout, kernel)
    maps = attention_maps(model, torch.randint(0, 10, (3, T)))  # (L, B, H, T, T)
    prev_head = maps[0, :, 0]
    for i in range(1, T):
        assert (prev_head[:, i, i - 1] > 0.99).all(), "the map shows the previous-token pattern"
    uniform = maps[0, :, 1]
    for i in range(T):
        torch.testing.assert_close(uniform[:, i, : i + 1], torch.full((3, i + 1), 1 / (i + 1)))
    stats = head_statistics(maps)
    assert stats["prev_token"][0, 0] > 0.99 and stats["prev_token"][0, 1] < 0.4
    assert stats["prev_token"].flatten().argmax() == 0
    assert stats["mean_distance"][0, 0] == pytest.approx((T - 1) / T, abs=0.01)  # 1 for every query but the first
    assert stats["entropy"][0, 0] < 0.05 < stats["entropy"][0, 1]
    first = sum(1 / (i + 1) for i in range(1, T)) / (T - 1)
    assert stats["first_token"][0, 1] == pytest.approx(first, abs=1e-5)


@pytest.mark.parametrize("layout", same_function_layouts("fused_qkv"))
def test_attention_rows_sum_to_one_and_respect_causality(layout):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, attention=layout)).eval()
    maps = attention_maps(model, torch.randint(0, 50, (2, 16)))
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    future = torch.ones(16, 16, dtype=torch.bool).triu(1)
    assert (maps[..., future] == 0).all()


@pytest.mark.parametrize("layout", same_function_layouts("fused_qkv"))
def test_ablating_a_head_equals_removing_its_slice_of_the_concatenated_heads(layout):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, attention=layout)
    model = GPT(config).eval()
    x, y = torch.randint(0, 50, (4, 16)), torch.randint(0, 50, (4, 16))
    original = mean_loss(model, x, y)
    with heads_removed(model, []):
        assert mean_loss(model, x, y) == original, "ablating no head reproduces the loss"
    with heads_removed(model, [(1, 2)]):
        ablated, _ = model(x, y)
    # The same head removed by hand: the columns of c_proj that read head 2's slice, zeroed.
    by_hand = GPT(config).eval()
    by_hand.load_state_dict(model.state_dict())
    with torch.no_grad():
        by_hand.transformer.h[1].attn.c_proj.weight[:, 16:24] = 0
    expected, expected_loss = by_hand(x, y)
    torch.testing.assert_close(ablated, expected)
    base, increase, *_ = ablation(model, x, y, progress=False)
    assert base == original and increase.shape == (2, 4)
    assert increase[1, 2].item() == pytest.approx(expected_loss.item() - original, abs=1e-6)


def test_an_ablations_standard_error_is_paired_over_the_windows_and_a_dead_head_is_noise():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32)).eval()
    with torch.no_grad():
        model.transformer.h[0].attn.c_proj.weight[:, 8:16] = 0  # head 1 of layer 0 reaches nothing
    x, y = torch.randint(0, 50, (6, 16)), torch.randint(0, 50, (6, 16))
    result = ablation(model, x, y, progress=False)
    base = window_losses(model, x, y)
    with heads_removed(model, [(1, 3)]):
        difference = window_losses(model, x, y) - base
    assert result.base == pytest.approx(base.mean().item())
    assert result.base_error == pytest.approx(base.std().item() / 6**0.5, rel=1e-6)
    assert result.increase[1, 3].item() == pytest.approx(difference.mean().item(), abs=1e-7)
    assert result.standard_error[1, 3].item() == pytest.approx(difference.std().item() / 6**0.5, rel=1e-6)
    # the spread of the windows' own losses is far wider than the spread of their paired differences
    assert result.standard_error[1, 3].item() < base.std().item() / 6**0.5
    assert result.increase[0, 1].item() == 0 and result.noise(0, 1), "a head that reaches nothing measures nothing"
    assert not result.noise(1, 3) or abs(result.increase[1, 3].item()) <= 2 * result.standard_error[1, 3].item()


def test_out_of_range_heads_are_refused():
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32))
    with pytest.raises(ValueError, match="layer=2 is out of range: this model has layers 0..1"):
        with heads_removed(model, [(2, 0)]):
            pass
    with pytest.raises(ValueError, match="head=4 is out of range: this model has heads 0..3"):
        with heads_removed(model, [(0, 4)]):
            pass


def config(trained_run, data_cache, tmp_path, **fields) -> heads.HeadsConfig:
    base = dict(
        source=str(trained_run), windows=4, device="cpu", data=DataConfig(cache_dir=str(data_cache)),
        out=str(tmp_path / "out"),
    )
    return heads.HeadsConfig(**{**base, **fields})


def test_command_writes_valid_pngs_and_tables(trained_run, data_cache, tmp_path, capsys):
    out = heads.run(config(trained_run, data_cache, tmp_path, prompt="import os\n", layer=0, head=1, prune=True))
    said = capsys.readouterr().err
    assert re.search(r"val loss \d\.\d{4} ±\d\.\d{4} \(its standard error over the 4 windows\) with all 2 heads, "
                     r"over 4 windows \(windows=4\) of 32 tokens .*; not the run's val/loss, which averaged "
                     r"trainer.eval_windows=8 windows \(windows=8 on the data it trained on reads the same ones\)",
                     said), said  # fmt: skip
    for name in ("maps.png", "head_L0_H1.png", "stats.png", "ablation.png", "pruning.png"):
        assert (out / name).read_bytes()[:8] == PNG, name
    with open(out / "stats.csv") as f:
        stats = list(csv.DictReader(f))
    assert [(r["layer"], r["head"]) for r in stats] == [("0", "0"), ("0", "1")]
    for row in stats:
        assert 0 <= float(row["prev_token"]) <= 1 and 0 <= float(row["first_token"]) <= 1
        assert float(row["entropy"]) >= 0 and float(row["mean_distance"]) >= 0
    with open(out / "ablation.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
    with open(out / "pruning.csv") as f:
        losses = [float(r["loss"]) for r in csv.DictReader(f)]
    assert len(losses) == 3, "all heads, then one removed, then both"
    assert "| layer | head | entropy |" in (out / "stats.md").read_text()


@pytest.mark.parametrize(
    "fields,error,message",
    [
        (dict(layer=3), ValueError, "layer=3 is out of range"),
        (dict(head=9), ValueError, "head=9 is out of range: this model has heads 0..1"),
        (dict(prompt="   "), ValueError, "prompt is empty"),
        (dict(source="/nonexistent/run"), FileNotFoundError, "no checkpoint at"),
    ],
)
def test_bad_input_is_a_clear_error(trained_run, data_cache, tmp_path, fields, error, message):
    with pytest.raises(error, match=message):
        heads.run(config(trained_run, data_cache, tmp_path, **fields))


def test_a_study_leaves_no_earlier_studys_results_beside_its_own(tmp_path):
    """Another head's map and a pruning curve from an earlier study (prune=true) in the same folder would read as
    this one's results, and go to wandb with them: removed; what heads.py does not write stays."""
    names = ["maps.png", "head_L0_H0.png", "head_L0_H1.png", "stats.csv", "stats.md", "stats.png", "ablation.csv",
             "ablation.md", "ablation.png", "pruning.csv", "pruning.md", "pruning.png", "notes.txt"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_text("x")
    removed = heads.remove_earlier_results(tmp_path, heads.HeadsConfig(source="run"))
    assert removed == ["head_L0_H1.png", "pruning.csv", "pruning.md", "pruning.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - set(removed))
    assert heads.remove_earlier_results(tmp_path, heads.HeadsConfig(source="run", head=1, prune=True)) == [
        "head_L0_H0.png"]
