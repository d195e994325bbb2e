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

from common.startup import guard_start_up, start_up_over

if __name__ == "__main__":
    guard_start_up()  # first: Ctrl-C or SIGTERM during the imports below (torch: seconds) is one line

import argparse
import itertools
import json
import math
import statistics
import textwrap
import time
from pathlib import Path

import torch
import torch.utils.benchmark as benchmark
from tqdm import tqdm

from analysis.tables import markdown_table, pyplot, save_figure, write_csv, write_text
from bench_reference import PLAIN_KERNELS, PLAIN_LAYOUTS, plain_twin
from cli import OneLineErrorParser
from common.machine_load import OthersLoad, cores, is_busy
from model import GPT, MIXERS, GPTConfig, registry
from model.attention import attention_of
from model.attention.kernels import check_kernel_runs
from model.attention.modifications import with_fields
from model.config import attention_label
from model.decoding.generation import generate_batch
from model.decoding.steps import DECODINGS, choose_decoding
from model.device import autocast, device_name, inductor_cache_per_cpu_capability, resolve_device, resolve_dtype
from training.optim import fused_adamw
from training.profiling import sdpa_backends, without_profiler_notices

COMPILE_MODES = ("eager", "compiled")
FIELDS = ["mode", "layout", "kernel", "kv_heads", "window", "compile", "seq_len", "batch", "n_embd", "n_head", "dtype",
          "forward_ms", "step_ms", "step_ms_min", "step_ms_max", "tokens_per_sec", "peak_mem_mb",
          "sdpa_backend", "compile_s", "others_cores", "warnings"]  # fmt: skip
# The attention options of issue 30, each a row field (and a CSV column) only where some cell sets it, and
# their defaults: a default grid's CSV has exactly FIELDS.
# Issue 54's options, each an axis: (its flag, its default, its help); the flag's values as typed give the option's.
AXES = {
    "attention_chunk": ("--attention-chunk", None, "Llama 4's chunks (model.attention_chunk): positions, or none"),
    "query_temperature": ("--query-temperature", None, "Llama 4's query temperature (model.query_temperature): "
                                                       "positions, or none"),
    "differential": ("--differential", False, "differential attention (model.differential): off and/or on"),
    "sparse_topk": ("--sparse-topk", None, "DeepSeek's sparse attention (model.sparse_topk): keys per query, or none"),
}  # fmt: skip
OPTION_DEFAULTS = {"position": "learned", **{mod.field: mod.off for mod in with_fields()}, "kv_latent": None,
                   "rope_head_dim": None, "layer_pattern": None, "layer_kinds": None,
                   **{field: default for field, (_, default, _) in AXES.items()}}  # fmt: skip
DECODE_FIELDS = ["mode", "layout", "kernel", "kv_heads", "window", *OPTION_DEFAULTS, "decoding", "seq_len",
                 "context_multiple", "position_at", "batch", "n_embd", "n_head", "n_layer", "dtype", "ms_per_token",
                 "median_step_ms", "tokens_per_sec", "tokens_per_sec_min", "tokens_per_sec_max", "passes",
                 "speed_ratio", "speed_ratio_min", "speed_ratio_max", "decoding_bytes", "others_cores", "busy",
                 "warnings"]  # fmt: skip
# Measurements of one cell this far apart (slowest / fastest) make it noisy: a 2.5x outlier is, whatever the
# interquartile range says.
NOISY_RANGE = 1.5
BUSY_MARK = "†"  # a figure timed while other processes used a share of the machine's cores
DECODE_REPEATS = 3  # --mode decode's generations per cell by default: a median and a spread
PLAIN_REPEATS = 5  # --mode plain's rounds by default: ratios of interleaved timings, a median and a spread
PLAIN_FIELDS = ["mode", "layout", "kernel", "compile", "seq_len", "batch", "n_embd", "n_head", "dtype", "forward_ms",
                "plain_forward_ms", "forward_ratio", "forward_ratio_min", "forward_ratio_max", "step_ms",
                "plain_step_ms", "step_ratio", "step_ratio_min", "step_ratio_max", "rounds", "others_cores",
                "busy"]  # fmt: skip


def default_layouts() -> list[str]:
    """The layouts of the canonical layout's function (fused_qkv, separate_qkv, wrapper): those that compute the
    same function; another function (attention=mla) is benchmarked when --layouts names it."""
    function = getattr(MIXERS[registry.canonical_layout()], "function", None)
    return sorted(name for name, cls in MIXERS.items() if getattr(cls, "function", None) == function)


def takes_latent(layout: str) -> bool:
    """Whether the layout keeps keys and values as a latent (it applies model.kv_latent)."""
    return "kv_latent" in MIXERS[layout].applies


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
        setattr(args, field, [axis_value(p, flag, default, v) for v in getattr(args, field)])
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


def axis_value(p: argparse.ArgumentParser, flag: str, default, typed: str):
    """One value of an AXES flag as typed -> the option's: off/on for a switch, none or a positive number."""
    if default is False:
        if typed.lower() not in ("off", "on"):
            p.error(f"{flag} {typed}: give off and/or on")
        return typed.lower() == "on"
    if typed.lower() == "none":
        return None
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


