"""Benchmark the attention layouts x kernels: the attention block alone, or a whole GPT training step.

    python bench.py                                      # attention block, eager, CPU (CUDA when present)
    python bench.py --seq-len 128 256 512 1024 --compile eager compiled
    python bench.py --mode gpt --n-layer 12 --n-head 12 --n-embd 768 --seq-len 1024 --dtype bfloat16
    python bench.py --position learned rope alibi --qk-norm off on --kernels manual   # the new axes
    python bench.py --layouts fused_qkv mla --kv-latent 64                             # latent keys/values
    python bench.py --mode decode --position learned rope --window 64 --seq-len 128 --context-multiples 1 4 16
    python bench.py --mode plain --seq-len 1024 --batch 2 --n-embd 768 --n-head 12   # against the plainest code

Grid: layout x kernel x (eager, compiled) x sequence length, and the attention
options (--kv-heads, --window, --position, --qk-norm, --softcap, --sinks; attention=mla's --kv-latent).
Block mode times forward and forward+backward of one attention block; gpt mode
times the forward and a full training step (forward, backward, AdamW) of a
GPT. Times are medians from torch.utils.benchmark (which synchronises CUDA),
after warm-up calls; peak memory is measured on CUDA. Decode mode generates
(model.decoding.generation, with the KV cache, as sample.py does) up to the largest
--context-multiples x block_size (--seq-len) tokens and reports tokens/s over
the block_size tokens that end at each multiple: the median over --repeats
generations. Plain mode times each layout x kernel block against the plainest
code of the same layout and kernel (bench_reference.py: the same weights, the
same function), the two interleaved, and reports the ratios' median and range
over --repeats rounds (default 5). Writes bench.csv, bench.md and bench.png
(plain mode: no plot) to --out, and prints the table.
"""

from __future__ import annotations

import argparse
import json

