"""Muon beside AdamW (training/muon.py): torch's own Muon and AdamW where each weight is orthogonalised as stored; the
same step in every layout where Q, K and V (or heads) are orthogonalised apart, and another step as stored; each
registered layer's declared split covering its weights' rows once; what it cannot do refused in one line."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from helpers import TINY, compose_train, tiny_gpt_config, train_losses
from torch import nn

from model import GPT
from model.attention.layouts import SeparateQKVAttention
from model.checkpoints.convert import convert_attention_layout
from model.registry import MIXERS
from training.config import OptimConfig
from training.loop import train
from training.muon import adjusted_lr, embedding_ids, hidden_matrices, is_hidden_matrix, muon_adamw
from training.optim import make_optimizer

CPU = torch.device("cpu")
LAYOUTS = ("fused_qkv", "separate_qkv", "wrapper")
# Options that let every registered layer build (MLA's latent and rotary key), and a sparse indexer in the softmax ones
LAYER_OPTIONS = {"mla": dict(kv_latent=8, position="rope", rope_head_dim=4)}


def tiny_gpt(layout: str = "fused_qkv", **options) -> GPT:
    torch.manual_seed(0)  # every layout starts from the same weights
    return GPT(tiny_gpt_config(vocab_size=64, block_size=16, n_embd=32, n_head=4, n_layer=2, attention=layout,
                               **options))  # fmt: skip


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(seed))
    return idx, idx.roll(-1, dims=1)


def test_as_stored_is_torch_muon_for_the_hidden_matrices_beside_torch_adamw_for_the_rest():
    """fused_qkv's one 3C x C matrix and every other 2-D hidden weight as torch.optim.Muon steps them (its sqrt(3)
    for the tall one, momentum, Nesterov, decoupled decay), embeddings, norms and biases as torch.optim.AdamW: the
    same weights after three steps. (Held to bf16's round-off of the orthogonalised update, which a float32 difference
    of a gradient can flip; bit for bit on this CPU.)"""
    ours, theirs = tiny_gpt(), tiny_gpt()
    cfg = OptimConfig(name="muon", muon_weight_decay=0.1)
    optimizer = make_optimizer(ours, cfg, CPU, torch.bfloat16)  # orthogonalised in bfloat16, as torch does
    embeddings = embedding_ids(theirs)
    hidden = [p for name, p in theirs.named_parameters() if is_hidden_matrix(name, p, embeddings)]
    rest = [p for name, p in theirs.named_parameters() if not is_hidden_matrix(name, p, embeddings)]
    assert any(p.shape == (96, 32) for p in hidden), "fused_qkv's c_attn: one 3C x C matrix"
    torch_optimizers = [torch.optim.Muon(hidden, lr=cfg.muon_lr, weight_decay=0.1, momentum=cfg.muon_momentum),
                        torch.optim.AdamW(rest, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=0.0,
                                          fused=True)]  # as the trainer's (fused on CPU and CUDA)
    start = {name: p.detach().clone() for name, p in ours.named_parameters()}
    for step in range(3):
        for model, optimizers in ((ours, [optimizer]), (theirs, torch_optimizers)):
            model(*batch(step))[1].backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad()
    for (name, mine), (_, torchs) in zip(ours.named_parameters(), theirs.named_parameters()):
        moved = (torchs - start[name]).abs().max()
        assert moved > 0, name
        torch.testing.assert_close(mine, torchs, rtol=0, atol=1e-2 * moved.item(), msg=name)


@pytest.mark.parametrize("split", ["qkv", "heads", "as_stored"])
def test_apart_by_projection_or_head_every_layout_takes_the_same_step_and_as_stored_another(split):
    """The same weights and the same gradients (converted from fused_qkv's) in each layout, two steps: by Q/K/V or by
    head, the weights after them convert to fused_qkv's (up to float32 round-off); as stored, the separate and the
    wrapper's per-head matrices take other steps."""
    reference = tiny_gpt("fused_qkv", n_kv_head=2)
    reference(*batch(0))[1].backward()
    grads = {name: p.grad.clone() for name, p in reference.named_parameters()}
    after = {}
    for layout in LAYOUTS:
        model = tiny_gpt(layout, n_kv_head=2)
        optimizer = make_optimizer(model, OptimConfig(name="muon", muon_split=split), CPU)
        converted = grads if layout == "fused_qkv" else convert_attention_layout(grads, "fused_qkv", layout, 4)
        for _ in range(2):  # the second step moves by the momentum too
            for name, p in model.named_parameters():
                p.grad = converted[name].clone()
            optimizer.step()
        weights = {name: p.detach() for name, p in model.named_parameters()}
        after[layout] = weights if layout == "fused_qkv" else convert_attention_layout(weights, layout, "fused_qkv")
    moved = (after["fused_qkv"]["transformer.h.0.attn.c_attn.weight"]
             - reference.transformer.h[0].attn.c_attn.weight).abs().max().item()  # fmt: skip
    assert moved > 1e-3
    for layout in ("separate_qkv", "wrapper"):
        differs = max((after[layout][k] - after["fused_qkv"][k]).abs().max().item() for k in after["fused_qkv"])
        if split == "as_stored":
            assert differs > 0.05 * moved, (layout, differs, moved)
        else:
            assert differs <= 1e-6, (layout, differs)


@pytest.mark.slow
def test_the_training_losses_of_the_layouts_agree_by_q_k_v_and_part_as_stored(tmp_path, data_cache):
    """Whole runs (20 steps of the tiny model, float32: Muon orthogonalises in float32 too): by Q/K/V the three
    layouts' train losses agree to float32's round-off, as AdamW's do (5e-7 here); as stored they part by thousands of
    times more."""
    losses = {}
    for split in ("qkv", "as_stored"):
        for layout in LAYOUTS:
            run = tmp_path / f"{split}-{layout}"
            train(compose_train(*TINY, "logger=none", f"attention={layout}", "optim=muon", f"optim.muon_split={split}",
                                f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))  # fmt: skip
            losses[split, layout] = train_losses(run)
    gap = {split: max(abs(losses[split, layout][s] - losses[split, "fused_qkv"][s])
                      for layout in LAYOUTS for s in losses[split, layout])
           for split in ("qkv", "as_stored")}  # fmt: skip
    assert gap["qkv"] < 2e-5, gap
    assert gap["as_stored"] > 5e-4 and gap["as_stored"] > 100 * gap["qkv"], gap
    assert losses["qkv", "fused_qkv"][20] < losses["qkv", "fused_qkv"][1] - 1.0, "it learned"


def every_layer() -> list:
    """Each registered layer as a tiny model's layout (the softmax ones with a sparse indexer too)."""
    cases = [pytest.param(layout, LAYER_OPTIONS.get(layout, {}), id=layout) for layout in MIXERS]
    return [*cases, pytest.param("fused_qkv", dict(sparse_topk=2), id="fused_qkv+indexer"),
            pytest.param("wrapper", dict(n_kv_head=2), id="wrapper-kv2")]


@pytest.mark.parametrize("layout,options", every_layer())
def test_every_registered_layer_says_how_its_weights_split_and_each_row_is_in_one_matrix(layout, options):
    model = tiny_gpt(layout, **options)
    embeddings = embedding_ids(model)
    hidden = {name: p for name, p in model.named_parameters() if is_hidden_matrix(name, p, embeddings)}
    counts = {}
    for split in ("as_stored", "qkv", "heads"):
        matrices = hidden_matrices(model, split)
        rows = {name: torch.zeros(p.size(0), dtype=torch.int) for name, p in hidden.items()}
        names = {id(p): name for name, p in hidden.items()}
        for matrix in matrices:
            assert len({piece.param.size(1) for piece in matrix.pieces}) == 1, matrix.name
            for piece in matrix.pieces:
                rows[names[id(piece.param)]][piece.start : piece.end] += 1
        assert all((r == 1).all() for r in rows.values()), (split, {k: v.tolist() for k, v in rows.items()})
        counts[split] = len(matrices)
    assert counts["qkv"] < counts["heads"], "each head apart: more matrices"
    if layout == "fused_qkv":  # Q, K and V apart: three C x C matrices where c_attn was one 3C x C
        shapes = sorted(m.shape for m in hidden_matrices(model, "qkv") if "h.0.attn: " in m.name)
        assert shapes[:3] == [(32, 32)] * 3, shapes


def test_a_layer_that_does_not_say_how_it_splits_takes_only_the_split_as_stored(monkeypatch, tmp_path, data_cache):
    class Unsaid(SeparateQKVAttention):
        name, QKV_EXAMPLE = "unsaid_qkv", "q_unsaid"
        LINEARS = ("q_unsaid", "k_unsaid", "v_unsaid")

        @classmethod
        def matrix_rows(cls, spec):
            return None

    import re

    Unsaid.QKV_KEY = re.compile(r"(?P<proj>q_unsaid|k_unsaid|v_unsaid)\.(?P<kind>weight|bias)$")
    monkeypatch.setitem(MIXERS, Unsaid.name, Unsaid)
    common = [*TINY, "logger=none", "model.attention=unsaid_qkv", f"data.cache_dir={tmp_path / 'cache'}"]
    with pytest.raises(ValueError, match=r"^optim.muon_split=qkv orthogonalises each projection apart, but "
                                         r"attention=unsaid_qkv \(layers 0\) does not say how its weights split "
                                         r"\(its class's matrix_rows\); use optim.muon_split=as_stored$"):  # fmt: skip
        train(compose_train(*common, "optim=muon_qkv", f"trainer.run_dir={tmp_path / 'run'}"))
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists(), "refused before any work"
    summary = train(compose_train(*TINY, "logger=none", "model.attention=unsaid_qkv", "optim=muon",
                                  "trainer.max_steps=2", f"trainer.run_dir={tmp_path / 'as_stored'}",
                                  f"data.cache_dir={data_cache}"))  # fmt: skip
    assert summary["step"] == 2


def test_muon_on_a_model_without_a_hidden_matrix_is_refused_in_one_line():
    model = nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4))
    with pytest.raises(ValueError, match=r"^optim=muon orthogonalises a model's 2-D hidden weights, and this model "
                                         r"has none .*; use optim=adamw$"):  # fmt: skip
        muon_adamw(model, OptimConfig(name="muon"), fused=False)