def attention_cells(args: argparse.Namespace) -> list[dict]:
    """The grid's attention variants, in order: layout x kernel x key/value heads (attention=mla: its latent
    widths instead) x window x position x QK-norm x softcap x sinks."""
    cells = []
    for layout, kernel in itertools.product(args.layouts, args.kernels):
        latent = takes_latent(layout)
        shared = [(None, k) for k in args.kv_latent] if latent else [(kv, None) for kv in args.kv_heads]
        mods = [*with_fields(), *AXES]  # the modifications' fields, then issue 54's
        fields = [getattr(mod, "field", mod) for mod in mods]
        for (kv, k), window, position, *values in itertools.product(shared, args.window, args.position,
                                                                    *(getattr(args, field) for field in fields)):
            rope_dim = None
            if latent and registry.position(position).turns_queries_keys:
                rope_dim = args.rope_head_dim or max(2, args.n_embd // args.n_head // 4 * 2)
            cells.append(dict(layout=layout, kernel=kernel, kv_heads=kv, window=window, position=position,
                              **dict(zip(fields, values)), kv_latent=k,
                              rope_head_dim=rope_dim, layer_pattern=args.layer_pattern,
                              layer_kinds=args.layer_kinds))
    return cells


def config_of(args: argparse.Namespace, cell: dict, seq_len: int) -> GPTConfig:
    """The GPT of a cell (its attention block, in block mode), checked as training checks it."""
    kernel, backend = split_kernel(cell["kernel"])
    return GPTConfig(vocab_size=args.vocab_size, block_size=seq_len, n_layer=args.n_layer, n_head=args.n_head,
                     n_embd=args.n_embd, attention=cell["layout"], kernel=kernel, sdpa_backend=backend,
                     n_kv_head=cell["kv_heads"], window=cell["window"], position=cell["position"],
                     rope_theta=args.rope_theta, **{mod.field: cell[mod.field] for mod in with_fields()},
                     **{field: cell[field] for field in AXES},
                     kv_latent=cell["kv_latent"], rope_head_dim=cell["rope_head_dim"],
                     layer_pattern=cell["layer_pattern"],
                     layer_kinds=json.loads(cell["layer_kinds"] or "{}"))  # fmt: skip


def check_cells(args: argparse.Namespace) -> None:
    """Refuse a cell the model refuses, naming it and the reason; and a --kernels sdpa_<backend> that cannot run
    some cell's attention on the device, naming those that can."""
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    for cell, seq_len in itertools.product(attention_cells(args), args.seq_len):
        try:
            config = config_of(args, cell, seq_len)
        except ValueError as err:
            raise ValueError(f"cell {cell_label({**cell, 'n_head': args.n_head}, [])}: {err}") from None
        if split_kernel(cell["kernel"])[1] != "auto":
            check_kernel_runs(config, device, dtype, training=args.mode != "decode")


def split_kernel(name: str) -> tuple[str, str]:
    """A --kernels name -> (kernel, SDPA backend): ``sdpa_flash`` -> (sdpa, flash)."""
    return registry.split_kernel_option(name)


def forward_only() -> str:
    """For --help: the kernels that have no backward on a CPU (flex), which bench times forward only there."""
    names = ", ".join(name for name, cls in registry.KERNELS.items() if not cls.trains_on_cpu)
    return f" ({names}: forward only on a CPU)" if names else ""


def kernel_of(name: str):
    """The kernel class (its facts) of a --kernels name."""
    return registry.kernel(split_kernel(name)[0])


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


def closures(module, inputs: tuple, loss_of, optimizer, compiled: bool, device, dtype):
    """(forward, step) of ``module`` on ``inputs``: forward without gradients; step is forward, backward of
    ``loss_of(output)``, the optimizer's step if any, and the gradients cleared."""
    if compiled:
        inductor_cache_per_cpu_capability()
    run = torch.compile(module) if compiled else module

    def forward():
        with torch.no_grad(), autocast(device, dtype):
            return run(*inputs)

    def step():
        with autocast(device, dtype):
            loss = loss_of(run(*inputs))
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        module.zero_grad(set_to_none=True)
        for x in inputs:
            x.grad = None  # the block's input gradient would otherwise accumulate across calls

    return forward, step


def median_ms(fn, min_run_time: float, device: torch.device) -> tuple[float, float, float, float]:
    """(median ms, seconds of the first call, which holds any compilation, interquartile range / median, slowest
    timing / fastest): the range catches an outlier that the interquartile range, a median-relative measure,
    hides."""
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first_s = time.perf_counter() - start
    for _ in range(2):  # more warm-up: allocator, kernel selection, autotuning
        fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    times = measurement.times
    return measurement.median * 1e3, first_s, measurement.iqr / measurement.median, max(times) / min(times)


def step_label(mode: str) -> str:
    return "forward+backward" if mode == "block" else "train step"


def noise_warnings(runs: list[dict], step_name: str) -> str:
    """The cell's noisy measurements, each with its figures (``measurement_noise``)."""
    notes = []
    for what, name in (("forward", "forward"), ("step", step_name)):
        parts = measurement_noise(runs, what)
        if parts:
            notes.append(f"{name}: {', '.join(parts)}, a noisy measurement")
    return "; ".join(notes)


def busy_note(runs: list[dict]) -> str:
    """The passes timed on a busy machine (other processes used a share of its cores: common/machine_load.py),
    with what they used; "" where none was. A cell slowed as a whole has no spread to show it: this says it."""
    busy = [r["others_cores"] for r in runs if is_busy(r.get("others_cores"))]
    if not busy:
        return ""
    used = f"{min(busy):.1f}" if min(busy) == max(busy) else f"{min(busy):.1f}-{max(busy):.1f}"
    return (f"a busy machine in {len(busy)} of {len(runs)} pass(es) (other processes used {used} of {cores()} "
            f"cores): not this cell's own speed")  # fmt: skip


def max_load(runs: list[dict]) -> float | None:
    """The most cores other processes used in any of the cell's passes (None where the system does not say)."""
    loads = [r["others_cores"] for r in runs if r.get("others_cores") is not None]
    return max(loads) if loads else None


def joined(*notes: str) -> str:
    return "; ".join(note for note in notes if note)


def measurement_noise(runs: list[dict], what: str) -> list[str]:
    """Why one measurement (``forward`` or ``step``) of a cell is noisy, over its passes ([] when it is not): an
    interquartile range past 10% of the median (torch.utils.benchmark's own threshold) in a pass, a slowest
    timing past NOISY_RANGE x the fastest in a pass (an outlier the interquartile range hides), or pass medians
    that far apart (a pass slowed by a shared machine)."""
    parts = []
    noisy = [r[f"{what}_spread"] for r in runs if r[f"{what}_spread"] > 0.1]
    if noisy:
        figures = ", ".join(f"{spread:.0%}" for spread in noisy)
        parts.append(f"interquartile range {figures} of the median in {len(noisy)} of {len(runs)} pass(es)")
    ranges = [r[f"{what}_range"] for r in runs if r.get(f"{what}_range", 1.0) > NOISY_RANGE]
    if ranges:
        figures = ", ".join(f"{spread:.1f}x" for spread in ranges)
        parts.append(f"slowest timing {figures} the fastest in {len(ranges)} of {len(runs)} pass(es)")
    medians = [r[f"{what}_ms"] for r in runs if r.get(f"{what}_ms", math.nan) == r.get(f"{what}_ms", math.nan)]
    if len(medians) > 1 and max(medians) > NOISY_RANGE * min(medians):
        parts.append(f"pass medians {ms_text(min(medians))}-{ms_text(max(medians))} ms "
                     f"({max(medians) / min(medians):.1f}x)")  # fmt: skip
    return parts


def ms_text(ms: float) -> str:
    """Milliseconds as a reader takes them in: three significant digits, whole numbers from 100 up (1,583, not
    1.58e+03)."""
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def sdpa_backend(fn) -> str:
    """Which SDPA implementation one call ran, from the profiler's op names ("-" when none ran)."""
    with without_profiler_notices(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sdpa_backends(prof.events())


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


def options_set(cell: dict) -> dict:
    """The cell's issue-30 options, each only where it departs from its default (a default row is as before)."""
    return {k: cell[k] for k, default in OPTION_DEFAULTS.items() if cell[k] != default}


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


def varied(rows: list[dict]) -> list[str]:
    """The optional axes (key/value heads, window, position encoding) that take more than one value in these
    rows: a label spells them even at their default."""
    heads = {r["kv_heads"] for r in rows if r.get("kv_latent") is None}  # a latent has no key/value heads
    axes = [key for key, seen in (("kv_heads", heads), ("window", {r["window"] for r in rows})) if len(seen) > 1]
    return axes + (["position"] if len({r.get("position", "learned") for r in rows}) > 1 else [])


def option_columns(rows: list[dict]) -> list[str]:
    """The issue-30 options some row sets (each a column of the table): position, qk_norm, softcap, ..."""
    return [k for k in OPTION_DEFAULTS if any(r.get(k, OPTION_DEFAULTS[k]) != OPTION_DEFAULTS[k] for r in rows)]


def cell_label(r: dict, axes: list[str]) -> str:
    """The cell's attention as training names its runs (model.config.attention_label): ``wrapper-sdpa_flash-kv2``,
    ``fused_qkv-manual-rope-sinks``, spelling the key/value heads, window and position wherever the grid varies
    them."""
    kernel, backend = split_kernel(r["kernel"])
    model = {"attention": r["layout"], "kernel": kernel, "sdpa_backend": backend, "n_head": r["n_head"],
             "n_kv_head": r["kv_heads"], "window": r["window"],
             **{k: r.get(k, default) for k, default in OPTION_DEFAULTS.items()},
             "layer_kinds": json.loads(r.get("layer_kinds") or "{}")}  # fmt: skip
    return attention_label(model, show=[{"kv_heads": "n_kv_head"}.get(axis, axis) for axis in axes])


def axis_text(r: dict, axis: str) -> str:
    """A key/value-heads or window cell: its value, none (every key), or - (a latent has no key/value heads)."""
    if axis == "kv_heads" and r.get("kv_latent") is not None:
        return "-"
    return str(r[axis] or "none")


def option_text(value) -> str:
    """A table cell of an option: on/off for a switch, the value otherwise ("-" where unset)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def readable_log_ticks(low: float, high: float) -> list[float]:
    """Labelled values for a log axis from ``low`` to ``high``: 1-2-5 in each decade where that labels four or
    more, else evenly spaced round values (a narrow range, which 1-2-5 would label once or twice)."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    ticks = [m * 10.0**d for d in decades for m in (1, 2, 5) if low <= m * 10.0**d <= high]
    if len(ticks) >= 4:
        return ticks
    from matplotlib.ticker import MaxNLocator

    return [float(t) for t in MaxNLocator(6, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high) if low <= t <= high]


def markdown(rows: list[dict], title: str, step_name: str, repeats: int) -> str:
    axes, options = [a for a in varied(rows) if a != "position"], option_columns(rows)
    header = ["layout", "kernel", *(("kv heads" if a == "kv_heads" else "window") for a in axes),
              *(o.replace("_", " ") for o in options), "compile", "seq_len", "forward ms",
              f"{step_name} ms"]  # fmt: skip
    header += ["range over passes"] if repeats > 1 else []  # no range to show from one pass
    header += ["tokens/s", "peak MB", "SDPA backend", "compile s"]
    table = []
    for r in rows:
        step = "-" if r["step_ms"] != r["step_ms"] else f"{r['step_ms']:.3f}"  # NaN: not on this device
        cells = [r["layout"], r["kernel"], *(axis_text(r, a) for a in axes),
                 *(option_text(r.get(o, OPTION_DEFAULTS[o])) for o in options), r["compile"], str(r["seq_len"]),
                 f"{r['forward_ms']:.3f}", step]  # fmt: skip
        cells += ([step if step == "-" else f"{r['step_ms_min']:.1f}-{r['step_ms_max']:.1f}"]
                  if repeats > 1 else [])  # fmt: skip
        speed = "-" if r["tokens_per_sec"] != r["tokens_per_sec"] else f"{r['tokens_per_sec']:,.0f}"
        speed += f" {BUSY_MARK}" if is_busy(r.get("others_cores")) and speed != "-" else ""
        cells += [speed, "-" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:,.0f}",
                  r["sdpa_backend"], "-" if r["compile_s"] is None else f"{r['compile_s']:.1f}"]  # fmt: skip
        table.append(cells)
    right = [i >= 3 + len(axes) + len(options) and name != "SDPA backend" for i, name in enumerate(header)]
    lines = [title, "", markdown_table(header, table, right)]
    if any(is_busy(r.get("others_cores")) for r in rows):
        lines += ["", f"{BUSY_MARK} timed on a busy machine (other processes used a share of the cores: the warnings "
                      f"say how much): not the cell's own speed"]  # fmt: skip
    notes = []
    for r in rows:
        cell = f"{cell_label(r, varied(rows))}, {r['compile']}, seq {r['seq_len']}"
        if r["step_ms"] != r["step_ms"]:
            notes.append(f"- {cell}: forward only (FlexAttention has no backward on a CPU)")
        if r["warnings"]:
            notes.append(f"- {cell}: {r['warnings']}")
        if r["mode"] == "block" and r["forward_ms"] > r["step_ms"]:
            notes.append(f"- {cell}: forward ({r['forward_ms']:.3f} ms) measured slower than forward+backward "
                         f"({r['step_ms']:.3f} ms): too small or too noisy to time; use a larger shape")  # fmt: skip
    if notes:
        lines += ["", "Benchmark warnings:", *notes]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path, title: str, step_name: str) -> None:
    save_figure(figure(rows, title, step_name), path)


