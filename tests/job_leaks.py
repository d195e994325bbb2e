"""``python tests/job_leaks.py <out.json> <train.py's arguments>``: train.py as ``__main__`` (a real multirun, its
jobs run one after another in this process, as Hydra's basic launcher runs them), watched.

Each job's trainer is remembered by weak references once it has run or failed: its model, its parameters, its
optimizer and the optimizer's state tensors. When a later job's preflight has released the device
(``training.preflight.release_memory``, just before its plan reads the memory it may use), every earlier job's
references must be dead. <out.json> gets, per job start, how many of the earlier jobs' objects were still alive.
"""

from __future__ import annotations

import json
import runpy
import sys
import weakref
from pathlib import Path

import torch

import training.loop as loop
import training.preflight as preflight

out, sys.argv = Path(sys.argv[1]), [str(Path(__file__).parents[1] / "train.py"), *sys.argv[2:]]
finished_jobs: list[list[weakref.ref]] = []
readings: list[dict] = []


def remember(trainer: loop.Trainer) -> None:
    state = [t for s in trainer.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    objects = [trainer, trainer.model, trainer.optimizer, *trainer.model.parameters(), *state]
    finished_jobs.append([weakref.ref(o) for o in objects])


def watched_run(self: loop.Trainer, run=loop.Trainer.run) -> dict:
    try:
        return run(self)
    finally:
        remember(self)


def watched_release(device: torch.device, release=preflight.release_memory) -> None:
    release(device)
    alive = sum(ref() is not None for job in finished_jobs for ref in job)
    readings.append({"earlier_jobs": len(finished_jobs), "objects": sum(map(len, finished_jobs)), "alive": alive})


loop.Trainer.run = watched_run
preflight.release_memory = watched_release
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    out.write_text(json.dumps(readings))
