"""Sweeps you can stop, continue and read while they run (one continuation mechanism: training.continuation)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT, TINY, compose_train, read_metrics, run_cli, train_losses
from warm_python import start_python

import compare
from training.loop import train
from training.run_log import claim_run_dir


def tiny(run_dir: Path, data_cache: Path, *overrides: str):
    return compose_train(*TINY, "logger=none", f"trainer.run_dir={run_dir}", f"data.cache_dir={data_cache}",
                         *overrides)  # fmt: skip


@pytest.mark.slow
def test_a_signal_stops_the_whole_sweep_and_its_one_command_continues_it_to_the_uninterrupted_result(
        tmp_path, data_cache):  # fmt: skip
    args = ["-m", "attention=wrapper,fused_qkv", *TINY, "trainer.max_steps=40", "logger.mode=offline",
            f"data.cache_dir={data_cache}", f"hydra.sweep.dir={tmp_path / 'sweep'}"]  # fmt: skip
    # A process of its own (forked from the warm interpreter: tests/warm_python.py), signalled as it trains.
    proc = start_python([str(ROOT / "train.py"), *args], cwd=tmp_path)
    first = tmp_path / "sweep" / "0_wrapper-sdpa"
    deadline = time.time() + 120
    while time.time() < deadline and sum("train/loss" in line for line in _lines(first / "metrics.jsonl")) < 5:
        assert _running(proc.pid), proc.wait().stderr[-3000:]
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGINT)
    ended = proc.wait(timeout=120)
    err = ended.stderr
    assert ended.returncode == 130, err[-3000:]
    assert "no later job of the sweep was started" in err and not (tmp_path / "sweep" / "1_fused_qkv-sdpa").exists()
    assert json.loads((first / "run.json").read_text())["status"] == "interrupted"

    command = shlex.split(err.split("the rest start:\n")[1].strip().splitlines()[0])
    assert command[:3] == ["python", "train.py", "-m"] and command[-1] == "trainer.resume=auto"
    result = run_cli(*command[2:], cwd=tmp_path, env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"continuing {first} from step" in result.stdout

    for layout, name in (("wrapper", "0_wrapper-sdpa"), ("fused_qkv", "1_fused_qkv-sdpa")):
        whole = tmp_path / f"whole-{layout}"
        train(tiny(whole, data_cache, f"attention={layout}", "trainer.max_steps=40"))
        pieced = train_losses(tmp_path / "sweep" / name)
        assert sorted(pieced) == list(range(1, 41)), name
        assert [pieced[s] for s in range(1, 41)] == pytest.approx([train_losses(whole)[s] for s in range(1, 41)],
                                                                  rel=1e-6), name  # fmt: skip
    # wandb keeps one run per job: the continuation logged under the run's own id
    ids = {p.name.rsplit("-", 1)[1] for p in (first / "wandb").glob("offline-run-*")}
    assert len(list((first / "wandb").glob("offline-run-*"))) == 2 and len(ids) == 1


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _running(pid: int) -> bool:
    """Whether process ``pid`` has not ended (a zombie has: its parent has yet to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_continuing_a_killed_run_drops_what_it_logged_after_its_checkpoint_and_ends_as_if_never_stopped(
        tmp_path, data_cache):  # fmt: skip
    common = ("model.dropout=0.1", "trainer.max_steps=16", "trainer.checkpoint_interval=5")
    run = tmp_path / "run"
    train(tiny(run, data_cache, *common, "trainer.stop_at_step=12"))  # saves last.pt at step 12...
    # ... as if killed at step 14 after its last checkpoint at step 12: records of steps 13-14, status running
    info = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**info, "status": "running"}))
    with open(run / "metrics.jsonl", "a") as f:
        f.writelines(json.dumps({"step": s, "train/loss": 99.0}) + "\n" for s in (13, 14))
        f.write('{"step": 15, "train/lo')  # a line cut by the kill
    summary = train(tiny(run, data_cache, *common, "trainer.resume=auto"))
    assert summary["start_step"] == 12 and summary["step"] == 16
    train(tiny(tmp_path / "whole", data_cache, *common))
    assert train_losses(run) == train_losses(tmp_path / "whole"), "the same losses, step for step"
    assert json.loads((run / "run.json").read_text())["status"] == "finished"


