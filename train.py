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

from cli import refuse_renamed_options
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


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> float | None:
    # The only place that reads Hydra's state: train(cfg) gets the run directory and group as settings.
    hydra_cfg = HydraConfig.get()
    if cfg.trainer.run_dir is None:
        cfg.trainer.run_dir = hydra_cfg.runtime.output_dir
    if cfg.logger.group is None and hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = os.path.normpath(hydra_cfg.sweep.dir)
        cfg.logger.group = f"sweep-{os.path.basename(os.path.dirname(sweep_dir))}_{os.path.basename(sweep_dir)}"
    try:
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
