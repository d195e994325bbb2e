"""headlab against its references, side by side in one process, interleaved (printing numbers, not tests).

    python bench_reference.py train-step            # a training step vs transformers' GPT2LMHeadModel
    python bench_reference.py levers --vocab 50257 --loss-chunk 4096  # the head and loss in chunks vs whole logits
    python bench_reference.py levers --compile-mode reduce-overhead  # a compiled step replayed as CUDA graphs
    python bench_reference.py optimizer --split qkv  # a training step with Muon (by Q/K/V) vs with AdamW
    python bench_reference.py generate              # greedy / sampled generation vs transformers' generate
    python bench_reference.py sample-process        # sample.py num_samples=8 vs 1, whole process
    python bench_reference.py prepare               # data preparation with gpt2 vs tiktoken's batch encode
    python bench_reference.py decode-positions      # a decode step with rope, alibi, sinks vs learned positions
    python bench_reference.py decode-rounding --dtype bfloat16 --n-layer 12 --batch 8  # where greedy tokens part

Each comparison alternates the two sides for ``--rounds`` rounds and reports the
median of the per-round ratios (headlab / reference time; < 1 is faster), so a
shared machine's slow moments hit both sides. Needs transformers (the dev extra);
``prepare`` and ``sample-process`` need GPT-2's rank file (``TIKTOKEN_CACHE_DIR``).
"""

from __future__ import annotations

from common.startup import guard_start_up, start_up_over

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from cli import OneLineErrorParser
from common.run_files import write_text
from model import GPT, Checkpoint, GPTConfig, KVCache
from model.checkpoints.gpt2_export import hf_gpt2_config, hf_gpt2_state_dict
from model.compiling import COMPILE_MODES, compile_for_training
from model.decoding.generation import context_lengths, generate_batch
from model.decoding.steps import (
    DECODINGS,
    GraphedStep,
    StaticStep,
    bandwidth_limit,
    bandwidth_share,
    choose_decoding,
    step_class,
    weight_bytes,
)
from model.device import (
    autocast,
    device_name,
    inductor_cache_per_cpu_capability,
    resolve_device,
    resolve_dtype,
)
from training.config import MUON_SPLITS, OptimConfig
from training.optim import fused_adamw, make_optimizer

ROOT = Path(__file__).resolve().parent


# The plainest implementation of each layout x kernel, written from the formula in a from-scratch course's style
# (a single-head module and a wrapper of them; multi-head attention with separate Q/K/V projections; one combined
# QKV projection; torch's SDPA with is_causal): what headlab's own block must not be slower than
# (``python bench.py --mode plain``). Each holds the very nn.Linear modules of a headlab block (``plain_twin``),
# so both compute one function from one set of weights.
PLAIN_LAYOUTS = ("wrapper", "separate_qkv", "fused_qkv")
PLAIN_KERNELS = ("manual", "sdpa")


def plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str, hidden: torch.Tensor):
    """softmax(q k^T / sqrt(d), causal) v: written out (manual), or torch's SDPA with is_causal (a single head's
    (B, T, hd) as (B, 1, T, hd): a CPU's fused SDPA takes 4-d tensors; 3-d ones run its unfused math)."""
    if kernel == "sdpa":
        if q.dim() == 3:
            return F.scaled_dot_product_attention(*(t.unsqueeze(1) for t in (q, k, v)), is_causal=True).squeeze(1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.size(-2)
    scores = (q @ k.transpose(-2, -1)).masked_fill(hidden[:T, :T], float("-inf"))
    return torch.softmax(scores / math.sqrt(q.size(-1)), dim=-1) @ v


class PlainHead(nn.Module):
    """One causal attention head, d_model -> head_dim."""

    def __init__(self, query: nn.Linear, key: nn.Linear, value: nn.Linear, kernel: str, hidden: torch.Tensor):
        super().__init__()
        self.query, self.key, self.value, self.kernel = query, key, value, kernel
        self.register_buffer("hidden", hidden, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return plain_attention(self.query(x), self.key(x), self.value(x), self.kernel, self.hidden)


class PlainWrapper(nn.Module):
    """Single heads side by side, concatenated, then the output projection."""

    def __init__(self, heads: list[PlainHead], proj: nn.Linear):
        super().__init__()
        self.heads, self.proj = nn.ModuleList(heads), proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([head(x) for head in self.heads], dim=-1))


class PlainMultiHead(nn.Module):
    """Q, K and V from separate projections (or one combined projection split in three), reshaped into heads."""

    def __init__(self, projections: list[nn.Linear], proj: nn.Linear, n_head: int, kernel: str,
                 hidden: torch.Tensor):  # fmt: skip
        super().__init__()
        self.projections, self.proj, self.n_head, self.kernel = nn.ModuleList(projections), proj, n_head, kernel
        self.register_buffer("hidden", hidden, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        if len(self.projections) == 1:
            q, k, v = self.projections[0](x).split(C, dim=-1)
        else:
            q, k, v = (projection(x) for projection in self.projections)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = plain_attention(q, k, v, self.kernel, self.hidden)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


def plain_twin(block: nn.Module, layout: str, kernel: str, seq_len: int) -> nn.Module:
    """The plain reference of a headlab attention block (multi-head, learned positions, no score modifications),
    holding the block's own projections."""
    hidden = torch.ones(seq_len, seq_len, dtype=torch.bool, device=block.c_proj.weight.device).triu(1)
    if layout == "wrapper":
        heads = [PlainHead(h.query, h.key, h.value, kernel, hidden) for h in block.heads]
        return PlainWrapper(heads, block.c_proj)
    projections = [block.c_attn] if layout == "fused_qkv" else [block.query, block.key, block.value]
    return PlainMultiHead(projections, block.c_proj, block.n_head, kernel, hidden)


def hf_twin(model: GPT):
    """transformers' GPT2LMHeadModel holding exactly ``model``'s weights."""
    import transformers

    config = transformers.GPT2Config(**{k: v for k, v in hf_gpt2_config(model, None).items()
                                        if k not in ("architectures", "model_type")})  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config)
    missing, unexpected = hf.load_state_dict(hf_gpt2_state_dict(model), strict=False)
    assert not unexpected and all("lm_head" in k or "attn.bias" in k or "masked_bias" in k for k in missing), missing
    return hf


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()  # CUDA runs asynchronously: the clock stops when the GPU is done
    return time.perf_counter() - start


def sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleave(ours, theirs, rounds: int) -> tuple[list[float], list[float]]:
    a, b = [], []
    for _ in range(rounds):
        a.append(timed(ours))
        b.append(timed(theirs))
    return a, b


RESULTS: list[dict] = []  # what each comparison measured, for --json (gpu_story.py reads it)


def report(what: str, a: list[float], b: list[float], unit_work: float, unit: str, **facts) -> None:
    ratios = [x / y for x, y in zip(a, b)]
    print(f"{what}: headlab {unit_work / statistics.median(a):,.1f} {unit}, reference "
          f"{unit_work / statistics.median(b):,.1f} {unit}; time ratio headlab/reference: median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(a)} rounds")
    RESULTS.append({"what": what, "unit": unit, "headlab": unit_work / statistics.median(a),
                    "reference": unit_work / statistics.median(b), "ratio": statistics.median(ratios),
                    "ratio_min": min(ratios), "ratio_max": max(ratios), "rounds": len(a), **facts})  # fmt: skip


def train_step(args) -> None:
    """A whole training step (forward, backward, clipping, AdamW) of the same model and weights, as training
    runs it on the device: autocast in ``--dtype``, fused AdamW, optionally both sides compiled."""
    device = resolve_device(args.device, option="--device")
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as training does
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, attention=args.attention, kernel=args.kernel)  # fmt: skip
    ours = GPT(config)
    hf = hf_twin(ours).to(device)
    ours = ours.to(device)
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]

    def make_step(model, loss_of):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                fused=fused_adamw(device))  # fmt: skip
        run = torch.compile(model) if args.compile else model

        def step():
            for _ in range(args.steps):
                with autocast(device, dtype):
                    loss = loss_of(run)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)

        return step

    if args.compile:
        inductor_cache_per_cpu_capability()
    ours_step = make_step(ours, lambda m: m(x, y)[1])
    theirs_step = make_step(hf, lambda m: torch.nn.functional.cross_entropy(
        m(input_ids=x).logits.reshape(-1, args.vocab).float(), y.reshape(-1)))  # fmt: skip
    ours_step(), theirs_step()  # warm-up (and compilation)
    a, b = interleave(ours_step, theirs_step, args.rounds)
    tokens = args.steps * args.batch * args.seq
    report(f"training step ({args.attention}/{args.kernel}, batch {args.batch} x {args.seq}, {args.n_layer} layers x "
           f"{args.n_embd}, vocab {args.vocab}, {device_name(device)}, {str(dtype).removeprefix('torch.')}"
           f"{', compiled' if args.compile else ''})", a, b, tokens, "tokens/s", comparison="train-step")  # fmt: skip


