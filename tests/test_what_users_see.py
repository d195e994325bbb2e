"""What a user sees: the console and train.log, the wandb run read back from its file, names, plots."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from helpers import ROOT, TINY, compose_train, read_metrics, run_cli, run_script, user_env
from warm_python import run_python, start_python

import rebuild_wandb
from analysis.plots import val_loss_figure
from analysis.runs import find_runs
from analysis.wandb_file import history, read_complete
from training.loop import train

PNG = b"\x89PNG\r\n\x1a\n"


def wandb_file(run_dir: Path) -> Path:
    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    return path


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory, data_cache):
    run = tmp_path_factory.mktemp("wandb") / "run"
    train(compose_train(*TINY, "logger.mode=offline", "trainer.max_steps=20", "trainer.sample_tokens=30",
                        f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))  # fmt: skip
    return run


def test_the_wandb_file_holds_job_type_metric_axes_best_summaries_the_sample_and_grad_norm(offline_run):
    records = list(read_complete(wandb_file(offline_run)))
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.job_type == "train" and run.display_name == "fused_qkv-sdpa-nano"
    metrics = {(r.metric.name or r.metric.glob_name): r.metric
               for r in records if r.WhichOneof("record_type") == "metric"}  # fmt: skip
    assert metrics["val/loss"].summary.min and metrics["val/loss"].step_metric == "tokens"
    assert metrics["train/*"].step_metric == "tokens" and "tokens" in metrics
    steps = history(wandb_file(offline_run))
    assert all("train/grad_norm" in steps[s] and steps[s]["train/grad_norm"] > 0 for s in range(1, 21))
    assert steps[20]["samples/_type"] == "table-file"
    summaries = [r.summary for r in records if r.WhichOneof("record_type") == "summary"]
    best = {item.key: item.value_json for s in summaries for item in s.update}
    vals = [m["val/loss"] for m in read_metrics(offline_run) if "val/loss" in m]
    assert float(best["best/val_loss"]) == pytest.approx(min(vals))
    assert "samples.txt" in os.listdir(offline_run)


def test_rebuilding_the_wandb_history_from_metrics_gives_the_same_values_step_for_step(offline_run):
    folder = rebuild_wandb.main([str(offline_run)])
    (rebuilt,) = folder.glob("run-*.wandb")
    steps = history(rebuilt)
    for record in read_metrics(offline_run):
        for key, value in record.items():
            if key != "step":
                assert steps[record["step"]][key] == pytest.approx(value, rel=1e-12), (record["step"], key)
    (run,) = [r.run for r in read_complete(rebuilt) if r.WhichOneof("record_type") == "run"]
    assert run.run_id == wandb_file(offline_run).stem.removeprefix("run-"), "the original run's id"


def test_rebuilding_keeps_the_end_of_run_sample_as_its_table(offline_run):
    """The training run logged its closing sample as a wandb table at its last step: the rebuilt run has it too."""
    def tables(folder: Path) -> list[dict]:
        return [json.loads(path.read_text()) for path in folder.glob("**/files/media/table/samples_*.table.json")]

    (original,) = tables(offline_run / "wandb")
    assert original["data"][0][0] == 20 and len(original["data"][0][1]) > 0
    folder = rebuild_wandb.main([str(offline_run)])
    (rebuilt,) = folder.glob("run-*.wandb")
    assert history(rebuilt)[20]["samples/_type"] == "table-file", "logged at the step the run logged it"
    assert tables(folder) == [original], "the same text"


def test_a_resumed_run_rebuilds_as_one_history(tmp_path, data_cache):
    common = (*TINY, "logger=none", "trainer.max_steps=8", f"data.cache_dir={data_cache}")
    train(compose_train(*common, "trainer.stop_at_step=4", f"trainer.run_dir={tmp_path / 'a'}"))
    train(compose_train(*common, f"trainer.resume={tmp_path / 'a'}", f"trainer.run_dir={tmp_path / 'b'}"))
    (rebuilt,) = rebuild_wandb.main([str(tmp_path / "a"), str(tmp_path / "b")]).glob("run-*.wandb")
    steps = history(rebuilt)
    assert sorted(s for s in steps if "train/loss" in steps[s]) == list(range(1, 9)), steps


def test_the_console_names_the_run_directory_and_every_evaluation(tmp_path, data_cache):
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    result = run_cli(*TINY, "logger=none", "trainer.max_steps=4", "trainer.eval_interval=2", f"trainer.run_dir={run}",
                     f"data.cache_dir={data_cache}", f"hydra.run.dir={tmp_path / 'hydra'}",
                     cwd=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert f"run directory: {run}" in out
    for step in (2, 4):
        val = next(m["val/loss"] for m in read_metrics(run) if m.get("step") == step and "val/loss" in m)
        assert f"step {step}: val/loss {val:.4f}" in out
    assert "best val/loss" in out and f"python sample.py source={run}" in out
    assert "step 4: val/loss" in (tmp_path / "hydra" / "train.log").read_text(), "train.log holds the same"


@pytest.mark.slow
def test_a_wandb_run_ends_with_the_summary_below_wandbs_closing_lines(tmp_path, data_cache):
    run = tmp_path / "run"
    # one stream, as a terminal shows it: stderr (wandb's lines) joined to stdout (the log's)
    code = (f"import os, runpy, sys; os.dup2(1, 2); sys.argv = {['train.py', *TINY]!r} + sys.argv[1:]; "
            f"runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')")  # fmt: skip
    result = run_python(["-c", code, "logger.mode=offline", "trainer.max_steps=4", f"trainer.run_dir={run}",
                         f"data.cache_dir={data_cache}", f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=tmp_path,
                        env=user_env())  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.rstrip().splitlines()
    assert any(line.startswith("wandb: ") for line in lines), "wandb said its closing lines"
    tail = lines[-7:]
    assert tail[0].endswith("] summary") and tail[-1] == f"  sample from it: python sample.py source={run}", tail


def test_ctrl_c_prints_the_command_that_continues_the_run(tmp_path, data_cache):
    run = tmp_path / "run"
    args = [*TINY, "trainer.max_steps=100000", "trainer.eval_interval=100000", "logger=none",
            f"trainer.run_dir={run}", f"data.cache_dir={data_cache}",
            f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    proc = start_python([str(ROOT / "train.py"), *args], cwd=tmp_path)  # a process of its own, forked warm
    deadline = time.time() + 120
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGINT)  # a step is logged: the run's handlers are in place
    result = proc.wait(timeout=60)
    out, err = result.stdout, result.stderr
    assert result.returncode == 130, err[-2000:]
    assert "stopped by SIGINT at step" in out
    command = err.split("Continue the run from its last.pt, in the same directory:\n")[1].strip()
    assert command.startswith("python train.py ") and command.endswith("trainer.resume=auto")
    assert f"trainer.run_dir={run}" in command and f"hydra.run.dir={tmp_path / 'hydra'}" in command


@pytest.mark.slow
def test_a_multirun_over_a_non_attention_option_names_its_runs_apart(tmp_path, data_cache):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "optim.beta2=0.95,0.99", *TINY, "trainer.max_steps=2", "logger.mode=offline",
                     f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    run_dirs = sorted(p for p in sweep.iterdir() if (p / "run.json").exists())
    assert [p.name for p in run_dirs] == ["0_fused_qkv-sdpa-optim.beta2=0.95", "1_fused_qkv-sdpa-optim.beta2=0.99"]
    names = []
    for run_dir in run_dirs:
        (run,) = [r.run for r in read_complete(wandb_file(run_dir)) if r.WhichOneof("record_type") == "run"]
        names.append(run.display_name)
    assert names == ["fused_qkv-sdpa-nano-optim.beta2=0.95", "fused_qkv-sdpa-nano-optim.beta2=0.99"]


def test_a_sweep_preset_without_multirun_is_refused_naming_m(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    result = run_cli("experiment=compare_attention", "logger=none", cwd=tmp_path, env=env)
    assert result.returncode != 0
    assert "defines a sweep over attention, kernel; run it with -m" in result.stderr


@pytest.mark.parametrize("script", ["sample.py", "heads.py", "evaluate.py", "export.py"])
@pytest.mark.slow
def test_each_script_helps_with_its_own_options_and_names_a_missing_one_in_one_line(tmp_path, script):
    help_text = run_script(script, "--help", cwd=tmp_path, timeout=120).stdout
    assert f"Usage: python {script} source=" in help_text and "source: ???" in help_text
    assert "attention: fused_qkv, separate_qkv, wrapper" not in help_text, "not train.py's groups"
    result = run_script(script, cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [f"error: source is required; usage: python {script} source="
                                                  + result.stderr.split(f"python {script} source=", 1)[1].strip()]


@pytest.fixture(scope="module")
def seeded_sweep(tmp_path_factory, data_cache):
    """Two layouts, two seeds each: what the comparison draws, and what it logs into wandb."""
    sweep = tmp_path_factory.mktemp("compare") / "sweep"
    for layout in ("wrapper", "fused_qkv"):
        for seed in (1, 2):
            train(compose_train(*TINY, "logger=none", f"attention={layout}", f"trainer.seed={seed}",
                                "trainer.max_steps=20", f"trainer.run_dir={sweep / f'{layout}-{seed}'}",
                                f"data.cache_dir={data_cache}"))  # fmt: skip
    return sweep


@pytest.mark.xdist_group("seeded_sweep")  # pytest -n: one worker trains the sweep both tests read
@pytest.mark.slow
def test_the_comparison_plot_draws_one_line_per_variant_with_seeds_aggregated(seeded_sweep):
    sweep = seeded_sweep
    runs = find_runs([sweep])
    fig = val_loss_figure(runs, "step")
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2 and len(ax.collections) == 2, "a mean line and a band per variant"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["fused_qkv-sdpa, 2 seeds", "wrapper-sdpa, 2 seeds"]
    # Identical starts: the layouts' curves lie on each other, and the plot says so.
    assert [t.get_text().splitlines()[0] for t in ax.texts] == ["all 2 curves coincide:"]
    runs[0].evals = [{**e, "val/loss": e["val/loss"] + 0.01} for e in runs[0].evals]
    assert not val_loss_figure(runs, "step").axes[0].texts, "curves that differ get no such note"
    import compare

    out = compare.main([str(sweep)])
    for name in ("val_loss_vs_step.png", "val_loss_vs_time.png", "throughput.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 10_000, name


@pytest.mark.xdist_group("seeded_sweep")  # pytest -n: one worker trains the sweep both tests read
@pytest.mark.slow
def test_the_comparison_and_the_head_study_log_into_wandb(tmp_path, data_cache, trained_run, seeded_sweep):
    import compare
    import heads
    from data.config import DataConfig

    out = compare.main([str(seeded_sweep), "--wandb", "--out", str(tmp_path / "report")])
    (report_file,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    (run,) = [r.run for r in read_complete(report_file) if r.WhichOneof("record_type") == "run"]
    assert run.job_type == "compare"
    logged = {k for row in history(report_file).values() for k in row}
    assert {"report/_type", "throughput/_type", "val_loss_vs_step/_type"} <= logged

    folder = heads.run(heads.HeadsConfig(source=str(trained_run), data=DataConfig(cache_dir=str(data_cache)),
                                         windows=2, device="cpu", out=str(tmp_path / "heads"), wandb=True))  # fmt: skip
    (heads_file,) = (folder / "wandb").glob("offline-run-*/run-*.wandb")
    assert [r.run.job_type for r in read_complete(heads_file) if r.WhichOneof("record_type") == "run"] == ["heads"]
    logged = {k for row in history(heads_file).values() for k in row}
    assert {"head_stats/_type", "ablation/_type", "maps/_type"} <= logged
