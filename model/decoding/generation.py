"""Autoregressive generation: a batch of samples at once, a preallocated KV cache, a sliding window.

With the cache each new token costs one position, not the whole context, and
the cache is written in place (``model.decoding.kv_cache``). A model with learned
absolute positions knows them up to ``block_size``, so once the context is full
it slides: the cache is rebuilt from the last ``block_size // 2`` tokens and
grows again. Without the cache the same windows are used, so both paths predict
from exactly the same context. A model without a position table (rope, alibi,
none: ``GPTConfig.runs_past_context``) never re-encodes: each new token is one
more position, seeing the last ``cache_capacity`` keys (its window, or its
block size), and the cache stays that size forever (a ring).

Sampling happens on the model's device for the whole batch. Each sample has its
own random generator, drawing one uniform number per token (inverse-CDF
sampling), so sample ``i`` of a batch equals the sample generated alone with the
same generator, up to float round-off in the batched matmuls. CPU generators draw
all of a generation's numbers at the start (the same numbers: a CPU generator
draws serially), copied to the device once, not once per token and sample: on a
GPU each such copy waits for the device to finish its queue.

On a GPU the host reads a step's tokens after it has launched the next step (which
takes them from device memory): the device computes step t+1 while the host turns
step t's tokens into text. The tokens are the same; they reach the caller when the
next step is under way, and a generation that stops computes one step in vain.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, nullcontext

import torch
import torch.nn.functional as F

from model.config import GPTConfig
from model.decoding.kv_cache import KVCache
from model.decoding.packed import packed_linears, sampling_head
from model.decoding.steps import choose_decoding, make_step
from model.gpt import GPT

# Sampling's defaults, one place for sample.py and the trainer's end-of-run sample.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 200


def filter_logits(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float) -> torch.Tensor:
    """(B, V) logits -> temperature-scaled logits with top-k / nucleus (top-p) filtered tokens at -inf."""
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        # Keep the smallest set of most likely tokens whose probability reaches top_p.
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
        sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def draw(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float,
         generators: list[torch.Generator | None]) -> torch.Tensor:  # fmt: skip
    """One token id per row of (B, V) logits, on their device; temperature 0 is greedy.

    Row ``i`` uses one uniform number from ``generators[i]`` (a CPU generator gives the same draws for a
    seed whatever the model's device; one on the model's GPU draws there, without a copy) and takes the
    token where the cumulative probability passes it.
    """
    u = None if temperature == 0 else torch.stack([uniform(g, logits.device) for g in generators])
    return choose(logits, u, temperature, top_k, top_p)


def uniform(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """One uniform number from ``generator``, made on the generator's own device (a CPU or a GPU one)."""
    where = generator.device if generator is not None else torch.device("cpu")
    return torch.rand((), generator=generator, device=where).to(device)


