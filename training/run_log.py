"""Where metrics go: ``metrics.jsonl`` in the run directory always, wandb when enabled."""

from __future__ import annotations

import json
import netrc
import os
from pathlib import Path

from training.config import LoggerConfig


def wandb_mode(cfg: LoggerConfig) -> str:
    """``auto``: WANDB_MODE if set, else online with an API key and offline without one."""
    if cfg.mode == "auto":
        return os.environ.get("WANDB_MODE") or ("online" if has_wandb_key() else "offline")
    if cfg.mode == "online" and not has_wandb_key():
        raise ValueError(
            "logger.mode=online but no wandb API key is set; run `wandb login` or set WANDB_API_KEY, "
            "or use logger.mode=offline (sync later with `wandb sync`)"
        )
    return cfg.mode


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False


def atomic_write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


class RunLog:
    """Appends one JSON object per record to ``metrics.jsonl`` and mirrors it to a wandb run."""

    def __init__(self, run_dir: Path, wandb_run=None) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.file = open(self.path, "a", buffering=1)  # line-buffered: a crash loses at most a line
        self.wandb_run = wandb_run

    def log(self, step: int, metrics: dict) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log(metrics, step=step)

    def close(self) -> None:
        self.file.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()


def start_wandb(cfg: LoggerConfig, mode: str, run_dir: Path, name: str, group: str | None,
                tags: list[str], config: dict, run_id: str | None):  # fmt: skip
    import wandb  # imported here: runs with logger=none never pay for it

    return wandb.init(
        project=cfg.project, entity=cfg.entity, group=group, name=name, tags=tags, config=config,
        dir=str(run_dir), mode=mode, id=run_id, resume="allow" if run_id else None,
    )  # fmt: skip