def lever_step(args) -> None:
    """A lever of issue 53 measured on headlab's own training step (forward, backward, clipping, AdamW; train-step's
    weights, batch and optimizer): the step with ``--loss-chunk`` (the head and loss in chunks) and/or compiled in
    ``--compile-mode`` against the same step without them (the whole logits; compiled in the default mode where
    either side compiles), interleaved; on CUDA each side's peak memory too."""
    device = resolve_device(args.device, option="--device")
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, attention=args.attention, kernel=args.kernel)  # fmt: skip
    models = [GPT(config).to(device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    models[0].loss_chunk = args.loss_chunk
    compiled = args.compile or args.compile_mode != "default"
    modes = (args.compile_mode, "default")
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]
    peaks = [0, 0]

    def make_step(side: int):
        model = models[side]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused_adamw(device))
        run = compile_for_training(model, "model", modes[side]) if compiled else model

        def step():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for _ in range(args.steps):
                if modes[side] == "reduce-overhead":
                    torch.compiler.cudagraph_mark_step_begin()
                with autocast(device, dtype):
                    loss = run(x, y)[1]
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                peaks[side] = max(peaks[side], torch.cuda.max_memory_allocated(device))

        return step

    levers, plain = make_step(0), make_step(1)
    levers(), plain()  # warm-up (and compilation)
    a, b = interleave(levers, plain, args.rounds)
    said = [(f"the head and loss in chunks of {args.loss_chunk} tokens", "the whole logits")] if args.loss_chunk else []
    said += [(f"inductor's mode {args.compile_mode}", "the default mode")] if args.compile_mode != "default" else []
    lever = " and ".join(w for w, _ in said) or "no lever (the same step twice)"
    against = " and ".join(a for _, a in said) or "itself"
    memory = (f"; peak memory {peaks[0] / 2**30:.2f} GiB against {peaks[1] / 2**30:.2f} GiB"
              if device.type == "cuda" else "")
    report(f"training step with {lever} (reference: {against}; batch {args.batch} x {args.seq}, {args.n_layer} "
           f"layer{'s' if args.n_layer > 1 else ''} x {args.n_embd}, vocab {args.vocab}, {device_name(device)}, "
           f"{str(dtype).removeprefix('torch.')}"
           f"{', compiled' if compiled else ''}){memory}", a, b, args.steps * args.batch * args.seq, "tokens/s",
           comparison="levers", lever=lever, against=against, loss_chunk=args.loss_chunk,
           compile_mode=args.compile_mode,
           peak_bytes=peaks[0] or None, reference_peak_bytes=peaks[1] or None)  # fmt: skip


