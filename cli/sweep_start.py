"""A sweep's first check (a Hydra callback, configs/train.yaml): every job's config, composed and checked before the
first job starts, so that a value the model refuses in job 5 is said before jobs 0 to 4 have trained."""

from __future__ import annotations

import sys
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


class SweepCheck(Callback):
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        from hydra import compose
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = [f"{key}={value}" for key, value in (config.hydra.sweeper.get("params") or {}).items()]
        given = list(config.hydra.overrides.task)
        named = {o.partition("=")[0] for o in given}  # the command line's value wins over the preset's sweep
        overrides = OverridesParser.create().parse_overrides([p for p in params if p.partition("=")[0] not in named]
                                                             + given)  # fmt: skip
        jobs = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        for num, job in enumerate(jobs):
            try:
                OmegaConf.to_object(compose(config_name="train", overrides=list(job)))
            except ValueError as err:  # the config's own refusal, in its one line: nothing has trained
                sys.exit(f"error: job {num} of {len(jobs)} ({' '.join(job)}): {err}; no job of the sweep was started")
