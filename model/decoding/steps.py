"""Decoding steps: one new token per sample after the cached ones -> the next logits.

- ``eager``: the model's forward over the new position (a CPU, and wherever nothing faster applies).
- ``graph`` (CUDA): a *static* step, captured once per generation as a CUDA graph and replayed for every
  token: decoding a small model is bound by launching a few hundred small kernels per token, and a replay
  launches them all at once.
- ``compiled``: the static step compiled by inductor (fused kernels: fewer launches and fewer round trips
  through memory). On CUDA the compiled step is captured and replayed exactly as graph decoding's plain step is
  (``CompiledGraphedStep``: its warm-up compiles it, then one graph per token), so it replays one graph of fewer
  kernels per token: by construction no slower than graph decoding (a GPU's benchmark measures by how much).
  Compiling costs tens of seconds, once per process for
  a model and a batch size (a later generation's step passes the same guards: tested); it pays for long
  generations.

A static step takes the token and its position as tensors, writes its keys and values in place into the
preallocated KV cache and attends over every slot of it with a mask of the slots that hold keys (the
cache's own bookkeeping: ``model.decoding.kv_cache.KVCache.open_step``): the same shapes at every position, which
is what a graph needs. It computes the same function as the eager step (tested on a CPU, where the static
step runs compiled or eager).

Why not inductor's own CUDA graphs (``mode="reduce-overhead"``, CUDA graph trees), which compiled decoding used
before: measured on an H200 (torch 2.11, ``bench_reference.py generate --batch 8 --dtype bfloat16 --compile``), it
decoded 101 tokens/s at batch 1 where graph decoding did 1,109. What made it slow:

- a recompilation at every generation. ``generation.generate_batch`` gave the LM head a new sampling forward
  object per generation (``model.decoding.packed.sampling_head``); the compiled step traces it and Dynamo guards on its
  identity ("Cache line invalidated because ...lm_head.forward got deallocated"), so every generation compiled
  the step again, and with ``fullgraph`` the ninth generation of a process raised ``FailOnRecompileLimitHit``
  (torch 2.13, on a CPU; the H200's torch 2.11 ran its 12). The benchmark's decode rate began at the first token,
  so it counted that set-up:
  127 tokens at 101 tokens/s is 1.26 s per generation at batch 1, and 127 x 8 at 608 tokens/s 1.67 s at batch 8,
  a cost per generation, not per token. The head now keeps one forward object
  (``model.decoding.packed.transposed_head``), and the benchmark says the first decode step apart from the rate.
- CUDA graph trees then record a new graph per generation: the new cache's tensors are static inputs at new
  addresses (``cudagraph_trees.py``, ``check_invariants``: ``StaticInputIdxMismatch``), after a warm-up run,
  and every replay passes through the trees' bookkeeping in Python (invariant checks over every input, the
  generation and liveness tracking that decides whether the previous replay's outputs may be overwritten). The
  in-place cache writes did not turn graphs off: mutated static inputs are allowed
  (``cudagraph_utils.check_for_mutation``), and inductor writes the one new slot in place.

On a CPU the step had no graph break and no recompilation within a generation (``TORCH_LOGS=recompiles,
graph_breaks``: one graph for 40 tokens past the context and the window's ring, the cache refilled in place).
Capturing the compiled step in headlab's own graph is right by construction: the capture that graph decoding
proves (a warm-up on a side stream, where inductor also compiles and tunes its kernels, then one capture), the
cache written in place at fixed addresses, the logits a buffer read before the next replay, nothing per token but
graph decoding's two input copies and ``replay()``. SGLang captures its ``torch.compile``'d models the same way
(``mode="max-autotune-no-cudagraphs"``, then its own CUDA graphs). The default mode is used here: max-autotune
tunes every matmul shape for minutes, for products that are reads of the weights at a batch of a few rows.

Compiled and plain steps agree to round-off, not bit for bit. In bfloat16 inductor fuses pointwise ops and keeps
the intermediates of a fused kernel in float32 where the plain step rounds every op's output to bf16: the logits
differ by bf16 round-off, and a greedy choice whose top two logits are closer than that flips; the continuation
differs from there. ``bench_reference.py decode-rounding`` (GPT-2 small's shape, random weights, 8 greedy rows of
128 tokens, on a CPU): in bf16 the logits differed by at most 0.039 (median 0.027) at logits of about 2.9, where
bf16's spacing is 0.0156, and 2 rows parted, at tokens 14 and 24, where the plain step's top two logits were 0 and
0.0156 apart (bf16 logits tie); in float32 by at most 2.3e-6, and no row parted. The H200 benchmark's 99 of 128
equal greedy tokens compared headlab's compiled step with transformers' compiled static cache: two fusions of one
function, in bf16, from random weights, whose top-2 gaps are often that small.
"""

from __future__ import annotations

import contextlib
import statistics

import torch

from model.config import GPTConfig
from model.decoding.kv_cache import KVCache
from model.device import device_name, memory_bandwidth
from model.gpt import GPT

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
        cache.prepare_static_steps(device)
        self.compute = self.run  # what computes a step: ``run`` itself, or ``run`` compiled (``compiled``)

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
        return self.compute()

    def computed_again(self, runs: int) -> torch.Tensor:
        """This step's logits, computed ``runs`` times from the same cache (a graph's warm-up): the cache's tensors
        are put back before each later run, so a state a layer carries (a linear layer's, updated in place) advances
        by this token once, as a KV cache's slot is written once."""
        held = self.cache.buffers()
        before = [t.clone() for t in held] if runs > 1 else []
        for run in range(runs):
            if run:
                for t, kept in zip(held, before, strict=True):
                    t.copy_(kept)
            logits = self.compute()
        return logits


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
        # Warm up on a side stream (CUDA graphs require it). The warm-up steps are this very step, each from the
        # same cache (a linear layer's state advanced once, not twice), and give its logits. A compiled step compiles
        # (and tunes its kernels) here, so that the capture records only kernel launches.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), uncached_autocast():
            logits = self.computed_again(2)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), uncached_autocast():
            self.output = self.compute()
        return logits