def optimizer_step(args) -> None:
    """Muon (``optim=muon``, its matrices split as ``--split`` says) against AdamW (``optim=adamw``), each the trainer's
    own optimizer for a run in ``--dtype`` (Muon orthogonalises in bfloat16 for a bf16 run, float32 for a float32 one),
    on train-step's model and batch: the whole training step (forward, backward, clipping, the optimizer) and the
    optimizer's step alone (on fixed gradients), each interleaved."""
    device = resolve_device(args.device, option="--device")
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, attention=args.attention, kernel=args.kernel)  # fmt: skip
    models = [GPT(config).to(device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    settings = (OptimConfig(name="muon", muon_split=args.split), OptimConfig())
    optimizers = [make_optimizer(model, cfg, device, dtype) for model, cfg in zip(models, settings)]
    runs = [compile_for_training(model, "block", "default") if args.compile else model for model in models]
    idx = torch.randint(0, args.vocab, (args.batch, args.seq + 1), device=device)
    x, y = idx[:, :-1], idx[:, 1:]

    def whole(side: int):
        def step():
            for _ in range(args.steps):
                with autocast(device, dtype):
                    loss = runs[side](x, y)[1]
                loss.backward()
                torch.nn.utils.clip_grad_norm_(models[side].parameters(), 1.0)
                optimizers[side].step()
                optimizers[side].zero_grad(set_to_none=True)

        return step

    def alone(side: int):
        def step():
            for _ in range(args.steps):
                optimizers[side].step()

        return step

    whole(0)(), whole(1)()  # warm-up (and compilation): the optimizers' state made
    shape = (f"{args.attention}, batch {args.batch} x {args.seq}, {args.n_layer} layers x {args.n_embd}, vocab "
             f"{args.vocab}, {device_name(device)}, {str(dtype).removeprefix('torch.')}"
             f"{', compiled' if args.compile else ''}")  # fmt: skip
    muon = f"Muon split {args.split}"
    a, b = interleave(whole(0), whole(1), args.rounds)
    report(f"training step with {muon} (reference: with AdamW; {shape})", a, b, args.steps * args.batch * args.seq,
           "tokens/s", comparison="optimizer", part="step", split=args.split)  # fmt: skip
    for side in (0, 1):  # gradients to step on, kept
        with autocast(device, dtype):
            runs[side](x, y)[1].backward()
    a, b = interleave(alone(0), alone(1), args.rounds)
    report(f"the optimizer's step alone, {muon} (reference: AdamW; {shape})", a, b, args.steps, "steps/s",
           comparison="optimizer", part="optimizer", split=args.split)  # fmt: skip


class TokenTimes:
    """A transformers streamer that notes when each step's tokens come out (its first call is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value) -> None:
        sync()
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def split_times(start: float, times: list[float], tokens: int) -> tuple[float, float, float]:
    """(seconds to the first new token, seconds of the first decode step, decode tokens/s after that step) from the
    moments each step's tokens came out. The first decode step sets the step up in each generation (a CUDA graph
    captured, a compiled step's graph looked up or compiled): said apart from the rate, as sample.py says it."""
    setup = times[1] - times[0] if len(times) > 2 else 0.0
    after = times[1:] if len(times) > 2 else times
    return times[0] - start, setup, (len(after) - 1) * tokens / max(after[-1] - after[0], 1e-9)


def generation(args) -> None:
    """Greedy batch-1 and sampled batch-N generation of GPT-2 small's shape, ours against transformers' generate
    (same weights and prompt), each as time to the first token, the first decode step (its set-up) and the decode
    rate after it, with the rate's share of the memory-bandwidth limit. On CUDA ours replays each step as a CUDA
    graph (--compile: the step compiled with inductor, then captured); transformers uses its static cache,
    compiled, with --compile."""
    torch.manual_seed(0)
    config = (GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)  # GPT-2 small
              if args.model == "gpt2_small" else
              GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.n_layer, n_head=args.n_head,
                        n_embd=args.n_embd))  # fmt: skip
    shape = "GPT-2 small shape" if args.model == "gpt2_small" else f"{args.n_layer} layers x {args.n_embd}"
    ours = GPT(config).eval()
    hf = hf_twin(ours).eval()
    device = resolve_device(args.device, option="--device")
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    ours, hf = ours.to(device, dtype), hf.to(device, dtype)  # weights cast once, as sample.py dtype=... does
    weights = weight_bytes(ours)
    prompt = torch.randint(0, config.vocab_size, (1, 16)).to(device)
    n = args.new_tokens
    modes = decoding_modes(args, device)
    if "compiled" in modes:
        inductor_cache_per_cpu_capability()
    for decoding in modes:
        compare_generation(args, ours, hf, config, shape, prompt, n, weights, device, dtype, decoding)


