"""The output gate (model.gate) and partial rotary (model.rope_fraction): the properties that follow from their
formulas, beyond the float64 formula every layout x kernel cell is held to (tests/test_attention_properties.py:
the gate, the head gate, partial rotary, alone and with other options, at every length, decoding included).

- a gate whose projection is zero halves the heads' outputs (sigmoid 0 = 1/2), whatever the layout;
- a head gate scales its head's slice of the output and no other;
- a gated, partly rotary GPT converts between the layouts of its function with the same logits and gradients;
- partial rotary leaves the unturned dims of the queries and keys as projected, at every position;
- a schedule's layer kind may set either, its layers alone built with it;
- a sweep over the gate names each run by it, and compare.py reports the gate, the rotary share and the
  parameters the gate adds.

Their bad values: tests/test_score_mods.py (the config's one-line refusals).
"""

from __future__ import annotations

import csv
import itertools

import pytest
import torch
from helpers import GPT2_LAYOUTS, TINY, random_block, run_cli, tiny_gpt_config

import compare
from model import GPT, convert_attention_layout

LAYOUTS = GPT2_LAYOUTS


def seeded(layout: str, seed: int = 0, **options) -> torch.nn.Module:
    return random_block(layout, "sdpa", 0.3, seed, **options)


def heads_output(block: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the output projection reads: the heads' outputs side by side, gated when the block has a gate."""
    seen = []
    handle = block.c_proj.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    block(x)
    handle.remove()
    return seen[0]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_a_gate_of_zero_weights_halves_the_heads_outputs(layout, gate):
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    gated, plain = seeded(layout, gate=gate), seeded(layout)
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    with torch.no_grad():
        gated.gate.weight.zero_()
        torch.testing.assert_close(heads_output(gated, x), heads_output(plain, x) / 2, rtol=0, atol=1e-6)
        gated.gate.weight.normal_()
        assert not torch.allclose(heads_output(gated, x), heads_output(plain, x) / 2, atol=1e-3), "a live gate"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_head_gate_scales_its_head_and_no_other(layout):
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(2))
    block = seeded(layout, gate="headwise")
    before = heads_output(block, x).view(1, 9, 4, 8)
    with torch.no_grad():
        block.gate.weight[2] *= -3.0  # head 2's gate logits
    after = heads_output(block, x).view(1, 9, 4, 8)
    changed = [not torch.equal(before[:, :, h], after[:, :, h]) for h in range(4)]
    assert changed == [False, False, True, False]
    ratio = after[:, :, 2] / before[:, :, 2]  # one factor per position for all of the head's dims
    torch.testing.assert_close(ratio, ratio[..., :1].expand_as(ratio), rtol=1e-4, atol=1e-5)


OPTIONS = [dict(gate="elementwise"), dict(gate="headwise", position="rope", rope_fraction=0.5),
           dict(position="rope", rope_fraction=0.25, qk_norm=True)]  # fmt: skip


