"""Real (tiny) training runs: loss goes down, files are written, resume is exact, signals are safe."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TINY, compose_train, read_metrics, run_cli, train_losses, user_env
from warm_python import run_python, start_python

from model.checkpoints.checkpoint import load_checkpoint
from training.loop import RunFailed, train


def tiny(tmp_path: Path, data_cache: Path, name: str, *overrides: str):
    return compose_train(*TINY, f"trainer.run_dir={tmp_path / name}", f"data.cache_dir={data_cache}",
                         *overrides)  # fmt: skip


def test_tiny_run_learns_and_writes_metrics_checkpoints_and_a_wandb_offline_run(tmp_path, data_cache):
    summary = train(tiny(tmp_path, data_cache, "run", "logger.mode=offline", "trainer.max_steps=40"))
    run_dir = Path(summary["run_dir"])

    metrics = read_metrics(run_dir)
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    vals = [m["val/loss"] for m in metrics if "val/loss" in m]
    assert len(losses) == 40 and len(vals) == 4
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, "training lowered the loss"
    assert vals[-1] < vals[0]
    step_metrics = next(m for m in metrics if "train/loss" in m)
    assert {"lr", "perf/tokens_per_sec", "perf/step_ms", "perf/max_rss_mb", "perf/others_cores"} <= step_metrics.keys()
    assert all(m["perf/others_cores"] >= 0 for m in metrics if "train/loss" in m), "cores other processes used"
    assert "perf/mfu" not in step_metrics, "no MFU on a CPU"
    bpb = [m["val/bpb"] for m in metrics if "val/bpb" in m]
    assert bpb[-1] == pytest.approx(vals[-1] / math.log(2), rel=0.01), "bytes tokenizer: ~1 token per byte"

    for name in ("last.pt", "best.pt"):
        ckpt = load_checkpoint(run_dir / name)  # weights_only=True
        assert ckpt.tokenizer == "bytes" and ckpt.train_config["model"]["attention"] == "fused_qkv"
        assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt.model)
    assert load_checkpoint(run_dir).step == 40
    assert load_checkpoint(run_dir / "best.pt").best_val_loss == pytest.approx(min(vals))

    runs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
    assert load_checkpoint(run_dir).wandb_run_id in runs[0].name


def test_resume_continues_exactly(tmp_path, data_cache):
    common = ("logger=none", "model.dropout=0.1", "trainer.max_steps=12")  # dropout: RNG state matters
    train(tiny(tmp_path, data_cache, "whole", *common))
    first = train(tiny(tmp_path, data_cache, "part", *common, "trainer.stop_at_step=5"))
    assert first["step"] == 5
    second = train(tiny(tmp_path, data_cache, "rest", *common, f"trainer.resume={tmp_path / 'part'}"))
    assert second["start_step"] == 5 and second["step"] == 12

    whole = train_losses(tmp_path / "whole")
    pieced = {**train_losses(tmp_path / "part"), **train_losses(tmp_path / "rest")}
    assert sorted(pieced) == list(range(1, 13))
    assert pieced == whole, "the same losses, step for step"


@pytest.mark.slow
def test_every_micro_batch_trains_on_the_same_data_to_round_off(tmp_path, data_cache):
    """The step's windows are a function of (seed, step) alone: micro-batches of 8, 4 and 2 at batch 8 (1, 2 and 4
    accumulation steps) give the same train loss at every step, and so does a run continued with another
    micro-batch, up to float32 round-off in the sums."""
    common = ("logger=none", "trainer.max_steps=10", "trainer.eval_interval=10")
    runs = {}
    for micro in (8, 4, 2):
        train(tiny(tmp_path, data_cache, f"micro{micro}", *common, f"trainer.micro_batch_size={micro}"))
        runs[micro] = train_losses(tmp_path / f"micro{micro}")
    train(tiny(tmp_path, data_cache, "switched", *common, "trainer.stop_at_step=4"))
    train(tiny(tmp_path, data_cache, "switched", *common, "trainer.resume=auto", "trainer.micro_batch_size=2"))
    runs["8 then 2"] = train_losses(tmp_path / "switched")
    for name, losses in runs.items():
        assert sorted(losses) == list(range(1, 11)), name
        assert max(abs(losses[s] - runs[8][s]) for s in losses) <= 2e-4, (name, losses, runs[8])
    assert runs[8][10] < runs[8][1] - 0.5, "it learned: the losses compared are not a constant"


def test_resume_with_a_different_model_is_refused(tmp_path, data_cache):
    train(tiny(tmp_path, data_cache, "run", "logger=none", "trainer.max_steps=2"))
    cfg = tiny(tmp_path, data_cache, "other", "logger=none", "model.n_embd=64",
               f"trainer.resume={tmp_path / 'run'}")  # fmt: skip
    with pytest.raises(ValueError, match="this run's model.n_embd=64 differs from the checkpoint's"):
        train(cfg)


DIVERGING = ["optim.lr=1e6", "optim.min_lr=0", "optim.grad_clip=0", "optim.warmup_steps=0"]


def test_non_finite_loss_stops_the_run_records_why_and_keeps_the_last_good_checkpoint(tmp_path, data_cache):
    cfg = tiny(tmp_path, data_cache, "run", "logger=none", *DIVERGING, "trainer.checkpoint_interval=1")
    with pytest.raises(RunFailed, match=r"train/loss became (nan|inf) at step \d+.*last good checkpoint is .*"
                                        r"Lower optim.lr"):  # fmt: skip
        train(cfg)
    ckpt = load_checkpoint(tmp_path / "run")
    assert all(torch.isfinite(t).all() for t in ckpt.model.values())
    assert "train/loss became" in json.loads((tmp_path / "run" / "failure.json").read_text())["reason"]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_a_diverged_run_is_one_line_alone_and_one_failed_job_in_a_sweep_whose_others_go_on(tmp_path, data_cache):
    alone = run_cli(*TINY, *DIVERGING, f"trainer.run_dir={tmp_path / 'alone'}", f"data.cache_dir={data_cache}",
                    cwd=tmp_path, env=user_env())  # fmt: skip
    assert alone.returncode == 1 and "Traceback" not in alone.stderr, alone.stderr[-3000:]
    assert alone.stderr.strip().splitlines()[-1].startswith("error: fused_qkv-sdpa-nano: train/loss became")
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *TINY, "optim.lr=1e6,6e-4", *DIVERGING[1:], "trainer.max_steps=3",
                     f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}", cwd=tmp_path, env=user_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[train] job 0 failed: " in result.stderr and "Traceback" not in result.stderr
    assert f"the sweep has ended: 2 runs in {sweep} (1 failed, 1 finished)" in result.stdout
    (failed,) = sweep.glob("0_*/failure.json")
    assert "train/loss became" in json.loads(failed.read_text())["reason"]
    (second,) = sweep.glob("1_*/run.json")
    assert json.loads(second.read_text())["status"] == "finished"


def test_sigterm_finishes_the_step_saves_and_the_checkpoint_resumes(tmp_path, data_cache):
    run_dir = tmp_path / "run"
    args = [*TINY, "trainer.max_steps=100000", "trainer.checkpoint_interval=100000",
            "trainer.eval_interval=100000", "logger=none", f"trainer.run_dir={run_dir}",
            f"data.cache_dir={data_cache}", f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    proc = start_python([str(ROOT / "train.py"), *args], cwd=tmp_path)  # a process of its own, forked warm
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 3):
        assert proc.running(), proc.wait().stderr[-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    result = proc.wait(timeout=60)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr  # stopped by a signal: not a success

    ckpt = load_checkpoint(run_dir)
    logged = train_losses(run_dir)
    assert ckpt.step == max(logged) >= 3, "the checkpoint holds the last finished step"
    summary = train(compose_train(*TINY, f"trainer.max_steps={ckpt.step + 2}", "logger=none",
                                  f"trainer.resume={run_dir}", f"trainer.run_dir={tmp_path / 'resumed'}",
                                  f"data.cache_dir={data_cache}"))  # fmt: skip
    assert summary["start_step"] == ckpt.step and summary["step"] == ckpt.step + 2


@pytest.mark.slow
def test_multirun_writes_one_run_directory_and_one_wandb_run_per_job_in_one_group(tmp_path, data_cache):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "attention=wrapper,fused_qkv", *TINY, "trainer.max_steps=3",
                     "logger.mode=offline", f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}",
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.rstrip().splitlines()[-1] == (f"[train] the sweep has ended: 2 runs in {sweep} (2 finished); "
                                                      f"compare them: python compare.py {sweep}")  # fmt: skip
    run_dirs = sorted(p for p in sweep.iterdir() if p.is_dir() and (p / "metrics.jsonl").exists())
    assert [p.name for p in run_dirs] == ["0_wrapper-sdpa", "1_fused_qkv-sdpa"]
    group = f"sweep-{sweep.parent.name}_{sweep.name}".encode()
    for run_dir, layout in zip(run_dirs, ["wrapper", "fused_qkv"]):
        assert load_checkpoint(run_dir).train_config["model"]["attention"] == layout
        (wandb_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
        recorded = wandb_file.read_bytes()
        assert group in recorded and f"{layout}-sdpa-nano".encode() in recorded


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on loopback")
@pytest.mark.slow
def test_two_gloo_ranks_match_one_process_with_another_split_of_the_batch(tmp_path):
    """And the ranks, started on a corpus no process has prepared, prepare it once without a collective (this
    torchrun run also proves what test_architecture.py's test_two_gloo_ranks_prepare_an_unprepared_corpus_once_
    without_a_collective did)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"{i}.txt").write_text(f"def function_{i}(x):\n    return x * {i} + {i * i}\n" * 5)
    cache = tmp_path / "cache"
    common = [
        *TINY,
        "logger=none",
        "data=files",
        f"data.path={corpus}",
        "data.tokenizer=bytes",
        "data.num_proc=1",
        f"data.cache_dir={cache}",
        "trainer.batch_size=16",
        "trainer.max_steps=6",
        "trainer.eval_interval=3",
        "trainer.eval_windows=3",
    ]  # fmt: skip  (3 windows: the ranks hold unequal shares)
    # torchrun's launcher is forked warm (tests/warm_python.py); its ranks are fresh interpreters it starts, with
    # one thread each (torchrun's default, and pytest -n's share of the cores).
    result = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
                         *common, "trainer.micro_batch_size=8", f"trainer.run_dir={tmp_path / 'ddp'}",
                         f"hydra.run.dir={tmp_path / 'hydra'}"],
                        cwd=tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    prepared = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(prepared) == 1 and (prepared[0] / "meta.json").exists()
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name], "no half-written directory left"

    # One process, 4 micro-steps of 4: the ranks' windows, in another split.
    train(compose_train(*common, "trainer.micro_batch_size=4", f"trainer.run_dir={tmp_path / 'single'}"))
    single, ddp = read_metrics(tmp_path / "single"), read_metrics(tmp_path / "ddp")
    assert [sorted(m) for m in single if "val/loss" in m] == [sorted(m) for m in ddp if "val/loss" in m]
    for key in ("train/loss", "val/loss"):
        a = [m[key] for m in single if key in m]
        b = [m[key] for m in ddp if key in m]
        assert len(a) == len(b) == {"train/loss": 6, "val/loss": 2}[key]
        assert a == pytest.approx(b, abs=2e-4), key
    # Only rank 0 wrote: one metrics file, one Hydra directory.
    assert [p.name for p in (tmp_path / "ddp").iterdir()] and list((tmp_path / "hydra").glob(".hydra"))


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on loopback")
@pytest.mark.slow
def test_a_torchrun_run_stopped_in_place_continues_with_the_printed_torchrun_command_to_the_same_losses(
        tmp_path, data_cache):  # fmt: skip
    """No trainer.run_dir: Hydra's dated directory, which only rank 0 keeps. The printed command names it and starts
    with torchrun; every rank then reads the checkpoint there, and the run ends, finished, with the losses of one
    uninterrupted process (the same windows for any split of the batch)."""
    import shlex

    common = [*TINY, "logger=none", "trainer.max_steps=8", "trainer.micro_batch_size=4", "trainer.eval_interval=4",
              "trainer.checkpoint_interval=4", f"data.cache_dir={data_cache}"]  # fmt: skip
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py")]
    first = run_python([*torchrun, *common, "trainer.stop_at_step=3"], cwd=tmp_path, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    printed = first.stderr.strip().splitlines()[-1].strip()
    launcher = "torchrun --standalone --nproc_per_node=2 train.py "
    assert printed.startswith(launcher) and "trainer.resume=auto" in printed, printed
    second = run_python([*torchrun, *shlex.split(printed.removeprefix(launcher))], cwd=tmp_path, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").glob("*/*")
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"
    train(compose_train(*common, f"trainer.run_dir={tmp_path / 'single'}"))
    single, continued = train_losses(tmp_path / "single"), train_losses(run_dir)
    assert sorted(continued) == list(range(1, 9))
    assert max(abs(continued[s] - single[s]) for s in single) <= 2e-4, (continued, single)