def decoding_modes(args, device: torch.device) -> list[str]:
    """--decoding's modes on this device: ``all`` is every one it runs (eager; graph and compiled on CUDA,
    compiled on a CPU); --compile alone asks for compiled, as before."""
    if args.decoding == "all":
        return [mode for mode in DECODINGS if mode != "auto" and (mode != "graph" or device.type == "cuda")]
    return [choose_decoding("compiled" if args.compile and args.decoding == "auto" else args.decoding, device)]


def compare_generation(args, ours, hf, config, shape: str, prompt, n: int, weights: int, device, dtype,
                       decoding: str) -> None:  # fmt: skip
    """One decoding mode of ours against transformers' generate (its static cache, compiled, where ours is
    compiled), greedy at batch 1 and sampled at --batch, interleaved."""
    hf_extra = {"cache_implementation": "static"} if decoding == "compiled" else {}

    def ours_run(batch: int, sampled: bool, read_ahead: bool | None = None) -> dict:
        generators = [torch.Generator(device=device).manual_seed(i) for i in range(batch)]
        start, times, tokens = time.perf_counter(), [], []
        for step in generate_batch(ours, prompt[0].tolist(), n, generators, 1.0 if sampled else 0.0, 200 if sampled
                                   else None, decoding=decoding, read_ahead=read_ahead):  # fmt: skip
            times.append(time.perf_counter())  # each step syncs: its tokens are on the host
            tokens.append(step[0])
        return {"split": split_times(start, times, batch), "tokens": tokens}

    def hf_run(batch: int, sampled: bool) -> dict:
        streamer, start = TokenTimes(), time.perf_counter()
        with torch.no_grad():
            out = hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=sampled, top_k=200 if sampled
                              else None, num_return_sequences=batch, pad_token_id=0, streamer=streamer,
                              **hf_extra)  # fmt: skip
        return {"split": split_times(start, streamer.times[1:], batch), "tokens": out[0, prompt.size(1):].tolist()}

    for batch, sampled, what in ((1, False, "greedy"), (args.batch, True, "sampled")):
        if batch == 1 and sampled:
            continue
        ours_run(batch, sampled), hf_run(batch, sampled)  # warm-up (and compilation)
        mine, theirs, unread = [], [], []  # unread: ours reading each step's tokens before launching the next
        for _ in range(args.rounds):  # interleaved
            mine.append(ours_run(batch, sampled))
            theirs.append(hf_run(batch, sampled))
            if device.type == "cuda":  # the lever of reading ahead (the default on CUDA), measured against its absence
                unread.append(ours_run(batch, sampled, read_ahead=False))
        equal = sum(p == q for p, q in zip(mine[-1]["tokens"], theirs[-1]["tokens"]))
        ratios = [t["split"][2] / m["split"][2] for m, t in zip(mine, theirs)]  # decode time, ours / theirs
        rate, their_rate = (statistics.median(r["split"][2] for r in runs) for runs in (mine, theirs))
        first, setup = (statistics.median(m["split"][i] for m in mine) for i in (0, 1))
        their_first, their_setup = (statistics.median(t["split"][i] for t in theirs) for i in (0, 1))
        keys = context_lengths(config, prompt.size(1), n)[2:] or [prompt.size(1)]  # the steps after the set-up step
        limit, _ = bandwidth_limit(config, weights, batch, keys, dtype, device)
        their_share = "" if limit is None else f" ({their_rate / limit:.1%} of the limit)"
        how = f"headlab: {decoding} decoding" + ("; transformers: static cache" if hf_extra else "")
        agreement = "" if sampled else f"; {equal}/{n} greedy tokens equal"
        weights_dtype = str(dtype).removeprefix("torch.")
        print(f"{what} generation, batch {batch}, {n} new tokens ({shape}, {weights_dtype} weights on "
              f"{device}, {how}{agreement}): headlab decodes {rate:,.1f} tokens/s, "
              f"{bandwidth_share(rate, config, weights, batch, keys, dtype, device)}, after a first token in "
              f"{first:.3f} s and a first decode step in {setup:.3f} s; transformers {their_rate:,.1f} tokens/s"
              f"{their_share} after {their_first:.3f} s and {their_setup:.3f} s; decode time ratio headlab/reference: "
              f"median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) over "
              f"{args.rounds} rounds")  # fmt: skip
        ahead = [m["split"][2] / u["split"][2] for m, u in zip(mine, unread)]  # decode rate, ahead / not
        if ahead:
            print(f"  reading each step's tokens after launching the next: {statistics.median(ahead):.3f}x the "
                  f"decode rate of reading them before (min {min(ahead):.3f}, max {max(ahead):.3f})")
        RESULTS.append({"comparison": "generate", "decoding": decoding, "batch": batch, "sampled": sampled,
                        "new_tokens": n, "dtype": weights_dtype, "headlab": rate, "reference": their_rate,
                        "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                        "limit": limit, "share": None if limit is None else rate / limit,
                        "greedy_equal": None if sampled else equal, "tokens": mine[-1]["tokens"],
                        "first_token_s": first, "first_step_s": setup,
                        "read_ahead_gain": statistics.median(ahead) if ahead else None})  # fmt: skip


