"""Batched sampling on a CPU: every Linear's weight pre-packed by MKL for the batch's row count.

Decoding a batch of samples multiplies a few rows (one per sample) by every weight matrix.
MKL's ordinary sgemm handles such short, wide products poorly; a weight packed once for
that row count (``cblas_sgemm_pack``, the path PyTorch's inductor takes for frozen CPU
models) runs them faster. Measured here (Intel Xeon, 2 cores), GPT-2 small, 8 samples:
54 -> 37 ms per decoding step; for one row there was no gain on that Xeon. On an AMD EPYC (Zen 4, 2 cores) one row
gains too (the LM head's product 5.4 against 8.5 ms; GPT-2 small's greedy decoding, whole generations with the
packing's 0.5 s: 0.876x the plain path's time at 128 new tokens, 0.935x at 64, slower below about 48), so a single
sample's weights are packed on AMD CPUs for generations of at least ``ONE_ROW_TOKENS`` tokens (``packs_one_row``).

The packed copies live only while ``packed_linears`` is open and take about the weights'
size again (measured: GPT-2 small's resident memory grows by 0.47 GB); packing is skipped
when twice that much memory is not free.
Rows other than the packed count (a prompt, a refill of the cache) use the plain weights.

Without packing (one sample, bfloat16, too little memory, a compiled step), ``sampling_head`` still gives the
LM head a faster product for a few rows on a CPU: ``W @ h^T`` streams the large embedding matrix faster than
``h @ W^T`` (measured here: 56 vs 62 ms per step of a batch of 8 with GPT-2 small's shape; the same for one row).
The head keeps one such forward for every generation (``transposed_head``): a compiled decode step traces it and
guards on its identity.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from model.compiling import is_compiled


def mkl_packing_available() -> bool:
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def free_memory_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: do not guess
        return 0


ONE_ROW_VENDORS = ("AuthenticAMD",)  # the CPUs whose MKL multiplies one row faster through a packed weight (measured)
# A third more than the new tokens that repay packing GPT-2 small for one row on the AMD EPYC above (about 48; at 64
# the whole generation took 0.935x the plain path's time); at 96 (twice), greedy decoding at 64 new tokens ran 0.93x
# transformers' generate (issue 60, item 17)
ONE_ROW_TOKENS = 64


def cpu_vendor() -> str | None:
    """The CPU's vendor as Linux names it (``AuthenticAMD``, ``GenuineIntel``), or None where it does not say."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("vendor_id")), None)
    except OSError:
        return None


def packs_one_row(tokens: int | None) -> bool:
    """Whether a single sample's weights are packed: on a CPU measured to gain (``ONE_ROW_VENDORS``; the Intel Xeon
    above did not), for a generation long enough to repay the packing (``tokens`` new ones; None: unknown, not)."""
    return tokens is not None and tokens >= ONE_ROW_TOKENS and cpu_vendor() in ONE_ROW_VENDORS


def worth_packing(model: nn.Module, linears: list[nn.Linear], rows: int, tokens: int | None = None) -> bool:
    """True for float32 CPU inference of a batch (rows > 1), or of one sample where that pays (``packs_one_row``:
    ``tokens`` new ones), where MKL can pack and memory allows.

    Not under torch.compile: the compiler cannot trace MKL's packed product, and makes its own choices.
    """
    weights = [linear.weight for linear in linears]
    if rows < 1 or (rows == 1 and not packs_one_row(tokens)):
        return False
    if not weights or not mkl_packing_available() or is_compiled(model):
        return False
    if any(w.device.type != "cpu" or w.dtype != torch.float32 for w in weights):
        return False
    # MKL reserves up to 2.6x the bytes (padding), but only about 1x is ever touched.
    needed = sum(w.numel() * w.element_size() for w in weights)
    return 2 * needed < free_memory_bytes()


class PackedForward:
    """A Linear's forward for ``rows`` rows at a time through its MKL-packed weight (installed per instance).

    ``calls`` counts the products taken by each path ("packed", "plain"), so a caller can tell which ran.
    """

    def __init__(self, linear: nn.Linear, rows: int) -> None:
        self.linear, self.rows = linear, rows
        self.packed = torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), rows)
        self.calls = Counter()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.linear.weight, self.linear.bias
        if x.numel() != self.rows * x.size(-1) or torch.is_grad_enabled():
            self.calls["plain"] += 1
            return F.linear(x, weight, bias)
        self.calls["packed"] += 1
        y = torch.ops.mkl._mkl_linear(x.reshape(self.rows, -1), self.packed, weight, bias, self.rows)
        return y.view(*x.shape[:-1], -1)


def is_packed(linear: nn.Module) -> bool:
    return isinstance(vars(linear).get("forward"), PackedForward)


class TransposedHead:
    """The LM head's forward while sampling: for a few rows on a CPU without autograd, ``(W @ h^T)^T``."""

    def __init__(self, head: nn.Linear) -> None:
        self.head = head

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        weight, bias = self.head.weight, self.head.bias
        if h.dim() != 2 or h.device.type != "cpu" or torch.is_grad_enabled() or h.size(0) > 32 or bias is not None:
            return F.linear(h, weight, bias)
        return torch.mm(weight, h.t()).t()


def transposed_head(head: nn.Linear) -> TransposedHead:
    """The head's one ``TransposedHead``, made at its first generation and kept on it. A compiled decode step
    guards on the identity of the head's forward: a new object per generation recompiled the step at every
    generation (seconds each; "lm_head.forward got deallocated"), and with fullgraph the ninth generation of a
    process failed torch's recompile limit (8)."""
    kept = vars(head).get("_transposed_head")
    if kept is None:
        kept = head._transposed_head = TransposedHead(head)
    return kept


@contextmanager
def sampling_head(head: nn.Linear) -> Iterator[None]:
    """Within the block, the LM head takes the transposed product (``TransposedHead``), unless a forward of its
    own is already installed (weights packed for the batch: faster still)."""
    if "forward" in vars(head):
        yield
        return
    head.forward = transposed_head(head)
    try:
        yield
    finally:
        vars(head).pop("forward", None)


@contextmanager
def packed_linears(model: nn.Module, rows: int, tokens: int | None = None) -> Iterator[bool]:
    """Within the block, the model's Linears use weights packed for ``rows`` rows where that pays (for one row, a
    generation of ``tokens`` new tokens, ``packs_one_row``).

    Yields whether packing is on. The model's parameters and state dict are untouched;
    the packed copies are dropped on exit.
    """
    linears = [m for m in model.modules() if isinstance(m, nn.Linear) and not is_packed(m)]
    if not worth_packing(model, linears, rows, tokens):
        yield False
        return
    try:
        for linear in linears:
            linear.forward = PackedForward(linear, rows)
        yield True
    finally:
        for linear in linears:
            vars(linear).pop("forward", None)
