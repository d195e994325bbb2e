"""Validation loss and bits per byte over fixed windows: the same windows at every evaluation."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

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


LENGTH_HINT = "each length is a number of tokens, at least 1 (512), or a multiple of block_size (4x)"


def length_spellings(lengths: Any) -> list:
    """``lengths`` as given (one value or a list), each checked for its spelling: an int, or ``<number>x``."""
    values = list(lengths) if isinstance(lengths, (list, tuple)) else [lengths]
    if not values:
        raise ValueError(f"lengths=[] names no length; {LENGTH_HINT}, e.g. lengths=[1x,4x,16x]")
    for value in values:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if isinstance(value, str) and value.endswith("x"):
            try:
                ok = float(value[:-1]) > 0
            except ValueError:
                ok = False
        if not ok:
            raise ValueError(f"lengths={values}: {value!r} is not a length; {LENGTH_HINT}")
    return values


def resolve_lengths(lengths: Any, block_size: int) -> list[int]:
    """Token counts of ``lengths``: a multiple ``4x`` is 4 x block_size (rounded; at least 1)."""
    resolved = []
    for value in length_spellings(lengths):
        tokens = value if isinstance(value, int) else max(1, round(float(value[:-1]) * block_size))
        if tokens not in resolved:
            resolved.append(tokens)
    return resolved


PROTOCOLS = ("chunks", "sliding")


def check_protocol(protocol: str, stride: int | None) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}; choose one of: {', '.join(PROTOCOLS)} (chunks: independent "
                         f"chunks of the length, ALiBi's; sliding: a window moved by `stride`, YaRN's)")  # fmt: skip
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or stride < 1):
        raise ValueError(f"stride={stride!r} must be a whole number of tokens, at least 1 (e.g. stride=64)")


class LengthEvaluator:
    """Loss at one evaluation length, by a protocol, and the mean loss at each position of a sequence.

    Every length and protocol reads the same stretch of text: the first ``span`` tokens of the validation split
    (``length_rows``: its windows x the longest length), so that a difference between them is the context's,
    not the text's (ALiBi evaluates the whole validation set at every length for the same reason).

    - ``chunks`` (ALiBi's "train short, test long"): the stretch cut into independent chunks of ``length``
      tokens; every token of a chunk is scored, so position p's loss is that of a token with p tokens before it.
    - ``sliding`` (perplexity as YaRN and Hugging Face report it): windows of ``length`` tokens that start
      ``stride`` tokens apart; the first window scores all its tokens, each later one only its last ``stride``
      (those no window scored yet), so most tokens are scored with ``length - stride`` or more tokens before
      them. A position is a scored token's place in its window.

    A forward holds ``batch_tokens`` tokens at most (whole sequences, at least one), so memory does not grow
    with the length.
    """

    def __init__(self, val_tokens: np.ndarray, length: int, protocol: str, span: int, stride: int | None,
                 batch_tokens: int, bytes_per_token: float, device: torch.device,
                 dtype: torch.dtype) -> None:  # fmt: skip
        check_protocol(protocol, stride)
        available = len(val_tokens) - 1  # targets
        if available < length:
            raise ValueError(f"the validation split has {len(val_tokens):,} tokens: too few for length {length} "
                             f"(a sequence needs length + 1); evaluate shorter lengths or on more data")  # fmt: skip
        self.tokens, self.length, self.protocol = val_tokens, length, protocol
        self.stride = min(stride or max(1, length // 2), length)
        span = max(length, min(span, available))
        self.starts = np.arange(0, span - length + 1, length if protocol == "chunks" else self.stride, dtype=np.int64)
        self.batch = max(1, batch_tokens // length)
        self.bytes_per_token, self.device, self.dtype = bytes_per_token, device, dtype

    def scored(self, i: int) -> slice:
        """The positions window ``i`` scores: all of the first (and of every chunk), a later sliding window's
        last ``stride``."""
        return slice(0, self.length) if self.protocol == "chunks" or i == 0 else slice(self.length - self.stride, None)

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module, progress: bool = False) -> dict:
        from tqdm import tqdm

        was_training = model.training
        model.eval()
        sums = torch.zeros(self.length, dtype=torch.float64)
        counts = torch.zeros(self.length, dtype=torch.float64)
        batches = range(0, len(self.starts), self.batch)
        for first in tqdm(batches, desc=f"evaluate {self.length} tokens ({self.protocol})", unit="batch",
                          disable=not progress, leave=False):  # fmt: skip
            x, y = windows(self.tokens, self.starts[first : first + self.batch], self.length, self.device)
            with autocast(self.device, self.dtype):
                logits = model(x, y)[0]
            losses = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").double().cpu()
            for row, i in enumerate(range(first, first + len(x))):
                keep = self.scored(i)
                sums[keep] += losses[row, keep]
                counts[keep] += 1
        model.train(was_training)
        loss = float(sums.sum() / counts.sum())
        by_position = torch.where(counts > 0, sums / counts.clamp(min=1), torch.nan)
        return {"loss": loss, "bpb": loss / math.log(2) / self.bytes_per_token, "tokens": int(counts.sum()),
                "sequences": len(self.starts), "loss_by_position": by_position.tolist()}  # fmt: skip


def scaling_part(config) -> str | None:
    """A rotary scaling as the tables spell it (``yarn x4``), or None."""
    return f"{config.rope_scaling} x{config.rope_factor:g}" if config.rope_scaling else None


def length_rows(model: torch.nn.Module, val_tokens: np.ndarray, lengths: list[int], protocol: str, past_context: str,
                n_windows: int, stride: int | None, batch_tokens: int, bytes_per_token: float, device: torch.device,
                dtype: torch.dtype, progress: bool = False, span: int | None = None) -> list[dict]:  # fmt: skip
    """The model read at each length by ``protocol`` with ``past_context``'s rule, each over the first ``span``
    tokens of the split (default ``n_windows`` x the longest length): one row per length (evaluate.py's JSON,
    compare.py)."""
    from model.context import with_context

    rows, span = [], span or n_windows * max(lengths, default=1)  # the same stretch at every length
    for length in lengths:
        evaluator = LengthEvaluator(val_tokens, length, protocol, span, stride, batch_tokens, bytes_per_token,
                                    device, dtype)  # fmt: skip
        rows.append({"length": length, "multiple": length / model.config.block_size, "protocol": protocol,
                     "past_context": past_context, "rope_scaling": scaling_part(model.config),
                     "stride": evaluator.stride if protocol == "sliding" else None,
                     **evaluator(with_context(model, length, past_context), progress)})  # fmt: skip
    return rows