def uncached_autocast():
    """Under CUDA autocast (a trainer's fp32 weights sampled in bf16): the same autocast without its cache
    of cast weights. A graph would replay reads of cached casts that autocast frees when its context exits
    (PyTorch's make_graphed_callables refuses the cache for this reason); uncached, the casts are graph nodes."""
    if not torch.is_autocast_enabled("cuda"):
        return contextlib.nullcontext()
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), cache_enabled=False)


# How the static step is compiled: one graph for every position (fullgraph, static shapes), and never with
# inductor's own CUDA graphs (its "reduce-overhead" mode), on any device: on CUDA the compiled step is captured
# by ``CompiledGraphedStep`` instead (the module's docstring says why).
COMPILE_SETTINGS = {"fullgraph": True, "dynamic": False, "options": {"triton.cudagraphs": False}}


def compiled(step: StaticStep):
    """``step.run`` compiled by inductor (``COMPILE_SETTINGS``). Compiled once per process for a model and a batch
    size: a later generation's step (a new cache, new buffers) passes the same guards and reuses the graph."""
    return torch.compile(step.run, **COMPILE_SETTINGS)


class CompiledStep(StaticStep):
    """A CPU's compiled decoding: the compiled static step, called for every token."""

    def __init__(self, model: GPT, cache: KVCache, batch: int, device: torch.device) -> None:
        super().__init__(model, cache, batch, device)
        self.compute = compiled(self)


class CompiledGraphedStep(GraphedStep):
    """CUDA's compiled decoding: the compiled static step, captured and replayed as graph decoding's plain one is
    (its warm-up compiles it): one graph per token, of inductor's fewer, fused kernels."""

    def __init__(self, model: GPT, cache: KVCache, batch: int, device: torch.device) -> None:
        super().__init__(model, cache, batch, device)
        self.compute = compiled(self)


def step_class(decoding: str, device: torch.device) -> type[EagerStep]:
    """The step that runs ``decoding`` (a choice of ``choose_decoding``) on ``device``."""
    if decoding == "graph":
        return GraphedStep
    if decoding == "compiled":
        return CompiledGraphedStep if device.type == "cuda" else CompiledStep
    return EagerStep


def make_step(decoding: str, model: GPT, cache: KVCache, batch: int, device: torch.device) -> EagerStep:
    """The decode step for ``decoding`` (see ``choose_decoding``), over ``cache`` (filled by a prompt first)."""
    kind = step_class(decoding, device)
    return EagerStep(model, cache) if kind is EagerStep else kind(model, cache, batch, device)


def weight_bytes(model: GPT) -> int:
    """Bytes of the weights one decode step reads: every parameter once (the tied embedding and head once), in the
    dtype it is stored in, but for a learned position table, of which a step reads one row per sample."""
    table = {id(p) for p in model.transformer.wpe.parameters()}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in table)


def step_bytes(config: GPTConfig, weights: int, batch: int, keys: int, dtype: torch.dtype) -> int:
    """The bytes one decode step of ``batch`` samples must read at least, its new token seeing ``keys`` positions
    (its own included): the ``weights`` once, whatever the batch, and for each sample every layer's KV cache at that
    length (its ``cache_widths`` numbers per position, at most its capacity: a window's ring) and a linear layer's
    state, in ``dtype`` (the activations'). The static step reads every slot of its cache, filled or not; this is
    what a step needs, the bound's bytes."""
    size = torch.finfo(dtype).bits // 8
    cached = sum(width * min(keys, capacity) for width, capacity in zip(config.cache_widths, config.cache_capacities))
    return weights + batch * (cached * size + config.state_bytes(size))


def bandwidth_limit(config: GPTConfig, weights: int, batch: int, keys: list[int], dtype: torch.dtype,
                    device: torch.device) -> tuple[float | None, float]:  # fmt: skip
    """(the memory-bandwidth limit in tokens/s, or None where the bandwidth is not known; the bytes per step). At
    ``batch`` samples a step makes ``batch`` tokens and reads ``step_bytes`` (the mean over the steps' ``keys``): the
    limit is ``batch`` x bandwidth / bytes per step."""
    per_step = statistics.mean(step_bytes(config, weights, batch, n, dtype) for n in keys)
    bandwidth = memory_bandwidth(device)
    return (None if bandwidth is None else batch * bandwidth / per_step), per_step


def bandwidth_share(rate: float, config: GPTConfig, weights: int, batch: int, keys: list[int], dtype: torch.dtype,
                    device: torch.device) -> str:  # fmt: skip
    """``rate`` (tokens/s) as a share of the memory-bandwidth limit (``bandwidth_limit``), in words; where the
    bandwidth is not known (a CPU, an unlisted GPU) there is no share, and it says so."""
    limit, per_step = bandwidth_limit(config, weights, batch, keys, dtype, device)
    read = f"{in_units(per_step)} read per step"
    if limit is None:
        where = device_name(device) if device.type == "cuda" else device.type
        return f"memory bandwidth unknown for {where}: no share of its limit ({read})"
    return (f"{rate / limit:.1%} of the memory-bandwidth limit ({limit:,.0f} tokens/s on {device_name(device)} at "
            f"{memory_bandwidth(device) / 1e12:g} TB/s, {read})")


def in_units(size: float) -> str:
    """Bytes in decimal units, as bandwidths are quoted: 252.1 MB, 19.6 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size:,.0f} B"
