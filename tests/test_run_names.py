"""One name per variant, spelled as its options are: a sweep's job directories, the run names (run.json and
wandb), the report's rows and the plots' legends all say which value of the swept axis a run has."""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path

import pytest
from helpers import CONFIGS, TINY, as_if_quiet, compose_train, run_cli
from omegaconf import OmegaConf

import compare
from analysis.plots import throughput_figure, val_loss_figure
from analysis.report import build_rows
from analysis.runs import find_runs
from model.config import attention_label
from training.loop import train


def multirun(tmp_path_factory, data_cache, name: str, *overrides: str):
    sweep = tmp_path_factory.mktemp(name) / "sweep"
    result = run_cli("-m", *TINY, "logger=none", f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}",
                     *overrides, cwd=sweep.parent)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for run in run_dirs(sweep):  # the report judges the sweep, not how busy the suite's workers kept the machine
        as_if_quiet(run)
    return sweep


def run_dirs(sweep) -> list:
    return sorted((p for p in sweep.iterdir() if (p / "run.json").exists()), key=lambda p: int(p.name.split("_")[0]))


@pytest.fixture(scope="module")
def kernel_sweep(tmp_path_factory, data_cache):
    return multirun(tmp_path_factory, data_cache, "kernels", "experiment=compare_kernels", "trainer.max_steps=2")


@pytest.fixture(scope="module")
def kv_sweep(tmp_path_factory, data_cache):
    return multirun(tmp_path_factory, data_cache, "kv", "experiment=compare_kv_heads", "model.n_head=4",
                    "trainer.max_steps=6", "trainer.eval_interval=2")  # fmt: skip


@pytest.mark.parametrize(
    "model,show,label",
    [
        (dict(attention="fused_qkv", kernel="sdpa", n_head=4), (), "fused_qkv-sdpa"),
        (dict(attention="fused_qkv", kernel="sdpa", sdpa_backend="flash", n_head=4), (), "fused_qkv-sdpa_flash"),
        (dict(attention="wrapper", kernel="sdpa", n_head=4, n_kv_head=2), (), "wrapper-sdpa-kv2"),
        (dict(attention="wrapper", kernel="manual", n_head=4, n_kv_head=4, window=64), (), "wrapper-manual-window64"),
        # an axis a sweep varies is spelled at its default too
        (dict(attention="wrapper", kernel="sdpa", n_head=4, n_kv_head=None), ("n_kv_head",), "wrapper-sdpa-kv4"),
        (dict(attention="wrapper", kernel="sdpa", n_head=4, window=None), ("window",), "wrapper-sdpa-nowindow"),
    ],
)
def test_the_label_spells_each_option_as_the_command_line_does(model, show, label):
    assert attention_label(model, show=show) == label


