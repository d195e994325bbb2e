"""Time the attention layouts x kernels: the attention block alone, or the whole GPT.

    python bench.py                       # attention block, CPU (CUDA when present)
    python bench.py --mode gpt            # whole GPT, forward + backward of a training step
    python bench.py --seq-len 128 256 512 --batch 8 --n-embd 256 --n-head 8

Times are medians from torch.utils.benchmark (which synchronises CUDA), after
a warm-up call. It prints a markdown table; nothing is asserted.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable

import torch
import torch.utils.benchmark as benchmark
from tqdm import tqdm

from model import ATTENTION_LAYOUTS, GPT, KERNELS, GPTConfig, build_attention


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["block", "gpt"], default="block")
    p.add_argument("--layouts", nargs="+", default=sorted(ATTENTION_LAYOUTS))
    p.add_argument("--kernels", nargs="+", default=sorted(KERNELS))
    p.add_argument("--seq-len", nargs="+", type=int, default=[256])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-layer", type=int, default=4, help="GPT depth (--mode gpt)")
    p.add_argument("--vocab-size", type=int, default=256, help="GPT vocabulary (--mode gpt)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per cell")
    args = p.parse_args(argv)
    for name in args.layouts:
        if name not in ATTENTION_LAYOUTS:
            p.error(f"unknown layout {name!r}; choose from {sorted(ATTENTION_LAYOUTS)}")
    for name in args.kernels:
        if name not in KERNELS:
            p.error(f"unknown kernel {name!r}; choose from {sorted(KERNELS)}")
    return args


def make_step(args: argparse.Namespace, layout: str, kernel: str, seq_len: int):
    """(forward, forward+backward) closures for one cell of the grid; both compute a scalar loss."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    if args.mode == "block":
        module = build_attention(layout, args.n_embd, args.n_head, kernel).to(device)
        x = torch.randn(args.batch, seq_len, args.n_embd, device=device, requires_grad=True)

        def loss():
            return module(x).square().mean()
    else:
        config = GPTConfig(
            vocab_size=args.vocab_size,
            block_size=seq_len,
            n_layer=args.n_layer,
            n_head=args.n_head,
            n_embd=args.n_embd,
            attention=layout,
            kernel=kernel,
        )
        module = GPT(config).to(device)
        idx = torch.randint(0, args.vocab_size, (args.batch, seq_len), device=device)

        def loss():
            return module(idx, idx)[1]

    def forward():
        with torch.no_grad():
            return loss()

    def forward_backward():
        module.zero_grad(set_to_none=True)
        loss().backward()

    return forward, forward_backward


def median_ms(fn: Callable[[], object], min_run_time: float) -> float:
    fn()  # warm-up: allocator, kernel selection
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median * 1e3


def machine_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:  # Linux names the CPU model here; platform.processor() often says only "x86_64"
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cells = [(lay, ker, t) for t in args.seq_len for lay in args.layouts for ker in args.kernels]
    rows = []
    for layout, kernel, seq_len in tqdm(cells, desc="benchmark"):
        forward, forward_backward = make_step(args, layout, kernel, seq_len)
        fwd = median_ms(forward, args.min_run_time)
        rows.append((layout, kernel, seq_len, fwd, median_ms(forward_backward, args.min_run_time)))

    shape = f"batch={args.batch}, n_embd={args.n_embd}, n_head={args.n_head}"
    if args.mode == "gpt":
        shape += f", n_layer={args.n_layer}, vocab={args.vocab_size}"
    print(f"\n{args.mode} on {machine_name(args.device)}, torch {torch.__version__}, float32, {shape}\n")
    print("| layout | kernel | seq_len | forward ms | forward+backward ms |")
    print("| --- | --- | ---: | ---: | ---: |")
    for layout, kernel, seq_len, fwd, fwd_bwd in rows:
        print(f"| {layout} | {kernel} | {seq_len} | {fwd:.3f} | {fwd_bwd:.3f} |")


if __name__ == "__main__":
    main()
