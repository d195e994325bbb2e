"""trainer.profile: where a step's time goes, by kind, with the SDPA kernel the graph really calls."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import TINY, compose_train, read_metrics

from analysis.runs import load_run
from training.loop import train
from training.profiling import KINDS, kind_of

BACKENDS = {"sdpa": "flash (cpu)", "manual": "-"}


@pytest.fixture(scope="module")
def profiled_sweep(tmp_path_factory, data_cache):
    """Two profiled runs, one per kernel, in one sweep folder."""
    sweep = tmp_path_factory.mktemp("profiled")
    for kernel in BACKENDS:
        train(compose_train(*TINY, "logger=none", f"kernel={kernel}", "trainer.max_steps=12", "trainer.profile=true",
                            f"trainer.run_dir={sweep / kernel}", f"data.cache_dir={data_cache}"))  # fmt: skip
    return sweep


@pytest.mark.parametrize("kernel", sorted(BACKENDS))
def test_profile_mode_writes_time_by_kind_and_the_sdpa_kernel(profiled_sweep, kernel):
    run_dir, backend = profiled_sweep / kernel, BACKENDS[kernel]
    summary = json.loads((run_dir / "profile" / "time_by_kind.json").read_text())
    assert summary["steps"] == [2, 3, 4], "three steps after the warm-up step"
    assert summary["sdpa_backend"] == backend
    assert json.loads((run_dir / "run.json").read_text())["sdpa_backend"] == backend, "recorded for every run"
    ms = summary["ms_per_step"]
    assert list(ms) == list(KINDS)
    assert sum(ms.values()) == pytest.approx(summary["wall_ms_per_step"], rel=0.01), "the kinds add up to the step"
    assert ms["matrix products"] > 0 and ms["attention"] > 0 and ms["optimizer"] > 0 and ms["loss"] > 0
    assert "traceEvents" in json.loads((run_dir / "profile" / "trace.json").read_text())
    assert "| matrix products |" in (run_dir / "profile" / "time_by_kind.md").read_text()

    profiled = [m["step"] for m in read_metrics(run_dir) if m.get("perf/profiled")]
    assert profiled == [1, 2, 3, 4], "the first step (warm-up: the SDPA probe) and the window"
    assert not any(s.get("perf/profiled") for s in load_run(run_dir).steady_steps()), "no speed figure uses them"


def test_the_comparison_says_where_each_variants_step_time_goes(profiled_sweep):
    import compare

    report = (compare.main([str(profiled_sweep)]) / "report.md").read_text()
    assert "## Where a step's time goes (trainer.profile=true)" in report
    assert "| fused_qkv-sdpa (seed 1337) | flash (cpu) |" in report and "| fused_qkv-manual (seed 1337) | - |" in report
    main_table = report.split("## Where")[0]
    assert "| SDPA kernel |" in main_table and "| flash (cpu) |" in main_table and "| 8 |" in main_table


@pytest.mark.parametrize(
    "name,kind",
    [
        ("aten::addmm", "matrix products"), ("aten::mm", "matrix products"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "matrix products"),
        ("aten::_scaled_dot_product_flash_attention", "attention"), ("flash_fwd_kernel", "attention"),
        ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "attention"), ("aten::bmm", "attention"),
        ("triton_per_fused__softmax_masked_fill_3", "attention"),
        ("triton_red_fused__log_softmax_nll_loss_forward_7", "loss"), ("aten::_log_softmax", "loss"),
        ("multi_tensor_apply_kernel", "optimizer"), ("aten::copy_", "copies and casts"),
        ("Memcpy DtoD (Device -> Device)", "copies and casts"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "communication"),
        ("triton_poi_fused_add_native_layer_norm_2", "norms and elementwise"), ("aten::gelu", "norms and elementwise"),
    ],
)  # fmt: skip
def test_kernels_and_ops_are_classified_by_name(name, kind):
    assert kind_of(name) == kind


def test_a_profiled_run_shorter_than_the_window_still_writes_what_it_saw(tmp_path, data_cache):
    run_dir = tmp_path / "run"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=3", "trainer.profile=true",
                        f"trainer.run_dir={run_dir}", f"data.cache_dir={data_cache}"))  # fmt: skip
    summary = json.loads(Path(run_dir / "profile" / "time_by_kind.json").read_text())
    assert summary["steps"] == [2, 3], "the steps left after the warm-up"
