"""Checkpoints: written atomically, read with ``weights_only=True``."""

from __future__ import annotations

import os
from pathlib import Path

import torch

LAST, BEST = "last.pt", "best.pt"


def save_checkpoint(payload: dict, path: Path) -> None:
    """Write to a temporary name, then rename: a crash never leaves half a checkpoint."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def checkpoint_path(where: str | Path) -> Path:
    """A checkpoint file, or a run directory's ``last.pt``."""
    path = Path(where).expanduser()
    if path.is_dir():
        path = path / LAST
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {where!r}: give a run directory holding {LAST} or a checkpoint file (.pt)"
        )
    return path


def load_checkpoint(where: str | Path, map_location: str | torch.device = "cpu") -> dict:
    path = checkpoint_path(where)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated, foreign or unsafe pickles
        raise ValueError(f"{path} is not a readable headlab checkpoint ({type(err).__name__}: {err})") from err
    if not isinstance(payload, dict) or "model" not in payload or "config" not in payload:
        raise ValueError(f"{path} is not a headlab checkpoint (no 'model' and 'config' entries)")
    return payload


def model_from_checkpoint(ckpt: dict, attention: str | None = None, kernel: str | None = None):
    """Rebuild the GPT a checkpoint describes, optionally in another layout or kernel."""
    from model import GPT, GPTConfig

    fields = dict(ckpt["model_config"])
    fields["attention"] = attention or fields["attention"]
    fields["kernel"] = kernel or fields["kernel"]
    model = GPT(GPTConfig(**fields))
    try:
        model.load_weights(ckpt["model"])  # converts between layouts when they differ
    except ValueError as err:
        raise ValueError(f"the checkpoint's weights do not match its own config: {err}") from err
    return model
