"""Validation loss and bits per byte over fixed windows: the same windows at every evaluation."""

from __future__ import annotations

import contextlib
import math
from dataclasses import replace

import numpy as np
import torch

from data.loader import validation_starts, windows
from model import registry
from model.device import autocast
from training.distributed import Distributed
from training.lengths import check_protocol
from training.plan import eval_bytes, param_count

GIB = 2**30


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
            with autocast(self.device, self.dtype), out_of_memory_named(model, x.shape, "batch_size"):
                loss = model(x, y)[1]
            total += loss.item() * len(x)
            count += len(x)
        model.train(was_training)
        total, count = self.dist.sum([total, count], self.device)  # ranks may hold unequal shares
        val_loss = total / count
        # nats per token -> bits per byte of text
        return {"val/loss": val_loss, "val/bpb": val_loss / math.log(2) / self.bytes_per_token}


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
        per_sequence = torch.zeros(len(self.starts), 2, dtype=torch.float64)  # each sequence's scored loss, tokens
        batches = range(0, len(self.starts), self.batch)
        for first in tqdm(batches, desc=f"evaluate {self.length} tokens ({self.protocol})", unit="batch",
                          disable=not progress, leave=False):  # fmt: skip
            x, y = windows(self.tokens, self.starts[first : first + self.batch], self.length, self.device)
            with autocast(self.device, self.dtype), out_of_memory_named(model, x.shape, "lengths"):
                losses = model.token_losses(x, y).double().cpu()
            for row, i in enumerate(range(first, first + len(x))):
                keep = self.scored(i)
                sums[keep] += losses[row, keep]
                counts[keep] += 1
                per_sequence[i] = torch.tensor([float(losses[row, keep].sum()), losses[row, keep].numel()])
        model.train(was_training)
        loss = float(sums.sum() / counts.sum())
        by_position = torch.where(counts > 0, sums / counts.clamp(min=1), torch.nan)
        return {"loss": loss, "loss_se": sequence_noise(per_sequence, loss),
                "bpb": loss / math.log(2) / self.bytes_per_token, "tokens": int(counts.sum()),
                "sequences": len(self.starts), "loss_by_position": by_position.tolist()}  # fmt: skip


def sequence_noise(per_sequence: torch.Tensor, loss: float) -> float | None:
    """The standard error of a mean loss over sequences (each row: its scored tokens' summed loss and their count):
    how much the loss would move on another stretch of text as long, the text's noise (not the seed's). The ratio
    estimator's, sqrt(n / (n - 1) sum (s_i - loss c_i)^2) / sum c_i: for sequences of one length, the spread of
    their mean losses over sqrt(n). None for a single sequence: no spread to measure."""
    n = len(per_sequence)
    if n < 2:
        return None
    sums, counts = per_sequence[:, 0], per_sequence[:, 1]
    return float(torch.sqrt(n / (n - 1) * ((sums - loss * counts) ** 2).sum()) / counts.sum())


def scaling_part(config) -> str | None:
    """A rotary scaling as the tables spell it (``yarn x4``), or None."""
    return f"{config.rope_scaling} x{config.rope_factor:g}" if config.rope_scaling else None


def length_rows(model: torch.nn.Module, val_tokens: np.ndarray, lengths: list[int], protocol: str, past_context: str,
                n_windows: int, stride: int | None, batch_tokens: int, bytes_per_token: float, device: torch.device,
                dtype: torch.dtype, progress: bool = False, span: int | None = None) -> list[dict]:  # fmt: skip
    """The model read at each length by ``protocol`` with ``past_context``'s rule, each over the first ``span``
    tokens of the split (default ``n_windows`` x the longest length): one row per length (evaluate.py's JSON,
    compare.py)."""
    from model.decoding.context import with_context

    rows, span = [], span or n_windows * max(lengths, default=1)  # the same stretch at every length
    for length in lengths:
        evaluator = LengthEvaluator(val_tokens, length, protocol, span, stride, batch_tokens, bytes_per_token,
                                    device, dtype)  # fmt: skip
        rows.append({"length": length, "multiple": length / model.config.block_size, "protocol": protocol,
                     "past_context": past_context, "rope_scaling": scaling_part(model.config),
                     "stride": evaluator.stride if protocol == "sliding" else None,
                     **evaluator(with_context(model, length, past_context), progress)})  # fmt: skip
    return rows


# ------------------------------------------------------------------ memory: planned before, named when it runs out


def reading_bytes(config, length: int, batch_tokens: int, past_context: str = "ring") -> tuple[int, int]:
    """(sequences per forward, estimated bytes) reading ``length`` tokens, at most ``batch_tokens`` per forward:
    the plan's forward peak (``training/plan.py``'s ``eval_bytes``: the manual kernel's length x length weights
    dominate), plus the copy of the weights that ``past_context=full`` reads with past block_size
    (``model/decoding/context.py``'s ``with_context``)."""
    sequences, nbytes = eval_bytes(config, length, batch_tokens)
    if past_context == "full" and length > config.block_size:
        nbytes += 4 * param_count(config)
    return sequences, nbytes


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:,.1f} GiB" if nbytes >= GIB / 10 else f"{nbytes / 2**20:,.1f} MiB"


def memory_text(device: torch.device, available: int) -> str:
    """What the device has, in words."""
    if device.type == "cuda":
        return f"the GPU has {gib(available)} free"
    return f"this machine has {gib(available)} of RAM available"