@pytest.mark.slow
def test_a_kernel_sweep_names_directories_runs_and_report_rows_by_the_kernel_option(kernel_sweep, tmp_path):
    dirs = run_dirs(kernel_sweep)
    kernels = ["manual", "sdpa", "sdpa_flash", "sdpa_math"]  # experiment=compare_kernels, in its order
    assert [p.name for p in dirs] == [f"{i}_fused_qkv-{k}" for i, k in enumerate(kernels)]
    assert [json.loads((p / "run.json").read_text())["name"] for p in dirs] == [f"fused_qkv-{k}-nano" for k in kernels]
    out = compare.main([str(kernel_sweep), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["kernel"] for row in rows] == kernels
    # One final step measures no noise; the kernels' round-off differences are not flagged as "+0.0000".
    assert "for final_train_loss differing" in (out / "report.md").read_text()
    assert [row["flag"] for row in rows] == [""] * 4
    assert "sdpa-flash" not in (out / "report.md").read_text() and "sdpa-math" not in (out / "report.md").read_text()
    runs = find_runs([kernel_sweep])
    fig = throughput_figure(runs, build_rows(runs, None)[0])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [f"fused_qkv\n{k}" for k in kernels]


@pytest.mark.slow
def test_a_kv_heads_sweep_names_each_variant_by_its_key_value_heads(kv_sweep):
    variants = [f"{layout}-sdpa-kv{kv}" for layout in ("wrapper", "fused_qkv") for kv in (4, 2, 1)]
    dirs = run_dirs(kv_sweep)
    assert [p.name for p in dirs] == [f"{i}_{v}" for i, v in enumerate(variants)]
    assert [json.loads((p / "run.json").read_text())["name"] for p in dirs] == [f"{v}-nano" for v in variants]
    assert [run.variant for run in find_runs([kv_sweep])] == variants, "the report's label is the directory's"


@pytest.mark.slow
def test_the_kv_heads_report_gives_the_range_of_parameters_not_one_count(kv_sweep, tmp_path):
    out = compare.main([str(kv_sweep), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        params = sorted({int(row["params"]) for row in csv.DictReader(f)})
    assert len(params) == 3, "4, 2 and 1 key/value heads: three sizes"
    header = (out / "report.md").read_text().split("\n\n")[1]
    assert f"({params[0]:,} to {params[-1]:,} parameters: each run's in the table)" in header
    assert not re.search(r"\(\d[\d,]* parameters\)", header)


def test_the_loss_plot_names_the_curves_that_lie_on_each_other(kv_sweep):
    fig = val_loss_figure(find_runs([kv_sweep]), "step")
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"{layout}-sdpa-kv{kv}" for layout in ("fused_qkv", "wrapper") for kv in (1, 2, 4)]
    (note,) = [t.get_text() for t in ax.texts]
    # Same initial weights: each layout's curve lies on the other layout's with the same key/value heads.
    assert note.splitlines()[-3:] == [f"fused_qkv-sdpa-kv{kv} = wrapper-sdpa-kv{kv}" for kv in (1, 2, 4)]
    widths = {line.get_label(): line.get_linewidth() for line in ax.get_lines()}
    assert all(widths[f"fused_qkv-sdpa-kv{kv}"] > widths[f"wrapper-sdpa-kv{kv}"] for kv in (1, 2, 4)), \
        "the line drawn first is wider: both show"


@pytest.mark.slow
def test_a_job_of_a_parallel_launcher_names_itself_by_the_command_lines_sweep(tmp_path, data_cache):
    # submitit_local runs each job in its own process, whose command line is submitit's, not the user's:
    # the swept keys come from the sweep's multirun.yaml.
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="Hydra's submitit launcher (the cluster extra)")
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "hydra/launcher=submitit_local", *TINY, "trainer.max_steps=2", "logger=none",
                     "trainer.seed=1,2", f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
                     env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    dirs = run_dirs(sweep)
    assert [p.name for p in dirs] == ["0_fused_qkv-sdpa-trainer.seed=1", "1_fused_qkv-sdpa-trainer.seed=2"]
    assert [json.loads((p / "run.json").read_text())["name"] for p in dirs] == [
        "fused_qkv-sdpa-nano-trainer.seed=1", "fused_qkv-sdpa-nano-trainer.seed=2"]


def test_a_run_on_other_data_says_its_data_in_its_name(tmp_path, data_cache):
    """The default corpus goes unsaid; your own file is named by its stem, a named corpus by its name."""
    from data.config import DataConfig
    from training.run_log import data_part

    assert data_part(DataConfig()) == ""
    assert data_part(DataConfig(name="files", source="files", path="/home/me/my notes.txt")) == "my_notes"
    assert data_part(DataConfig(name="files", source="files", path="texts/*.txt")) == "files"
    assert data_part(DataConfig(name="tinyshakespeare", source="url", url="https://x/input.txt")) == "tinyshakespeare"
    assert data_part(DataConfig(name="hub", source="hub", path="HuggingFaceFW/fineweb-edu")) == "fineweb-edu"
    notes = tmp_path / "notes.txt"
    notes.write_text("def f(x):\n    return x + 1\n" * 400)
    run = tmp_path / "run"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=2", "data=files", f"data.path={notes}",
                        f"trainer.run_dir={run}", f"data.cache_dir={tmp_path / 'cache'}"))  # fmt: skip
    assert json.loads((run / "run.json").read_text())["name"] == "fused_qkv-sdpa-nano-notes"



@pytest.mark.parametrize(("overrides", "folder", "name"), [
    ((), "fused_qkv-sdpa", "fused_qkv-sdpa-nano"),
    (("data=files", "data.path=/home/me/my notes.txt"), "fused_qkv-sdpa-my_notes", "fused_qkv-sdpa-nano-my_notes"),
    (("data=tinyshakespeare",), "fused_qkv-sdpa-tinyshakespeare", "fused_qkv-sdpa-nano-tinyshakespeare"),
    (("model.n_kv_head=2", "data=hub", "data.path=HuggingFaceFW/fineweb-edu"), "fused_qkv-sdpa-kv2-fineweb-edu",
     "fused_qkv-sdpa-kv2-nano-fineweb-edu"),
])  # fmt: skip
def test_a_run_directory_says_what_the_run_name_says_but_the_model(overrides, folder, name):
    """One label makes both (training/run_log.py's run_label): a run on your own data carries it in its folder as in
    its name, runs/<date>/<time>_fused_qkv-sdpa-my_notes holding the run fused_qkv-sdpa-nano-my_notes."""
    from hydra import compose, initialize_config_dir

    import train  # noqa: F401  (registers the run_dir_name resolver that configs/train.yaml names)
    from training.run_log import run_name

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    assert Path(cfg.hydra.run.dir).name.split("_", 1)[1] == folder
    assert run_name(OmegaConf.to_object(compose_train(*overrides))) == name


@pytest.mark.slow
def test_a_sweep_over_your_own_files_names_each_directory_by_its_file(tmp_path_factory, data_cache):
    texts = tmp_path_factory.mktemp("texts")
    for stem in ("essays", "letters"):
        (texts / f"{stem}.txt").write_text(f"{stem}: the quick brown fox jumps over the lazy dog. " * 400)
    sweep = multirun(tmp_path_factory, data_cache, "files", "trainer.max_steps=2", "data=files",
                     f"data.path={texts / 'essays.txt'},{texts / 'letters.txt'}")  # fmt: skip
    dirs = run_dirs(sweep)
    assert [p.name for p in dirs] == ["0_fused_qkv-sdpa-essays", "1_fused_qkv-sdpa-letters"]
    assert [json.loads((p / "run.json").read_text())["name"] for p in dirs] == [
        "fused_qkv-sdpa-nano-essays", "fused_qkv-sdpa-nano-letters"]
