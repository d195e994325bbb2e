"""One way to continue a run that stopped: a sweep stopped by a signal, a SLURM job preempted or out of time.

A run directory records its state in ``run.json`` (``status``: running, interrupted, finished or
failed; a finished run also keeps its ``summary``) next to ``last.pt``. With ``trainer.resume=auto``
(the command a stopped sweep prints uses it for every job) and in every rerun of a requeued SLURM
job, a run first looks at the directory it would write to:

- nothing there: a new run;
- a finished run: skipped, its summary returned, nothing written;
- a run that stopped or was killed: continued in place from its ``last.pt`` (the same losses as an
  uninterrupted run, the same wandb run id); records it logged after that checkpoint are dropped
  from ``metrics.jsonl``, since they are about to be computed again;
- a run killed before its first checkpoint: started again in place.

A run continues only with the settings it was started with (the model, data, optimizer, seed and
batch); anything else is refused, naming the differences.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from model.checkpoint import LAST, Checkpoint, load_checkpoint
from training.run_log import read_json

log = logging.getLogger("headlab.train")

RUN_INFO, METRICS = "run.json", "metrics.jsonl"


def kept_settings(container: dict) -> dict:
    """The settings a run must keep to be continued: they decide its losses. (``trainer.max_steps`` may
    grow, as with ``trainer.resume``; the vocabulary follows ``data.tokenizer``.)"""
    flat = {f"{group}.{key}": value for group in ("model", "data", "optim") for key, value in container[group].items()}
    for key in ("model.vocab_size", "data.cache_dir", "data.num_proc"):
        flat.pop(key, None)
    trainer = container["trainer"]
    return {**flat, "trainer.seed": trainer["seed"], "trainer.batch_size": trainer["batch_size"]}


@dataclass
class Continuation:
    """What ``trainer.resume=auto`` found in the run directory, and will do about it."""

    run_dir: Path
    action: str  # new | continue | finished | restart
    checkpoint: Checkpoint | None = None
    summary: dict | None = None  # a finished run's

    @property
    def in_place(self) -> bool:
        return self.action in ("continue", "restart")


def inspect(run_dir: str | Path, container: dict) -> Continuation:
    """Decide how to continue the run in ``run_dir`` (a run configured as ``container``, resolved)."""
    if not run_dir:
        raise ValueError("trainer.resume=auto continues the run in trainer.run_dir, which is not set "
                         "(train.py sets it to Hydra's output directory)")  # fmt: skip
    path = Path(run_dir).expanduser().resolve()
    info = read_json(path / RUN_INFO)
    has_checkpoint = (path / LAST).is_file()
    if info is None and not has_checkpoint and not (path / METRICS).exists():
        return Continuation(path, "new")
    if info is not None and info.get("status") == "finished":
        return Continuation(path, "finished", summary=info.get("summary") or {})
    if not has_checkpoint:
        return Continuation(path, "restart")
    checkpoint = load_checkpoint(path)
    check_same_settings(path, checkpoint.train_config or {}, container)
    if checkpoint.step >= container["trainer"]["max_steps"]:  # killed after its last save: nothing left to do
        return Continuation(path, "finished", summary={"step": checkpoint.step,
                                                       "best_val_loss": checkpoint.best_val_loss})  # fmt: skip
    return Continuation(path, "continue", checkpoint=checkpoint)


def check_same_settings(path: Path, saved: dict, now: dict) -> None:
    before, after = kept_settings(saved), kept_settings(now)
    diffs = [f"{key}: {before.get(key)!r} then, {after.get(key)!r} now"
             for key in sorted(before.keys() | after.keys()) if before.get(key) != after.get(key)]  # fmt: skip
    if diffs:
        raise ValueError(
            f"cannot continue the run in {path}: it was started with other settings ({'; '.join(diffs)}). "
            f"Continue it with its own settings (its .hydra/overrides.yaml), or write to another directory "
            f"(another hydra.sweep.dir or trainer.run_dir)"
        )


def prepare_in_place(run_dir: Path, step: int) -> None:
    """Make the directory ready to continue from ``step``: records after it dropped, a failure forgotten."""
    metrics = run_dir / METRICS
    if metrics.exists():
        kept = [line for line in metrics.read_text().splitlines(True) if _step_of(line) <= step]
        tmp = metrics.with_name(f".{METRICS}.tmp-{os.getpid()}")
        tmp.write_text("".join(kept))
        os.replace(tmp, metrics)
    (run_dir / "failure.json").unlink(missing_ok=True)


def _step_of(line: str) -> float:
    try:
        return json.loads(line).get("step", 0)
    except json.JSONDecodeError:  # a line cut by a kill: drop it
        return float("inf")


def continue_command(argv: list[str], sweep_dir: str | None, run_dir: str | None) -> str:
    """The command that continues a stopped multirun (or run): the same overrides, the same directory,
    ``trainer.resume=auto``."""
    pinned = {"hydra.sweep.dir": sweep_dir} if sweep_dir else {"hydra.run.dir": run_dir}
    kept = [arg for arg in argv if arg not in ("-m", "--multirun")
            and arg.partition("=")[0].lstrip("+") not in ("hydra.sweep.dir", "hydra.run.dir", "trainer.resume")]
    parts = ["python", "train.py", *(["-m"] if sweep_dir else []), *kept,
             *(f"{key}={value}" for key, value in pinned.items()), "trainer.resume=auto"]  # fmt: skip
    return " ".join(shlex.quote(part) for part in parts)