def what_fits(config, length: int, batch_tokens: int, most: int, past_context: str, budget: int,
              device: torch.device, dtype: torch.dtype, shorter: bool) -> list[str]:  # fmt: skip
    """The options that would read within ``budget`` bytes: fewer sequences per forward (``batch_size``),
    another kernel (one that keeps no length x length weights), a shorter length in its place (where
    ``shorter``: as many sequences, ``most`` at most)."""
    block, fits = config.block_size, []
    if reading_bytes(config, length, batch_tokens, past_context)[0] > 1:
        batch = longest_within(lambda b: reading_bytes(config, length, b * block, past_context)[1] <= budget,
                               batch_tokens // block)  # fmt: skip
        if batch:
            sequences, nbytes = reading_bytes(config, length, batch * block, past_context)
            batch = -(-sequences * length // block)  # the smallest batch_size that reads as many at once
            fits.append(f"batch_size={batch} ({per_forward(sequences)}, {gib(nbytes)})")
    for name in registry.KERNELS:
        if name == config.kernel:
            continue
        try:
            other = replace(config, kernel=name)
            registry.kernel(name).check_runs(other, device, dtype, training=False)
        except ValueError:  # a kernel that cannot read this model (a score modification it lacks)
            continue
        nbytes = reading_bytes(other, length, batch_tokens, past_context)[1]
        if nbytes <= budget:
            fits.append(f"kernel={name} ({gib(nbytes)})")
    if shorter:
        longest = longest_within(lambda n: reading_bytes(config, n, min(batch_tokens, most * n), past_context)[1]
                                 <= budget, length)  # fmt: skip
        if longest:
            fits.append(f"lengths up to {longest:,} tokens")
    return fits


def longest_within(fits, above: int) -> int:
    """The largest n below ``above`` for which ``fits(n)`` (which holds up to some n, not past it), or 0."""
    low, high = 0, above  # fits(low) or low is 0; not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def per_forward(sequences: int) -> str:
    return f"{sequences} sequence{'s' * (sequences != 1)} per forward"


def check_memory(config, readings: list[tuple[str, int, int]], batch_tokens: int, past_context: str,
                 available: int | None, device: torch.device, dtype: torch.dtype) -> None:  # fmt: skip
    """Refuse, before any forward, a reading whose estimated peak is more than ``available`` bytes (None:
    unknown, nothing refused), in one line: the option as typed, the length, the bytes it needs, what the
    device has, and what would fit. ``readings``: (option, length, the most sequences it has to read: a
    forward holds no more), the option ``lengths=...`` where a shorter length is a way out."""
    if available is None:
        return
    for option, length, most in readings:
        tokens = min(batch_tokens, max(1, most) * length)
        sequences, nbytes = reading_bytes(config, length, tokens, past_context)
        if nbytes <= available:
            continue
        fits = what_fits(config, length, tokens, most, past_context, available, device, dtype,
                         shorter=option.startswith("lengths"))  # fmt: skip
        way_out = f"what fits: {', or '.join(fits)}" if fits else "nothing fits: use a device with more memory"
        raise ValueError(f"{option}: reading {length:,} tokens ({per_forward(sequences)}, kernel="
                         f"{config.kernel}) needs an estimated {gib(nbytes)}, and {memory_text(device, available)}; "
                         f"{way_out}")  # fmt: skip


def most_sequences(length: int, protocol: str, span: int, stride: int | None) -> int:
    """The sequences ``LengthEvaluator`` reads at ``length`` over ``span`` tokens: what one forward can hold at
    most, whatever the batch."""
    step = length if protocol == "chunks" else min(stride or max(1, length // 2), length)
    return max(1, (max(span, length) - length) // step + 1)


class ReadingOutOfMemory(torch.OutOfMemoryError):
    """A forward of an evaluation ran out of memory, in one line naming the reading and what to try (the trainer
    still catches it as torch's own)."""


def is_out_of_memory(err: BaseException) -> bool:
    """torch's CUDA error, the CPU allocator's (a RuntimeError: "can't allocate memory"), or Python's own."""
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "can't allocate memory" in str(err)


@contextlib.contextmanager
def out_of_memory_named(model: torch.nn.Module, shape: tuple[int, ...], option: str):
    """Around one forward: running out of memory ends in one line naming the reading (``shape``: sequences x
    tokens), the kernel and what to try (``option``: the option that asked for the reading), not the
    allocator's message."""
    try:
        yield
    except (RuntimeError, MemoryError) as err:
        if isinstance(err, ReadingOutOfMemory) or not is_out_of_memory(err):
            raise
        detail = " ".join(str(err).split())
        detail = detail if len(detail) <= 200 else detail[:197] + "..."
        message = out_of_memory_text(getattr(model, "config", None), *shape, option)
        raise ReadingOutOfMemory(f"{message} ({type(err).__name__}: {detail})") from None


def out_of_memory_text(config, sequences: int, length: int, option: str) -> str:
    """What ran out of memory and what to try: fewer sequences per forward, a shorter length, a kernel that
    keeps no length x length weights."""
    tries = ["a smaller batch_size"] if sequences > 1 else []
    if option == "lengths":
        tries.append("shorter lengths")
    what = f"{length:,} tokens ({per_forward(sequences)}"
    if config is not None:
        what += f", kernel={config.kernel}, planned {gib(reading_bytes(config, length, sequences * length)[1])}"
        if registry.kernel(config.kernel).keeps_scores(config.sdpa_backend):
            tries += [f"kernel={name}" for name in registry.KERNELS if not registry.kernel(name).keeps_scores()]
    return f"out of memory reading {what}); try {', or '.join(tries) or 'a device with more memory'}"
