"""The score modifications (model.qk_norm, model.softcap, model.sinks) and the position options: what each one
does to the attention that the formula says it must, and every bad value refused before any work, in one line
naming the value and the fix (through GPTConfig and through train.py, a real process).

The float64 formula of each (tests/attention_reference.py) holds every layout x kernel cell to it at many lengths
(tests/test_attention_properties.py); these are the properties that follow from the formulas themselves.
"""

from __future__ import annotations

import math
import subprocess

import pytest
import torch
from attention_reference import REFERENCED_MODS
from helpers import GPT2_LAYOUTS, random_block, run_script
from helpers import tiny_gpt_config as config

from analysis.plots import legend_title
from analysis.report import COLUMNS, shown_columns
from measuring import bench_command, cells
from model.attention.modifications import Activations, with_fields
from model.checkpoints.gpt2_export import what_gpt2_cannot_hold
from model.config import LABEL_AXES, attention_label
from model.registry import KERNELS, MODIFICATIONS
from training.plan import activation_bytes

LAYOUTS = GPT2_LAYOUTS


@pytest.mark.parametrize(("options", "expected"), [
    (dict(position="rotary"), "unknown model.position 'rotary'; choose one of: alibi, learned, none, path, rope"),
    (dict(softcap=0), "model.softcap=0 must be a finite positive number"),
    (dict(softcap=-2.5), "model.softcap=-2.5 must be a finite positive number"),
    (dict(softcap=True), "model.softcap=True must be a finite positive number"),
    (dict(softcap=math.nan), "model.softcap=nan must be a finite positive number"),  # NaN compares false
    (dict(softcap=math.inf), "model.softcap=inf must be a finite positive number"),
    (dict(kernel="sdpa", softcap=30.0), "model.softcap=30.0 changes the scores before the softmax, which kernel=sdpa "
                                        "cannot do; use kernel=manual or flex"),
    (dict(kernel="sdpa_math", softcap=30.0), "which kernel=sdpa cannot do; use kernel=manual or flex"),
    (dict(position="rope", n_embd=60, n_head=4), "model.position=rope turns pairs of a head's dimensions, but the "
                                                 "head dim n_embd/n_head = 60/4 = 15 is odd"),
    (dict(position="rope", rope_theta=1), "model.rope_theta=1 must be a finite number above 1"),
    (dict(position="rope", rope_theta=-10000.0), "model.rope_theta=-10000.0 must be a finite number above 1"),
    (dict(position="rope", rope_theta=math.nan), "model.rope_theta=nan must be a finite number above 1"),
    (dict(position="rope", rope_theta=math.inf), "model.rope_theta=inf must be a finite number above 1"),
    (dict(qk_norm="yes"), "model.qk_norm='yes' must be true or false"),
    (dict(qk_norm=1), "model.qk_norm=1 must be true or false"),
    (dict(sinks="no"), "model.sinks='no' must be true or false"),
    (dict(gate="sigmoid"), "model.gate='sigmoid'; choose one of: none, headwise, elementwise"),
    (dict(gate=True), "model.gate=True; choose one of: none, headwise, elementwise"),
    (dict(position="rope", rope_fraction=0), "model.rope_fraction=0 must be in (0, 1]"),
    (dict(position="rope", rope_fraction=1.5), "model.rope_fraction=1.5 must be in (0, 1]"),
    (dict(position="rope", rope_fraction=math.nan), "model.rope_fraction=nan must be in (0, 1]"),
    (dict(position="rope", rope_fraction=True), "model.rope_fraction=True must be in (0, 1]"),
    (dict(position="rope", rope_fraction=0.3), "model.rope_fraction=0.3 turns 0.3 x 8 = 2.4 of each head's 8 dims; "
                                               "rotary turns pairs: choose a fraction that turns an even whole "
                                               "number of them (0.25, 0.5, 0.75, ...)"),
    (dict(position="rope", rope_fraction=0.375), "turns 0.375 x 8 = 3 of each head's 8 dims"),
    (dict(position="alibi", rope_fraction=0.5), "model.rope_fraction=0.5 is the share of each head's dims that "
                                                "rotary turns, but model.position=alibi turns nothing"),
    (dict(position="rope", attention="mla", kv_latent=16, rope_head_dim=4, rope_fraction=0.5),
     "model.rope_fraction=0.5: attention=mla turns a rotary part of its own (model.rope_head_dim)"),
])  # fmt: skip
def test_a_bad_value_is_refused_by_the_config_naming_it(options, expected):
    with pytest.raises(ValueError) as refused:
        config(**{"kernel": "manual", **options})
    message = str(refused.value)
    assert expected in message, message
    assert "\n" not in message


