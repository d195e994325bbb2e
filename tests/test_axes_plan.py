"""The plan of a model on the new axes: parameters and FLOPs as the model counts them, the KV cache's bytes per
token from the layout's ``cache_width`` (multi-head, grouped-query, multi-query, latent), and the presets'
plans (``experiment=compare_positions|compare_score_mods|compare_latent`` and their ``_gpu`` twins)."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import run_cli

from model import GPT, GPTConfig, KVCache, registry
from training.config import TrainConfig
from training.plan import activation_bytes, make_plan

SHAPE = dict(vocab_size=64, block_size=32, n_layer=3, n_head=4, n_embd=64)
CACHES = [
    (dict(), "multi-head", 2 * 4 * 16),
    (dict(n_kv_head=2), "grouped-query: 2 key/value heads for 4", 2 * 2 * 16),
    (dict(n_kv_head=1), "multi-query: 1 key/value head for 4", 2 * 16),
    (dict(attention="mla", kv_latent=24), "latent: 24 latent dims", 24),
    (dict(attention="mla", kv_latent=24, position="rope", rope_head_dim=8),
     "latent: 24 latent dims + a rotary key of 8", 24 + 8),
]  # fmt: skip


@pytest.mark.parametrize("options,kind,width", CACHES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_plans_kv_cache_is_layers_times_cache_width_times_bytes_and_what_the_cache_holds(options, kind, width,
                                                                                            dtype):  # fmt: skip
    config = GPTConfig(**SHAPE, **options)
    assert registry.mixer(config.attention).cache_width(config.attention_spec) == width
    plan = make_plan(TrainConfig(model=config), config, 1, dtype)
    assert plan.kv_cache_bytes_per_token == config.n_layer * width * (torch.finfo(dtype).bits // 8)
    line = next(line for line in plan.text().splitlines() if "sampling's KV cache" in line)
    assert f"({kind}; {width} numbers per layer x 3 layers, {str(dtype).removeprefix('torch.')})" in line
    if dtype == torch.float32:  # what a real cache holds: 2 samples x 32 positions of capacity
        model = GPT(config).eval()
        cache = KVCache(config.n_layer)
        with torch.no_grad():
            model(torch.randint(0, 64, (2, 8)), cache=cache)
        assert cache.nbytes() == plan.kv_cache_bytes_per_token * 2 * config.block_size


@pytest.mark.parametrize(
    "options",
    [dict(position="rope"), dict(position="alibi", kernel="manual"), dict(position="none"), dict(qk_norm=True),
     dict(sinks=True, kernel="manual"), dict(softcap=30.0, kernel="manual"), dict(attention="mla", kv_latent=24),
     dict(attention="mla", kv_latent=24, position="rope", rope_head_dim=8, qk_norm=True), dict(differential=True),
     dict(sparse_topk=8), dict(attention="mla", kv_latent=24, sparse_topk=8, indexer_dim=16),
     dict(position="none", query_temperature=8, attention_chunk=8)],
)  # fmt: skip
def test_the_plan_counts_the_parameters_and_flops_the_model_counts(options):
    config = GPTConfig(**SHAPE, **options)
    model = GPT(config)
    plan = make_plan(TrainConfig(model=config), config, 1, torch.float32)
    assert plan.params == model.num_params() and plan.flops_per_token == model.flops_per_token()
    learned = GPT(GPTConfig(**SHAPE))
    if config.position != "learned":  # no position table: block_size x n_embd fewer, and none of them in FLOPs
        assert model.position_params() == 0 and learned.num_params() - model.num_params() >= 32 * 64 - 2 * 3 * 16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_memory_estimate_counts_qk_norm_and_rotary_and_nothing_for_a_default_model(dtype):
    plain = activation_bytes(GPTConfig(**SHAPE), 4, dtype)
    assert "query/key encodings" not in plain, "a default model's estimate as before"
    encoded = activation_bytes(GPTConfig(**SHAPE, position="rope", qk_norm=True), 4, dtype)
    assert encoded["query/key encodings"] > 0
    assert {k: v for k, v in encoded.items() if k != "query/key encodings"} == plain
    mla = activation_bytes(GPTConfig(**SHAPE, attention="mla", kv_latent=24), 4, dtype)
    assert sum(mla.values()) > 0  # the layout states its input casts (input_casts) like the others


PRESETS = {
    "compare_positions": ["fused_qkv + sdpa)", "fused_qkv + sdpa; rope)", "fused_qkv + sdpa; alibi)",
                          "fused_qkv + sdpa; nopos)"],
    "compare_score_mods": ["fused_qkv + manual)", "fused_qkv + manual; qknorm)", "fused_qkv + manual; softcap20)",
                           "fused_qkv + manual; sinks)", "fused_qkv + manual; forget)"],
    "compare_latent": ["fused_qkv + sdpa)", "fused_qkv + sdpa; kv2)", "fused_qkv + sdpa; kv1)",
                       "mla + sdpa; latent85)"],
    "compare_positions_gpu": ["fused_qkv + flex)", "fused_qkv + flex; rope)", "fused_qkv + flex; alibi)",
                              "fused_qkv + flex; nopos)"],
    "compare_score_mods_gpu": ["fused_qkv + flex)", "fused_qkv + flex; qknorm)", "fused_qkv + flex; softcap20)",
                               "fused_qkv + flex; sinks)"],
    "compare_latent_gpu": ["fused_qkv + sdpa)", "fused_qkv + sdpa; kv4)", "fused_qkv + sdpa; kv1)",
                           "mla + sdpa; latent512)"],
}  # fmt: skip


@pytest.mark.parametrize("experiment", sorted(PRESETS))
@pytest.mark.slow
def test_each_preset_plans_its_variants(experiment, tmp_path):
    result = run_cli(f"experiment={experiment}", "trainer.plan=true", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert f"would run {len(PRESETS[experiment])} runs" in out
    plans = re.findall(r"^plan: \w+ \((.*?\)), ([\d,]+) parameters", out, flags=re.M)
    assert [how for how, _ in plans] == PRESETS[experiment]
    assert not list(tmp_path.iterdir()) or not any(tmp_path.rglob("metrics.jsonl")), "a plan trains nothing"
    if experiment.startswith("compare_latent"):
        params = [int(p.replace(",", "")) for _, p in plans]
        mha, gqa, mqa, mla = params
        assert mqa < gqa < mha and abs(mla - mha) / mha < 2e-4, "MLA at multi-head's parameters"
        caches = re.findall(r"sampling's KV cache: ([\d.]+) KiB", out)
        expected = ["4.0", "2.0", "1.0", "1.3"] if experiment == "compare_latent" else ["36.0", "12.0", "3.0", "12.0"]
        assert caches == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "options",
    [dict(position="rope"), dict(qk_norm=True), dict(position="rope", qk_norm=True),
     dict(attention="mla", kv_latent=32), dict(attention="mla", kv_latent=32, position="rope", rope_head_dim=8),
     dict(attention="gated_deltanet", position="none"), dict(differential=True),
     dict(differential=True, position="rope", attention_chunk=16, n_kv_head=2), dict(sparse_topk=16),
     dict(sparse_topk=16, position="rope", kernel="manual", indexer_heads=2, indexer_dim=16),
     dict(position="rope", layer_pattern="DG", layer_kinds={"D": {"attention": "gated_deltanet", "position": "none"},
                                                            "G": {}})],
)  # fmt: skip
def test_the_memory_estimate_of_the_new_axes_is_within_25_percent_of_what_autograd_saves(options, dtype):
    from test_gpu_readiness import saved_tensor_bytes

    config = GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=4, n_embd=64, **options)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        measured = saved_tensor_bytes(GPT(config), torch.randint(0, 257, (4, 64)))
    estimated = sum(activation_bytes(config, 4, dtype).values())
    assert abs(estimated - measured) / measured < 0.25, (estimated, measured)
