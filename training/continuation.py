"""One way to continue a run that stopped: a sweep stopped by a signal, a SLURM job preempted or out of time.

A run directory records its state in ``run.json`` (``status``: running, interrupted, finished or
failed; a finished run also keeps its ``summary``) next to ``last.pt``. With ``trainer.resume=auto``
(the command a stopped sweep prints uses it for every job) and in every rerun of a requeued SLURM
job, a run first looks at the directory it would write to:

- nothing there: a new run;
- a finished run: skipped, its summary returned, nothing written; with a larger ``trainer.max_steps``
  it is extended: continued in place from its ``last.pt`` to the new budget;
- a run that stopped or was killed: continued in place from its ``last.pt`` (the same losses as an
  uninterrupted run, the same wandb run id); records it logged after that checkpoint are dropped
  from ``metrics.jsonl``, since they are about to be computed again;
- a run killed before its first checkpoint (even before it wrote anything but its lock file): started again
  in place.

A run continues only with the settings it was started with (the model, data, optimizer, seed and
batch); anything else is refused, naming the differences. ``trainer.max_steps`` may change: with the
same value a continuation repeats the uninterrupted run exactly; with another the learning-rate
schedule (``optim.schedule``: warmup, then cosine or warmup-stable-decay to ``trainer.max_steps``) is
re-planned over the new budget from the checkpoint's step on, as nanoGPT does when ``max_iters``
grows, and the continuation says so (``describe``). Where the steps taken had the same learning rates
under both budgets (a wsd checkpoint of its constant phase, a checkpoint within the warmup) the
continuation is the run planned for the new budget from the start, exactly, and it says that.
"""

from __future__ import annotations

import json
import logging
import shlex
from dataclasses import dataclass
from pathlib import Path

from common.run_files import FAILURE, LAST, METRICS, OWNER, RUN_INFO, directory_in_use, read_json, write_text
from model.checkpoints.checkpoint import Checkpoint, checkpoint_path, load_checkpoint
from training import reuse
from training.config import OptimConfig
from training.optim import lr_at, same_schedule

log = logging.getLogger("headlab.train")

STOP_AT_STEP = "stop_at_step"  # run.json's stopped_by when trainer.stop_at_step ended the run (else a signal's name)


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
    """Decide how to continue the run in ``run_dir`` (a run configured as ``container``, resolved, its
    vocabulary the tokenizer's)."""
    if not run_dir:
        raise ValueError("trainer.resume=auto continues the run in trainer.run_dir, which is not set "
                         "(train.py sets it to Hydra's output directory)")  # fmt: skip
    path = Path(run_dir).expanduser().resolve()
    info = read_json(path / RUN_INFO)
    has_checkpoint = (path / LAST).is_file()
    if info is None and not has_checkpoint and not (path / METRICS).exists():
        if (path / OWNER).exists() and not directory_in_use(path):  # a run killed before it wrote anything
            return Continuation(path, "restart")
        return Continuation(path, "new")
    max_steps = container["trainer"]["max_steps"]
    if info is not None and info.get("status") == "finished":
        summary = info.get("summary") or {}
        if not has_checkpoint or summary.get("step", max_steps) >= max_steps:
            return Continuation(path, "finished", summary=summary)
        # a larger trainer.max_steps extends the finished run: continued below like a stopped one; but not back to a
        # budget it was shortened from, which is what its old continue command asks for
        check_not_shortened_from(path, info, summary.get("step"), max_steps)
    if not has_checkpoint:
        return Continuation(path, "restart")
    checkpoint = load_checkpoint(path)
    check_same_settings(path, checkpoint.train_config or {}, container)
    if checkpoint.step >= max_steps:  # killed after its last save: nothing left to do
        return Continuation(path, "finished", summary={"step": checkpoint.step,
                                                       "best_val_loss": checkpoint.best_val_loss})  # fmt: skip
    return Continuation(path, "continue", checkpoint=checkpoint)


def check_not_shortened_from(path: Path, info: dict, finished_at: int | None, max_steps: int) -> None:
    """Refuse to extend a finished run back to a budget an earlier segment of it ran towards: a continuation
    shortened it from there, so this is most likely that stop's old continue command, and the run is done."""
    budgets = [s.get("max_steps") for s in info.get("segments", [])]
    if max_steps in budgets[:-1] and budgets[-1] != max_steps:
        raise ValueError(
            f"the run in {path} finished at step {finished_at} (trainer.max_steps={budgets[-1]}): it was shortened "
            f"from trainer.max_steps={max_steps}, which this command asks for again (the continue command printed "
            f"before it was shortened?). It is finished: nothing to do. To train it on to {max_steps} steps anyway, "
            f"continue it into a new directory: trainer.resume={path} trainer.run_dir=<new directory> "
            f"trainer.max_steps={max_steps}"
        )