@pytest.mark.parametrize("name", MODIFICATIONS)
def test_each_modification_is_checked_named_shown_benched_and_refused_for_gpt2_as_its_class_says(name):
    """Everything a modification means outside its arithmetic is asked of its registered class: a new one appears
    in every place below without another file naming it (issue 37)."""
    mod = MODIFICATIONS[name]
    assert name in REFERENCED_MODS, f"{name} has no float64 reference in tests/attention_reference.py"
    kernel = next(k for k, cls in KERNELS.items() if name in cls.applies or not mod.on_scores)
    model = config(**{mod.field: mod.example}, kernel=kernel, n_head=4)
    assert mod.used(getattr(model, mod.field)) and not mod.used(mod.off)
    assert (name in model.attention_spec.score_mods) == mod.on_scores
    label = attention_label(vars(model))
    problems = " ".join(what_gpt2_cannot_hold(model))
    assert mod.option(mod.example) in problems or mod.gpt2_lacks is None
    if mod.column is None:  # ALiBi: its position encoding's part, column and flag say it
        return
    part = mod.label(mod.example)
    assert label.endswith(f"-{part}") and mod.field in LABEL_AXES
    assert mod.label_title in legend_title([label])
    row = {mod.field: mod.row_value(mod.example)}
    assert (mod.field, mod.column) in COLUMNS and (mod.field, mod.column) in shown_columns([row])
    assert (mod.field, mod.column) not in shown_columns([{mod.field: mod.row_value(mod.off)}])
    args = bench_command.parse_args(["--kernels", kernel, f"--{mod.flag()}", mod.bench_off, str(mod.example).lower()])
    assert getattr(args, mod.field) == [mod.off, mod.example]
    assert [cell[mod.field] for cell in cells.attention_cells(args)][-2:] == [mod.off, mod.example]
    with pytest.raises(SystemExit):
        bench_command.parse_args([f"--{mod.flag()}", "sideways"])
    with pytest.raises(ValueError, match=rf"model\.{mod.field}='sideways'"):
        config(**{mod.field: "sideways"}, kernel=kernel)


def test_the_plan_counts_what_each_modification_keeps_as_its_class_says():
    """The activation memory a modification adds to the plan is its own term (``plan_bytes``), and no other."""
    plain = config(kernel="manual", n_head=4)
    n = 2 * plain.block_size * plain.n_embd  # one query tensor of a micro-batch of 2
    for mod in with_fields():
        used = config(**{mod.field: mod.example}, kernel="manual", n_head=4)
        added = sum(activation_bytes(used, 2, torch.float32).values()) - sum(
            activation_bytes(plain, 2, torch.float32).values())
        forward = Activations(2, plain.block_size, plain.n_head, n, 1.0)
        assert added == plain.n_layer * int(mod.plan_bytes(forward)), mod.name


def train_plan(*overrides: str, cwd) -> subprocess.CompletedProcess:
    """``python train.py model=nano <overrides> trainer.plan=true``, as a user runs it (no full tracebacks)."""
    return run_script("train.py", "model=nano", *overrides, "trainer.plan=true", "logger=none", cwd=cwd, timeout=120)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["model.position=rotary"], "error: unknown model.position 'rotary'; choose one of: alibi, learned, none, path, "
                                "rope"),
    (["kernel=sdpa", "model.softcap=30"], "error: model.softcap=30.0 changes the scores before the softmax, which "
                                          "kernel=sdpa cannot do; use kernel=manual or flex"),
    (["model.position=rope", "model.n_embd=60", "model.n_head=4"], "the head dim n_embd/n_head = 60/4 = 15 is odd"),
    # the command line's spellings of what is no number: 1e400 is read as an infinity
    (["model.position=rope", "model.rope_theta=1e400"], "error: model.rope_theta=inf must be a finite number"),
    (["model.position=rope", "model.rope_theta=nan"], "error: model.rope_theta=nan must be a finite number"),
    (["kernel=manual", "model.softcap=inf"], "error: model.softcap=inf must be a finite positive number"),
])  # fmt: skip
@pytest.mark.slow
def test_train_plan_refuses_a_bad_value_in_one_line_before_any_work(overrides, expected, tmp_path):
    result = train_plan(*overrides, cwd=tmp_path)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert result.stdout == "", "refused before the plan"
    written = sorted(p.name for p in tmp_path.rglob("*") if p.is_file() and ".hydra" not in p.parts)
    assert written in ([], ["train.log"]), f"nothing but Hydra's own folder: {written}"