def choose(logits: torch.Tensor, u: torch.Tensor | None, temperature: float, top_k: int | None,
           top_p: float) -> torch.Tensor:  # fmt: skip
    """Per row of (B, V) logits, the token where the cumulative probability passes ``u`` (B uniform
    numbers in [0, 1)); the most likely token when ``temperature`` is 0 (``u`` is then unused)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = F.softmax(filter_logits(logits, temperature, top_k, top_p), dim=-1)
    cdf = probs.cumsum(dim=-1)
    token = torch.searchsorted(cdf, (u.to(cdf.device) * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return token.clamp_(max=logits.size(-1) - 1)


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> int:
    """One token id from a (vocab,) row of logits; temperature 0 is greedy."""
    return int(draw(logits.unsqueeze(0), temperature, top_k, top_p, [generator])[0])


def context_lengths(config: GPTConfig, prompt_len: int, new_tokens: int) -> list[int]:
    """The tokens each step of ``generate_batch`` reads as its context, one number per new token: the prompt
    (at most ``block_size`` of it) for the first, then one more each step; a model with a position table slides
    its window back to its last ``block_size // 2`` tokens once it passes ``block_size``. What a decode step's
    bytes scale with (``model.decoding.steps.step_bytes``)."""
    block, keep = config.block_size, max(1, config.block_size // 2)
    slides = not config.runs_past_context
    start = max(0, prompt_len - block) if slides else 0
    lengths = []
    for length in range(prompt_len, prompt_len + new_tokens):
        if slides and length - start > block:
            start = length - keep
        lengths.append(length - start)
    return lengths


class Uniforms:
    """The uniform numbers a generation samples with: row ``i``'s come from ``generators[i]``, one per token.

    CPU generators (and None, torch's default one) draw ``steps`` numbers each at the start, the numbers they would
    draw one per token (the CPU's generator is serial), copied to the device once: one copy per token and row would
    make the host wait for the device at every one. Generators on the model's GPU draw there at each step, without
    a copy. A greedy generation draws nothing.
    """

    def __init__(self, generators: list[torch.Generator | None], steps: int, device: torch.device,
                 greedy: bool) -> None:  # fmt: skip
        self.generators, self.device, self.greedy = generators, device, greedy
        on_cpu = all(g is None or g.device.type == "cpu" for g in generators)
        self.drawn = None
        if not greedy and on_cpu:
            self.drawn = torch.stack([torch.rand((steps,), generator=g) for g in generators]).to(device)

    def at(self, step: int) -> torch.Tensor | None:
        """(B,) the numbers of generation step ``step``; None when greedy."""
        if self.greedy:
            return None
        if self.drawn is not None:
            return self.drawn[:, step]
        return torch.stack([uniform(g, self.device) for g in self.generators])


@torch.inference_mode()
def generate_batch(
    model: GPT,
    prompt: list[int],
    max_new_tokens: int,
    generators: list[torch.Generator | None],
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    use_cache: bool = True,
    stop_id: int | None = None,
    decoding: str = "auto",
    read_ahead: bool | None = None,
) -> Iterator[list[int | None]]:
    """``len(generators)`` continuations of ``prompt`` at once; yields each step's new token per sample.

    A sample that produced ``stop_id`` yields None from then on; generation ends when every
    sample has stopped or after ``max_new_tokens``. ``decoding`` is how a cached step runs
    (``model.decoding.steps``: auto is a CUDA graph on CUDA, eager on a CPU). ``read_ahead`` (default: on
    CUDA) reads a decode step's tokens once the next step is launched, so that the device never
    waits for the host between steps; on a CPU, which computes as it launches, it would only delay
    every token by a step.
    """
    if not prompt:
        raise ValueError("the prompt is empty; start from at least one token (e.g. <|endoftext|>)")
    n, block = len(generators), model.config.block_size
    keep = max(1, block // 2)
    device = next(model.parameters()).device
    decoding = choose_decoding(decoding, device) if use_cache else "eager"
    read_ahead = device.type == "cuda" if read_ahead is None else read_ahead
    tokens = torch.empty(n, len(prompt) + max_new_tokens, dtype=torch.long, device=device)
    tokens[:, : len(prompt)] = torch.tensor(prompt, device=device)
    uniforms = Uniforms(generators, max_new_tokens, device, greedy=temperature == 0)
    slides = not model.config.runs_past_context  # a position table ends at block_size: re-encode from there
    length, start = len(prompt), max(0, len(prompt) - block) if slides else 0
    cache, step, refill = KVCache(model.config.n_layer), None, True  # the model sizes it: its context or window
    stopped = [False] * n
    unread: int | None = None  # the position of tokens chosen on the device and not yet read

    def read(position: int) -> list[int | None]:
        """The tokens at ``position`` on the host (the one host sync of a step, for every sample); None for a
        sample stopped before them."""
        new = tokens[:, position].tolist()
        out = [None if stopped[i] else token for i, token in enumerate(new)]
        stopped[:] = [done or token == stop_id for done, token in zip(stopped, new)]
        return out

    # Decoding multiplies n rows by every weight: on a CPU, weights packed for n rows are read faster, and the
    # head's product for a few rows is faster transposed where it is not packed.
    with ExitStack() as faster:
        packing = packed_linears(model, n, max_new_tokens) if use_cache and decoding == "eager" else nullcontext()
        faster.enter_context(packing)
        faster.enter_context(sampling_head(model.lm_head))
        for i in range(max_new_tokens):
            if slides and length - start > block:  # the context is full: slide the window
                start, refill = length - keep, True
            replays = use_cache and not refill and step is not None  # a decode step that only launches
            if unread is not None and not (read_ahead and replays):  # the first token is not held back by set-up
                yield read(unread)
                unread = None
                if all(stopped):
                    return
            if not use_cache:
                logits = model(tokens[:, start:length])[0][:, -1]
            elif refill:  # (re)fill the cache with the whole window, in place: a captured step keeps its buffers
                cache.reset()
                logits = model(tokens[:, start:length], cache=cache)[0][:, -1]
                refill = False
            else:
                step = step or make_step(decoding, model, cache, n, device)
                logits = step(tokens[:, length - 1 : length], length - 1 - start)
            tokens[:, length] = choose(logits, uniforms.at(i), temperature, top_k, top_p)
            if unread is not None:  # read ahead: the step just launched computes while the host reads the last
                yield read(unread)
                if all(stopped):
                    return
            unread, length = length, length + 1
        if unread is not None:
            yield read(unread)


def generate(
    model: GPT,
    prompt: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    stop_id: int | None = None,
    decoding: str = "auto",
) -> Iterator[int]:
    """Yield new token ids one at a time after ``prompt`` (non-empty), stopping at ``stop_id``."""
    for (token,) in generate_batch(model, prompt, max_new_tokens, [generator], temperature, top_k, top_p,
                                   use_cache, stop_id, decoding):  # fmt: skip
        yield token
