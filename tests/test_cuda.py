"""What only a GPU can show: a compiled bf16 step, the plan's memory estimate against the real peak, a real
out-of-memory error, the SDPA kernel the compiled graph calls, a profile of CUDA kernels. Skipped without CUDA."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import pytest
import torch
from helpers import TINY, assert_steps_are_a_full_forward, compose_train, read_metrics
from omegaconf import OmegaConf

from model import GPT, GPTConfig
from model.device import available_memory
from training.loop import RunFailed, train
from training.memory import release_memory
from training.plan import make_plan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

ON_GPU = [o for o in TINY if not o.startswith("trainer.device")] + ["trainer.device=cuda", "logger=none"]
FUSED_SDPA = ("flash", "mem-efficient", "cudnn")


def test_a_compiled_bf16_run_learns_and_records_its_compile_time_and_sdpa_kernel(tmp_path, data_cache):
    run = tmp_path / "run"
    train(compose_train(*ON_GPU, "trainer.compile=true", "trainer.dtype=bfloat16", "trainer.max_steps=40",
                        f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))  # fmt: skip
    metrics = read_metrics(run)
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5, "training lowered the loss"
    assert any("perf/compile_s" in m and "perf/compile_cache_hits" in m for m in metrics)
    info = json.loads((run / "run.json").read_text())
    assert info["dtype"] == "bfloat16" and info["sdpa_backend"] in FUSED_SDPA
    assert all("perf/peak_mem_mb" in m for m in metrics if "train/loss" in m)


def test_the_plans_memory_estimate_is_within_30_percent_of_the_measured_peak(tmp_path, data_cache):
    # Large enough that activations, not fixed allocations (cuBLAS workspaces), make the peak: ~1 GB estimated.
    shape = ["model.n_layer=4", "model.n_head=8", "model.n_embd=512", "model.block_size=512",
             "trainer.batch_size=16", "trainer.micro_batch_size=16"]  # fmt: skip
    cfg = compose_train(*ON_GPU, *shape, "trainer.dtype=bfloat16", "trainer.max_steps=3",
                        f"trainer.run_dir={tmp_path / 'run'}", f"data.cache_dir={data_cache}")  # fmt: skip
    train(cfg)
    measured = max(m["perf/peak_mem_mb"] for m in read_metrics(tmp_path / "run") if "perf/peak_mem_mb" in m) * 2**20
    config = OmegaConf.to_object(cfg)
    plan = make_plan(config, GPTConfig(**{**vars(config.model), "vocab_size": 257}), 1, torch.bfloat16)
    assert abs(plan.peak_bytes - measured) / measured < 0.30, (plan.peak_bytes, measured)


def test_a_real_out_of_memory_error_is_recorded_and_its_memory_freed(tmp_path, data_cache, monkeypatch):
    import training.loop as loop

    device = torch.device("cuda")
    for dtype in (torch.float32, torch.bfloat16):  # every library workspace a product makes, made before we count
        torch.ones(64, 64, device=device, dtype=dtype) @ torch.ones(64, 64, device=device, dtype=dtype)
    release_memory(device)  # what earlier tests left, cuBLAS's workspaces included (they count as allocated)
    before = torch.cuda.memory_allocated()
    big = ["model.n_layer=4", "model.n_head=4", "model.n_embd=256", "model.block_size=256",
           "trainer.batch_size=64", "trainer.micro_batch_size=64", "kernel=manual"]  # fmt: skip
    free, _ = torch.cuda.mem_get_info()
    models = []
    monkeypatch.setattr(loop, "GPT", lambda config: models.append(GPT(config)) or models[-1])
    # Leave this process ~200 MB: the plan (which reads the whole GPU) lets the run start; the step cannot fit.
    torch.cuda.set_per_process_memory_fraction(min(1.0, (before + 200 * 2**20) / torch.cuda.get_device_properties(0)
                                                   .total_memory))  # fmt: skip
    try:
        with pytest.raises(RunFailed, match=r"out of memory at trainer.micro_batch_size=64; try "
                                            r"trainer.micro_batch_size=32"):  # fmt: skip
            train(compose_train(*ON_GPU, *big, "trainer.max_steps=2", f"trainer.run_dir={tmp_path / 'run'}",
                                f"data.cache_dir={data_cache}"))  # fmt: skip
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    reason = json.loads((tmp_path / "run" / "failure.json").read_text())["reason"]
    assert reason.startswith("out of memory at trainer.micro_batch_size=64")
    parameters = [weakref.ref(p) for p in models.pop().parameters()]
    assert not [p for p in parameters if p() is not None], "nothing holds the failed run's weights"
    release_memory(device)  # cuBLAS's workspaces again: the failed run's first products made them anew
    assert torch.cuda.memory_allocated() - before < 16 * 2**20, "the failed run's tensors were freed"
    assert free > 0


def test_a_jobs_auto_micro_batch_is_its_pick_alone_whatever_ran_before(tmp_path, data_cache):
    """A multirun's jobs share one process: the previous job's cached blocks must not shrink the next one's plan."""
    from training.plan import auto_micro_batch, planned_model

    shape = ["model.n_layer=4", "model.n_head=8", "model.n_embd=512", "model.block_size=1024",
             "trainer.batch_size=512", "trainer.micro_batch_size=auto", "trainer.max_steps=2",
             "trainer.dtype=bfloat16", f"data.cache_dir={data_cache}"]  # fmt: skip
    config = OmegaConf.to_object(compose_train(*ON_GPU, *shape, "kernel=manual"))
    device = torch.device("cuda")
    release_memory(device)
    alone = auto_micro_batch(config, planned_model(config), 1, torch.bfloat16, available_memory(device))
    train(compose_train(*ON_GPU, *shape, "kernel=manual", f"trainer.run_dir={tmp_path / 'first'}"))
    train(compose_train(*ON_GPU, *shape, "kernel=manual", f"trainer.run_dir={tmp_path / 'second'}"))
    picked = json.loads((tmp_path / "second" / "run.json").read_text())["trainer"]["micro_batch_size"]
    assert picked == alone