def sample_process(args) -> None:
    """Whole ``sample.py`` processes: num_samples=N against 1, the same checkpoint and length."""
    from data.tokenizers import get_tokenizer

    tokenizer = get_tokenizer("gpt2")
    folder = Path(tempfile.mkdtemp(prefix="bench-sample-"))
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    Checkpoint(model=model.state_dict(), model_config=asdict(model.config), tokenizer="gpt2").save(folder / "last.pt")

    def run(n):
        cmd = [sys.executable, str(ROOT / "sample.py"), f"source={folder}", f"num_samples={n}",
               f"max_new_tokens={args.new_tokens}", "prompt='The meaning of life is'", "device=cpu"]  # fmt: skip
        return lambda: subprocess.run(cmd, check=True, capture_output=True, env={**os.environ})

    a, b = interleave(run(args.batch), run(1), args.rounds)
    ratios = [x / y for x, y in zip(a, b)]
    print(f"sample.py num_samples={args.batch} vs 1 ({args.new_tokens} new tokens, GPT-2 small shape, whole "
          f"process): {statistics.median(a):.2f} s vs {statistics.median(b):.2f} s; wall-time ratio median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(a)} rounds")


def prepare_speed(args) -> None:
    """Our preparation of the embedded corpus with gpt2 against tiktoken's own batch encode of the same texts."""
    import shutil

    from data.config import DataConfig
    from data.prepare import prepare
    from data.sources import load_documents
    from data.tokenizers import get_tokenizer

    tokenizer = get_tokenizer("gpt2")
    cfg = DataConfig(tokenizer="gpt2", num_proc=args.threads)
    texts = load_documents(cfg)["text"]
    megabytes = sum(len(t.encode("utf-8")) for t in texts) / 1e6

    def ours():
        cache = tempfile.mkdtemp(prefix="bench-prepare-")
        try:
            prepare(DataConfig(tokenizer="gpt2", num_proc=args.threads, cache_dir=cache), tokenizer)
        finally:
            shutil.rmtree(cache)

    def tiktoken_raw():
        tokenizer.encoding.encode_ordinary_batch(texts, num_threads=args.threads)

    a, b = interleave(ours, tiktoken_raw, args.rounds)
    report(f"preparing the embedded corpus with gpt2 ({megabytes:.1f} MB, {args.threads} threads/processes; "
           f"ours includes loading, splitting and writing)", a, b, megabytes, "MB/s")  # fmt: skip


