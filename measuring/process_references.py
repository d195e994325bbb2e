"""bench_reference.py sample-process and prepare: whole sample.py processes (num_samples=N
against 1), and data preparation with gpt2 against tiktoken's own batch encode."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from measuring import ROOT
from measuring.side_by_side import interleave, report
from model import GPT, Checkpoint, GPTConfig


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
    workers = "thread/process" if args.threads == 1 else "threads/processes"
    report(f"preparing the embedded corpus with gpt2 ({megabytes:.1f} MB, {args.threads} {workers}; "
           f"ours includes loading, splitting and writing)", a, b, megabytes, "MB/s")  # fmt: skip
