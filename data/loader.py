"""Prepared token files -> batches of (inputs, targets) windows.

Training batches are random contiguous windows of ``block_size + 1`` tokens.
A step's whole batch (``trainer.batch_size`` windows over every rank and
micro-step) is drawn from a generator seeded by (seed, step) alone, then sliced:
rank r takes its share, and each micro-step the next ``micro_batch_size`` of it.
So every split of one batch (the micro-batch, the accumulation count, the number
of ranks, a run continued with another of them) trains on the same windows in
the same order, and a resumed run sees the same batches.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from data.prepare import FORMAT_VERSION, SPLITS, source_label, split_percents, tokens_needed_by_position


class PreparedData:
    """The token files of one prepared directory, checked against their ``meta.json``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        meta_path = self.folder / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(
                f"{self.folder} holds no meta.json: it is not a prepared data directory "
                f"(prepare one with `python -m data data=...`)"
            )
        try:
            self.meta = json.loads(meta_path.read_text())
            if self.meta.get("format") != FORMAT_VERSION:
                raise ValueError(
                    f"{meta_path} has format {self.meta.get('format')!r}, this headlab reads {FORMAT_VERSION}; "
                    f"delete {self.folder} to prepare it again"
                )
            self.meta["splits"]["val"]["tokens"], self.meta["vocab_size"], self.meta["dtype"]  # noqa: B018
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
            raise ValueError(
                f"{meta_path} is damaged ({type(err).__name__}: {err}); delete {self.folder} to prepare it again"
            ) from None
        self.dtype = np.dtype(self.meta["dtype"])
        self.tokens: dict[str, np.memmap] = {}
        for split in SPLITS:
            path = self.folder / f"{split}.bin"
            expected = self.meta["splits"][split]["tokens"]
            found = path.stat().st_size // self.dtype.itemsize if path.exists() else None
            if found != expected:
                raise ValueError(
                    f"{path} holds {found} tokens but meta.json says {expected}; the directory is "
                    f"damaged: delete {self.folder} to prepare it again"
                )
            self.tokens[split] = np.memmap(path, dtype=self.dtype, mode="r")
            # Every id must be a token of the vocabulary; anything else is a damaged file, not data.
            top = int(self.tokens[split].max()) if len(self.tokens[split]) else 0
            if top >= self.meta["vocab_size"]:
                raise ValueError(
                    f"{path} holds token id {top}, outside the vocabulary of {self.meta['vocab_size']}: the file is "
                    f"damaged; delete {self.folder} to prepare it again"
                )

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    @property
    def split_by(self) -> str:
        """``document`` or ``position`` (meta.json's ``split``; folders prepared before it was kept: document)."""
        return self.meta.get("split", {}).get("by", "document")

    @property
    def split_note(self) -> str | None:
        """How the tokens were split, in a line (None for folders prepared before meta.json kept it)."""
        return self.meta.get("split", {}).get("note")

    def bytes_per_token(self, split: str) -> float:
        """Text bytes per token: turns nats per token into bits per byte."""
        counts = self.meta["splits"][split]
        return counts["bytes"] / counts["tokens"]

    def check_fits(self, block_size: int, vocab_size: int) -> None:
        """Refuse a model that cannot read these tokens, before training starts."""
        if vocab_size < self.vocab_size:
            raise ValueError(
                f"the tokenizer {self.meta['tokenizer']!r} has {self.vocab_size} tokens but the model's "
                f"vocab_size={vocab_size}; set model.vocab_size >= {self.vocab_size} (or leave it unset)"
            )
        for split in SPLITS:
            n = len(self.tokens[split])
            if n < block_size + 1 and self.split_by == "position":
                raise ValueError(self._too_short_to_split(split, block_size))
            if n < block_size + 1:
                raise ValueError(
                    f"the {split} split of {self.folder.name} has {n} tokens, fewer than "
                    f"block_size + 1 = {block_size + 1}; use a smaller block_size or more data"
                )

    def check_documents(self) -> None:
        """Refuse document masking on a source whose training split is one document (no end-of-text between
        documents to mask at), before training starts."""
        documents = self.meta["splits"]["train"].get("documents")
        if documents is not None and documents <= 1:
            raise ValueError(
                f"model.document_masking=true, but the train split of {source_label(self.meta['config'])} is "
                f"{documents} document (no end-of-text between documents): nothing to mask; use a source of "
                f"several documents (data=pystdlib, data=tinystories, data=fineweb_edu), or "
                f"model.document_masking=false"
            )

    def _too_short_to_split(self, split: str, block_size: int) -> str:
        """A text split by position that cannot give each side a window: what it has and what it needs."""
        total = sum(len(self.tokens[s]) for s in SPLITS)
        val_fraction = self.meta["config"]["val_fraction"]
        needed = tokens_needed_by_position(block_size + 1, val_fraction)
        return (
            f"{source_label(self.meta['config'])} has {total:,} tokens, split {split_percents(val_fraction)} by "
            f"position: its {split} part has {len(self.tokens[split]):,}, fewer than block_size + 1 = "
            f"{block_size + 1}; it needs at least "
            f"{needed:,} tokens at data.val_fraction={val_fraction}; use a longer text or a smaller block_size"
        )


