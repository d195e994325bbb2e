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

import argparse
import json
import os
from pathlib import Path

import torch

from cli import OneLineErrorParser
from common.run_files import write_text
from common.startup import start_up_over
from measuring.decode_steps import decode_positions, decode_rounding
from measuring.generation_reference import generation
from measuring.process_references import prepare_speed, sample_process
from measuring.side_by_side import RESULTS
from measuring.step_references import lever_step, optimizer_step, train_step
from model.compiling import COMPILE_MODES
from model.decoding.steps import DECODINGS
from model.device import device_name, resolve_device
from training.config import MUON_SPLITS


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