@pytest.mark.parametrize("options", OPTIONS, ids=["gate", "headgate+ropefrac0.5", "ropefrac0.25+qknorm"])
@pytest.mark.parametrize("src,dst", list(itertools.permutations(LAYOUTS, 2)))
def test_a_gated_partly_rotary_gpt_converts_between_layouts_exactly(src, dst, options):
    config = dict(vocab_size=61, block_size=16, n_layer=2, n_head=4, n_embd=32, kernel="sdpa", **options)
    torch.manual_seed(0)
    a, b = GPT(tiny_gpt_config(attention=src, **config)), GPT(tiny_gpt_config(attention=dst, **config))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in a.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    b.load_weights(a.state_dict())
    idx = torch.randint(0, 61, (2, 15), generator=gen)
    (logits_a, loss_a), (logits_b, loss_b) = a(idx, idx), b(idx, idx)
    loss_a.backward()
    loss_b.backward()
    torch.testing.assert_close(logits_b, logits_a, rtol=0, atol=1e-5)
    grads_a = {n: p.grad for n, p in a.named_parameters()}
    as_b = convert_attention_layout(grads_a, src, dst, n_head=4)
    for name, p in b.named_parameters():
        torch.testing.assert_close(p.grad, as_b[name], rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_partial_rotary_turns_the_first_dims_of_each_head_and_leaves_the_rest(layout, fraction):
    x = torch.randn(2, 37, 32, generator=torch.Generator().manual_seed(4))
    turned = seeded(layout, position="rope", rope_fraction=fraction)
    unturned = seeded(layout, position="none")  # the same weights: its queries and keys are as projected
    q, k = turned.queries_keys(x)
    q0, k0 = unturned.queries_keys(x)
    r = round(fraction * 8)
    for t, t0 in ((q, q0), (k, k0)):
        assert torch.equal(t[..., r:], t0[..., r:]), "the unturned dims pass as they are"
        torch.testing.assert_close(t[:, :, 0, :r], t0[:, :, 0, :r], rtol=0, atol=1e-6)  # position 0: no turn
        assert not torch.allclose(t[:, :, 5:, :r], t0[:, :, 5:, :r], atol=1e-3), "later positions turn"
        torch.testing.assert_close(t[..., :r].norm(dim=-1), t0[..., :r].norm(dim=-1), rtol=1e-5, atol=1e-5)


def test_a_layer_kind_may_set_the_gate_and_the_rotary_share():
    config = tiny_gpt_config(n_layer=4, n_head=2, n_embd=16, position="rope", layer_pattern="LG",
                             layer_kinds={"L": {"rope_fraction": 0.5}, "G": {"gate": "headwise"}})  # fmt: skip
    model = GPT(config)
    gates = [block.attn.gate for block in model.transformer.h]
    assert [g is not None for g in gates] == [False, True, False, True]
    assert [block.attn.rotary.dim for block in model.transformer.h] == [4, 8, 4, 8]
    assert gates[1].weight.shape == (2, 16), "one gate per head, from the layer's input"


@pytest.mark.slow
def test_a_sweep_over_the_gate_names_and_reports_each_value(tmp_path, data_cache):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *TINY, "logger=none", f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}",
                     "model.n_head=4", "trainer.max_steps=2", "trainer.eval_interval=2", "model.position=rope",
                     "model.rope_fraction=0.5", "model.gate=none,headwise,elementwise", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    variants = ["fused_qkv-sdpa-rope-ropefrac0.5", "fused_qkv-sdpa-rope-ropefrac0.5-headgate",
                "fused_qkv-sdpa-rope-ropefrac0.5-elemgate"]  # fmt: skip
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == [f"{i}_{v}" for i, v in enumerate(variants)]
    out = compare.main([str(sweep), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["gate"] for row in rows] == ["none", "headwise", "elementwise"]
    assert {row["rope_fraction"] for row in rows} == {"0.5"}
    header = (out / "report.md").read_text()
    assert "| gate |" in header and "| rope fraction |" in header
    params = [int(row["params"]) for row in rows]
    assert params[1] - params[0] == 32 * 4 and params[2] - params[0] == 32 * 32, "W_g, one layer: C x H, C x C"


@pytest.mark.slow
def test_heads_reports_each_heads_mean_gate_in_the_layers_that_have_one(tmp_path, data_cache, capsys):
    from helpers import tiny_run

    import heads
    from analysis.heads import GATE, gate_means
    from data.config import DataConfig
    from model import load_model

    run = tiny_run(tmp_path / "run", data_cache, "model.n_layer=2", "model.layer_pattern=NG",
                   "+model.layer_kinds.N={}", "+model.layer_kinds.G.gate=headwise")  # fmt: skip
    out = heads.run(heads.HeadsConfig(source=str(run), windows=2, map_tokens=8, device="cpu", out=str(tmp_path / "h"),
                                      data=DataConfig(cache_dir=str(data_cache))))  # fmt: skip
    with open(out / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["layer"] for row in rows] == ["0", "0", "1", "1"] and GATE in rows[0]
    assert [row[GATE] for row in rows[:2]] == ["nan", "nan"], "layer 0 has no gate"
    assert all(0 < float(row[GATE]) < 1 for row in rows[2:])
    assert "gate: each head's output times a sigmoid of the layer's input" in capsys.readouterr().err
    # the mean is of sigmoid(x W_g): with W_g zero, every gate is exactly 1/2
    model = load_model(str(run)).model.eval()
    x = torch.randint(1, 200, (1, 16))
    assert not torch.equal(gate_means(model, x)[1], torch.full((2,), 0.5)), "a trained gate"
    with torch.no_grad():
        model.transformer.h[1].attn.gate.weight.zero_()
    means = gate_means(model, x)
    assert means[0].isnan().all() and torch.equal(means[1], torch.full((2,), 0.5))