def decode_positions(args) -> None:
    """What a position encoding or sinks add to a decode step: one model per variant (the same shape, batch 1,
    fp32, ``--new-tokens`` steps per generation, ``--rounds`` generations), one step of each model in turn (which
    goes first rotates), each step's time over the learned-position model's step of the same turn."""
    device = resolve_device(args.device, option="--device")
    variants = {"learned": {}, "rope": {"position": "rope"}, "alibi": {"position": "alibi"}, "sinks": {"sinks": True}}
    models = {}
    for name, fields in variants.items():
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=args.vocab, block_size=args.new_tokens, n_layer=args.n_layer,
                           n_head=args.n_head, n_embd=args.n_embd, attention=args.attention, kernel=args.kernel,
                           **fields)  # fmt: skip
        models[name] = GPT(config).to(device).eval()
    steps = {name: [] for name in models}
    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    with torch.inference_mode():
        for _ in range(args.rounds):
            caches = {name: KVCache(args.n_layer, model.cache_capacities) for name, model in models.items()}
            for step in range(args.new_tokens):
                names = list(models)[step % len(models):] + list(models)[:step % len(models)]  # each goes first
                for name in names:
                    steps[name].append(timed(lambda m=models[name], c=caches[name]: m(token, cache=c)))
    print(f"decode steps, {args.attention}/{args.kernel}, n_layer={args.n_layer}, n_embd={args.n_embd}, "
          f"n_head={args.n_head}, vocab={args.vocab}, batch 1, {torch.get_num_threads()} thread(s), "
          f"{args.rounds} x {args.new_tokens} steps each")  # fmt: skip
    for name, times in steps.items():
        ratios = sorted(t / base for t, base in zip(times, steps["learned"]))
        quarter = len(ratios) // 4
        print(f"{name:8s} median step {statistics.median(times) * 1e3:.3f} ms; / learned: median "
              f"{statistics.median(ratios):.3f} (quartiles {ratios[quarter]:.3f}-{ratios[-1 - quarter]:.3f})")


def decode_rounding(args) -> None:
    """Greedy decoding of GPT-2 small's shape (random weights, as ``generate``; ``--n-layer`` layers), ``--batch``
    rows of their own 16-token prompts, by the compiled static step and by the plain one (graph decoding's on
    CUDA), side by side: how far their logits differ while a row's tokens agree, and where each row's tokens part,
    with the top-2 gap there. In bf16 inductor's fused kernels keep intermediates in float32 where the plain step
    rounds each op's output to bf16: the logits differ by bf16 round-off, and a row parts where its top two logits
    are that close."""
    device = resolve_device(args.device, option="--device")
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=50257, block_size=1024, n_layer=args.n_layer, n_head=12, n_embd=768)
    model = GPT(config).eval().to(device, dtype)
    prompts = torch.randint(0, 50257, (args.batch, 16), generator=torch.Generator().manual_seed(1)).to(device)
    inductor_cache_per_cpu_capability()
    kinds = {"plain": GraphedStep if device.type == "cuda" else StaticStep, "compiled": step_class("compiled", device)}
    parted: list[int | None] = [None] * args.batch
    diffs, gaps, largest, partings = [], [], [], []
    with torch.inference_mode():
        caches = {name: KVCache(config.n_layer) for name in kinds}
        logits = {name: model(prompts, cache=caches[name])[0][:, -1] for name in kinds}
        steps = {name: kind(model, caches[name], args.batch, device) for name, kind in kinds.items()}
        for t in tqdm(range(args.new_tokens), desc="greedy tokens", leave=False):
            plain, compiled = logits["plain"].float().cpu(), logits["compiled"].float().cpu()
            tokens = {"plain": plain.argmax(-1), "compiled": compiled.argmax(-1)}
            top2 = plain.topk(2, dim=-1).values
            for row in (r for r in range(args.batch) if parted[r] is None):  # the same tokens so far
                diffs.append((plain[row] - compiled[row]).abs().max().item())
                gaps.append((top2[row, 0] - top2[row, 1]).item())
                largest.append(plain[row].abs().max().item())
                if tokens["plain"][row] != tokens["compiled"][row]:
                    parted[row] = t
                    partings.append(f"row {row} at token {t} (top-2 gap {gaps[-1]:.3g}, logits differ by "
                                    f"{diffs[-1]:.3g})")  # fmt: skip
            if t + 1 < args.new_tokens:
                for name in kinds:
                    logits[name] = steps[name](tokens[name].view(-1, 1).to(device), 16 + t)
    scale = statistics.median(largest)
    spacing = torch.finfo(dtype).eps * 2 ** math.floor(math.log2(scale))
    print(f"decode rounding ({config.n_layer} layers of GPT-2 small's shape, random weights, "
          f"{str(dtype).removeprefix('torch.')} weights on {device}, {args.batch} greedy rows x {args.new_tokens} "
          f"tokens, compiled vs plain static step): while a row's tokens agree its logits differ by at most "
          f"{max(diffs):.3g} (median {statistics.median(diffs):.3g}; the dtype's spacing at the largest logits, "
          f"{scale:.3g}, is {spacing:.3g}); {sum(p is not None for p in parted)} of {args.batch} rows part: "
          f"{'; '.join(partings) or 'none'}; top-2 gaps of the compared steps: median {statistics.median(gaps):.3g}, "
          f"{sum(g <= max(diffs) for g in gaps)} of {len(gaps)} within the largest difference")


