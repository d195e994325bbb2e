"""The attention grid: layouts x kernels (manual, sdpa, flex) x {multi-head, grouped-query, multi-query}
x {full, sliding window}. Every cell is held to the formula at many shapes, and its cached decoding to a full
recomputation, in test_attention_properties.py; here: weights convert exactly between layouts; flex serves every
length from a few graphs; the plan counts what the model holds; bad values are refused."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import FLEX_ON_CPU_UNAVAILABLE, TINY, compose_train, read_metrics, sharp_gpt, tiny_gpt_config

from model import GPT, KVCache, build_attention, convert_attention_layout, generate, same_function_layouts
from model.attention import AttentionSpec
from model.attention.masks import seen
from training.loop import train
from training.plan import make_plan, param_count

LAYOUTS = same_function_layouts("fused_qkv")
C, H, T = 48, 4, 12
KV_HEADS = {"multi-head": 4, "grouped-query": 2, "multi-query": 1}
WINDOWS = {"full": None, "window 5": 5}


def randomize_(module: torch.nn.Module, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


@pytest.mark.parametrize("n_kv", [2, 1], ids=["grouped-query", "multi-query"])
@pytest.mark.parametrize("src,dst", list(itertools.permutations(LAYOUTS, 2)))
def test_grouped_query_weights_convert_exactly_and_compute_the_same_function(src, dst, n_kv):
    a = build_attention(src, C, H, "sdpa", n_kv_head=n_kv)
    b = build_attention(dst, C, H, "sdpa", n_kv_head=n_kv)
    randomize_(a)
    b.load_state_dict(convert_attention_layout(a.state_dict(), src, dst, n_head=H))
    back = convert_attention_layout(b.state_dict(), dst, src, n_head=H)
    assert back.keys() == a.state_dict().keys() and all(torch.equal(back[k], t) for k, t in a.state_dict().items())
    x = torch.randn(2, T, C)
    torch.testing.assert_close(b(x), a(x), rtol=0, atol=1e-5)
    # The wrapper's members of a group share the notes of its first member: only it owns a key and a value.
    wrapper = a if src == "wrapper" else b if dst == "wrapper" else None
    if wrapper is not None:
        owners = sorted({int(k.split(".")[1]) for k in wrapper.state_dict() if ".key." in k})
        assert owners == list(range(0, H, H // n_kv))


def tiny(layout="fused_qkv", kernel="sdpa", n_kv=None, window=None, block_size=16, seed=1) -> GPT:
    return sharp_gpt(seed, block_size=block_size, n_layer=2, n_head=4, n_embd=64, attention=layout, kernel=kernel,
                     n_kv_head=n_kv, window=window)  # fmt: skip


@pytest.mark.slow
def test_flex_serves_prompts_of_every_length_from_a_few_compiled_graphs():
    # Evaluating or sampling at many lengths must not recompile flex per length (Dynamo gives up after 8 and
    # falls back to an unfused flex): the mask reads its lengths from tensors, and on a CPU lengths are padded.
    if FLEX_ON_CPU_UNAVAILABLE:
        pytest.skip(FLEX_ON_CPU_UNAVAILABLE)
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = tiny(kernel="flex", n_kv=2, block_size=300)
    reference = tiny(kernel="manual", n_kv=2, block_size=300)
    lengths = [*range(2, 42), 97, 127, 128, 129, 200, 257, 300]
    with torch.no_grad():
        for T in lengths:
            idx = torch.randint(0, 50, (1, T))
            torch.testing.assert_close(model(idx, idx)[0], reference(idx, idx)[0], rtol=0, atol=1e-4, msg=f"T={T}")
    graphs = counters["stats"]["unique_graphs"]
    assert graphs <= 4, f"{graphs} compiled graphs for {len(lengths)} lengths"


def test_a_first_fill_longer_than_the_window_keeps_its_last_positions():
    model = tiny(n_kv=2, window=5)
    idx = torch.randint(0, 50, (1, 12))
    with torch.no_grad():
        full, _ = model(idx, idx)
        cache = KVCache(model.config.n_layer)
        model(idx[:, :9], cache=cache)  # 9 positions into a 5-slot ring
        logits, _ = model(idx[:, 9:10], cache=cache)
        torch.testing.assert_close(logits[:, -1], full[:, 9], rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match="a windowed KV cache takes one position at a time once it holds 5"):
            model(idx[:, 10:12], cache=cache)


@pytest.mark.parametrize("kernel", ["sdpa", pytest.param("flex", marks=pytest.mark.slow)])  # flex: 30 s cold
def test_windowed_grouped_query_generation_gives_the_same_choices_with_and_without_the_cache(kernel):
    if kernel == "flex" and FLEX_ON_CPU_UNAVAILABLE:
        pytest.skip(FLEX_ON_CPU_UNAVAILABLE)
    model = tiny(kernel=kernel, n_kv=2, window=6, block_size=16)
    cached = list(generate(model, [3, 1, 4, 1, 5], 40, temperature=0))  # past the window and the context
    uncached = list(generate(model, [3, 1, 4, 1, 5], 40, temperature=0, use_cache=False))
    first_diff = next((i for i, (a, b) in enumerate(zip(cached, uncached)) if a != b), None)
    assert first_diff is None or first_diff > 10, "a near-tie at most, late"  # choices equal up to round-off
    assert len(set(cached)) > 3


@pytest.mark.slow
def test_the_kv_cache_of_a_gpt2_small_shaped_model_with_one_key_value_head_is_a_twelfth():
    sizes = {}
    for n_kv in (12, 1):
        torch.manual_seed(0)
        model = GPT(tiny_gpt_config(vocab_size=64, block_size=1024, n_layer=12, n_head=12, n_embd=768,
                                    n_kv_head=n_kv)).eval()  # fmt: skip
        cache = KVCache(model.config.n_layer)
        with torch.no_grad():
            model(torch.randint(0, 64, (2, 8)), cache=cache)
        sizes[n_kv] = cache.nbytes()
        plan = make_plan(compose_train_config(model.config), model.config, 1, torch.float32)
        assert plan.kv_cache_bytes_per_token * 1024 * 2 == sizes[n_kv], "the plan counts what the cache holds"
    assert sizes[1] * 12 == sizes[12] and sizes[12] == 2 * 12 * 2 * 12 * 1024 * 64 * 4


def compose_train_config(model_config):
    from training.config import TrainConfig

    return TrainConfig(model=model_config)


@pytest.mark.parametrize("n_kv,window", [(2, None), (1, 8), (4, 8)])
def test_the_plan_counts_parameters_and_flops_of_every_cell(n_kv, window):
    config = tiny_gpt_config(vocab_size=300, block_size=24, n_layer=3, n_head=4, n_embd=32, n_kv_head=n_kv,
                             window=window)  # fmt: skip
    model = GPT(config)
    assert param_count(config) == model.num_params()
    plan = make_plan(compose_train_config(config), config, 1, torch.float32)
    assert plan.flops_per_token == model.flops_per_token()


def test_export_of_a_grouped_query_model_gives_transformers_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    from model.checkpoints.gpt2_export import export_hf_gpt2

    model = tiny("wrapper", n_kv=2)
    export_hf_gpt2(model, tmp_path / "hf", eot_id=None)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx, idx)[0], rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="GPT-2 has no sliding-window attention"):
        export_hf_gpt2(tiny(window=4), tmp_path / "hf2", eot_id=None)


def test_head_maps_are_per_query_head_and_see_only_the_window():
    model = tiny("wrapper", "manual", n_kv=1, window=3)
    with torch.no_grad():
        x = model.transformer.wte(torch.randint(0, 50, (2, 10))) + model.transformer.wpe(torch.arange(10))
        maps = model.transformer.h[0].attn.attention_weights(x)
    assert maps.shape == (2, 4, 10, 10)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 4, 10))
    assert (maps[..., ~seen(10, 10, AttentionSpec(16, 2, window=3).masks, torch.device("cpu"))] == 0).all()


def test_grouped_query_windowed_training_gives_every_layout_the_same_losses(tmp_path, data_cache):
    losses = {}
    for layout in ("wrapper", "fused_qkv"):
        run = tmp_path / layout
        train(compose_train(*TINY, "logger=none", f"attention={layout}", "model.n_kv_head=1", "model.window=8",
                            "trainer.max_steps=8", f"trainer.run_dir={run}",
                            f"data.cache_dir={data_cache}"))  # fmt: skip
        losses[layout] = [m["train/loss"] for m in read_metrics(run) if "train/loss" in m]
    assert losses["wrapper"] == pytest.approx(losses["fused_qkv"], abs=1e-4)


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.n_kv_head=3", r"model.n_kv_head=3 does not divide model.n_head=2; choose a divisor of n_head"),
        ("model.window=0", r"model.window=0 must be a positive number of positions, or null"),
        ("model.sdpa_backend=fastest", r"unknown model.sdpa_backend 'fastest'; choose one of: auto, cudnn, efficient"),
        ("kernel=manual model.sdpa_backend=math", r"model.sdpa_backend=math chooses kernel=sdpa's implementation"),
        ("kernel=flex model.dropout=0.1", r"kernel=flex has no attention dropout, but model.dropout=0.1"),
        ("kernel=flex", r"kernel=flex cannot train on a CPU: torch's FlexAttention has no backward there"),
        ("model.sdpa_backend=efficient", r"kernel=sdpa_efficient \(model.sdpa_backend=efficient\) cannot run this "
                                         r"model's attention on cpu \(float32, 2 heads of 16, 2 key/value heads\): "
                                         r".*Backends that can: flash, math; or kernel=sdpa \(PyTorch chooses\)"),
        ("model.n_kv_head=0", r"model.n_kv_head=0 is not a positive divisor of model.n_head=2"),
    ],
)  # fmt: skip
def test_bad_values_are_refused_before_any_work(override, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        train(compose_train(*TINY, *override.split(), "logger=none", f"trainer.run_dir={tmp_path / 'run'}",
                            f"data.cache_dir={tmp_path / 'cache'}"))  # fmt: skip
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()
