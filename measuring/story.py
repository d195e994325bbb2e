"""The GPU story in one command, on the GPU at hand, in at most 10 minutes (offline, once its data is prepared):

    python gpu_story.py                           # GPT-2 small's shape on one GPU: the table, and the folder it names
    python gpu_story.py --quick --device cpu      # the same stages at a toy shape: the machinery, on a CPU

Each stage is a process of its own (a clean device for each), with its share of the time:

- ``tests``: ``pytest tests/test_cuda.py``: the CUDA tests pass;
- ``sweep``: ``train.py -m experiment=compare_attention_gpu`` (every layout x kernel, seed 1, a few steps), then
  ``compare.py``: each variant's tokens/s, MFU, micro-batch and compile time, and whether the layouts of one
  function agree in loss;
- ``step``: ``bench_reference.py train-step``: headlab's training step against transformers' GPT-2, interleaved;
- ``loss`` and ``mode``: ``bench_reference.py levers``: the step with ``trainer.loss_chunk`` against the whole logits,
  and compiled in mode reduce-overhead (CUDA graphs) against the default mode, time and peak memory;
- ``decode``: ``bench_reference.py generate``: eager, graph and compiled decoding against transformers' generate,
  tokens/s and their share of the memory-bandwidth limit, and how many greedy tokens agree;
- ``plain``: ``bench.py --mode plain``: each attention block against its plainest code;
- ``optim``: ``bench_reference.py optimizer``: the training step with Muon (by Q/K/V) against the step with AdamW,
  and Muon's optimizer step alone against AdamW's, interleaved.

It prints one table (check, measured, goal, verdict: ``ok``, ``SHORT`` of the goal, ``FAILED``, or ``NOT RUN``
where time ran out) and writes it, with every stage's own output, to ``--out`` (default
``gpu-story/<date>_<device>/``: ``gpu_story.md``, ``gpu_story.json``): what docs/results.md quotes, with its date,
GPU and torch. The goals are the open issues' (46% MFU, decoding at 4,000 tokens/s and a fifth of the bandwidth
limit at batch 1, ...): a SHORT is a finding, not an error.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from analysis.tables import markdown_table, write_text
from cli import OneLineErrorParser
from common.machine_load import OthersLoad, busy_text, is_busy
from common.startup import start_up_over
from measuring import ROOT
from measuring.story_stages import STAGES, Check, Stage, as_text, data_options, in_our_flags, last_line

BUDGET_S = 600  # the whole story, data preparation apart
OUT_OF_TIME = ("still running", "no time left")  # a stage killed at the end of its share of the budget, or not begun


def run_stage(stage: Stage, args: argparse.Namespace, folder: Path, seconds: float) -> list[Check]:
    """The stage's process, killed past ``seconds``; its output kept in its folder."""
    out = folder / stage.name
    out.mkdir(parents=True, exist_ok=True)
    command = stage.command(args, out)
    (out / "command.txt").write_text(" ".join(command) + "\n")
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=max(1.0, seconds), cwd=folder,
                              env={**os.environ, **stage.env})  # fmt: skip
    except subprocess.TimeoutExpired as ran:
        (out / "output.log").write_text(as_text(ran.stdout) + as_text(ran.stderr))
        return [Check(stage.name, "the stage", f"{OUT_OF_TIME[0]} after {seconds:.0f} s: killed", f"{seconds:.0f} s",
                      "NOT RUN")]  # fmt: skip
    took = time.perf_counter() - start
    (out / "output.log").write_text(done.stdout + done.stderr)
    try:
        checks = stage.read(args, out)
    except (OSError, ValueError, KeyError, AttributeError) as err:  # it wrote nothing readable
        last = (last_line(done.stderr) or last_line(done.stdout) or "no output")[:200]
        return [Check(stage.name, "the stage", f"exit {done.returncode}: {last} ({type(err).__name__})", "",
                      "FAILED")]  # fmt: skip
    if done.returncode != 0 and not any(c.verdict == "FAILED" for c in checks):
        checks.append(Check(stage.name, "the stage's exit", f"exit {done.returncode}", "0", "FAILED"))
    return [*checks, Check(stage.name, "time", f"{took:.0f} s", f"{seconds:.0f} s", "said")]