def main(argv: list[str] | None = None) -> None:
    p = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["train-step", "levers", "optimizer", "generate", "sample-process", "prepare",
                                    "decode-positions", "decode-rounding"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10, help="train-step, levers, optimizer: steps per round")
    p.add_argument("--batch", type=int, default=12, help="train-step: batch; generate/sample-process: samples")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocab", type=int, default=257)
    p.add_argument("--attention", default="fused_qkv")
    p.add_argument("--kernel", default="sdpa")
    p.add_argument("--new-tokens", type=int, default=128,
                   help="generate, decode-positions, decode-rounding: tokens per generation")
    p.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda | cuda:N")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="train-step: autocast dtype; generate: the weights' dtype (auto: bf16 on GPUs, fp32 on CPUs)")
    p.add_argument("--compile", action="store_true",
                   help="train-step, optimizer: torch.compile both sides; generate: our compiled decode step against "
                        "transformers' static cache, compiled")  # fmt: skip
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="prepare: tokenizer threads/processes")
    p.add_argument("--decoding", choices=[*DECODINGS, "all"], default="auto",
                   help="generate: how our cached step runs (all: every mode this device runs, each against "
                        "transformers)")  # fmt: skip
    p.add_argument("--model", choices=["gpt2_small", "given"], default="gpt2_small",
                   help="generate: GPT-2 small's shape, or the one --n-layer, --n-head, --n-embd, --vocab and --seq "
                        "(the context) give")  # fmt: skip
    p.add_argument("--loss-chunk", type=int, default=0, help="levers: tokens per chunk of the head and loss (0: whole)")
    p.add_argument("--split", choices=MUON_SPLITS, default="as_stored",
                   help="optimizer: how Muon splits the matrices it orthogonalises (optim.muon_split)")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default="default",
                   help="levers: inductor's mode for the step with the levers (compiled as one graph)")
    p.add_argument("--json", default=None, help="also write what each comparison measured to this JSON file")
    args = p.parse_args(argv)
    if args.loss_chunk < 0:
        p.error(f"--loss-chunk {args.loss_chunk} must be at least 0 (0: the whole logits)")
    for option in ("rounds", "steps", "batch", "seq", "n_layer", "n_head", "n_embd", "vocab", "new_tokens", "threads"):
        if getattr(args, option) < 1:
            p.error(f"--{option.replace('_', '-')} {getattr(args, option)} must be at least 1")
    device = resolve_device(args.device, option="--device")
    print(f"machine: {device_name(device)}, torch {torch.__version__}")
    start_up_over()  # the measurements begin
    {"train-step": train_step, "levers": lever_step, "optimizer": optimizer_step, "generate": generation,
     "sample-process": sample_process,
     "prepare": prepare_speed, "decode-positions": decode_positions,
     "decode-rounding": decode_rounding}[args.what](args)  # fmt: skip
    if args.json:
        write_text(Path(args.json), json.dumps({"machine": device_name(device), "torch": torch.__version__,
                                                "results": RESULTS}, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
