"""Rebuild a run's wandb history from its ``metrics.jsonl``, ``samples.txt`` and ``run.json``: nothing logged is lost.

    python rebuild_wandb.py runs/2026-11-21/10-00-00_fused_qkv-sdpa                 # a damaged or missing .wandb
    python rebuild_wandb.py runs/.../10-00-00_fused_qkv-sdpa runs/.../11-00-00_fused_qkv-sdpa   # a run and its resume
    wandb sync <the printed folder>                                                  # then upload it

``metrics.jsonl`` has every step even when the process was killed (wandb's own
file may then be empty), and a resumed run continues in a new directory:
given the directories of one run in order, this writes ONE offline wandb run
(same id, name, group and config, the whole history, later directories winning
on shared steps) to ``<last dir>/wandb-rebuilt/``. Use it instead of ``wandb sync``
on the separate offline folders of a resumed run, which would replace the
first part of the history with the second.
"""

from __future__ import annotations

from common.startup import guard_start_up, start_up_over

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from cli import OneLineErrorParser, user_errors
from common.run_files import METRICS, RUN_INFO, WANDB_REBUILT, read_samples
from model.config import GPTConfig
from training.run_log import define_metrics, tags_of, wandb_config


def merged_history(run_dirs: list[Path]) -> list[tuple[int, dict]]:
    """(step, metrics) in step order; a later directory's values win for a step both logged."""
    by_step: dict[int, dict] = {}
    for run_dir in run_dirs:
        path = run_dir / METRICS
        if not path.exists():
            raise FileNotFoundError(f"{run_dir} holds no metrics.jsonl: not a headlab run directory")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                print(f"skipped {path}:{number}: not a JSON line (cut by a kill?)")
                continue
            step = record.pop("step")
            by_step.setdefault(step, {}).update(record)
    return sorted(by_step.items())


def rebuild(run_dirs: list[Path], mode: str = "offline", new_id: bool = False) -> Path:
    import wandb

    info = json.loads((run_dirs[-1] / RUN_INFO).read_text())
    logger = info.get("logger", {})
    # the tags training gave the run (a field an older run.json lacks counts as its default)
    model = {**asdict(GPTConfig()), **info.get("model", {})}
    tags = tags_of(model, info.get("data", {}).get("name"), logger.get("preset"), logger.get("tags", []))
    out = run_dirs[-1] / WANDB_REBUILT
    out.mkdir(exist_ok=True)
    run = wandb.init(
        project=logger.get("project", "headlab"), entity=logger.get("entity"), group=info.get("group"),
        name=info.get("name"), config=wandb_config(info), job_type="train", dir=str(out), mode=mode,
        id=None if new_id else info.get("wandb_id"), tags=[*tags, "rebuilt"],
    )  # fmt: skip
    define_metrics(run)
    best = None
    samples = {step: text for run_dir in run_dirs for step, text in read_samples(run_dir).items()}  # later wins
    for step, metrics in merged_history(run_dirs):
        if step in samples:  # the end-of-run sample, as the training run logged it: a table at its step
            metrics = {**metrics, "samples": wandb.Table(columns=["step", "text"], data=[[step, samples[step]]])}
        run.log(metrics, step=step)
        if "val/loss" in metrics and (best is None or metrics["val/loss"] < best[1]["val/loss"]):
            best = (step, metrics)
    if best is not None:
        run.summary.update({"best/val_loss": best[1]["val/loss"], "best/val_bpb": best[1].get("val/bpb"),
                            "best/step": best[0]})  # fmt: skip
    if info.get("status"):
        run.summary["status"] = info["status"]  # as a training run's wandb summary says how it ended
    run.finish()
    return Path(run.dir).parent if mode == "offline" else out


def main(argv: list[str] | None = None) -> Path:
    p = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", type=Path, help="a run directory, then its resumed continuations in order")
    p.add_argument("--mode", choices=["offline", "online"], default="offline", help="online uploads at once")
    p.add_argument("--new-id", action="store_true", help="a new wandb run instead of the original run's id")
    args = p.parse_args(argv)
    start_up_over()  # the rebuild begins
    folder = rebuild(args.run_dirs, args.mode, args.new_id)
    if args.mode == "offline":
        print(f"rebuilt {len(args.run_dirs)} run director{'y' if len(args.run_dirs) == 1 else 'ies'} into "
              f"{folder}\nupload it with: wandb sync {folder}")  # fmt: skip
    return folder


if __name__ == "__main__":
    with user_errors("python rebuild_wandb.py <run dir> [<resumed run dir> ...] [--mode offline|online]"):
        main()