def story(args: argparse.Namespace) -> tuple[Path, list[Check]]:
    import torch

    from model.device import device_name, resolve_device

    device = resolve_device(args.device, option="--device")
    name = device_name(device)
    machine = re.sub(r"[^\w.-]+", "_", name)
    folder = Path(args.out or ROOT / "gpu-story" / f"{datetime.date.today()}_{machine}")
    start_up_over()  # the stages begin
    folder.mkdir(parents=True, exist_ok=True)
    if not args.quick:
        prepare(args, folder)
    checks, deadline = [], time.perf_counter() + args.budget
    load = OthersLoad(children=True)  # the cores other processes use while the stages run: a busy machine
    for i, stage in enumerate(s for s in STAGES if s.name in args.stages):
        if stage.gpu_only and device.type != "cuda":
            checks.append(Check(stage.name, "the stage", f"needs CUDA ({name})", "", "NOT RUN"))
            continue
        left = deadline - time.perf_counter()
        later = sum(s.share for s in STAGES[i + 1 :] if s.name in args.stages)
        seconds = left * stage.share / (stage.share + later) if later else left
        if seconds < 1:  # the budget is spent
            checks.append(Check(stage.name, "the stage", f"{OUT_OF_TIME[1]} of --budget {args.budget:g} s", "",
                                "NOT RUN"))  # fmt: skip
            continue
        print(f"[gpu_story] {stage.name}: up to {seconds:.0f} s", flush=True)
        checks += run_stage(stage, args, folder, seconds)
    header = (f"{name}, torch {torch.__version__}, {datetime.datetime.now():%Y-%m-%d %H:%M}, "
              f"{'--quick: a toy shape, the machinery only' if args.quick else 'GPT-2 small shape'}")  # fmt: skip
    table = markdown_table(["stage", "check", "measured", "goal", "verdict"],
                           [[c.stage, c.check, c.measured, c.goal, c.verdict] for c in checks],
                           [False] * 5)  # fmt: skip
    short = [c for c in checks if c.verdict in ("SHORT", "FAILED", "NOT RUN")]
    summary = (f"{len(short)} of {sum(c.verdict != 'said' for c in checks)} checks fall short: "
               + "; ".join(f"{c.stage} {c.check} ({c.verdict})" for c in short)) if short else "every check holds"
    write_text(folder / "gpu_story.md", f"# The GPU story\n\n{header}\n\n{table}\n\n{summary}\n")
    write_text(folder / "gpu_story.json", json.dumps({"header": header, "checks": [asdict(c) for c in checks]},
                                                     indent=2))  # fmt: skip
    late = out_of_time(checks, args.budget, load.since_start())
    print(f"\n{header}\n\n{table}\n\n{summary}\n{late and late + chr(10)}written to {folder}/ (gpu_story.md, "
          f"gpu_story.json, each stage's output)")  # fmt: skip
    if all(c.verdict == "NOT RUN" for c in checks):  # a table of NOT RUN is no story: said, and not a success
        raise SystemExit(f"error: nothing was measured ({'; '.join(f'{c.stage}: {c.measured}' for c in checks)})"
                         f"{f'. {late}' if late else ''}")  # fmt: skip
    return folder, checks


def out_of_time(checks: list[Check], budget: float, others: float | None) -> str:
    """The stages that ran out of the budget (killed at their share, or not begun), why and what to change; ""
    where none did."""
    late = [c.stage for c in checks if c.measured.startswith(OUT_OF_TIME)]
    if not late:
        return ""
    busy = f" on a busy machine ({busy_text(others)} meanwhile)" if is_busy(others) else ""
    return (f"{', '.join(late)} ran out of --budget {budget:g} s{busy}: "
            + ("run it on a quieter machine, or give it more time" if busy else "give it more time")
            + f" (--budget {2 * budget:g})")  # fmt: skip


def prepare(args: argparse.Namespace, folder: Path) -> None:
    """The sweep's data, before the clock starts: prepared once (offline with a local tokenizer's ranks)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "data", *data_options(args)], capture_output=True, text=True)
    (folder / "data.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        flags = in_our_flags(" ".join(data_options(args)))
        raise SystemExit(f"error: preparing the sweep's data ({flags}) failed: "
                         f"{last_line(done.stderr) or f'exit {done.returncode}'}")
    print(f"[gpu_story] data ready in {time.perf_counter() - start:.0f} s", flush=True)


class HelpWithDefaults(argparse.RawDescriptionHelpFormatter):
    """``--help`` gives each option's default after its help (``(default: 600)``; a list as it is typed), except a
    flag's and an unset one's (its help says what happens then)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, False) or action.default is argparse.SUPPRESS or not action.option_strings:
            return action.help
        default = " ".join(map(str, action.default)) if isinstance(action.default, list) else "%(default)s"
        return f"{action.help} (default: {default})"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = OneLineErrorParser(description=__doc__.split("\n\n")[0], formatter_class=HelpWithDefaults)
    p.add_argument("--device", default="auto", help="auto (CUDA when present) | cpu | cuda | cuda:N")
    p.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                   help="auto: bfloat16 on GPUs that have it natively, float16 on older ones, float32 on a CPU")
    p.add_argument("--quick", action="store_true", help="a toy shape: checks the machinery (a CPU can run it)")
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for every stage together")
    p.add_argument("--steps", type=int, default=30, help="steps of each sweep job")
    p.add_argument("--stages", nargs="+", default=[s.name for s in STAGES], choices=[s.name for s in STAGES],
                   metavar="STAGE", help=f"which stages to run, of {', '.join(s.name for s in STAGES)}")
    p.add_argument("--data", default="pystdlib", help="the sweep's data= (prepared first)")
    p.add_argument("--tokenizer", default="gpt2", help="the sweep's data.tokenizer=")
    p.add_argument("--out", default=None, help="default: gpu-story/<date>_<device>/")
    return p.parse_args(argv)
