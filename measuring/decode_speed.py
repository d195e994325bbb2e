"""bench.py --mode decode: generation tokens/s at multiples of block_size (model.decoding.generation,
with the KV cache, as sample.py generates), the median over --repeats generations and each generation's own
ratio to the first multiple; bench.csv, bench.md and bench.png."""

from __future__ import annotations

import argparse
import itertools
import statistics
import textwrap
import time
from pathlib import Path

import torch
from tqdm import tqdm

from analysis.tables import markdown_table, pyplot, save_figure, write_csv, write_text
from common.machine_load import OthersLoad
from measuring.cells import OPTION_DEFAULTS, attention_cells, cell_label, config_of, varied
from measuring.noise import NOISY_RANGE, busy_note, max_load
from model import GPT, GPTConfig
from model.decoding.generation import generate_batch
from model.decoding.steps import choose_decoding
from model.device import autocast, device_name, resolve_device, resolve_dtype

DECODE_FIELDS = ["mode", "layout", "kernel", "kv_heads", "window", *OPTION_DEFAULTS, "decoding", "seq_len",
                 "context_multiple", "position_at", "batch", "n_embd", "n_head", "n_layer", "dtype", "ms_per_token",
                 "median_step_ms", "tokens_per_sec", "tokens_per_sec_min", "tokens_per_sec_max", "passes",
                 "speed_ratio", "speed_ratio_min", "speed_ratio_max", "decoding_bytes", "others_cores", "busy",
                 "warnings"]  # fmt: skip
DECODE_REPEATS = 3  # --mode decode's generations per cell by default: a median and a spread


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
