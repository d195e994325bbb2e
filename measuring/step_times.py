"""bench.py --mode block and --mode gpt: each cell's forward and step times, an attention block's
forward+backward (block) or a whole GPT's training step with AdamW (gpt), the passes interleaved; then
bench.csv, bench.md and bench.png."""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from analysis.tables import write_csv, write_text
from common.machine_load import OthersLoad
from measuring.cells import OPTION_DEFAULTS, attention_cells, config_of, kernel_of, options_set
from measuring.noise import busy_note, joined, max_load, measurement_noise, noise_warnings
from measuring.step_figures import plot
from measuring.step_table import markdown, option_columns
from measuring.timing import closures, median_ms, sdpa_backend
from model import GPT
from model.attention import attention_of
from model.device import device_name, resolve_device, resolve_dtype
from training.optim import fused_adamw

FIELDS = ["mode", "layout", "kernel", "kv_heads", "window", "compile", "seq_len", "batch", "n_embd", "n_head", "dtype",
          "forward_ms", "step_ms", "step_ms_min", "step_ms_max", "tokens_per_sec", "peak_mem_mb",
          "sdpa_backend", "compile_s", "others_cores", "warnings"]  # fmt: skip


def make_cell(args: argparse.Namespace, cell: dict, compiled: bool, seq_len: int, device):
    """(forward, step) closures for one cell: step is forward+backward (block) or a training step (gpt)."""
    torch.manual_seed(0)
    config = config_of(args, cell, seq_len)
    if args.mode == "block":
        module = attention_of(config.attention, config.attention_spec).to(device)
        x = torch.randn(args.batch, seq_len, args.n_embd, device=device, requires_grad=True)
        optimizer = None
        inputs = (x,)

        def loss_of(out):
            return out.float().square().mean()
    else:
        module = GPT(config).to(device)
        optimizer = torch.optim.AdamW(module.parameters(), lr=1e-4, fused=fused_adamw(device))
        idx = torch.randint(0, args.vocab_size, (args.batch, seq_len), device=device)
        inputs = (idx, idx)

        def loss_of(out):
            return out[1]

    return closures(module, inputs, loss_of, optimizer, compiled, device, resolve_dtype(args.dtype, device, "--dtype"))


def time_cell(args: argparse.Namespace, cell: tuple, device) -> dict:
    """Forward and step ms, peak MB (CUDA), the SDPA backend that ran, compile seconds and warnings of one cell."""
    seq_len, compile_mode, attention = cell
    kernel = attention["kernel"]
    torch._dynamo.reset()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    forward, step = make_cell(args, attention, compile_mode == "compiled", seq_len, device)
    load = OthersLoad()  # the cores other processes use while this cell is timed
    forward_ms, forward_first_s, forward_spread, forward_range = median_ms(forward, args.min_run_time, device)
    if device.type == "cpu" and not kernel_of(kernel).trains_on_cpu:  # flex: no backward on a CPU, forward only
        step_ms, step_first_s, step_spread, step_range, step = math.nan, 0.0, 0.0, 1.0, forward
    else:
        step_ms, step_first_s, step_spread, step_range = median_ms(step, args.min_run_time, device)
    return {
        "forward_ms": forward_ms, "step_ms": step_ms,
        "peak_mem_mb": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "sdpa_backend": sdpa_backend(step),
        # the first calls compile (forward, then the backward graph); later ones take forward_ms / step_ms
        "compile_s": forward_first_s - forward_ms / 1e3 + (step_first_s - step_ms / 1e3 if step_ms == step_ms else 0),
        "forward_spread": forward_spread, "step_spread": step_spread,
        "forward_range": forward_range, "step_range": step_range, "others_cores": load.since_start(),
    }  # fmt: skip


def measure(args: argparse.Namespace) -> list[dict]:
    """Time every cell; with repeats, the passes interleave so slow drifts of a shared machine hit every cell."""
    device = resolve_device(args.device)
    attention = attention_cells(args)
    cells = list(itertools.product(args.seq_len, args.compile_modes, range(len(attention))))
    times: dict[tuple, list[dict]] = {cell: [] for cell in cells}
    with tqdm(total=len(cells) * args.repeats, desc=f"benchmark ({args.mode})") as bar:
        for _ in range(args.repeats):
            for seq_len, compile_mode, i in cells:
                times[seq_len, compile_mode, i].append(time_cell(args, (seq_len, compile_mode, attention[i]), device))
                bar.update()
    dtype = str(resolve_dtype(args.dtype, device, option="--dtype")).removeprefix("torch.")
    rows = []
    for (seq_len, compile_mode, i), runs in times.items():
        cell = attention[i]
        layout, kernel, kv_heads, window = cell["layout"], cell["kernel"], cell["kv_heads"], cell["window"]
        step = [r["step_ms"] for r in runs]
        step_ms = statistics.median(step)  # NaN where the device cannot take the step (flex's backward on a CPU)
        peaks = [r["peak_mem_mb"] for r in runs if r["peak_mem_mb"] is not None]
        compiles = compile_mode == "compiled" or kernel_of(kernel).compiles  # flex compiles on its first call
        compile_s = statistics.median(r["compile_s"] for r in runs) if compiles else None
        rows.append(dict(mode=args.mode, layout=layout, kernel=kernel, kv_heads=kv_heads, window=window,
                         compile=compile_mode, seq_len=seq_len,
                         batch=args.batch, n_embd=args.n_embd, n_head=args.n_head, dtype=dtype,
                         forward_ms=statistics.median(r["forward_ms"] for r in runs), step_ms=step_ms,
                         step_ms_min=min(step), step_ms_max=max(step),
                         tokens_per_sec=args.batch * seq_len / (step_ms / 1e3),
                         peak_mem_mb=max(peaks) if peaks else None, sdpa_backend=runs[0]["sdpa_backend"],
                         compile_s=compile_s, others_cores=max_load(runs),
                         warnings=joined(noise_warnings(runs, step_label(args.mode)), busy_note(runs)),
                         noisy={what for what in ("forward", "step")
                                if measurement_noise(runs, what) or busy_note(runs)},
                         **options_set(cell)),
                    )  # fmt: skip
    return rows


def step_label(mode: str) -> str:
    return "forward+backward" if mode == "block" else "train step"


def main_steps(args: argparse.Namespace) -> list[dict]:
    """--mode block or gpt: measure, then write bench.csv, bench.md and bench.png, and print the table."""
    rows = measure(args)
    device = resolve_device(args.device)
    shape = f"batch={args.batch}, n_embd={args.n_embd}, n_head={args.n_head}"
    if args.mode == "gpt":
        shape += f", n_layer={args.n_layer}, vocab={args.vocab_size}"
    dtype = rows[0]["dtype"] if rows else args.dtype
    title = (f"{args.mode} on {device_name(device)}, torch {torch.__version__}, {dtype}, {shape}; "
             f"medians over {args.repeats} pass(es)")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fields = FIELDS + option_columns(rows)  # the issue-30 options only where some cell sets them
    write_csv(out / "bench.csv", fields, [[row.get(k, OPTION_DEFAULTS.get(k)) for k in fields] for row in rows])
    table = markdown(rows, title, step_label(args.mode), args.repeats)
    write_text(out / "bench.md", table + "\n")
    plot(rows, out / "bench.png", title, step_label(args.mode))
    print("\n" + table)
    print(f"\nwritten to {out}/ (bench.csv, bench.md, bench.png)")
    return rows
