"""Every job of a multirun starts on a clean device: nothing of an earlier job, finished or failed, stays referenced
when the next job's plan reads the memory it may use (its auto micro-batch is then what it picks alone)."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
from helpers import ROOT, TINY, compose_train
from warm_python import run_python

import training.loop as loop
import training.preflight as preflight
from training.loop import RunFailed, train

DIVERGING = ["optim.lr=1e6", "optim.min_lr=0", "optim.grad_clip=0", "optim.warmup_steps=0"]


def test_nothing_of_a_failed_or_finished_job_is_alive_when_the_next_plan_reads_memory(tmp_path, data_cache,
                                                                                      monkeypatch):  # fmt: skip
    jobs: list[list[weakref.ref]] = []
    alive_at_start: list[int] = []
    run, release = loop.Trainer.run, preflight.release_memory

    def watched_run(self):
        try:
            return run(self)
        finally:
            state = [t for s in self.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
            jobs.append([weakref.ref(o) for o in (self, self.model, self.optimizer, *self.model.parameters(),
                                                    *state)])  # fmt: skip

    def watched_release(device):
        release(device)
        alive_at_start.append(sum(ref() is not None for job in jobs for ref in job))

    monkeypatch.setattr(loop.Trainer, "run", watched_run)
    monkeypatch.setattr(preflight, "release_memory", watched_release)
    common = [*TINY, "logger=none", "trainer.max_steps=3", "trainer.micro_batch_size=auto",
              f"data.cache_dir={data_cache}"]  # fmt: skip
    with pytest.raises(RunFailed, match="train/loss became"):
        train(compose_train(*common, *DIVERGING, f"trainer.run_dir={tmp_path / 'failed'}"))
    train(compose_train(*common, f"trainer.run_dir={tmp_path / 'finished'}"))
    train(compose_train(*common, f"trainer.run_dir={tmp_path / 'third'}"))
    assert len(jobs) == 3 and all(len(job) > 10 for job in jobs[1:]), "parameters and optimizer state were watched"
    assert alive_at_start == [0, 0, 0]


@pytest.mark.slow
def test_a_real_multirun_releases_each_job_before_the_next_plans(tmp_path, data_cache):
    out = tmp_path / "readings.json"
    result = run_python([str(ROOT / "tests" / "job_leaks.py"), str(out), "-m", *TINY, "logger=none",
                         "trainer.max_steps=3", "trainer.micro_batch_size=auto", "optim.lr=1e6,3e-3", *DIVERGING[1:],
                         f"data.cache_dir={data_cache}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[train] job 0 failed" in result.stderr
    readings = json.loads(out.read_text())
    assert [r["earlier_jobs"] for r in readings] == [0, 1], readings
    assert readings[1]["objects"] > 10 and readings[1]["alive"] == 0, readings
    runs = {p.parent.name: json.loads(p.read_text())["status"] for p in (tmp_path / "sweep").glob("*/run.json")}
    assert sorted(runs.values()) == ["failed", "finished"], runs
