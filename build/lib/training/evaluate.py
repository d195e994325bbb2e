"""Validation loss and bits per byte over fixed windows: the same windows at every evaluation."""

from __future__ import annotations

import math

import numpy as np
import torch

from data.loader import validation_starts, windows
from model.device import autocast
from training.distributed import Distributed


class Evaluator:
    """Mean loss over ``n_windows`` windows spread evenly over the validation split, shared out over ranks."""

    def __init__(self, val_tokens: np.ndarray, block_size: int, n_windows: int, batch_size: int,
                 bytes_per_token: float, device: torch.device, dtype: torch.dtype,
                 dist: Distributed | None = None) -> None:  # fmt: skip
        self.dist = dist or Distributed()
        self.tokens, self.block_size, self.batch_size = val_tokens, block_size, batch_size
        self.starts = validation_starts(len(val_tokens), block_size, n_windows)[self.dist.rank :: self.dist.world_size]
        self.bytes_per_token = bytes_per_token
        self.device, self.dtype = device, dtype

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        was_training = model.training
        model.eval()
        total, count = 0.0, 0
        for i in range(0, len(self.starts), self.batch_size):
            x, y = windows(self.tokens, self.starts[i : i + self.batch_size], self.block_size, self.device)
            with autocast(self.device, self.dtype):
                loss = model(x, y)[1]
            total += loss.item() * len(x)
            count += len(x)
        model.train(was_training)
        total, count = self.dist.sum([total, count], self.device)  # ranks may hold unequal shares
        val_loss = total / count
        # nats per token -> bits per byte of text
        return {"val/loss": val_loss, "val/bpb": val_loss / math.log(2) / self.bytes_per_token}