def test_a_cuda_profile_counts_matrix_products_and_the_fused_attention_kernel(tmp_path, data_cache):
    run = tmp_path / "run"
    train(compose_train(*ON_GPU, "trainer.dtype=bfloat16", "trainer.max_steps=12", "trainer.profile=true",
                        f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))  # fmt: skip
    summary = json.loads(Path(run / "profile" / "time_by_kind.json").read_text())
    ms = summary["ms_per_step"]
    assert summary["sdpa_backend"] in FUSED_SDPA
    assert ms["matrix products"] > 0 and ms["attention"] > 0 and ms["optimizer"] > 0
    assert sum(ms.values()) >= summary["wall_ms_per_step"] * 0.99, "the kinds and the idle time fill the step"


def test_cuda_graph_decoding_makes_the_eager_choices_with_generators_on_the_gpu(monkeypatch):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from same_choices import assert_same_choices, record_choices

    from model import GPT
    from model.decoding.generation import generate_batch

    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=300, block_size=64, n_layer=2, n_head=4, n_embd=64, n_kv_head=2)).cuda().eval()
    recorder = record_choices(monkeypatch)
    for decoding in ("eager", "graph"):  # 100 tokens: the context slides, the cache refills in place
        recorder.start()
        generators = [torch.Generator(device="cuda").manual_seed(i) for i in range(4)]
        list(generate_batch(model, [1, 2, 3], 100, generators, 1.0, decoding=decoding))
    assert_same_choices(recorder.traces[1], recorder.traces[0])


def test_graph_decoding_waits_for_the_device_once_per_token_whatever_the_batch():
    """sample.py's CPU generators draw a generation's numbers at its start (one copy to the device, not one per
    token and sample: each copy from pageable memory is a synchronisation), and reading a step's tokens is a token's
    one wait. Counted by torch's sync debug mode: 40 more tokens, at most 40 more synchronisations (200 before)."""
    import warnings

    from model.decoding.generation import generate_batch

    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=300, block_size=128, n_layer=2, n_head=4, n_embd=64)).cuda().eval()

    def synchronisations(tokens: int) -> int:
        generators = [torch.Generator().manual_seed(i) for i in range(4)]
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                list(generate_batch(model, [1, 2, 3], tokens, generators, 1.0, top_k=50, decoding="graph"))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return sum("synchroniz" in str(w.message) for w in caught)

    synchronisations(20)  # a first generation: lazy CUDA set-up
    fewer, more = synchronisations(20), synchronisations(60)
    assert more - fewer <= 40, f"{more - fewer} synchronisations for 40 more tokens of 4 samples"


