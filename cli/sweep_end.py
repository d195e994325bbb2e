"""A sweep's last words (a Hydra callback, configs/train.yaml): where its runs are, how they ended, and the
command that compares them."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from common.run_files import RUN_INFO, read_json, remove_husk


class SweepEnd(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from training.distributed import from_environment

        if not from_environment().is_main:  # under torchrun every rank runs the sweep; one says it
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        if not any(sweep_dir.glob(f"*/{RUN_INFO}")):  # a plan (-m ... trainer.plan=true): nothing ran
            remove_husk(sweep_dir, {"multirun.yaml"})
            return
        print(sweep_end_text(sweep_dir), flush=True)


def sweep_end_text(sweep_dir: Path) -> str:
    """``[train] the sweep has ended: 4 runs in <dir> (3 finished, 1 failed); compare them: python compare.py
    <dir>``, for a sweep folder that holds runs."""
    sweep_dir = sweep_dir.absolute()
    infos = [read_json(p / RUN_INFO) for p in sorted(sweep_dir.iterdir()) if p.is_dir()]
    states = Counter(info.get("status", "unknown") for info in infos if info is not None)
    how = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    count = sum(states.values())
    return (f"[train] the sweep has ended: {count} run{'s' if count != 1 else ''} in {sweep_dir}"
            f"{f' ({how})' if how else ''}; compare them: python compare.py {shlex.quote(str(sweep_dir))}")
