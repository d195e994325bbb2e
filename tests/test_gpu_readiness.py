"""What a GPU run relies on, checked on a CPU: the plan and its memory estimate, MFU peaks by name,
precision choice, fp16 with a loss scaler, identical starts, per-run memory, failed jobs, warm-up."""

from __future__ import annotations

import functools
import itertools
import json
import re
from pathlib import Path

import pytest
import torch
from helpers import CONFIGS, CPU_KERNELS, TINY, compose_train, read_metrics, run_script
from omegaconf import OmegaConf

import compare
from analysis.runs import load_run
from model import GPT, GPTConfig, convert_attention_layout, same_function_layouts
from model.checkpoints.checkpoint import load_checkpoint
from model.device import peak_tflops, resolve_dtype
from training.config import grad_accum_steps
from training.loop import RunFailed, train
from training.plan import AUTO_HEADROOM, activation_bytes, auto_micro_batch, check_fits_device, make_plan, param_count

LAYOUTS, KERNEL_NAMES = same_function_layouts("fused_qkv"), CPU_KERNELS


@pytest.mark.parametrize(
    "name,bf16",
    [
        ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100-PCIE-40GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0), ("NVIDIA L40", 181.0),
        ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0), ("NVIDIA A10", 125.0), ("NVIDIA A10G", None),
        ("NVIDIA A40", 149.7), ("NVIDIA A30", 165.0), ("NVIDIA GeForce RTX 4090", 165.2),
        ("NVIDIA GeForce RTX 3090", 71.0), ("NVIDIA GeForce RTX 3090 Ti", 71.0), ("Tesla T4", None),
        ("NVIDIA RTX A6000", None),
    ],
)  # fmt: skip
def test_mfu_peaks_match_whole_device_names(name, bf16):
    assert peak_tflops(name, torch.bfloat16) == bf16
    assert peak_tflops(name, torch.float32) is None


def test_fp16_peaks_for_pre_ampere_gpus():
    assert peak_tflops("Tesla T4", torch.float16) == 65.0
    assert peak_tflops("Tesla V100-SXM2-16GB", torch.float16) == 125.0