def figure(rows: list[dict], title: str, step_name: str):
    """Time against sequence length (``line_figure``); where the grid measures one length, a line through one
    point per cell would be a dot per cell: a bar per cell instead (``bar_figure``)."""
    if len({r["seq_len"] for r in rows}) == 1:
        return bar_figure(rows, title, step_name)
    return line_figure(rows, title, step_name)


def timed_rows(rows: list[dict]) -> tuple[str, list[dict], list[str]]:
    """What a figure draws: forward+backward (or a training step) where the device can take it, forward only
    where it cannot (flex on a CPU); the rows that have it, and the labels of those that do not."""
    axes = varied(rows)
    timed = "forward_ms" if all(r["step_ms"] != r["step_ms"] for r in rows) else "step_ms"
    untimed = sorted({cell_label(r, axes) for r in rows if r[timed] != r[timed]})
    return timed, [r for r in rows if r[timed] == r[timed]], untimed


def series_colours(rows: list[dict], labels: list[str], axes: list[str]):
    """A colour per cell: its layout's, or one per series (``labels``, spelled with ``axes``) where the grid varies
    more than layout and kernel."""
    from analysis.plots import colour

    palette = pyplot().get_cmap("tab10" if len(labels) <= 10 else "tab20").colors
    by_series = len(labels) > len({(r["layout"], r["kernel"]) for r in rows})
    return lambda r: palette[labels.index(cell_label(r, axes)) % len(palette)] if by_series else colour(r["layout"])


