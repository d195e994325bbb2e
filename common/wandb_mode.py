"""Which wandb mode a run or a report logs in: training's runs and the reports follow the same rule."""

from __future__ import annotations

import netrc
import os


def wandb_mode(mode: str) -> str:
    """``auto``: WANDB_MODE if set, else online with an API key and offline without one."""
    if mode == "auto":
        return os.environ.get("WANDB_MODE") or ("online" if has_wandb_key() else "offline")
    if mode == "online" and not has_wandb_key():
        raise ValueError(
            "logger.mode=online but no wandb API key is set; run `wandb login` or set WANDB_API_KEY, "
            "or use logger.mode=offline (sync later with `wandb sync`)"
        )
    return mode


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