def planned_steps(checkpoint: Checkpoint) -> int | None:
    """The ``trainer.max_steps`` the checkpoint's run was planned for (its schedule spans them)."""
    return ((checkpoint.train_config or {}).get("trainer") or {}).get("max_steps")


def describe(source: str | Path, checkpoint: Checkpoint, max_steps: int, optim: OptimConfig,
             run_dir: Path | None = None) -> str:  # fmt: skip
    """One line: where a run continues from, to which step, and what becomes of its learning-rate schedule."""
    step, before = checkpoint.step, planned_steps(checkpoint)
    where = f" in {run_dir}" if run_dir is not None and Path(run_dir) != Path(source) else ""
    head = f"continuing {source} from step {step} to {max_steps}{where}"
    next_lr = lr_at(step, optim, max_steps)  # the lr of step `step + 1`, as the loop sets it
    schedule = "learning-rate schedule" + ("" if optim.schedule == "cosine" else f" ({optim.schedule})")
    if before == max_steps:
        return f"{head}: the same {schedule}, exactly (lr at step {step + 1}: {next_lr:.2e})"
    if before and same_schedule(optim, step, before, max_steps):
        return (f"{head}: the {schedule} over {max_steps} steps, as a run planned for {max_steps} from the start, "
                f"exactly: its {step} steps so far had the same learning rates under both budgets (lr at step "
                f"{step + 1}: {next_lr:.2e})")  # fmt: skip
    was = (f"it spanned {before} steps and was at lr {lr_at(step - 1, optim, before):.2e}; "
           if before and step > 0 else "")  # fmt: skip
    return (f"{head}: the {schedule} is re-planned over {max_steps} steps "
            f"({was}lr at step {step + 1}: {next_lr:.2e})")


def earlier_run_dirs(resume: str | None, run_dir: Path, in_place: bool) -> list[str]:
    """The directories holding the earlier segments of a continued run, oldest first (run.json's ``continues``):
    with ``run_dir``, what ``rebuild_wandb.py`` needs to rebuild the run's whole history."""
    source = Path(run_dir) if in_place else checkpoint_path(resume).parent.resolve()
    before = (read_json(source / RUN_INFO) or {}).get("continues", [])
    return list(before) if in_place else [*before, str(source)]


def check_same_settings(path: Path, saved: dict, now: dict) -> None:
    """A run continues in place only with every setting that decides its losses (training/reuse.py's
    ``continue``): ``trainer.max_steps`` may change, and where and how fast it runs."""
    diffs = sorted(reuse.differences("continue", saved, now), key=lambda d: d.key)
    if diffs:
        raise ValueError(f"cannot continue the run in {path}: this run's {reuse.differ(diffs)} from the settings "
                         f"it was started with. Continue "
                         f"it with its own settings (add {reuse.restoring(diffs)}; its run.json holds them all), "
                         f"or write to another directory (another hydra.sweep.dir or "
                         f"trainer.run_dir)")  # fmt: skip


def prepare_in_place(run_dir: Path, step: int) -> None:
    """Make the directory ready to continue from ``step``: records after it dropped, a failure forgotten."""
    metrics = run_dir / METRICS
    if metrics.exists():
        kept = [line for line in metrics.read_text().splitlines(True) if _step_of(line) <= step]
        write_text(metrics, "".join(kept))
    (run_dir / FAILURE).unlink(missing_ok=True)


def _step_of(line: str) -> float:
    try:
        return json.loads(line).get("step", 0)
    except json.JSONDecodeError:  # a line cut by a kill: drop it
        return float("inf")


def continue_command(argv: list[str], sweep_dir: str | None, run_dir: str | None, stopped_by: str | None = None,
                     launcher: tuple[str, ...] = ("python",)) -> str:  # fmt: skip
    """The command that continues a stopped multirun (or run): the same launcher (``python``, or torchrun and its
    ranks: ``training.distributed.relaunch_prefix``), the same overrides, the same directory,
    ``trainer.resume=auto`` (without ``trainer.stop_at_step`` when that was what stopped it)."""
    pinned = {"hydra.sweep.dir": sweep_dir} if sweep_dir else {"hydra.run.dir": run_dir}
    replaced = ("hydra.sweep.dir", "hydra.run.dir", "trainer.resume",
                *(("trainer.stop_at_step",) if stopped_by == STOP_AT_STEP else ()))  # fmt: skip
    kept = [arg for arg in argv
            if arg not in ("-m", "--multirun") and arg.partition("=")[0].lstrip("+") not in replaced]  # fmt: skip
    parts = [*launcher, "train.py", *(["-m"] if sweep_dir else []), *kept,
             *(f"{key}={value}" for key, value in pinned.items()), "trainer.resume=auto"]  # fmt: skip
    return " ".join([*launcher[:-1], *(shlex.quote(part) for part in parts[len(launcher) - 1 :])])