def test_train_plan_takes_the_new_values(tmp_path):
    result = train_plan("model.position=rope", "model.qk_norm=true", "model.softcap=30", "kernel=manual",
                        "model.sinks=true", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "parameters" in result.stdout, result.stdout


def block_with(layout: str, seed: int = 0, **options) -> torch.nn.Module:
    return random_block(layout, "manual", 0.5, seed, **options)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_softcap_bounds_the_odds_between_any_two_keys_a_query_sees(layout):
    # Capped scores lie in (-c, c): two weights of a row differ by a factor e^(2c) at most, however sharp the
    # attention is without the cap (it is: the weights' ratio passes e^2 there).
    x = torch.randn(2, 20, 32, generator=torch.Generator().manual_seed(1)) * 3
    for cap, bounded in ((None, False), (1.0, True)):
        weights = block_with(layout, softcap=cap).attention_weights(x)
        seen = torch.ones(20, 20, dtype=torch.bool).tril()
        odds = weights.masked_fill(~seen, 0.0).amax(-1) / weights.masked_fill(~seen, float("inf")).amin(-1)
        assert bool((odds <= torch.e**2 * (1 + 1e-5)).all()) is bounded, (cap, odds.max().item())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_sink_takes_weight_from_every_key_alike_and_more_the_larger_it_is(layout):
    x = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(2))
    block = block_with(layout, sinks=True)
    with torch.no_grad():
        block.sinks.fill_(float("-inf"))  # e^-inf = 0 in the denominator: no sink
    plain = block.attention_weights(x)
    torch.testing.assert_close(plain.sum(-1), torch.ones(1, 4, 12))
    totals = []
    for logit in (-100.0, 0.0, 2.0, 200.0):  # the scores here reach about 30
        with torch.no_grad():
            block.sinks.fill_(logit)
        weights = block.attention_weights(x)
        total = weights.sum(-1, keepdim=True)  # the keys' share; the sink took the rest
        torch.testing.assert_close(weights, plain * total, atol=1e-6, rtol=1e-5)  # each key's share alike
        totals.append(total)
    assert torch.allclose(totals[0], torch.ones_like(totals[0])), "a sink at -100 takes nothing"
    for smaller, larger in zip(totals[1:], totals[2:]):  # a larger sink leaves the keys less (where it shows)
        assert bool((larger <= smaller).all()) and bool((larger < smaller).any())
    assert totals[3].max().item() < 1e-6, "a sink at +200 takes everything"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_qk_norm_makes_attention_blind_to_the_scale_of_queries_and_keys(layout):
    # RMSNorm divides out each head's query and key length: scaling their projections changes nothing (up to
    # eps); without QK-norm the same scaling sharpens the attention.
    x = torch.randn(2, 15, 32, generator=torch.Generator().manual_seed(3))
    for qk_norm in (True, False):
        block = block_with(layout, qk_norm=qk_norm)
        before = block(x)
        with torch.no_grad():
            for name, p in block.named_parameters():
                if any(part in name for part in ("query", "key", "c_attn")):
                    p.mul_(5.0)
            if layout == "fused_qkv":  # c_attn holds the values too: leave them as they were
                block.c_attn.weight[-32:] /= 5.0
                block.c_attn.bias[-32:] /= 5.0
        same = torch.allclose(block(x), before, atol=1e-5, rtol=1e-4)
        assert same is qk_norm, f"qk_norm={qk_norm}"


@pytest.mark.parametrize("options", [dict(position="alibi"), dict(sinks=True),
                                     dict(position="alibi", sinks=True, window=5)])
def test_sdpa_builds_the_float_mask_once_per_forward_for_every_layer(options, monkeypatch):
    # The mask (0 where a key is seen, -inf where not, plus ALiBi's bias) is the same in every layer: built once per
    # forward, and again for the next forward's positions; not once per layer.
    from model import GPT
    from model.attention import kernels

    built = []
    build = kernels.seen
    monkeypatch.setattr(kernels, "seen", lambda *args: built.append(args) or build(*args))
    torch.manual_seed(0)
    model = GPT(config(n_layer=3, n_head=4, n_embd=32, block_size=16, kernel="sdpa", **options)).eval()
    idx = torch.randint(0, 50, (2, 11))
    with torch.no_grad():
        model(idx)
        assert len(built) == 1, built
        model(idx)
    assert len(built) == 2, "the next forward's positions are another tensor: built again"