class BatchLoader:
    """Deterministic random windows from one split, as (inputs, targets) on ``device``: one rank's micro-batches
    of each step's ``batch_size`` windows (``step_starts``)."""

    def __init__(
        self,
        tokens: np.ndarray,
        block_size: int,
        batch_size: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
        micro_batch_size: int | None = None,
    ) -> None:
        if len(tokens) < block_size + 1:
            raise ValueError(
                f"{len(tokens)} tokens are fewer than block_size + 1 = {block_size + 1}; "
                f"use a smaller block_size or more data"
            )
        share = batch_size // world_size
        micro = share if micro_batch_size is None else micro_batch_size
        if share * world_size != batch_size or share % micro:
            raise ValueError(f"batch_size={batch_size} does not split into {world_size} rank(s) x micro-batches of "
                             f"{micro}; choose a micro-batch that divides batch_size / ranks = "
                             f"{batch_size / world_size:g}")  # fmt: skip
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size  # the step's, over every rank and micro-step
        self.micro_batch_size = micro  # one forward's, on this rank
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)

    def starts(self, step: int, micro_step: int = 0) -> np.ndarray:
        """Window start offsets of one micro-batch: its slice of the step's windows."""
        first = self.rank * (self.batch_size // self.world_size) + micro_step * self.micro_batch_size
        return step_starts(self.seed, step, self.batch_size, len(self.tokens), self.block_size)[
            first : first + self.micro_batch_size
        ]

    def batch(self, step: int, micro_step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return windows(self.tokens, self.starts(step, micro_step), self.block_size, self.device)


def step_starts(seed: int, step: int, batch_size: int, n_tokens: int, block_size: int) -> np.ndarray:
    """The start offsets of a step's ``batch_size`` windows: a function of (seed, step) alone, whatever the split."""
    rng = np.random.default_rng([seed, step])
    return rng.integers(0, n_tokens - block_size, size=batch_size)


def validation_starts(n_tokens: int, block_size: int, n_windows: int) -> np.ndarray:
    """A fixed set of windows spread evenly over the validation split."""
    return np.linspace(0, n_tokens - block_size - 1, num=n_windows).round().astype(np.int64)


def windows(
    tokens: np.ndarray, starts: np.ndarray, block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack windows of ``block_size + 1`` tokens; targets are the inputs shifted by one."""
    rows = np.stack([tokens[s : s + block_size + 1] for s in starts]).astype(np.int64)
    batch = torch.from_numpy(rows)
    if device.type == "cuda":  # pinned host memory lets the copy overlap with compute
        batch = batch.pin_memory().to(device, non_blocking=True)
    else:
        batch = batch.to(device)
    return batch[:, :-1], batch[:, 1:]
