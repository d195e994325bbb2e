"""A run stopped at any moment of its life can be continued by the documented command, and says how it ended.

- a signal that comes during the last step (the final evaluation or save) leaves a finished run, which
  ``trainer.resume=auto`` skips (a sweep's continue command goes on to its later jobs);
- Ctrl-C on ``python train.py ... | tee log`` ends the reader too: the run still saves, records that it was
  interrupted and leaves its continue command in train.log;
- a SIGKILL at each moment a run creates a file, from the first: ``python train.py <same options>
  hydra.run.dir=<its directory> trainer.resume=auto`` continues it to the uninterrupted run's losses.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, TINY, compose_train, run_cli, train_losses
from warm_python import start_python

from common.run_files import LAST, OWNER
from training import loop
from training.loop import train


def test_a_signal_during_the_last_save_leaves_a_finished_run_that_resume_auto_skips(tmp_path, data_cache,
                                                                                     monkeypatch):  # fmt: skip
    real_save = loop.Trainer.save

    def save_signalled(trainer, name, step):
        if name == LAST and step == trainer.cfg.trainer.max_steps:
            os.kill(os.getpid(), signal.SIGTERM)  # lands while the run saves its last checkpoint
        real_save(trainer, name, step)

    monkeypatch.setattr(loop.Trainer, "save", save_signalled)
    run = tmp_path / "run"
    options = [*TINY, "trainer.max_steps=4", "logger=none", f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"]
    summary = train(compose_train(*options))
    assert summary["step"] == 4 and summary["stopped_by"] is None and summary["signal"] == "SIGTERM"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["summary"]["stopped_by"] is None
    monkeypatch.undo()
    again = train(compose_train(*options, "trainer.resume=auto"))
    assert again["skipped"] and again["stopped_by"] is None, "a sweep's continue command goes on past it"


def test_a_finished_run_whose_record_says_a_signal_stopped_it_is_skipped_as_finished(tmp_path, data_cache):
    """A finished run's run.json may say a signal stopped it (the signal came during its last step, recorded so
    before that was told apart): trainer.resume=auto skips it as finished, and nothing stops a sweep there."""
    run = tmp_path / "run"
    options = [*TINY, "trainer.max_steps=3", "logger=none", f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"]
    train(compose_train(*options))
    info = json.loads((run / "run.json").read_text())
    info["summary"].update(stopped_by="SIGTERM", signal="SIGTERM")
    (run / "run.json").write_text(json.dumps(info))
    again = train(compose_train(*options, "trainer.resume=auto"))
    assert again["skipped"] and again["stopped_by"] is None and "signal" not in again


@pytest.mark.slow
def test_a_sweep_whose_job_was_signalled_in_its_last_step_continues_to_its_end_and_then_skips_every_job(
        tmp_path, data_cache):  # fmt: skip
    """A real multirun, a real SIGTERM as its first job saves its last step: the job is finished, the sweep stops
    (exit 143); its printed command runs the rest, and again skips every job and exits 0."""
    sweep = tmp_path / "sweep"
    args = ["-m", "attention=wrapper,fused_qkv", *TINY, "trainer.max_steps=4", "logger=none",
            f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}"]  # fmt: skip
    code = ("import os, runpy, signal, sys\n"
            "from training import loop\n"
            "save, sent = loop.Trainer.save, []\n"
            "def signalled(trainer, name, step):\n"
            "    if name == 'last.pt' and step == trainer.cfg.trainer.max_steps and not sent:\n"
            "        sent.append(step); os.kill(os.getpid(), signal.SIGTERM)\n"
            "    save(trainer, name, step)\n"
            "loop.Trainer.save = signalled\n"
            f"sys.argv[0] = {str(ROOT / 'train.py')!r}; runpy.run_path(sys.argv[0], run_name='__main__')")  # fmt: skip
    first = start_python(["-c", code, *args], cwd=tmp_path).wait(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-3000:]
    assert "came as the run finished its last step (step 4)" in first.stderr
    command = first.stderr.strip().splitlines()[-1].split()
    assert command[:3] == ["python", "train.py", "-m"] and command[-1] == "trainer.resume=auto"
    for _ in range(2):  # the rest of the sweep; then every job skipped
        result = run_cli(*command[2:], cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"the sweep has ended: 2 runs in {sweep} (2 finished)" in result.stdout
    assert "already finished" in result.stdout + result.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="a pipe whose reader exits")
@pytest.mark.slow
def test_ctrl_c_on_a_run_piped_into_a_reader_that_exits_still_saves_and_continues(tmp_path, data_cache):
    run = tmp_path / "run"
    options = [*TINY, "trainer.max_steps=100000", "trainer.checkpoint_interval=100000",
               "trainer.eval_interval=100000", "logger=none", f"data.cache_dir={data_cache}",
               f"hydra.run.dir={run}"]  # fmt: skip
    # `python train.py ... 2>&1 | tee log`: its stdout and stderr are a pipe (a named one, so that the run can be
    # forked warm: tests/warm_python.py), whose reader is this test
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # open before the writer: its open does not block
    # The terminal the command is typed in: a pseudo-terminal, the run's controlling terminal (its session's).
    terminal, screen = os.openpty()
    code = (f"import os, runpy, sys; os.setsid(); os.open({os.ttyname(screen)!r}, os.O_RDWR); "
            f"pipe = os.open({str(pipe)!r}, os.O_WRONLY); os.dup2(pipe, 1); os.dup2(pipe, 2); "
            f"sys.argv[0] = {str(ROOT / 'train.py')!r}; runpy.run_path(sys.argv[0], run_name='__main__')")  # fmt: skip
    proc = start_python(["-c", code, *options], cwd=tmp_path)
    deadline = time.time() + 120
    while time.time() < deadline and len(train_losses(run) if (run / "metrics.jsonl").exists() else {}) < 3:
        assert proc.running(), os.read(reader, 1 << 16).decode(errors="replace")[-3000:]
        time.sleep(0.05)
    os.close(reader)  # `| tee log` after Ctrl-C: the reader is gone
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=60).returncode == 130, "stopped by Ctrl-C, not killed by a write to the closed pipe"
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "interrupted" and (run / LAST).exists()
    log = (run / "train.log").read_text()
    assert "stopped by SIGINT" in log and f"hydra.run.dir={run} trainer.resume=auto" in log
    os.set_blocking(terminal, False)
    shown = os.read(terminal, 1 << 16).decode(errors="replace")
    os.close(terminal), os.close(screen)
    assert "stopped by SIGINT" in shown and f"hydra.run.dir={run} trainer.resume=auto" in shown, shown
    assert f"this is also in {run / 'train.log'}" in shown, "the screen says where the continue command is kept"
    more = f"trainer.max_steps={info['summary']['step'] + 2}"  # two more steps: what it says, not how long it trains
    continued = run_cli(*[o for o in options if not o.startswith("trainer.max_steps")], more, "trainer.resume=auto",
                        cwd=tmp_path)  # fmt: skip
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert f"continuing {run} from step" in continued.stdout


# The files a run creates, in order (the directory itself first): a SIGKILL as each appears.
MOMENTS = {
    "the run directory": lambda run: run.is_dir(),
    "Hydra's .hydra folder": lambda run: (run / ".hydra" / "overrides.yaml").exists(),
    "the lock file": lambda run: (run / OWNER).exists(),
    "run.json": lambda run: (run / "run.json").exists(),
    "the first metrics": lambda run: (run / "metrics.jsonl").exists() and (run / "metrics.jsonl").stat().st_size,
    "last.pt": lambda run: (run / LAST).exists(),
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_cache):
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(compose_train(*TINY, "logger=none", f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))
    return train_losses(run)


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.slow
def test_a_run_killed_as_it_creates_each_file_continues_to_the_uninterrupted_losses(moment, tmp_path, data_cache,
                                                                                     uninterrupted):  # fmt: skip
    run = tmp_path / "run"
    options = [*TINY, "logger=none", f"data.cache_dir={data_cache}", f"hydra.run.dir={run}"]
    proc, appeared = start_python([str(ROOT / "train.py"), *options], cwd=tmp_path), MOMENTS[moment]
    deadline = time.time() + 60
    while not appeared(run) and time.time() < deadline:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60).returncode == -signal.SIGKILL, f"it ended before {moment} appeared"
    continued = run_cli(*options, "trainer.resume=auto", cwd=tmp_path)
    assert continued.returncode == 0, f"killed at {moment}: {continued.stderr[-2000:]}"
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    assert train_losses(run) == uninterrupted, f"killed at {moment}"


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MB filesystem (tmpfs), to fill up; skipped where this user cannot mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem to fill: {mounted.stderr.decode().strip()[:200]}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk) -> None:
    """Write into ``disk`` until it has no byte left."""
    with open(disk / "filler", "wb", buffering=0) as f:
        for chunk in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                continue


def test_a_disk_that_fills_up_during_a_save_fails_with_that_message_and_the_run_continues(
        data_cache, small_disk, monkeypatch):  # fmt: skip
    run_dir = small_disk / "run"
    cfg = compose_train(*TINY, "logger=none", "trainer.max_steps=6", "trainer.checkpoint_interval=2",
                        f"trainer.run_dir={run_dir}", f"data.cache_dir={data_cache}")  # fmt: skip
    real_save = loop.Trainer.save

    def save_on_a_full_disk(self, name, step):
        if step == 4:
            fill(small_disk)
        return real_save(self, name, step)

    monkeypatch.setattr(loop.Trainer, "save", save_on_a_full_disk)
    # the first error (torch.save's own words for a full disk are obscure: "unexpected pos 64 vs 0"), not a
    # second one from recording the run's end
    with pytest.raises(OSError, match=r"could not write checkpoint .*last.pt \(.*\); free disk space"):
        train(cfg)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed", "written in place"
    monkeypatch.undo()
    (small_disk / "filler").unlink()
    summary = train(compose_train(*TINY, "logger=none", "trainer.max_steps=6", "trainer.checkpoint_interval=2",
                                  f"trainer.run_dir={run_dir}", f"data.cache_dir={data_cache}",
                                  "trainer.resume=auto"))  # fmt: skip
    assert summary["start_step"] == 2 and summary["step"] == 6, "continued from the last checkpoint written"
