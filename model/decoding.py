"""Decoding steps: one new token per sample after the cached ones -> the next logits.

- ``eager``: the model's forward over the new position (a CPU, and wherever nothing faster applies).
- ``graph`` (CUDA): a *static* step, captured once per generation as a CUDA graph and replayed for every
  token: decoding a small model is bound by launching a few hundred small kernels per token, and a replay
  launches them all at once.
- ``compiled``: the static step compiled by inductor (on CUDA in ``reduce-overhead`` mode: fused kernels,
  replayed as CUDA graphs); compiling costs tens of seconds, so it pays for long generations.

A static step takes the token and its position as tensors, writes its keys and values in place into the
preallocated KV cache and attends over every slot of it with a mask of the slots that hold keys (the
cache's own bookkeeping: ``model.kv_cache.KVCache.open_step``): the same shapes at every position, which
is what a graph needs. It computes the same function as the eager step (tested on a CPU, where the static
step runs compiled or eager).
"""

from __future__ import annotations

import contextlib

import torch

from model.gpt import GPT
from model.kv_cache import KVCache

DECODINGS = ("auto", "eager", "graph", "compiled")


def choose_decoding(asked: str, device: torch.device) -> str:
    """``auto``: a CUDA graph on CUDA, eager elsewhere."""
    if asked not in DECODINGS:
        raise ValueError(f"decoding={asked!r}; choose one of: {', '.join(DECODINGS)}")
    if asked == "auto":
        return "graph" if device.type == "cuda" else "eager"
    if asked == "graph" and device.type != "cuda":
        raise ValueError("decoding=graph needs a CUDA GPU (CUDA graphs); use decoding=eager or compiled on a CPU")
    return asked


class EagerStep:
    def __init__(self, model: GPT, cache: KVCache) -> None:
        self.model, self.cache = model, cache

    def __call__(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """(B, 1) tokens at ``position`` -> (B, V) logits."""
        return self.model(tokens, cache=self.cache)[0][:, -1]


class StaticStep(EagerStep):
    """The step at a position held in a tensor, over the whole cache: static shapes."""

    def __init__(self, model: GPT, cache: KVCache, batch: int, device: torch.device) -> None:
        super().__init__(model, cache)
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros((), dtype=torch.long, device=device)
        self.cache_tensors = cache.prepare_static_steps(device)

    def run(self) -> torch.Tensor:
        self.cache.open_step(self.position)
        try:
            return self.model(self.token, cache=self.cache)[0][:, -1]
        finally:
            self.cache.close_step()

    def __call__(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        self.token.copy_(tokens)
        self.position.fill_(position)
        logits = self.step()
        self.cache.stepped(position)
        return logits

    def step(self) -> torch.Tensor:
        return self.run()


class GraphedStep(StaticStep):
    """The static step captured as a CUDA graph at its first call, replayed at every later one."""

    def __init__(self, model: GPT, cache: KVCache, batch: int, device: torch.device) -> None:
        super().__init__(model, cache, batch, device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.output: torch.Tensor | None = None

    def step(self) -> torch.Tensor:
        if self.graph is not None:
            self.graph.replay()
            return self.output
        # Warm up on a side stream (CUDA graphs require it). The warm-up steps are this very step: they write
        # the same keys and values into the same slot, and give its logits.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), uncached_autocast():
            for _ in range(2):
                logits = self.run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), uncached_autocast():
            self.output = self.run()
        return logits


def uncached_autocast():
    """Under CUDA autocast (a trainer's fp32 weights sampled in bf16): the same autocast without its cache
    of cast weights. A graph would replay reads of cached casts that autocast frees when its context exits
    (PyTorch's make_graphed_callables refuses the cache for this reason); uncached, the casts are graph nodes."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)


class CompiledStep(StaticStep):
    """The static step compiled once for every position (on CUDA: reduce-overhead, i.e. CUDA graphs)."""

    def __init__(self, model: GPT, cache: KVCache, batch: int, device: torch.device) -> None:
        super().__init__(model, cache, batch, device)
        # The cache and the step's inputs live at fixed addresses: graphs may keep them.
        for tensor in (*self.cache_tensors, self.token, self.position):
            torch._dynamo.mark_static_address(tensor)
        mode = "reduce-overhead" if device.type == "cuda" else None
        self.compiled = torch.compile(self.run, mode=mode, fullgraph=True, dynamic=False)

    def step(self) -> torch.Tensor:
        return self.compiled().clone()  # the graph's output buffer is overwritten by the next replay


def make_step(decoding: str, model: GPT, cache: KVCache, batch: int, device: torch.device) -> EagerStep:
    """The decode step for ``decoding`` (see ``choose_decoding``), over ``cache`` (filled by a prompt first)."""
    if decoding == "graph":
        return GraphedStep(model, cache, batch, device)
    if decoding == "compiled":
        return CompiledStep(model, cache, batch, device)
    return EagerStep(model, cache)