def untimed_note(fig, untimed: list[str]) -> None:
    """A point the device could not time is said under the figure, not drawn at a made-up place."""
    if untimed:
        note = textwrap.fill(f"not shown, forward only on this device (see bench.md): {'; '.join(untimed)}", 110)
        fig.text(0.01, 0.01, note, fontsize=7, va="bottom")
        fig.set_layout_engine("tight", rect=(0, 0.035 * (note.count("\n") + 2), 1, 1))  # room for the note


def bar_figure(rows: list[dict], title: str, step_name: str):
    """One sequence length: a horizontal bar per cell, named on its tick as training names runs, its median time
    written at its end ("noisy" where bench.md lists the measurement drawn as noisy), the range over passes as
    whiskers, a colour per layout (or series) and the kernel's hatch."""
    plt = pyplot()
    from analysis.plots import hatch
    from analysis.plots import legend_title as variant_parts

    axes = varied(rows)
    timed, rows, untimed = timed_rows(rows)  # in the grid's order, as bench.md lists them
    labels = sorted({cell_label(r, axes) for r in rows})
    tint = series_colours(rows, labels, axes)
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.32 * len(rows)))
    times = [r[timed] for r in rows]
    spread = timed == "step_ms" and any(r.get("step_ms_min", t) != r.get("step_ms_max", t) for r, t in zip(rows, times))
    ends = [r["step_ms_max"] if spread else t for r, t in zip(rows, times)]  # where a bar's whisker ends
    errors = [[t - r["step_ms_min"] for r, t in zip(rows, times)], [end - t for end, t in zip(ends, times)]]
    bars = ax.barh(range(len(rows)), times, color=[tint(r) for r in rows], xerr=errors if spread else None,
                   capsize=3, edgecolor="white")  # fmt: skip
    kernels = [split_kernel(r["kernel"])[0] for r in rows]
    for bar, kernel in zip(bars, kernels):
        bar.set_hatch(hatch(kernel))
    noisy = [timed.removesuffix("_ms") in r.get("noisy", ()) for r in rows]  # the measurement drawn
    room = 0.015 * max(ends)
    for y, (t, end, n) in enumerate(zip(times, ends, noisy)):  # written past the whisker, not over it
        ax.text(end + room, y, f"{ms_text(t)} ms" + (", noisy" if n else ""), fontsize=7, va="center")
    ax.set_yticks(range(len(rows)), [f"{cell_label(r, axes)}, {r['compile']}" for r in rows], fontsize=8)
    ax.invert_yaxis()  # the first cell on top, as in bench.md
    ax.set_xlim(0, max(ends) * 1.3)
    ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
    what = step_name if timed == "step_ms" else "forward"
    ax.set_xlabel(f"{what} time (ms, median{'; whiskers: range over passes' if spread else ''}) at sequence length "
                  f"{rows[0]['seq_len'] if rows else '?'}")  # fmt: skip
    ax.set_ylabel(f"{variant_parts(labels)}, compile", fontsize=8)
    hatched = sorted({k for k in kernels if hatch(k)})
    note = f"\nhatched: {' and '.join(hatched)} kernel" if hatched else ""
    ax.set_title(textwrap.fill(title, 80) + note, fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    untimed_note(fig, untimed)
    return fig


def line_figure(rows: list[dict], title: str, step_name: str):
    """Time against sequence length: a colour per layout (or per series where the grid varies more than layout
    and kernel), dashed for the manual kernel, solid for sdpa, circles eager, squares compiled."""
    plt = pyplot()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

    from analysis.plots import legend_title as variant_parts
    from analysis.plots import line_style

    fig, ax = plt.subplots(figsize=(7, 4.5))
    axes = varied(rows)
    timed, rows, untimed = timed_rows(rows)
    labels = sorted({cell_label(r, axes) for r in rows})
    tint_of = series_colours(rows, labels, axes)
    for (label, compile_mode), group in itertools.groupby(
        sorted(rows, key=lambda r: (cell_label(r, axes), r["compile"], r["seq_len"])),
        key=lambda r: (cell_label(r, axes), r["compile"]),
    ):
        group = list(group)
        marker = "o" if compile_mode == "eager" else "s"
        kernel = split_kernel(group[0]["kernel"])[0]
        ax.plot([r["seq_len"] for r in group], [r[timed] for r in group], line_style(kernel),
                marker=marker, color=tint_of(group[0]), label=f"{label}, {compile_mode}")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    seq_lens = sorted({r["seq_len"] for r in rows})
    ax.xaxis.set_major_locator(FixedLocator(seq_lens))  # the lengths measured, whatever powers of 2 they are
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(NullLocator())
    if rows:
        low, high = ax.get_ylim()
        ax.set_ylim(low, high)
        ax.yaxis.set_major_locator(FixedLocator(readable_log_ticks(low, high)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("sequence length")
    ax.set_ylabel(f"{step_name if timed == 'step_ms' else 'forward'} time (ms, median)")
    ax.set_title(textwrap.fill(title, 80), fontsize=8)
    ax.grid(alpha=0.3, which="both")
    legend_title = f"{variant_parts(labels)}, compile"
    kernels = sorted({split_kernel(r["kernel"])[0] for r in rows})
    if len({line_style(k) for k in kernels}) > 1:  # the line styles tell the kernels apart: say which is which
        legend_title += "\n(" + ", ".join(f"{registry.kernel(k).line_name}: {k} kernel" for k in kernels) + ")"
    # Long handles: a dash needs room beside the marker to tell manual (dashed) from sdpa (solid).
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=legend_title, title_fontsize=7,
              handlelength=5)  # fmt: skip
    untimed_note(fig, untimed)
    return fig


def decode_times(args: argparse.Namespace, config: GPTConfig, device, dtype) -> list[float]:
    """One greedy generation of ``max(--context-multiples) x block_size`` tokens for --batch samples, as
    sample.py generates (``model.decoding.generation``, the KV cache): the clock after each token."""
    torch.manual_seed(0)
    model = GPT(config).to(device).eval()
    n_tokens = max(args.context_multiples) * config.block_size
    clock = []
    with torch.no_grad(), autocast(device, dtype):
        for _ in generate_batch(model, [0], n_tokens, [None] * args.batch, temperature=0.0, decoding=args.decoding):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            clock.append(time.perf_counter())
    return clock


def window_speed(clock: list[float], end: int, span: int, batch: int) -> tuple[float, float]:
    """Over the ``span`` tokens generated up to token ``end`` (1-based): tokens/s (every sample counted; the
    steps that re-encode the context included) and the median step's ms (what a typical step costs, steady
    against other work on a shared machine)."""
    start = max(0, end - span)
    steps = [b - a for a, b in zip(clock[start : end - 1], clock[start + 1 : end])]
    return batch * len(steps) / sum(steps), 1e3 * statistics.median(steps)


def measure_decode(args: argparse.Namespace) -> list[dict]:
    """Generation tokens/s at each context multiple: over the block_size tokens that end at multiple x
    block_size (a learned-position model re-encodes its context in there, every block_size/2 tokens), the
    median over --repeats generations, interleaved so that a shared machine's drifts hit every cell. The speed
    ratio to the first multiple is taken within each generation (its drifts cancel), then its median and range."""
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    cells = list(itertools.product(args.seq_len, attention_cells(args)))
    clocks: dict[int, list[list[float]]] = {i: [] for i in range(len(cells))}
    loads: dict[int, list[dict]] = {i: [] for i in range(len(cells))}  # per generation, the cores others used
    with tqdm(total=len(cells) * args.repeats, desc="benchmark (decode)") as bar:
        for _ in range(args.repeats):
            for i, (seq_len, cell) in enumerate(cells):
                load = OthersLoad()
                clocks[i].append(decode_times(args, config_of(args, cell, seq_len), device, dtype))
                loads[i].append({"others_cores": load.since_start()})
                bar.update()
    decoding = choose_decoding(args.decoding, device)
    first = min(args.context_multiples)
    rows = []
    for i, (seq_len, cell) in enumerate(cells):
        config = config_of(args, cell, seq_len)
        base = [window_speed(clock, first * seq_len, seq_len, args.batch)[0] for clock in clocks[i]]
        for multiple in args.context_multiples:
            measured = [window_speed(clock, multiple * seq_len, seq_len, args.batch) for clock in clocks[i]]
            speeds = [speed for speed, _ in measured]
            ratios = [speed / at_first for speed, at_first in zip(speeds, base)]
            speed = statistics.median(speeds)
            rows.append(dict(mode="decode", layout=cell["layout"], kernel=cell["kernel"], kv_heads=cell["kv_heads"],
                             window=cell["window"], **{k: cell[k] for k in OPTION_DEFAULTS}, decoding=decoding,
                             seq_len=seq_len, context_multiple=multiple, position_at=multiple * seq_len,
                             batch=args.batch, n_embd=args.n_embd, n_head=args.n_head, n_layer=args.n_layer,
                             dtype=str(dtype).removeprefix("torch."), ms_per_token=1e3 * args.batch / speed,
                             median_step_ms=statistics.median(ms for _, ms in measured),
                             tokens_per_sec=speed, tokens_per_sec_min=min(speeds), tokens_per_sec_max=max(speeds),
                             passes=len(speeds), speed_ratio=statistics.median(ratios), speed_ratio_min=min(ratios),
                             speed_ratio_max=max(ratios),
                             decoding_bytes=config.decoding_bytes(dtype.itemsize), others_cores=max_load(loads[i]),
                             busy=busy_note(loads[i]),
                             warnings=decode_noise(speeds, ratios, multiple, first)))  # fmt: skip
    return rows


def decode_noise(speeds: list[float], ratios: list[float], multiple: int, first: int) -> str:
    """Why a decode cell's figure is not to be trusted ("" when it is): generations whose tokens/s, or whose ratio
    to the first multiple, lie more than NOISY_RANGE x apart; or a single generation, which measures no spread."""
    if len(speeds) == 1:
        return "one generation: no spread measured (--repeats 3 or more measures it)"
    notes = []
    if max(speeds) > NOISY_RANGE * min(speeds):
        notes.append(f"tokens/s {min(speeds):,.0f}-{max(speeds):,.0f} over {len(speeds)} generations "
                     f"({max(speeds) / min(speeds):.1f}x)")  # fmt: skip
    if multiple != first and max(ratios) > NOISY_RANGE * min(ratios):
        notes.append(f"ratio to {first}x {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} generations")
    return ", ".join(notes) + ", a noisy measurement" if notes else ""


def decode_markdown(rows: list[dict], title: str) -> str:
    """A row per cell and context multiple; then, per cell, tokens/s at the largest multiple against the first
    (the median of the generations' own ratios, and their range); then the noisy cells."""
    axes = varied(rows)
    header = ["variant", "block_size", "context multiple", "position", "tokens/s", "range over passes",
              "ms per step", "median step ms", "cache + state KiB per sample"]
    table = [[cell_label(r, axes), str(r["seq_len"]), f"{r['context_multiple']}x", f"{r['position_at']:,}",
              f"{r['tokens_per_sec']:,.0f}", f"{r['tokens_per_sec_min']:,.0f}-{r['tokens_per_sec_max']:,.0f}",
              f"{r['ms_per_token']:.2f}", f"{r['median_step_ms']:.2f}", f"{r['decoding_bytes'] / 1024:,.1f}"]
             for r in rows]  # fmt: skip
    lines = [title, "", markdown_table(header, table, [i >= 1 for i in range(len(header))]), ""]
    for (label, seq_len), group in itertools.groupby(rows, key=lambda r: (cell_label(r, axes), r["seq_len"])):
        group = sorted(group, key=lambda r: r["context_multiple"])
        first, last = group[0], group[-1]
        if first is not last:
            spread = (f" (median of {last['passes']} generations' own ratios, range {last['speed_ratio_min']:.2f}-"
                      f"{last['speed_ratio_max']:.2f})" if last["passes"] > 1 else " (one generation)")  # fmt: skip
            spread += ": noisy, see the warnings" if (last["warnings"] and last["passes"] > 1) or last["busy"] else ""
            lines.append(f"- {label}, block_size {seq_len}: tokens/s at {last['context_multiple']}x block_size is "
                         f"{last['speed_ratio']:.2f} x that at {first['context_multiple']}x{spread}")  # fmt: skip
    single = [r for r in rows if r["passes"] == 1]
    notes = [f"- {cell_label(r, axes)}, block_size {r['seq_len']}, {r['context_multiple']}x: {r['warnings']}"
             for r in rows if r["warnings"] and r["passes"] > 1]  # fmt: skip
    notes += [f"- every cell: {single[0]['warnings']}"] if single else []
    notes += [f"- {cell_label(r, axes)}, block_size {r['seq_len']}: {r['busy']}"
              for r in rows if r["busy"] and r["context_multiple"] == rows[0]["context_multiple"]]  # fmt: skip
    if notes:
        lines += ["", "Benchmark warnings:", *notes]
    return "\n".join(lines)


def decode_figure(rows: list[dict], title: str):
    """Tokens/s against the position generated (multiples of block_size), a line per variant."""
    plt = pyplot()
    from analysis.plots import legend_title as variant_parts

    fig, ax = plt.subplots(figsize=(7, 4.5))
    axes = varied(rows)
    labels = sorted({(cell_label(r, axes), r["seq_len"]) for r in rows})
    palette = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20").colors
    for i, (label, seq_len) in enumerate(labels):
        group = sorted((r for r in rows if (cell_label(r, axes), r["seq_len"]) == (label, seq_len)),
                       key=lambda r: r["context_multiple"])  # fmt: skip
        xs = [r["context_multiple"] for r in group]
        ax.plot(xs, [r["tokens_per_sec"] for r in group], marker="o", color=palette[i % len(palette)],
                label=f"{label}, block {seq_len}")  # fmt: skip
        ax.fill_between(xs, [r["tokens_per_sec_min"] for r in group], [r["tokens_per_sec_max"] for r in group],
                        color=palette[i % len(palette)], alpha=0.15, lw=0)  # fmt: skip
    multiples = sorted({r["context_multiple"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(multiples, [f"{m}x" for m in multiples])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(lambda value, _: f"{value:,.0f}")
    ax.set_xlabel("position generated (multiples of block_size; tokens/s over the block_size tokens up to it)")
    ax.set_ylabel("generation tokens/s (median over passes; band: range)")
    ax.set_title(textwrap.fill(title, 80), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title=variant_parts([lb for lb, _ in labels]),
              title_fontsize=7)  # fmt: skip
    return fig


def main_decode(args: argparse.Namespace) -> list[dict]:
    rows = measure_decode(args)
    device = resolve_device(args.device)
    title = (f"decode on {device_name(device)}, torch {torch.__version__}, {rows[0]['dtype']}, {rows[0]['decoding']} "
             f"steps, batch={args.batch}, n_layer={args.n_layer}, n_embd={args.n_embd}, n_head={args.n_head}, "
             f"vocab={args.vocab_size}; medians over {args.repeats} generation(s)")  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "bench.csv", DECODE_FIELDS, [[row[k] for k in DECODE_FIELDS] for row in rows])
    table = decode_markdown(rows, title)
    write_text(out / "bench.md", table + "\n")
    save_figure(decode_figure(rows, title), out / "bench.png")
    print("\n" + table)
    print(f"\nwritten to {out}/ (bench.csv, bench.md, bench.png)")
    return rows


def plain_pair(args: argparse.Namespace, cell: tuple, device, dtype: torch.dtype) -> dict:
    """A headlab block and its plain reference (holding the block's own weights), each with its input (the same
    values) and its (forward, step) closures; the two checked to compute one function first."""
    seq_len, compile_mode, layout, kernel = cell
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=args.vocab_size, block_size=seq_len, n_layer=1, n_head=args.n_head,
                       n_embd=args.n_embd, attention=layout, kernel=kernel)  # fmt: skip
    block = attention_of(layout, config.attention_spec).to(device)
    plain = plain_twin(block, layout, kernel, seq_len)
    x = torch.randn(args.batch, seq_len, args.n_embd, device=device)
    with torch.no_grad():
        torch.testing.assert_close(plain(x), block(x), msg=lambda m: f"{layout}/{kernel}: the plain reference "
                                   f"computes another function ({m})")  # fmt: skip
    return {side: closures(module, (x.clone().requires_grad_(),), lambda out: out.float().square().mean(), None,
                           compile_mode == "compiled", device, dtype)
            for side, module in (("headlab", block), ("plain", plain))}  # fmt: skip


def measure_plain(args: argparse.Namespace) -> list[dict]:
    """Each cell's forward and forward+backward, headlab's block against its plain reference: per round the two
    timed one after the other (which goes first alternates), the ratio of the two; the median and range of the
    ratios over --repeats rounds, so a shared machine's drifts cancel."""
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device, option="--dtype")
    cells = list(itertools.product(args.seq_len, args.compile_modes, args.layouts, args.kernels))
    ms = {(cell, side, what): [] for cell in cells for side in ("headlab", "plain") for what in ("forward", "step")}
    loads: dict[tuple, list[dict]] = {cell: [] for cell in cells}  # per round, the cores other processes used
    with torch._dynamo.config.patch(recompile_limit=64):  # one forward per layout, kernel and length
        pairs = {cell: plain_pair(args, cell, device, dtype) for cell in cells}
        with tqdm(total=len(cells) * args.repeats, desc="benchmark (plain)") as bar:
            for r in range(args.repeats):
                for cell in cells:
                    load = OthersLoad()
                    for w, what in enumerate(("forward", "step")):
                        order = ("headlab", "plain") if r % 2 == 0 else ("plain", "headlab")
                        for side in order:
                            fn = pairs[cell][side][w]
                            ms[cell, side, what].append(median_ms(fn, args.min_run_time, device)[0])
                    loads[cell].append({"others_cores": load.since_start()})
                    bar.update()
    rows = []
    for cell in cells:
        seq_len, compile_mode, layout, kernel = cell
        row = dict(mode="plain", layout=layout, kernel=kernel, compile=compile_mode, seq_len=seq_len, batch=args.batch,
                   n_embd=args.n_embd, n_head=args.n_head, rounds=args.repeats,
                   dtype=str(dtype).removeprefix("torch."), others_cores=max_load(loads[cell]),
                   busy=busy_note(loads[cell]))  # fmt: skip
        for what in ("forward", "step"):
            ours, theirs = ms[cell, "headlab", what], ms[cell, "plain", what]
            ratios = [a / b for a, b in zip(ours, theirs)]
            row.update({f"{what}_ms": statistics.median(ours), f"plain_{what}_ms": statistics.median(theirs),
                        f"{what}_ratio": statistics.median(ratios), f"{what}_ratio_min": min(ratios),
                        f"{what}_ratio_max": max(ratios)})  # fmt: skip
        rows.append(row)
    return rows


def plain_markdown(rows: list[dict], title: str) -> str:
    header = ["cell", "compile", "seq_len", "forward ms (plain)", "forward ratio (min-max)",
              "fwd+bwd ms (plain)", "fwd+bwd ratio (min-max)"]  # fmt: skip
    body = [[f"{r['layout']}-{r['kernel']}", r["compile"], r["seq_len"],
             *(x for what in ("forward", "step") for x in (
                 f"{ms_text(r[f'{what}_ms'])} ({ms_text(r[f'plain_{what}_ms'])})",
                 f"{r[f'{what}_ratio']:.3f} ({r[f'{what}_ratio_min']:.3f}-{r[f'{what}_ratio_max']:.3f})"))]
            for r in rows]  # fmt: skip
    note = ("ratio: headlab's block time / its plain reference's (bench_reference.py), the median of the rounds' "
            "ratios and their range (below 1: headlab is faster)")
    busy = [f"- {r['layout']}-{r['kernel']}, {r['compile']}, seq {r['seq_len']}: {r['busy']}"
            for r in rows if r["busy"]]  # fmt: skip
    warnings = ["", "Benchmark warnings (a ratio of interleaved timings cancels much of a busy machine, not all):",
                *busy] if busy else []  # fmt: skip
    return "\n".join([title, "", markdown_table(header, body, [i >= 2 for i in range(len(header))]), "", note,
                      *warnings])


def main_plain(args: argparse.Namespace) -> list[dict]:
    rows = measure_plain(args)
    device = resolve_device(args.device)
    title = (f"plain references on {device_name(device)}, torch {torch.__version__}, {rows[0]['dtype']}, "
             f"batch={args.batch}, n_embd={args.n_embd}, n_head={args.n_head}; {args.repeats} interleaved rounds")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "bench.csv", PLAIN_FIELDS, [[row[k] for k in PLAIN_FIELDS] for row in rows])
    table = plain_markdown(rows, title)
    write_text(out / "bench.md", table + "\n")
    print("\n" + table)
    print(f"\nwritten to {out}/ (bench.csv, bench.md)")
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    start_up_over()  # the measurements begin
    if args.mode == "decode":
        return main_decode(args)
    if args.mode == "plain":
        return main_plain(args)
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


if __name__ == "__main__":
    main()
