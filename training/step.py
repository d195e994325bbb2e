"""One optimizer step: micro-batches with gradient accumulation, DDP sync on the last, clipping."""

from __future__ import annotations

import contextlib

import torch

from data.loader import BatchLoader
from model.device import autocast
from training.distributed import Distributed


def step_seed(seed: int, rank: int, step: int) -> int:
    """The dropout RNG seed of one step on one rank: ranks differ, and a resumed run repeats it exactly."""
    return (seed * 1_000_003 + rank) * 1_000_003 + step


class TrainStep:
    """``step(n)`` runs optimizer step ``n`` and returns (mean loss over ranks, gradient norm before clipping)."""

    def __init__(self, model: torch.nn.Module, forward: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 loader: BatchLoader, grad_accum: int, grad_clip: float, seed: int, dtype: torch.dtype,
                 dist: Distributed, scaler: torch.amp.GradScaler | None = None,
                 graphs_replayed: bool = False, indexer_warmup: int = 0) -> None:  # fmt: skip
        self.model, self.forward, self.optimizer, self.loader = model, forward, optimizer, loader
        self.grad_accum, self.grad_clip, self.seed = grad_accum, grad_clip, seed
        self.device, self.dtype, self.dist, self.scaler = loader.device, dtype, dist, scaler
        # compile_mode=reduce-overhead: each forward begins a new step of inductor's CUDA graph trees, whose outputs of
        # the last replay (a micro-step's loss, already summed) may then be overwritten
        self.graphs_replayed = graphs_replayed
        # Sparse attention (model.attention.sparse): dense for the first indexer_warmup steps while its indexers
        # learn; the mean of their KL over the last step's micro-steps and ranks (None without sparse attention)
        self.indexer_warmup, self.indexer_kl = indexer_warmup, None
        # clipped apart: sparse attention's indexers from the rest (GPT.gradient_groups); the first one's norm reported
        self.clip_groups = model.gradient_groups()

    def __call__(self, step: int) -> tuple[float, float]:
        torch.manual_seed(step_seed(self.seed, self.dist.rank, step))
        total = torch.zeros((), dtype=torch.float64, device=self.device)  # summed on the device: no sync per micro-step
        sparse = bool(self.model.indexers)
        if sparse:
            self.model.select_sparse_keys(step >= self.indexer_warmup)
        kl = torch.zeros((), dtype=torch.float64, device=self.device)
        for micro in range(self.grad_accum):
            x, y = self.loader.batch(step, micro)
            last = micro == self.grad_accum - 1
            # DDP all-reduces gradients on the last micro-step only.
            sync = contextlib.nullcontext() if last or not self.dist.enabled else self.forward.no_sync()
            with sync:
                if self.graphs_replayed:
                    torch.compiler.cudagraph_mark_step_begin()
                with autocast(self.device, self.dtype):
                    loss = self.forward(x, y)[1]  # not the logits: (B, T, V) floats would outlive the step
                scaled = loss / self.grad_accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            total += loss.detach()
            if sparse and self.model.indexer_kl is not None:
                kl += self.model.indexer_kl
        if self.scaler:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
        # max_norm=inf measures the norm without clipping. Sparse attention's indexers apart: the language model's norm
        # is its own (the one reported), and the KL's gradient never scales its update
        norm, *_ = [torch.nn.utils.clip_grad_norm_(group, self.grad_clip or float("inf")) for group in self.clip_groups]
        if self.scaler:
            self.scaler.step(self.optimizer)  # skipped when the scaled gradients overflowed
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, norm, kl_sum = torch.stack([total, norm.double(), kl]).tolist()  # one host sync per step
        # the means over ranks, the KL's in the loss's all-reduce
        loss, kl = (s / self.dist.world_size for s in self.dist.sum([loss_sum / self.grad_accum,
                                                                       kl_sum / self.grad_accum], self.device))
        self.indexer_kl = kl if sparse else None
        return loss, norm
