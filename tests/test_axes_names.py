"""The axes of issue 30 (positions, QK-norm, softcap, sinks, latent keys/values) in every name a user reads: the
run label (directories, run names, report rows, plot legends), wandb tags and compare.py's columns, each part
shown only when set, so that a default model's names and tables stay as they were."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import TINY, compose_train, run_cli
from omegaconf import OmegaConf

import compare
from analysis.plots import val_loss_figure
from analysis.report import COLUMNS
from analysis.runs import find_runs
from model import GPTConfig, registry
from model.config import attention_label
from training.run_log import run_tags

BASE = dict(attention="fused_qkv", kernel="sdpa", n_head=4)


@pytest.mark.parametrize(
    "options,show,label",
    [
        ({}, (), "fused_qkv-sdpa"),  # every new field at its default: today's label
        (dict(position="learned", rope_theta=10000.0, qk_norm=False, softcap=None, sinks=False, kv_latent=None), (),
         "fused_qkv-sdpa"),
        (dict(position="rope"), (), "fused_qkv-sdpa-rope"),
        (dict(position="rope", rope_theta=500000.0), (), "fused_qkv-sdpa-rope500000"),
        (dict(position="rope"), ("rope_theta",), "fused_qkv-sdpa-rope10000"),
        (dict(position="learned", rope_theta=500000.0), (), "fused_qkv-sdpa"),  # theta means nothing without rope
        (dict(position="alibi"), (), "fused_qkv-sdpa-alibi"),
        (dict(position="none"), (), "fused_qkv-sdpa-nopos"),
        (dict(position="learned"), ("position",), "fused_qkv-sdpa-learned"),
        (dict(kernel="manual", qk_norm=True, softcap=30.0, sinks=True), (), "fused_qkv-manual-qknorm-softcap30-sinks"),
        (dict(kernel="manual", softcap=2.5), (), "fused_qkv-manual-softcap2.5"),
        (dict(n_kv_head=2, window=64, position="rope", sinks=True), (), "fused_qkv-sdpa-kv2-window64-rope-sinks"),
        (dict(attention="mla", kv_latent=64), (), "mla-sdpa-latent64"),
        # a latent has no key/value heads to count, even where a sweep shows them for the other variants
        (dict(attention="mla", kv_latent=64, position="rope", rope_head_dim=16), ("n_kv_head",),
         "mla-sdpa-latent64-ropedim16-rope"),
    ],
)  # fmt: skip
def test_each_axis_is_spelled_only_when_set_or_shown(options, show, label):
    assert attention_label({**BASE, **options}, show=show) == label


def test_wandb_tags_name_the_options_set_and_nothing_more_for_a_default_model():
    default = OmegaConf.to_object(compose_train("logger=none"))
    assert run_tags(default) == ["fused_qkv", "sdpa", "nano", "pystdlib", "adamw"], "its optimizer too, as Muon's is"
    cfg = OmegaConf.to_object(compose_train("logger=none", "kernel=manual", "model.position=rope",
                                            "model.softcap=30", "model.sinks=true", "logger.tags=[mine]"))  # fmt: skip
    assert run_tags(cfg) == ["fused_qkv", "manual", "rope", "softcap30", "sinks", "nano", "pystdlib", "adamw", "mine"]
    muon = OmegaConf.to_object(compose_train("logger=none", "optim=muon_qkv", "optim.schedule=wsd"))
    assert run_tags(muon)[-2:] == ["muon_qkv", "wsd"] and "adamw" not in run_tags(muon)


def multirun(tmp_path_factory, data_cache, name: str, *overrides: str):
    sweep = tmp_path_factory.mktemp(name) / "sweep"
    result = run_cli("-m", *TINY, "logger=none", f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}",
                     "model.n_head=4", "trainer.max_steps=4", "trainer.eval_interval=2", *overrides,
                     cwd=sweep.parent)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return sweep


def run_dirs(sweep) -> list:
    return sorted((p for p in sweep.iterdir() if (p / "run.json").exists()), key=lambda p: int(p.name.split("_")[0]))


@pytest.fixture(scope="module")
def positions_sweep(tmp_path_factory, data_cache):
    return multirun(tmp_path_factory, data_cache, "positions", "experiment=compare_positions")


@pytest.fixture(scope="module")
def latent_sweep(tmp_path_factory, data_cache):
    return multirun(tmp_path_factory, data_cache, "latent", "experiment=compare_latent")


def report_rows(sweep, tmp_path) -> tuple[list[dict], str]:
    out = compare.main([str(sweep), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        return list(csv.DictReader(f)), (out / "report.md").read_text()


@pytest.mark.slow
def test_a_positions_sweep_names_every_encoding_the_learned_one_too(positions_sweep, tmp_path):
    variants = ["fused_qkv-sdpa-learned", "fused_qkv-sdpa-rope", "fused_qkv-sdpa-alibi", "fused_qkv-sdpa-nopos"]
    dirs = run_dirs(positions_sweep)
    assert [p.name for p in dirs] == [f"{i}_{v}" for i, v in enumerate(variants)]
    assert [json.loads((p / "run.json").read_text())["name"] for p in dirs] == [f"{v}-nano" for v in variants]
    runs = find_runs([positions_sweep])
    assert [run.variant for run in runs] == variants, "the report's label is the directory's"
    rows, report = report_rows(positions_sweep, tmp_path)
    assert [row["position"] for row in rows] == ["learned", "rope", "alibi", "none"]
    header = report.split("\n\n")[2].splitlines()[0]
    assert "| position |" in header
    for absent in ("qk norm", "softcap", "sinks", "kv latent", "rope theta", "KV cache B/token", "kv heads"):
        assert f"| {absent} |" not in header, f"{absent}: no run sets it"
    legend = val_loss_figure(runs, "step").axes[0].get_legend()
    assert legend.get_title().get_text() == "layout-kernel-<position>"
    assert sorted(t.get_text() for t in legend.get_texts()) == sorted(variants)


@pytest.mark.slow
def test_a_latent_sweep_reports_parameters_and_kv_cache_bytes_per_token(latent_sweep, tmp_path):
    variants = ["fused_qkv-sdpa-kv4", "fused_qkv-sdpa-kv2", "fused_qkv-sdpa-kv1", "mla-sdpa-latent85"]
    assert [p.name for p in run_dirs(latent_sweep)] == [f"{i}_{v}" for i, v in enumerate(variants)]
    assert [run.variant for run in find_runs([latent_sweep])] == variants
    rows, report = report_rows(latent_sweep, tmp_path)
    header = report.split("\n\n")[2].splitlines()[0]
    assert "| kv heads | kv latent |" in header and "| KV cache B/token |" in header
    assert [row["kv_heads"] for row in rows] == ["4", "2", "1", ""] and rows[3]["kv_latent"] == "85"
    for row, run_dir in zip(rows, run_dirs(latent_sweep)):
        info = json.loads((run_dir / "run.json").read_text())
        config = GPTConfig(**info["model"])
        width = registry.mixer(config.attention).cache_width(config.attention_spec)
        assert int(row["kv_cache_bytes"]) == config.n_layer * width * 4, "layers x cache_width x float32 bytes"
        assert int(row["params"]) == info["params"]
    assert [int(row["kv_cache_bytes"]) for row in rows] == [256, 128, 64, 340]  # 1 layer, 32 wide, 4 bytes
    params = sorted(int(row["params"]) for row in rows)
    assert f"({params[0]:,} to {params[-1]:,} parameters: each run's in the table)" in report


def test_a_default_report_has_exactly_the_columns_it_had(tmp_path, data_cache):
    from training.loop import train

    train(compose_train(*TINY, "logger=none", "trainer.max_steps=4", f"trainer.run_dir={tmp_path / 'run'}",
                        f"data.cache_dir={data_cache}"))  # fmt: skip
    out = compare.main([str(tmp_path / "run"), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        header = next(csv.reader(f))
    before = ["layout", "kernel", "kv_heads", "window", "seed", "state", "params", "micro_batch", "sdpa_backend",
              "final_train_loss", "best_val_loss", "best_val_bpb", "tokens_per_sec", "step_ms", "peak_mem_mb", "mfu",
              "compile_s", "time_to_target_s", "flag"]  # fmt: skip
    # and the label (issue 35 item 8): the variant's one name, as legends and run names spell it
    assert header == ["run", "label", *before, "final_train_loss_se"]
    table_header = (out / "report.md").read_text().split("\n\n")[2].splitlines()[0]
    titles = dict(COLUMNS)
    shown = ["label", *(k for k in before if k not in ("kv_heads", "window"))]
    assert table_header == "| " + " | ".join(titles[k] for k in shown) + " |"


def test_curves_of_different_options_that_coincide_are_not_called_the_same_function():
    from analysis.plots import coincide_note

    same = coincide_note([["fused_qkv-sdpa-kv2", "wrapper-sdpa-kv2"]], 4)
    assert "same initial\nweights, the same function" in same, "layouts of one function: as before"
    capped = coincide_note([["fused_qkv-manual", "fused_qkv-manual-softcap20"]], 4)
    assert "the same function" not in capped and "options that changed\nnothing in these runs" in capped
    assert capped.endswith("fused_qkv-manual = fused_qkv-manual-softcap20")
