"""Llama 4's temperature of the queries (``model.query_temperature``) and its iRoPE schedule (``schedule=llama4``).

The temperature's float64 formula is in tests/attention_reference.py, where the property grid holds every layer that
applies it (its encoding cells, with QK-norm before it: test_attention_properties.py). Here: what it is at the
positions where it is still 1, its refusals, its label, and the schedule that composes it with chunked attention."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import TINY, compose_train
from helpers import tiny_gpt_config as config
from omegaconf import OmegaConf

from model import GPT, build_attention
from model.attention.pipeline import tempered
from model.checkpoints.gpt2_export import what_gpt2_cannot_hold
from model.config import attention_label


@pytest.mark.parametrize("steps", [1, 2, 3, 7, 8])
def test_the_temperature_is_one_before_its_first_step_and_grows_by_the_log_of_the_steps_after(steps):
    positions = torch.arange(5 * steps + 3)
    scale = tempered(torch.ones(len(positions), 1), positions, steps)[:, 0].double()
    # by hand: position i has taken floor((i + 1) / steps) steps; log1p of that, times 0.1
    for i in positions.tolist():
        taken = (i + 1) // steps
        assert abs(scale[i].item() - (1 + 0.1 * torch.log1p(torch.tensor(float(taken))).item())) < 1e-6
    assert scale[: steps - 1].eq(1).all(), "no position before the first step is scaled"
    assert (scale[1:] >= scale[:-1]).all(), "it never falls"


@pytest.mark.parametrize("layout", ["fused_qkv", "separate_qkv", "wrapper", "mla"])
def test_a_block_is_unchanged_before_the_first_step_and_changed_after(layout):
    torch.manual_seed(0)
    extra = {"kv_latent": 16} if layout == "mla" else {}
    plain = build_attention(layout, 32, 4, "manual", position="none", **extra).eval()
    warm = build_attention(layout, 32, 4, "manual", position="none", query_temperature=6, **extra).eval()
    warm.load_state_dict(plain.state_dict())
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        a, b = plain(x), warm(x)
    assert torch.equal(a[:, :5], b[:, :5]), "positions 0..4 take no step of 6: the same function"
    assert not torch.allclose(a[:, 5:], b[:, 5:]), "from position 5 on, the queries are hotter"


def test_bad_values_and_the_layers_that_cannot_apply_it_are_refused():
    for bad in (0, -1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="model.query_temperature=.* must be a positive number of positions"):
            config(query_temperature=bad)
    with pytest.raises(ValueError, match=r"model.query_temperature=17 is longer than the context .*at most 16"):
        config(block_size=16, query_temperature=17)
    with pytest.raises(ValueError, match="model.query_temperature=4 .*gated_deltanet"):
        config(attention="gated_deltanet", position="none", query_temperature=4)
    assert any("model.query_temperature=4" in p for p in what_gpt2_cannot_hold(config(query_temperature=4)))
    assert attention_label(vars(config(position="none", query_temperature=4))) == "fused_qkv-sdpa-nopos-qtemp4"


def test_schedule_llama4_is_chunked_rotary_layers_and_a_nope_layer_with_the_temperature_at_a_quarter_context():
    model_config = OmegaConf.to_object(compose_train(*TINY, "model.n_layer=4", "schedule=llama4")).model
    quarter = model_config.block_size // 4
    assert model_config.layer_pattern == "RRRN"
    assert model_config.layer_kinds == {"R": {"attention_chunk": quarter},
                                        "N": {"position": "none", "query_temperature": quarter}}  # fmt: skip
    assert model_config.cache_capacities[:3] == [quarter] * 3, "a rotary layer's ring holds one chunk"
    assert attention_label(vars(model_config)).endswith(f"-rope-RRRN_R.chunked{quarter}_N.nopos.qtemp{quarter}")
    GPT(dataclasses.replace(model_config, vocab_size=64))  # it builds
    with pytest.raises(ValueError, match=r"model.layer_kinds.R.attention_chunk is a schedule's share of the context, "
                                         r"model.block_size=3 / 4, which rounds down to 0"):  # fmt: skip
        OmegaConf.to_object(compose_train(*TINY, "model.n_layer=4", "schedule=llama4", "model.block_size=3"))