def test_a_finished_run_is_skipped_and_left_as_it_was(tmp_path, data_cache):
    run = tmp_path / "run"
    done = train(tiny(run, data_cache))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    again = train(tiny(run, data_cache, "trainer.resume=auto"))
    assert again["skipped"] and again["val_loss"] == done["val_loss"]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


def test_a_run_killed_before_its_first_checkpoint_starts_again_in_place(tmp_path, data_cache):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 99.0}) + "\n")
    summary = train(tiny(run, data_cache, "trainer.resume=auto"))
    assert summary["start_step"] == 0 and [m["step"] for m in read_metrics(run) if "train/loss" in m] == list(
        range(1, 21))


def test_a_continuation_with_other_settings_is_refused_naming_them(tmp_path, data_cache):
    run = tmp_path / "run"
    train(tiny(run, data_cache, "trainer.stop_at_step=5"))
    with pytest.raises(ValueError, match=r"cannot continue the run in .*run: this run's optim.lr=0.001 differs from "
                                         r"the settings it was started with\. "):  # fmt: skip
        train(tiny(run, data_cache, "trainer.resume=auto", "optim.lr=1e-3"))


def test_two_processes_never_write_one_run_directory(tmp_path):
    held = claim_run_dir(str(tmp_path / "run"), continuing=True)
    try:
        with pytest.raises(ValueError, match="is being written by another process right now"):
            claim_run_dir(str(tmp_path / "run"), continuing=True)
    finally:
        held.release()
    claim_run_dir(str(tmp_path / "run"), continuing=True).release()  # free again once the writer is gone


@pytest.mark.slow
def test_the_report_reads_a_sweep_at_any_moment(tmp_path, data_cache, capsys):
    sweep = tmp_path / "sweep"
    for seed in (1, 2):
        train(tiny(sweep / f"wrapper-{seed}", data_cache, "attention=wrapper", f"trainer.seed={seed}"))
    train(tiny(sweep / "fused-1", data_cache, "trainer.seed=1"))
    train(tiny(sweep / "fused-2", data_cache, "trainer.seed=2", "trainer.stop_at_step=3"))  # before any evaluation
    train(tiny(sweep / "separate-1", data_cache, "attention=separate_qkv", "trainer.stop_at_step=12"))
    running = sweep / "separate-1"
    info = json.loads((running / "run.json").read_text())
    (running / "run.json").write_text(json.dumps({**info, "status": "running"}))
    claim = claim_run_dir(str(running), continuing=True)  # a process writes it right now
    (sweep / "broken").mkdir()
    (sweep / "broken" / "run.json").write_text(json.dumps({**info, "status": "running", "segments": []}))
    (sweep / "broken" / "failure.json").write_text(json.dumps({"reason": "out of memory (injected)"}))
    try:
        out = compare.main([str(sweep)])
        report = (out / "report.md").read_text()
        assert "6 runs (1 failed, 3 finished, 1 running, 1 stopped)" in report
        for row in ("| wrapper | sdpa | 1 | finished |", "| fused_qkv | sdpa | 2 | stopped 3/20 |",
                    "| separate_qkv | sdpa | 1337 | running 12/20 |", "| separate_qkv | sdpa | 1337 | FAILED |"):
            assert row in report, row
        assert "FAILED: out of memory (injected)" in report
        for name in ("val_loss_vs_step.png", "val_loss_vs_time.png", "throughput.png"):
            assert (out / name).stat().st_size > 10_000

        # --watch reports again until no run is still going (here: its writer stops)
        threading.Timer(1.0, claim.release).start()
        start = time.monotonic()
        compare.main([str(sweep), "--watch", "0.3"])
        assert time.monotonic() - start >= 0.9
        printed = capsys.readouterr().out.split("1 run(s) still going")
        assert len(printed) >= 2, "a report found the run going, and another came after it"
        assert "| running 12/20 |" in printed[0] and "| killed 12/20 |" in printed[-1], "its writer is gone"
        assert "| running 12/20 |" not in printed[-1], "the last report is the one that found nothing going"
    finally:
        claim.release()