@pytest.mark.parametrize("adjustment,rows,cols,factor", [
    ("original", 96, 32, math.sqrt(3)), ("original", 32, 128, 1.0), ("match_rms_adamw", 32, 128, 0.2 * math.sqrt(128)),
    ("none", 96, 32, 1.0),
])  # fmt: skip
def test_the_learning_rate_is_adjusted_by_the_matrix_shape_as_torch_says(adjustment, rows, cols, factor):
    from torch.optim._muon import _adjust_lr  # torch's own rule (original, match_rms_adamw)

    assert adjusted_lr(0.02, adjustment, rows, cols) == pytest.approx(0.02 * factor)
    if adjustment != "none":
        assert adjusted_lr(0.02, adjustment, rows, cols) == pytest.approx(_adjust_lr(0.02, adjustment, (rows, cols)))


def test_the_checkpointed_state_is_one_momentum_buffer_per_matrix_and_two_moments_for_the_rest():
    model = tiny_gpt()
    optimizer = make_optimizer(model, OptimConfig(name="muon"), CPU)
    model(*batch(0))[1].backward()
    optimizer.step()
    optimizer.zero_grad()
    saved = copy.deepcopy(optimizer.state_dict())
    kinds = {tuple(sorted(state)) for state in saved["state"].values()}
    assert kinds == {("momentum_buffer",), ("exp_avg", "exp_avg_sq", "step")}
    # loaded into a fresh optimizer: the same next step
    twin = tiny_gpt()
    twin.load_state_dict(model.state_dict())
    other = make_optimizer(twin, OptimConfig(name="muon"), CPU)
    other.load_state_dict(saved)
    for m, opt in ((model, optimizer), (twin, other)):
        m(*batch(1))[1].backward()
        opt.step()
    for (name, a), (_, b) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.equal(a, b), name
