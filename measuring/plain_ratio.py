"""bench.py --mode plain: each layout x kernel block against the plainest code of the same layout
and kernel (measuring/plain_attention.py: the same weights, the same function), the two interleaved, the ratios'
median and range over --repeats rounds; bench.csv and bench.md."""

from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from analysis.tables import markdown_table, write_csv, write_text
from common.machine_load import OthersLoad
from measuring.noise import busy_note, max_load, ms_text
from measuring.plain_attention import plain_twin
from measuring.timing import closures, median_ms
from model import GPTConfig
from model.attention import attention_of
from model.device import device_name, resolve_device, resolve_dtype

PLAIN_FIELDS = ["mode", "layout", "kernel", "compile", "seq_len", "batch", "n_embd", "n_head", "dtype", "forward_ms",
                "plain_forward_ms", "forward_ratio", "forward_ratio_min", "forward_ratio_max", "step_ms",
                "plain_step_ms", "step_ratio", "step_ratio_min", "step_ratio_max", "rounds", "others_cores",
                "busy"]  # fmt: skip
PLAIN_REPEATS = 5  # --mode plain's rounds by default: ratios of interleaved timings, a median and a spread


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