@pytest.mark.parametrize("capability,expected", [((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16),
                                                 ((7, 5), torch.float16), ((7, 0), torch.float16)])  # fmt: skip
def test_auto_precision_uses_bf16_only_where_it_is_native(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a GPU")
    assert resolve_dtype("auto", torch.device("cuda:0")) == expected
    if expected == torch.float16:
        with pytest.raises(ValueError, match=r"trainer.dtype=bfloat16 but a GPU has no native bf16.*float16"):
            resolve_dtype("bfloat16", torch.device("cuda:0"))


def test_every_layout_starts_from_the_same_weights():
    config = dict(vocab_size=100, block_size=16, n_layer=2, n_head=4, n_embd=32)
    states = {}
    for layout in LAYOUTS:
        torch.manual_seed(7)
        model = GPT(GPTConfig(**config, attention=layout))
        states[layout] = convert_attention_layout(model.state_dict(), layout, "fused_qkv")
    for layout in LAYOUTS[1:]:
        assert states[layout].keys() == states[LAYOUTS[0]].keys()
        for key, tensor in states[LAYOUTS[0]].items():
            assert torch.equal(states[layout][key], tensor), (layout, key)


@functools.cache
def composed(*overrides: str):
    """``compose_train(*overrides)``, composed once for this module: several tests read the same presets."""
    return compose_train(*overrides)


def preset(*overrides: str):
    """The composed config as train.py's objects, a fresh copy for each caller."""
    return OmegaConf.to_object(composed(*overrides))


def gpu_experiments() -> dict:
    """Each experiment whose trainer runs on CUDA: its name -> its trainer settings."""
    trainers = {p.stem: preset(f"experiment={p.stem}").trainer for p in (CONFIGS / "experiment").glob("*.yaml")}
    return {name: trainer for name, trainer in trainers.items() if trainer.device == "cuda"}


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
@pytest.mark.slow
def test_every_gpu_experiment_splits_its_batch_over_1_2_4_8_ranks(world_size):
    experiments = gpu_experiments()
    assert {"gpt2_small", "compare_attention_gpu"} <= set(experiments)
    for trainer in experiments.values():
        if trainer.micro_batch_size == "auto":  # the micro-batch is chosen on the device, from the rank's share
            assert trainer.batch_size % world_size == 0
            grad_accum_steps(trainer, world_size)  # raises if the batch does not split
        else:
            assert grad_accum_steps(trainer, world_size) >= 1


def test_the_gpu_preset_prints_its_plan_on_a_cpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU, as a laptop
    summary = train(compose_train("experiment=compare_attention_gpu", "trainer.plan=true"))
    out = capsys.readouterr().out
    assert "124,475,904 parameters" in out and "micro-batch 64 x 1024 tokens, 1 accumulation step(s)" in out
    assert "micro-batch auto: planned above for an 80 GiB GPU (an H100; none is here)" in out
    assert "40 GiB free -> 32 (estimated 31.1 GiB); 24 GiB free -> 16" in out
    assert "estimated peak memory per GPU (bfloat16 autocast, eager)" in out and "(an estimate)" in out
    assert summary["plan"].peak_bytes < AUTO_HEADROOM * 80 * 2**30


@pytest.mark.parametrize("free_gib,expected", [(80, 64), (40, 32), (24, 16), (12, 8), (4, 1)])
def test_auto_micro_batch_is_the_largest_divisor_of_the_batch_the_plan_fits(free_gib, expected):
    cfg = preset("experiment=compare_attention_gpu")
    planned = GPTConfig(**{**vars(cfg.model), "vocab_size": 50257})
    micro = auto_micro_batch(cfg, planned, 1, torch.bfloat16, free_gib * 2**30)
    assert micro == expected and 64 % micro == 0
    budget = AUTO_HEADROOM * free_gib * 2**30
    assert make_plan(cfg, planned, 1, torch.bfloat16, micro_batch=micro).peak_bytes <= budget
    if micro < 64:  # the next divisor up would not fit
        bigger = next(m for m in range(micro + 1, 65) if 64 % m == 0)
        assert make_plan(cfg, planned, 1, torch.bfloat16, micro_batch=bigger).peak_bytes > budget


def test_auto_micro_batch_that_cannot_fit_one_sequence_is_a_clear_error():
    cfg = preset("experiment=compare_attention_gpu", "kernel=manual")
    planned = GPTConfig(**{**vars(cfg.model), "vocab_size": 50257})
    with pytest.raises(ValueError, match=r"micro_batch_size=auto: not even one sequence fits; it needs an estimated "
                                         r"3.6 GiB and 85% of the 1.0 GiB free is 0.8 GiB"):  # fmt: skip
        auto_micro_batch(cfg, planned, 1, torch.bfloat16, 2**30)


def test_auto_micro_batch_on_a_cpu_run_splits_nothing(tmp_path, data_cache):
    summary = train(tiny(tmp_path, data_cache, "run", "trainer.micro_batch_size=auto", "trainer.max_steps=2"))
    info = json.loads((Path(summary["run_dir"]) / "run.json").read_text())
    assert info["trainer"]["micro_batch_size"] == 8, "the whole batch of 8 fits a CPU's memory: no accumulation"


@pytest.mark.parametrize("value", ["atuo", 0, -2])
def test_a_bad_micro_batch_is_refused_naming_auto(value):
    with pytest.raises(ValueError, match=f"trainer.micro_batch_size={value!r} must be a positive number of sequences, "
                                         r"null \(a rank's whole share of the batch\) or auto"):  # fmt: skip
        train(compose_train(*TINY, f"trainer.micro_batch_size={value}"))


@pytest.mark.parametrize("layout,kernel", list(itertools.product(LAYOUTS, KERNEL_NAMES)))
def test_every_variant_of_the_gpu_preset_finds_a_micro_batch_on_a_40gb_card(layout, kernel):
    cfg = preset("experiment=compare_attention_gpu", f"attention={layout}", f"kernel={kernel}")
    planned = GPTConfig(**{**vars(cfg.model), "vocab_size": 50257})
    micro = auto_micro_batch(cfg, planned, 1, torch.bfloat16, 40 * 2**30)
    plan = make_plan(cfg, planned, 1, torch.bfloat16, micro_batch=micro)
    assert micro >= 8 and plan.peak_bytes < 40 * 2**30
    assert plan.params == param_count(plan.config)


def test_parameter_count_formula_matches_the_model():
    for bias in (True, False):
        config = GPTConfig(vocab_size=300, block_size=24, n_layer=3, n_head=4, n_embd=32, bias=bias)
        assert param_count(config) == GPT(config).num_params()


def saved_tensor_bytes(model: GPT, idx: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd keeps for backward, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and t.is_floating_point():
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)[1].backward()
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout,kernel", list(itertools.product(LAYOUTS, KERNEL_NAMES)))
def test_activation_estimate_is_within_25_percent_of_what_autograd_saves(layout, kernel, dtype):
    config = GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=4, n_embd=64, attention=layout, kernel=kernel)
    model = GPT(config)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        measured = saved_tensor_bytes(model, torch.randint(0, 257, (4, 64)))
    estimated = sum(activation_bytes(config, 4, dtype).values())
    assert abs(estimated - measured) / measured < 0.25, (estimated, measured)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout,kernel", [("fused_qkv", "manual"), ("wrapper", "sdpa"), ("mla", "manual"),
                                           ("mla", "sdpa")])  # fmt: skip
