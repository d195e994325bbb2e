"""Stopping and extending a run, and what the run says about it: trainer.stop_at_step, a larger
trainer.max_steps on resume (the schedule re-planned, said in one line), an offline wandb run continued,
and the other lines a run prints (its plan on a CPU, its closing sample)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from helpers import TINY, compose_train, read_metrics, run_cli, train_losses

import rebuild_wandb
from analysis.wandb_file import history, read_complete
from model.decoding.generation import DEFAULT_TEMPERATURE, DEFAULT_TOP_K
from sample import SampleConfig
from training.config import OptimConfig
from training.continuation import continue_command
from training.loop import train
from training.optim import lr_at
from training.plan import duration_text

TINY_OPTIM = OptimConfig(lr=3e-3, warmup_steps=2)  # TINY's schedule


def tiny(run_dir: Path, data_cache: Path, *overrides: str):
    """TINY in ``run_dir``; without wandb unless the overrides set ``logger.mode``."""
    logger = [] if any(o.startswith("logger.mode=") for o in overrides) else ["logger=none"]
    return compose_train(*TINY, *logger, f"trainer.run_dir={run_dir}", f"data.cache_dir={data_cache}",
                         *overrides)  # fmt: skip


def lrs(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["lr"] for m in read_metrics(run_dir) if "lr" in m}


def run_info(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


@pytest.mark.slow
def test_stop_at_step_says_so_records_it_and_its_printed_command_continues_the_run(tmp_path, data_cache):
    run = tmp_path / "run"
    args = [*TINY, "logger=none", "trainer.max_steps=16", "trainer.stop_at_step=8", f"data.cache_dir={data_cache}",
            f"hydra.run.dir={run}"]  # fmt: skip
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-2000:]  # asked for: not a failure
    assert f"stopped at step 8 (trainer.stop_at_step): saved {run / 'last.pt'}" in first.stdout
    info = run_info(run)
    assert info["summary"]["stopped_by"] == "stop_at_step" and info["status"] == "interrupted"

    command = shlex.split(first.stderr.split("Continue the run from its last.pt, in the same directory:\n")[1])
    assert command[:2] == ["python", "train.py"] and command[-1] == "trainer.resume=auto"
    assert "trainer.stop_at_step=8" not in command and f"hydra.run.dir={run}" in command
    rest = run_cli(*command[2:], cwd=tmp_path)
    assert rest.returncode == 0, rest.stderr[-2000:]
    assert (f"continuing {run} from step 8 to 16: the same learning-rate schedule, exactly "
            f"(lr at step 9: {lr_at(8, TINY_OPTIM, 16):.2e})") in rest.stdout  # fmt: skip
    assert sorted(train_losses(run)) == list(range(1, 17))
    assert lrs(run) == pytest.approx({s: lr_at(s - 1, TINY_OPTIM, 16) for s in range(1, 17)})
    assert run_info(run)["status"] == "finished" and run_info(run)["summary"]["stopped_by"] is None


def test_the_continue_command_drops_stop_at_step_only_when_it_was_what_stopped_the_run():
    argv = ["trainer.max_steps=16", "trainer.stop_at_step=8", "hydra.run.dir=old", "trainer.resume=auto"]
    after_stop_at_step = shlex.split(continue_command(argv, None, "/runs/a", "stop_at_step"))
    after_a_signal = shlex.split(continue_command(argv, None, "/runs/a", "SIGINT"))
    assert after_stop_at_step[2:] == ["trainer.max_steps=16", "hydra.run.dir=/runs/a", "trainer.resume=auto"]
    assert after_a_signal[2:] == ["trainer.max_steps=16", "trainer.stop_at_step=8", "hydra.run.dir=/runs/a",
                                  "trainer.resume=auto"]  # fmt: skip


def test_continuing_with_stop_at_step_already_reached_is_refused_naming_the_fix(tmp_path, data_cache):
    train(tiny(tmp_path / "run", data_cache, "trainer.stop_at_step=4"))
    with pytest.raises(ValueError, match=r"trainer.stop_at_step=4 but .*run is already at step 4; leave "
                                         r"trainer.stop_at_step out \(or raise it\)"):  # fmt: skip
        train(tiny(tmp_path / "run", data_cache, "trainer.stop_at_step=4", "trainer.resume=auto"))


def test_the_old_continue_command_of_a_run_shortened_since_does_not_extend_it_back(tmp_path, data_cache):
    run = tmp_path / "run"
    train(tiny(run, data_cache, "trainer.max_steps=12", "trainer.stop_at_step=4"))  # stopped; continue: 12 steps
    train(tiny(run, data_cache, "trainer.max_steps=8", "trainer.resume=auto"))  # shortened: finished at 8
    with pytest.raises(ValueError, match=r"finished at step 8 \(trainer.max_steps=8\): it was shortened from "
                                         r"trainer.max_steps=12, which this command asks for again .* "
                                         r"trainer.resume=.*run trainer.run_dir=<new directory> trainer.max_steps=12"):
        train(tiny(run, data_cache, "trainer.max_steps=12", "trainer.resume=auto"))  # the old continue command
    assert run_info(run)["summary"]["step"] == 8 and max(train_losses(run)) == 8, "left as it was"
    onwards = train(tiny(tmp_path / "onwards", data_cache, "trainer.max_steps=12", f"trainer.resume={run}"))
    assert (onwards["start_step"], onwards["step"]) == (8, 12), "the way the message names"
    extended = train(tiny(run, data_cache, "trainer.max_steps=16", "trainer.resume=auto"))
    assert extended["step"] == 16, "a budget it never had still extends it"


def test_a_larger_budget_extends_a_finished_run_alike_in_place_and_in_a_new_directory(tmp_path, data_cache,
                                                                                         log_lines):  # fmt: skip
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    train(tiny(run, data_cache, "trainer.max_steps=12"))
    assert run_info(run)["status"] == "finished"
    old_lr, new_lr = lr_at(11, TINY_OPTIM, 12), lr_at(12, TINY_OPTIM, 20)
    replanned = (f"from step 12 to 20: the learning-rate schedule is re-planned over 20 steps (it spanned 12 "
                 f"steps and was at lr {old_lr:.2e}; lr at step 13: {new_lr:.2e})")  # fmt: skip

    moved = train(tiny(elsewhere, data_cache, "trainer.max_steps=20", f"trainer.resume={run}"))
    assert f"continuing {run} {replanned.replace('20:', f'20 in {elsewhere}:', 1)}" in log_lines()
    assert (moved["start_step"], moved["step"]) == (12, 20)

    skipped = train(tiny(run, data_cache, "trainer.max_steps=12", "trainer.resume=auto"))
    assert skipped["skipped"] and any(line.endswith("skipped. A larger trainer.max_steps extends it")
                                      for line in log_lines())  # fmt: skip
    extended = train(tiny(run, data_cache, "trainer.max_steps=20", "trainer.resume=auto"))
    assert f"continuing {run} {replanned}" in log_lines()
    assert (extended["start_step"], extended["step"]) == (12, 20) and "skipped" not in extended
    assert run_info(run)["status"] == "finished" and run_info(run)["summary"]["step"] == 20

    # The schedule over the new budget, from the checkpoint's step on: a jump up from the old schedule's end.
    assert lrs(run)[13] == pytest.approx(new_lr) and new_lr > 3 * lrs(run)[12]
    assert {s: lrs(run)[s] for s in range(13, 21)} == pytest.approx({s: lr_at(s - 1, TINY_OPTIM, 20)
                                                                     for s in range(13, 21)})  # fmt: skip
    assert lrs(elsewhere) == pytest.approx({s: lrs(run)[s] for s in range(13, 21)}), "both ways: one schedule"
    assert train_losses(elsewhere) == pytest.approx({s: train_losses(run)[s] for s in range(13, 21)}, rel=1e-6)


@pytest.mark.slow
def test_a_continued_offline_wandb_run_names_rebuild_wandb_not_wandb_sync_and_its_config_keeps_no_status(
        tmp_path, data_cache, log_lines, capfd):  # fmt: skip
    first, second = tmp_path / "first", tmp_path / "second"
    common = ("logger.mode=offline", "trainer.max_steps=12")
    train(tiny(first, data_cache, *common, "trainer.stop_at_step=4"))
    # A run without earlier segments names no rebuild (once a test of its own, with a run of its own).
    assert not any("rebuild_wandb" in line for line in log_lines()), "one segment: nothing to rebuild"
    assert "You can sync this run to the cloud by running:" in "".join(capfd.readouterr()), "one segment: wandb sync"
    train(tiny(first, data_cache, *common, "trainer.stop_at_step=8", "trainer.resume=auto"))
    hint = "upload its whole history with: python rebuild_wandb.py {}, then wandb sync <the folder it prints>"
    assert any(hint.format(first) in line for line in log_lines())
    said = "".join(capfd.readouterr())
    assert "wandb sync" not in said, "wandb's own wandb sync line (one segment over the other) is not said above it"
    train(tiny(second, data_cache, *common, f"trainer.resume={first}"))
    assert any(hint.format(f"{first} {second}") in line for line in log_lines())
    assert run_info(second)["continues"] == [str(first)]

    (rebuilt,) = rebuild_wandb.main([str(first), str(second)]).glob("run-*.wandb")
    assert sorted(s for s, m in history(rebuilt).items() if "train/loss" in m) == list(range(1, 13))

    for offline_run in (second / "wandb").glob("offline-run-*/run-*.wandb"):
        records = list(read_complete(offline_run))
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        config = {item.key for item in run.config.update}
        assert "trainer" in config and not config & {"status", "segments"}, "nothing in the config goes stale"
        summary = {item.key: json.loads(item.value_json) for r in records
                   if r.WhichOneof("record_type") == "summary" for item in r.summary.update}  # fmt: skip
        assert summary["status"] == "finished"


def test_a_cpu_plan_estimates_the_time_on_this_cpu_and_calls_float32_no_autocast(capsys):
    summary = train(compose_train("trainer.plan=true", "trainer.device=cpu"))
    out = capsys.readouterr().out
    assert "estimated time on this CPU: " in out and "GFLOP/s just now" in out
    assert "on a GPU instead (trainer=gpu), one H100" in out
    assert "estimated peak memory in RAM (float32, eager)" in out and "autocast" not in out
    plan = summary["plan"]
    assert f"estimated time on this CPU: {duration_text(plan.cpu_minutes())} (its float32 matmuls measured at " \
           f"{plan.cpu_flops / 1e9:,.0f} GFLOP/s" in out  # fmt: skip
    gpu = train(compose_train("trainer.plan=true", "trainer=gpu"))["plan"]
    assert gpu.cpu_minutes() is None and "estimated peak memory per GPU (bfloat16 autocast, eager)" in gpu.text()


@pytest.mark.parametrize("minutes,text", [(0.001, "under a second"), (0.5, "30 s"), (90, "90.0 min"),
                                          (300, "5.0 h")])  # fmt: skip
def test_durations_read_in_the_unit_a_reader_wants(minutes, text):
    assert duration_text(minutes) == text


def test_the_end_of_run_sample_uses_sample_py_s_defaults(tmp_path, data_cache, log_lines):
    assert (SampleConfig.temperature, SampleConfig.top_k) == (DEFAULT_TEMPERATURE, DEFAULT_TOP_K)
    train(tiny(tmp_path / "run", data_cache, "trainer.max_steps=2", "trainer.sample_tokens=8"))
    (line,) = [line for line in log_lines() if line.startswith("sample (")]
    assert line.startswith(f"sample (8 tokens from <|endoftext|>, temperature {DEFAULT_TEMPERATURE}, "
                           f"top_k={DEFAULT_TOP_K}, as sample.py's defaults):")  # fmt: skip
