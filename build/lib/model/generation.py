"""Autoregressive generation: a KV cache, a sliding context window, and sampling filters.

With the cache each new token costs one position, not the whole context. The
model has absolute positions up to ``block_size``, so once the context is
full it slides: the cache is rebuilt from the last ``block_size // 2`` tokens
and grows again. Without the cache the same windows are used, so both paths
predict from exactly the same context.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from model.gpt import GPT, KVCache


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> int:
    """One token id from a (vocab,) row of logits; temperature 0 is greedy.

    Sampling runs on the CPU in float32, so a seeded CPU generator gives the same
    draws whatever device the model is on.
    """
    logits = logits.detach().float().cpu()
    if temperature == 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        # Keep the smallest set of most likely tokens whose probability reaches top_p.
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = F.softmax(sorted_logits, dim=-1)
        before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
        sorted_logits = sorted_logits.masked_fill(before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
    probs = F.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.no_grad()
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
) -> Iterator[int]:
    """Yield new token ids one at a time after ``prompt`` (non-empty), stopping at ``stop_id``."""
    if not prompt:
        raise ValueError("the prompt is empty; start from at least one token (e.g. <|endoftext|>)")
    block = model.config.block_size
    keep = max(1, block // 2)
    device = next(model.parameters()).device
    tokens = list(prompt)
    start = max(0, len(tokens) - block)
    cache: KVCache | None = None
    for _ in range(max_new_tokens):
        if len(tokens) - start > block:  # the context is full: slide the window
            start, cache = len(tokens) - keep, None
        if not use_cache:
            logits, _ = model(torch.tensor([tokens[start:]], device=device))
        elif cache is None:  # (re)fill the cache with the whole window
            cache = KVCache(model.config.n_layer)
            logits, _ = model(torch.tensor([tokens[start:]], device=device), cache=cache)
        else:
            logits, _ = model(torch.tensor([tokens[-1:]], device=device), cache=cache)
        token = sample_next(logits[0, -1], temperature, top_k, top_p, generator)
        tokens.append(token)
        yield token
        if token == stop_id:
            return