from cli import OneLineErrorParser
from common.startup import start_up_over
from measuring.cells import AXES, COMPILE_MODES, SCALES, check_cells, default_layouts
from measuring.decode_speed import DECODE_REPEATS, main_decode
from measuring.plain_attention import PLAIN_KERNELS, PLAIN_LAYOUTS
from measuring.plain_ratio import PLAIN_REPEATS, main_plain
from measuring.step_times import main_steps
from model import MIXERS, registry
from model.attention.modifications import with_fields
from model.decoding.steps import DECODINGS
from model.device import resolve_device, resolve_dtype


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineErrorParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["block", "gpt", "decode", "plain"], default="block",
                   help="plain: each block against the plainest code of its layout and kernel (bench_reference.py)")
    p.add_argument("--layouts", nargs="+",
                   help=f"from {', '.join(sorted(MIXERS))} (default: {', '.join(default_layouts())})")
    p.add_argument("--kernels", nargs="+", default=["manual", "sdpa"],
                   help=f"from {', '.join(registry.kernel_options())}{forward_only()}")
    p.add_argument("--kv-heads", nargs="+", type=int, help="key/value heads (default: --n-head, multi-head)")
    p.add_argument("--window", nargs="+", default=["none"], help="sliding windows: positions, or none")
    p.add_argument("--position", nargs="+", default=["learned"],
                   help=f"position encodings (model.position): {', '.join(registry.POSITIONS)}")
    p.add_argument("--rope-theta", type=float, default=10000.0, help="rotary's base (model.rope_theta)")
    for mod in with_fields():  # --qk-norm, --softcap, --sinks
        p.add_argument(f"--{mod.flag()}", nargs="+", default=[mod.bench_off], help=mod.bench_help)
    for field, (flag, default, text) in AXES.items():  # --attention-chunk, --query-temperature, --differential
        p.add_argument(flag, nargs="+", dest=field, default=["off" if default is False else "none"], help=text)
    p.add_argument("--kv-latent", nargs="+", type=int,
                   help="attention=mla's latent widths (model.kv_latent; default n_embd / 2)")
    p.add_argument("--rope-head-dim", type=int,
                   help="attention=mla's rotary key width with --position rope (default head dim / 2)")
    p.add_argument("--context-multiples", nargs="+", type=int, default=[1, 4, 16],
                   help="--mode decode: measure at these multiples of block_size (--seq-len)")
    p.add_argument("--compile", nargs="+", default=["eager"], dest="compile_modes", help="eager and/or compiled")
    p.add_argument("--seq-len", nargs="+", type=int, default=[256])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=8)
    p.add_argument("--n-layer", type=int, default=4, help="GPT depth (--mode gpt)")
    p.add_argument("--layer-pattern", help="--mode gpt or decode: a schedule of layers (model.layer_pattern: LLLG)")
    p.add_argument("--layer-kinds", help='with --layer-pattern: each kind\'s fields as JSON (model.layer_kinds: '
                                        '\'{"L": {"window": 128}, "G": {}}\')')
    p.add_argument("--vocab-size", type=int, default=50257, help="GPT vocabulary (--mode gpt)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                   help="autocast dtype; auto: as training uses it (bf16 on Ampere+ GPUs, fp16 on older, fp32 on CPU)")
    p.add_argument("--no-tf32", dest="tf32", action="store_false",
                   help="on CUDA, keep float32 matmuls exact (training enables TF32)")
    p.add_argument("--min-run-time", type=float, default=1.0, help="seconds of timing per measurement")
    p.add_argument("--repeats", type=int,
                   help="passes over the grid (--mode decode: generations); a cell reports the median over passes "
                        f"and its range (default 1; --mode decode {DECODE_REPEATS})")  # fmt: skip
    p.add_argument("--decoding", choices=DECODINGS, default="auto",
                   help="--mode decode: how a cached step runs (auto: a CUDA graph on CUDA, eager on a CPU)")
    p.add_argument("--out", default="bench-out", help="folder for bench.csv, bench.md, bench.png")
    args = p.parse_args(argv)
    if args.layouts is None:  # plain mode: those of them a plain reference exists for
        args.layouts = [name for name in default_layouts() if args.mode != "plain" or name in PLAIN_LAYOUTS]
    if args.repeats is None:  # a decode ratio from one generation has no spread to say how far it holds
        args.repeats = {"decode": DECODE_REPEATS, "plain": PLAIN_REPEATS}.get(args.mode, 1)
    for option, names, valid, what in (("--layouts", args.layouts, MIXERS, "layout"),
                                       ("--kernels", args.kernels, registry.kernel_options(), "kernel"),
                                       ("--compile", args.compile_modes, COMPILE_MODES, "compile mode")):  # fmt: skip
        for name in names:
            if name not in valid:
                p.error(f"{option}: unknown {what} {name!r}; choose from {', '.join(sorted(valid))}")
    for option, values in (("--seq-len", args.seq_len), ("--batch", [args.batch]), ("--n-embd", [args.n_embd]),
                           ("--n-head", [args.n_head]), ("--n-layer", [args.n_layer]),
                           ("--vocab-size", [args.vocab_size]), ("--repeats", [args.repeats]),
                           ("--kv-latent", args.kv_latent or []), ("--context-multiples", args.context_multiples),
                           ("--rope-head-dim", [args.rope_head_dim or 1])):  # fmt: skip
        for value in values:
            if value < 1:
                p.error(f"{option} {value} must be at least 1")
    if not args.min_run_time > 0:
        p.error(f"--min-run-time {args.min_run_time} must be a positive number of seconds")
    try:
        resolve_dtype(args.dtype, resolve_device(args.device, option="--device"), option="--dtype")
    except ValueError as err:
        p.error(str(err))
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}")
    args.kv_heads = args.kv_heads or [args.n_head]
    for kv in args.kv_heads:
        if kv < 1:
            p.error(f"--kv-heads {kv} must be at least 1")
        if args.n_head % kv:
            p.error(f"--kv-heads {kv} does not divide --n-head {args.n_head}; choose a divisor (or set --n-head)")
    args.window = [axis_value(p, "--window", None, w) for w in args.window]
    for mod in with_fields():
        try:
            setattr(args, mod.field, [mod.bench_value(v) for v in getattr(args, mod.field)])
        except ValueError as err:
            p.error(str(err))
    for field, (flag, default, _) in AXES.items():
        setattr(args, field, [axis_value(p, flag, default, v, SCALES.get(field)) for v in getattr(args, field)])
    for position in args.position:
        if position not in registry.POSITIONS:
            p.error(f"--position: unknown position encoding {position!r}; choose from {', '.join(registry.POSITIONS)}")
    args.kv_latent = args.kv_latent or [args.n_embd // 2]
    check_schedule_args(p, args)
    if args.mode == "plain":
        check_plain_grid(p, args)
    try:  # a cell the model refuses (softcap with sdpa, an odd head dim with rope, ...) or an SDPA backend the
        check_cells(args)  # device cannot run is refused here, not after the first cells
    except ValueError as err:
        p.error(str(err))
    return args


def forward_only() -> str:
    """For --help: the kernels that have no backward on a CPU (flex), which bench times forward only there."""
    names = ", ".join(name for name, cls in registry.KERNELS.items() if not cls.trains_on_cpu)
    return f" ({names}: forward only on a CPU)" if names else ""


def axis_value(p: argparse.ArgumentParser, flag: str, default, typed: str, scale: float | None = None):
    """One value of an AXES flag as typed -> the option's: off/on for a switch, none or a positive number (a
    positive float where the axis is a scale, ``scale`` a value that sets it: SSMax's s, 0.43)."""
    if default is False:
        if typed.lower() not in ("off", "on"):
            p.error(f"{flag} {typed}: give off and/or on")
        return typed.lower() == "on"
    if typed.lower() == "none":
        return None
    if scale is not None:  # a scale, not a count
        try:
            value = float(typed)
        except ValueError:
            value = 0.0
        if not value > 0 or value == float("inf"):
            p.error(f"{flag} {typed}: give a positive scale (e.g. {scale}), or none")
        return value
    if not (typed.isdigit() and int(typed) > 0):
        p.error(f"{flag} {typed}: give a positive number of positions, or none")
    return int(typed)


def check_schedule_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A schedule of layers is a whole model's (--mode gpt or decode); its kinds are JSON, kept as typed for the
    CSV and the table, and checked with the cells as the model checks them."""
    if args.layer_kinds is not None and args.layer_pattern is None:
        p.error("--layer-kinds needs --layer-pattern (which layers are which kind)")
    if args.layer_pattern is not None and args.mode in ("block", "plain"):
        p.error(f"--layer-pattern: --mode {args.mode} times one attention block; use --mode gpt or decode")
    try:
        if not isinstance(json.loads(args.layer_kinds or "{}"), dict):
            raise ValueError("not an object")
    except ValueError as err:
        p.error(f"--layer-kinds {args.layer_kinds}: give a JSON object of kinds, e.g. '{{\"L\": {{\"window\": 128}}, "
                f"\"G\": {{}}}}' ({err})")


def check_plain_grid(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--mode plain times what a plain reference exists for: the three layouts' multi-head blocks with a manual
    or SDPA kernel, no other option."""
    for option, names, valid in (("--layouts", args.layouts, PLAIN_LAYOUTS),
                                 ("--kernels", args.kernels, PLAIN_KERNELS)):
        for name in names:
            if name not in valid:
                p.error(f"--mode plain: {option} {name} has no plain reference; choose from {', '.join(valid)}")
    options = {"--kv-heads": args.kv_heads != [args.n_head], "--window": args.window != [None],
               "--position": args.position != ["learned"],
               **{f"--{mod.flag()}": getattr(args, mod.field) != [mod.off] for mod in with_fields()}}  # fmt: skip
    for option, set_away in options.items():
        if set_away:
            p.error(f"--mode plain times the plain multi-head block; leave out {option}")


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    start_up_over()  # the measurements begin
    if args.mode == "decode":
        return main_decode(args)
    if args.mode == "plain":
        return main_plain(args)
    return main_steps(args)
