"""bench_reference.py generate: greedy and sampled generation against transformers'
generate, the same weights and prompt: time to the first token, the first decode step, the decode rate and its share
of the memory-bandwidth limit, for each way a cached step runs."""

from __future__ import annotations

import statistics
import time

import torch

from measuring.side_by_side import RESULTS, hf_twin, sync
from model import GPT, GPTConfig
from model.decoding.generation import context_lengths, generate_batch
from model.decoding.steps import DECODINGS, bandwidth_limit, bandwidth_share, choose_decoding, weight_bytes
from model.device import inductor_cache_per_cpu_capability, resolve_device, resolve_dtype


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