def test_cuda_graph_decoding_under_autocast_as_the_trainer_samples(monkeypatch):
    """float32 weights under bf16 autocast (the trainer's end-of-run sample): the graph casts weights itself."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from same_choices import assert_same_choices, record_choices

    from model import GPT
    from model.decoding.generation import generate_batch

    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=300, block_size=64, n_layer=2, n_head=4, n_embd=64)).cuda().eval()
    recorder = record_choices(monkeypatch)
    for decoding in ("eager", "graph"):
        recorder.start()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            list(generate_batch(model, [1, 2, 3], 80, [torch.Generator().manual_seed(7)], 1.0, decoding=decoding))
    assert_same_choices(recorder.traces[1], recorder.traces[0], atol=5e-2)  # bf16 round-off


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
def test_compiled_decoding_is_captured_and_makes_graph_decodings_choices(dtype, atol, monkeypatch):
    """Compiled decoding on CUDA: the static step compiled without inductor's CUDA graphs, then captured and replayed
    as graph decoding's (model/decoding/steps.py says why). float32: graph decoding's tokens up to round-off near-ties.
    bf16: the fused kernels keep intermediates in float32 where graph decoding rounds each op to bf16, so the logits
    differ by bf16 round-off (under 5e-2 here) and a row may part at a near-tie within it, then its tokens differ."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from same_choices import assert_same_choices, record_choices

    import model.decoding.generation as generation
    from model import GPT
    from model.decoding.steps import CompiledGraphedStep

    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # a training test before may have set it
    steps = []
    make_step = generation.make_step
    monkeypatch.setattr(generation, "make_step", lambda *args: steps.append(make_step(*args)) or steps[-1])
    torch.manual_seed(1)
    model = GPT(GPTConfig(vocab_size=300, block_size=64, n_layer=2, n_head=4, n_embd=64, n_kv_head=2))
    model = model.cuda().eval().to(dtype)
    recorder = record_choices(monkeypatch)
    for decoding in ("graph", "compiled"):  # 100 tokens: the context slides, the cache refills in place
        recorder.start()
        generators = [torch.Generator(device="cuda").manual_seed(i) for i in range(4)]
        list(generation.generate_batch(model, [1, 2, 3], 100, generators, 1.0, decoding=decoding))
    assert_same_choices(recorder.traces[1], recorder.traces[0], atol=atol)
    [compiled] = [step for step in steps if isinstance(step, CompiledGraphedStep)]
    assert compiled.graph is not None and compiled.output.is_cuda, "the compiled step was captured, then replayed"


@pytest.mark.parametrize("attention,fields", [("gated_deltanet", {}), ("fused_qkv", {"forget_gate": True})])
def test_cuda_graph_decoding_of_a_carried_state_is_a_full_recomputation(attention, fields):
    """A graph's warm-up runs its first step twice: a linear layer's state and a token bias's states are taken once
    (the cache is put back between the runs), so every replayed step's logits are a full forward's."""
    from model.decoding.steps import GraphedStep

    torch.manual_seed(3)
    model = GPT(GPTConfig(vocab_size=300, block_size=32, n_layer=2, n_head=4, n_embd=64, attention=attention,
                          **fields)).cuda().eval()  # fmt: skip
    idx = torch.randint(0, 300, (2, 30), device="cuda")
    assert_steps_are_a_full_forward(
        model, idx, 5, lambda model, cache: GraphedStep(model, cache, 2, torch.device("cuda")), atol=1e-4)


@pytest.mark.parametrize("sinks", [False, True])
def test_flex_masks_documents_in_its_block_mask_as_sdpa_does_forward_and_backward(sinks, monkeypatch):
    """A GPU's flex puts the documents in its block mask (a CPU's in its score_mod, tests/test_document_masking.py):
    the same function and gradients as sdpa's (B, 1, T, T) mask, in float32, with boundaries anywhere."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # a training test before may have set it
    grads, outputs = {}, {}
    idx = torch.randint(1, 300, (3, 200), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    idx[0, 17], idx[0, 150], idx[1, 99], idx[2, 0] = 0, 0, 0, 0
    for kernel in ("sdpa", "flex"):
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=300, block_size=256, n_layer=2, n_head=4, n_embd=64, kernel=kernel,
                           position="rope", document_masking=True, document_end=0, sinks=sinks)  # fmt: skip
        model = GPT(config).cuda()
        logits, loss = model(idx, idx)
        loss.backward()
        outputs[kernel] = logits.detach()
        grads[kernel] = {name: p.grad for name, p in model.named_parameters()}
    torch.testing.assert_close(outputs["flex"], outputs["sdpa"], atol=2e-4, rtol=1e-4)
    for name, g in grads["sdpa"].items():
        torch.testing.assert_close(grads["flex"][name], g, atol=2e-4, rtol=1e-3, msg=name)


def test_a_bf16_run_compiled_in_mode_reduce_overhead_replays_cuda_graphs_and_learns(tmp_path, data_cache):
    """trainer.compile_mode=reduce-overhead: inductor's graph trees replay each region with gradient accumulation
    (each micro-step a new graph step), and the run learns as the default mode's does."""
    run = tmp_path / "run"
    train(compose_train(*ON_GPU, "trainer.compile=true", "trainer.compile_mode=reduce-overhead",
                        "trainer.dtype=bfloat16", "trainer.max_steps=40", "trainer.micro_batch_size=4",
                        f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))  # fmt: skip
    losses = [m["train/loss"] for m in read_metrics(run) if "train/loss" in m]
    assert sum(losses[-5:]) / 5 < losses[0] - 0.5, "training lowered the loss"
