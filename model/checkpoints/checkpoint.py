"""The checkpoint: one typed record, written atomically and read with ``weights_only=True``.

A checkpoint is self-describing: the model's config and tokenizer rebuild the
model without anything else; the training state (optimizer, step, scaler,
the resolved training config, the wandb run id) lets ``trainer.resume``
continue it exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from common.run_files import BEST as BEST  # re-exported: scripts name a run's checkpoints from here
from common.run_files import LAST, write_atomically
from model.config import GPTConfig


@dataclass
class Checkpoint:
    model: dict  # the uncompiled, unwrapped module's state dict: no "_orig_mod." / "module." prefixes
    model_config: dict  # GPTConfig fields
    tokenizer: str
    step: int = 0
    best_val_loss: float = float("inf")
    optimizer: dict | None = None
    grad_scaler: dict | None = None  # fp16 training's loss scale
    train_config: dict | None = None  # the resolved training config (None for exported/imported weights)
    wandb_run_id: str | None = None

    @property
    def config(self) -> GPTConfig:
        return GPTConfig(**self.model_config)

    def save(self, path: Path) -> None:
        """Write to a temporary name, then rename: a crash never leaves half a checkpoint.

        A failed write (disk full, read-only folder) removes its temporary file, leaves
        the previous checkpoint as it was, and says which path and why.
        """
        try:
            write_atomically(path, lambda tmp: torch.save(asdict(self), tmp))
        except (OSError, RuntimeError) as err:
            raise OSError(
                f"could not write checkpoint {path} ({type(err).__name__}: {str(err).strip()[:200]}); "
                f"free disk space or make {path.parent} writable. The previous checkpoint is unchanged"
            ) from err


def checkpoint_path(where: str | Path, name: str = LAST) -> Path:
    """A checkpoint file, or a run directory's ``name`` (``last.pt`` unless told)."""
    path = Path(where).expanduser()
    if path.is_dir():
        path = path / name
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {str(where)!r}: give a run directory holding {name} or a checkpoint file (.pt)"
        )
    return path


def load_checkpoint(where: str | Path, map_location: str | torch.device = "cpu", name: str = LAST) -> Checkpoint:
    path = checkpoint_path(where, name)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # truncated, foreign or unsafe pickles
        raise ValueError(f"{path} is not a readable headlab checkpoint ({type(err).__name__}: {err})") from err
    known = {f.name for f in fields(Checkpoint)}
    if not isinstance(payload, dict) or not {"model", "model_config", "tokenizer"} <= payload.keys():
        raise ValueError(f"{path} is not a headlab checkpoint (no 'model', 'model_config' and 'tokenizer' entries)")
    return Checkpoint(**{k: v for k, v in payload.items() if k in known})