def test_nsa_activation_estimate_counts_its_three_branches(layout, kernel, dtype):
    """NSA runs two kernel calls and a compressed attention where a dense layer runs one call: its plan term
    (``NativeSparseAttention.plan_bytes``) is within 25% of what autograd saves, where the dense term alone is not."""
    assert_selection_activations(layout, kernel, dtype, dict(nsa_block=8, nsa_window=16), dense_short_by=0.25)


def assert_selection_activations(layout: str, kernel: str, dtype: torch.dtype, options: dict,
                                 dense_short_by: float) -> None:  # fmt: skip
    """A key selection's plan term (its ``plan_part``) brings the plan's activations within 25% of what autograd saves
    for a 2-layer model of ``layout`` with the selection's ``options``, where the dense terms alone fall short of it
    by more than ``dense_short_by`` (else the test would prove nothing)."""
    from model.attention.selection import selection_of

    extra = {"kv_latent": 16} if layout == "mla" else {}
    config = GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=4, n_embd=64, attention=layout, kernel=kernel,
                       **options, **extra)  # fmt: skip
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        measured = saved_tensor_bytes(GPT(config), torch.randint(0, 257, (4, 64)))
    parts = activation_bytes(config, 4, dtype)
    assert abs(sum(parts.values()) - measured) / measured < 0.25, (parts, measured)
    dense = sum(parts.values()) - parts[selection_of(config.attention_spec).plan_part]
    assert (measured - dense) / measured > dense_short_by, "the dense terms alone would have passed: it proves nothing"


def test_a_run_that_would_not_fit_the_gpu_is_refused_naming_a_micro_batch_that_fits():
    cfg = preset("experiment=compare_attention_gpu", "kernel=manual", "trainer.micro_batch_size=64")
    plan = make_plan(cfg, GPTConfig(**{**vars(cfg.model), "vocab_size": 50257}), 1, torch.bfloat16)
    with pytest.raises(ValueError, match=r"micro_batch_size=64 needs an estimated [\d.]+ GiB .* the GPU has 40.0 GiB; "
                                         r"set trainer.micro_batch_size=(16|8)"):  # fmt: skip
        check_fits_device(plan, torch.device("cuda"), total_bytes=40 * 2**30)


def test_a_cpu_run_that_would_not_fit_the_ram_is_refused_in_one_line_before_any_work(tmp_path):
    from model.device import available_memory

    # ~627 GiB of float32 weights, optimizer state and activations: more than any test machine's RAM
    result = run_script("train.py", "model=nano", "model.n_embd=8192", "model.n_layer=48", "model.n_head=64",
                        "trainer.device=cpu", "logger=none", f"trainer.run_dir={tmp_path / 'run'}", cwd=tmp_path)
    available = available_memory(torch.device("cpu"))
    if available is None:
        pytest.skip("no /proc/meminfo: the RAM available is unknown here")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert re.fullmatch(r"error: out of memory expected: trainer.micro_batch_size=16 needs an estimated [\d.]+ GiB "
                        r"of RAM per process \(fused_qkv \+ sdpa\), this machine has [\d.]+ GiB of RAM available; "
                        r"no micro-batch fits: use a smaller model or block_size. `trainer.plan=true` shows the "
                        r"estimate", line), line  # fmt: skip
    assert not (tmp_path / "run").exists(), "refused before the run directory is made"


