"""Train a GPT: ``python train.py [group=option ...] [key=value ...]``.

    python train.py                                   # nano GPT on the embedded corpus, CPU, minutes
    python train.py attention=wrapper kernel=manual
    python train.py -m attention=wrapper,separate_qkv,fused_qkv kernel=manual,sdpa
    torchrun --standalone --nproc_per_node=8 train.py experiment=gpt2_small

``python train.py --help`` lists the config groups and every option.
"""

from __future__ import annotations

import os
import sys
import tempfile

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from cli import refuse_renamed_options, user_errors
from training.config import TrainConfig  # noqa: F401  (registers the config schema with Hydra)
from training.loop import RunFailed, train

RENAMED = {
    "attention.layout": "attention",
    "attention.kernel": "kernel",
    "model.layout": "attention",
}


def _quiet_non_main_ranks() -> None:
    """Under torchrun only rank 0 writes: the other ranks' Hydra keeps no output directory or log."""
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv += [
            f"hydra.run.dir={tempfile.gettempdir()}",
            "hydra.output_subdir=null",
            "hydra/job_logging=disabled",
            "hydra/hydra_logging=disabled",
        ]


def swept_keys(hydra_cfg) -> list[str]:
    """The keys a multirun varies: its sweeper's params and the command line's comma lists."""
    keys = list(hydra_cfg.sweeper.get("params") or {})
    for arg in sys.argv[1:]:
        key, sep, value = arg.partition("=")
        if sep and "," in value and not key.startswith("hydra") and key not in keys:
            keys.append(key.lstrip("+~"))
    return keys


def sweep_run_name(cfg: DictConfig, hydra_cfg) -> str | None:
    """``<attention>-<kernel>-<model>`` plus this job's values of the other swept keys (``-optim.lr=0.001``)."""
    job = dict(o.split("=", 1) for o in hydra_cfg.overrides.task if "=" in o)
    extra = [f"{k}={job[k]}" for k in swept_keys(hydra_cfg) if k in job and k not in NAMED_BY_DEFAULT]
    if not extra:
        return None
    return f"{cfg.model.attention}-{cfg.model.kernel}-{cfg.model.name}-" + "-".join(extra)


NAMED_BY_DEFAULT = ("attention", "kernel", "model", "model.attention", "model.kernel")


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # The only place that reads Hydra's state: train(cfg) gets the run directory, group and name as settings.
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if not multirun and hydra_cfg.sweeper.get("params"):
        sys.exit(f"error: this config defines a sweep over {', '.join(hydra_cfg.sweeper.params)}; run it with -m "
                 f"(python train.py -m {' '.join(sys.argv[1:])}), or pick single values without the experiment")
    if cfg.trainer.run_dir is None:
        cfg.trainer.run_dir = hydra_cfg.runtime.output_dir
    if multirun and cfg.logger.group is None:
        sweep_dir = os.path.normpath(hydra_cfg.sweep.dir)
        cfg.logger.group = f"sweep-{os.path.basename(os.path.dirname(sweep_dir))}_{os.path.basename(sweep_dir)}"
    if multirun and cfg.logger.name is None:
        cfg.logger.name = sweep_run_name(cfg, hydra_cfg)
    try:
        with user_errors("python train.py [group=option ...] [key=value ...]; python train.py --help lists them"):
            summary = train(cfg)
    except RunFailed as err:
        if hydra_cfg.mode != RunMode.MULTIRUN:
            raise
        # One variant failing (e.g. out of memory) must not end the sweep: it is recorded, the rest go on.
        print(f"[train] job {hydra_cfg.job.num} failed: {err}", file=sys.stderr, flush=True)
        return None
    return summary.get("val_loss")  # what a Hydra sweeper would optimise


if __name__ == "__main__":
    refuse_renamed_options(RENAMED)
    _quiet_non_main_ranks()
    main()
