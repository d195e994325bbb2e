"""bench_reference.py decode-positions and decode-rounding: what a position encoding or sinks
add to a decode step, and where the compiled and plain static steps' greedy tokens part (and why: round-off)."""

from __future__ import annotations

import math
import statistics

import torch
from tqdm import tqdm

from measuring.side_by_side import timed
from model import GPT, GPTConfig, KVCache
from model.decoding.steps import GraphedStep, StaticStep, step_class
from model.device import inductor_cache_per_cpu_capability, resolve_device, resolve_dtype, threads_text


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
          f"n_head={args.n_head}, vocab={args.vocab}, batch 1, {threads_text()}, "
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