def tiny(tmp_path: Path, data_cache: Path, name: str, *overrides: str):
    return compose_train(*TINY, "logger=none", f"trainer.run_dir={tmp_path / name}", f"data.cache_dir={data_cache}",
                         *overrides)  # fmt: skip


def test_fp16_autocast_with_a_loss_scaler_trains_and_saves_its_scale(tmp_path, data_cache):
    train(tiny(tmp_path, data_cache, "fp16", "trainer.dtype=float16", "trainer.max_steps=30"))
    losses = [m["train/loss"] for m in read_metrics(tmp_path / "fp16") if "train/loss" in m]
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5
    scales = [m["train/loss_scale"] for m in read_metrics(tmp_path / "fp16") if "train/loss_scale" in m]
    assert len(scales) == 30 and all(s > 0 for s in scales)
    assert load_checkpoint(tmp_path / "fp16").grad_scaler["scale"] == scales[-1]


@pytest.mark.slow
def test_each_job_reports_its_own_peak_memory(tmp_path, data_cache):
    big = ("model.n_layer=2", "model.n_embd=256", "model.n_head=4", "model.block_size=128",
           "trainer.batch_size=64", "trainer.micro_batch_size=64", "trainer.max_steps=2")  # fmt: skip
    train(tiny(tmp_path, data_cache, "big", *big))
    train(tiny(tmp_path, data_cache, "small", "trainer.max_steps=2"))
    peak = {name: max(m["perf/max_rss_mb"] for m in read_metrics(tmp_path / name) if "perf/max_rss_mb" in m)
            for name in ("big", "small")}  # fmt: skip
    assert peak["small"] < peak["big"] - 100, peak


def test_an_out_of_memory_job_is_recorded_and_the_next_job_and_the_report_go_on(tmp_path, data_cache, monkeypatch):
    from training import step as step_module

    real_call = step_module.TrainStep.__call__

    def out_of_memory(self, step):
        if step == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected)")
        return real_call(self, step)

    sweep = tmp_path / "sweep"
    with monkeypatch.context() as patch:
        patch.setattr(step_module.TrainStep, "__call__", out_of_memory)
        expected = r"out of memory at trainer.micro_batch_size=8; try trainer.micro_batch_size=4"
        with pytest.raises(RunFailed, match=expected):
            train(tiny(sweep, data_cache, "0_wrapper-sdpa", "attention=wrapper", "trainer.max_steps=10"))
    train(tiny(sweep, data_cache, "1_fused_qkv-sdpa", "trainer.max_steps=10"))

    failure = json.loads((sweep / "0_wrapper-sdpa" / "failure.json").read_text())["reason"]
    assert failure.startswith("out of memory at trainer.micro_batch_size=8")
    out = compare.main([str(sweep)])
    report = (out / "report.md").read_text()
    assert "| wrapper | sdpa |" in report and "FAILED: out of memory at trainer.micro_batch_size=8" in report
    fused_row = next(line for line in report.splitlines() if line.startswith("| fused_qkv"))
    assert "FAILED" not in fused_row and fused_row.count(" - ") < 4, "the healthy run keeps its numbers"


def test_a_slow_first_step_changes_time_to_target_by_no_more_than_that_step(tmp_path, data_cache):
    train(tiny(tmp_path, data_cache, "run", "trainer.max_steps=30"))
    run = load_run(tmp_path / "run")
    before = run.training_seconds()
    run.steps[0]["perf/step_ms"] += 60_000.0  # a minute of compilation or autotuning in step 1
    after = run.training_seconds()
    typical = run.steady_step_ms() / 1e3
    for step, seconds in before.items():
        assert abs(after[step] - seconds) <= typical + 1e-9


@pytest.mark.parametrize("n_kv,window,backend", [(1, None, "auto"), (2, 16, "auto"), (4, None, "math")])
def test_activation_estimate_holds_for_grouped_heads_windows_and_sdpas_math_backend(n_kv, window, backend):
    # SDPA's math implementation keeps the attention matrices, as the manual kernel does.
    config = GPTConfig(vocab_size=257, block_size=64, n_layer=2, n_head=4, n_embd=64, n_kv_head=n_kv, window=window,
                       sdpa_backend=backend)  # fmt: skip
    measured = saved_tensor_bytes(GPT(config), torch.randint(0, 257, (4, 64)))
    estimated = sum(activation_bytes(config, 4, torch.float32).values())
    assert abs(estimated - measured) / measured < 0.25, (estimated, measured)
