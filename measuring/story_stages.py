"""gpu_story.py's stages: each a process of its own (its command), its share of the time, and
what its output says (its checks: measured, goal, verdict)."""

from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from measuring import ROOT

MFU_GOAL = 0.46  # the GPU preset's fused_qkv/sdpa step (issue 53)
DECODE_GOALS = {1: 4_000, 8: 20_000}  # greedy tokens/s of GPT-2 small in bf16 by batch (issue 53)
BANDWIDTH_SHARE_GOAL = 0.20  # of the memory-bandwidth limit, at batch 1 (issue 53)


@dataclass
class Check:
    """One line of the table."""

    stage: str
    check: str
    measured: str
    goal: str = ""
    verdict: str = "ok"  # ok | SHORT | FAILED | NOT RUN | said (a figure with no goal)


@dataclass
class Stage:
    """A process of its own, its share of the budget, and what its output says."""

    name: str
    share: float  # of the budget
    command: Callable[[argparse.Namespace, Path], list[str]]
    read: Callable[[argparse.Namespace, Path], list[Check]]
    gpu_only: bool = False
    env: dict = field(default_factory=dict)


# The stages' options that this script's own flags set: a stage's message naming one (an offline hint:
# ``data.tokenizer=bytes``) is shown as the flag that sets it (``--tokenizer bytes``), which this script takes.
FLAG_OF = {"data": "--data", "data.tokenizer": "--tokenizer", "trainer.device": "--device"}


def data_options(args: argparse.Namespace) -> list[str]:
    return [f"data={args.data}", f"data.tokenizer={args.tokenizer}"]


def in_our_flags(text: str) -> str:
    """A stage's message in this script's words: ``data.tokenizer=bytes`` -> ``--tokenizer bytes``."""
    for key, flag in FLAG_OF.items():
        text = re.sub(rf"(?<![\w.+~-]){re.escape(key)}=(?=[^\s=])", f"{flag} ", text)
    return text


def last_line(output: str) -> str:
    """A process's last line of output, as its one-line error: ``error: `` once (this script says it)."""
    lines = output.strip().splitlines()
    return in_our_flags(lines[-1].removeprefix("error: ")) if lines else ""


def as_text(output: str | bytes | None) -> str:
    """What a process wrote: a killed process's output comes as bytes even with ``text=True`` (subprocess)."""
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def tests_command(args: argparse.Namespace, out: Path) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "tests" / "test_cuda.py"),
            f"--junitxml={out / 'junit.xml'}"]  # fmt: skip


def read_tests(args: argparse.Namespace, out: Path) -> list[Check]:
    text = (out / "junit.xml").read_text()
    counts = {key: int(re.search(rf'{key}="(\d+)"', text).group(1)) for key in ("tests", "failures", "errors",
                                                                                   "skipped")}  # fmt: skip
    failed = counts["failures"] + counts["errors"]
    passed = counts["tests"] - failed - counts["skipped"]
    names = re.findall(r'<testcase [^>]*name="([^"]+)"[^>]*>\s*<(?:failure|error)', text)
    verdict = "FAILED" if failed else ("said" if not passed else "ok")
    return [Check("tests", "pytest tests/test_cuda.py", f"{passed} passed, {failed} failed, {counts['skipped']} "
                  f"skipped" + (f" ({', '.join(names)})" if names else ""), "all pass", verdict)]  # fmt: skip


def sweep_command(args: argparse.Namespace, out: Path) -> list[str]:
    experiment = ["experiment=compare_attention", "trainer.max_steps=6", "trainer.eval_interval=6",
                  "trainer.eval_windows=4"] if args.quick else \
        ["experiment=compare_attention_gpu", "hydra.sweeper.params.trainer.seed=1", f"trainer.max_steps={args.steps}",
         f"trainer.eval_interval={args.steps}", "trainer.eval_windows=16", "trainer.checkpoint_interval=100000",
         *data_options(args)]  # fmt: skip
    return [sys.executable, str(ROOT / "train.py"), "-m", *experiment, f"trainer.device={args.device}", "logger=none",
            f"hydra.sweep.dir={out / 'sweep'}"]  # fmt: skip


def read_sweep(args: argparse.Namespace, out: Path) -> list[Check]:
    """The sweep's report (compare.py, run here): a line per variant, then what the report flags."""
    report = subprocess.run([sys.executable, str(ROOT / "compare.py"), str(out / "sweep"), "--out",
                             str(out / "report")], capture_output=True, text=True, timeout=120)  # fmt: skip
    (out / "compare.log").write_text(report.stdout + report.stderr)
    for checkpoint in (out / "sweep").glob("*/*.pt"):  # GPT-2 small's training state: 1.5 GB each, not the story
        checkpoint.unlink()
    if report.returncode != 0:
        return [Check("sweep", "compare.py", report.stderr.strip().splitlines()[-1][:200], "a report", "FAILED")]
    with open(out / "report" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    checks = []
    for row in rows:
        mfu = float(row["mfu"]) if row.get("mfu") else None
        cached = "" if not row.get("compile_s") else f", compile {float(row['compile_s']):.1f} s"
        measured = (f"{float(row['tokens_per_sec']):,.0f} tokens/s" + (f", MFU {mfu:.1%}" if mfu else "")
                    + f", micro-batch {row['micro_batch']}{cached}")  # fmt: skip
        fused_sdpa = row["layout"] == "fused_qkv" and row["kernel"] == "sdpa"
        goal, verdict = ("said", "said") if not fused_sdpa or mfu is None else \
            (f"MFU >= {MFU_GOAL:.0%}", "ok" if mfu >= MFU_GOAL else "SHORT")  # fmt: skip
        if row["state"] != "finished":
            measured, verdict = f"{row['state']}: {row['flag']}"[:200], "FAILED"
        checks.append(Check("sweep", row["label"], measured, "" if goal == "said" else goal, verdict))
    loss_flags = [f"{row['label']}: {row['flag']}" for row in rows if "vs median" in row["flag"]]
    checks.append(Check("sweep", "losses of one function agree", "; ".join(loss_flags) or "no loss flagged",
                        "no variant flagged", "FAILED" if loss_flags else "ok"))  # fmt: skip
    speed_flags = sorted({re.sub(r"^.*?(a busy machine|micro-batch|ran alongside|tokens seen|compile s read).*$", r"\1",
                                 part) for row in rows for part in row["flag"].split("; ")
                          if "not comparable" in part or "compile cache" in part})  # fmt: skip
    checks.append(Check("sweep", "speed figures comparable", ", ".join(speed_flags) or "nothing flagged", "",
                        "said"))  # fmt: skip
    return checks


def plain_command(args: argparse.Namespace, out: Path) -> list[str]:
    shape = (["--seq-len", "64", "--batch", "2", "--n-embd", "32", "--n-head", "4", "--min-run-time", "0.05",
              "--repeats", "2"] if args.quick else
             ["--seq-len", "1024", "--batch", "8", "--n-embd", "768", "--n-head", "12", "--min-run-time", "0.2",
              "--repeats", "3"])  # fmt: skip
    return [sys.executable, str(ROOT / "bench.py"), "--mode", "plain", *shape, "--device", args.device, "--dtype",
            args.dtype, "--out", str(out)]  # fmt: skip


def read_plain(args: argparse.Namespace, out: Path) -> list[Check]:
    with open(out / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    return [Check("plain", f"{r['layout']}-{r['kernel']} forward+backward vs its plainest code",
                  f"{float(r['step_ratio']):.3f}x ({float(r['step_ratio_min']):.3f}-{float(r['step_ratio_max']):.3f})",
                  "<= 1.05x", "ok" if float(r["step_ratio"]) <= 1.05 else "SHORT") for r in rows]  # fmt: skip


def step_shape(args: argparse.Namespace) -> list[str]:
    """The training step's shape, steps and rounds for bench_reference.py (GPT-2 small at batch 12; --quick a toy)."""
    return (["--batch", "4", "--seq", "32", "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--vocab", "300",
             "--steps", "2", "--rounds", "2"] if args.quick else
            ["--batch", "12", "--seq", "1024", "--n-layer", "12", "--n-head", "12", "--n-embd", "768", "--vocab",
             "50257", "--steps", "5", "--rounds", "3"])  # fmt: skip


def step_command(args: argparse.Namespace, out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "bench_reference.py"), "train-step", *step_shape(args), "--device",
            args.device, "--dtype", args.dtype, "--json", str(out / "step.json")]  # fmt: skip


def read_step(args: argparse.Namespace, out: Path) -> list[Check]:
    (result,) = json.loads((out / "step.json").read_text())["results"]
    return [Check("step", "training step vs transformers' GPT-2 (same weights, batch, dtype; eager)",
                  f"{result['ratio']:.3f}x its time ({result['ratio_min']:.3f}-{result['ratio_max']:.3f}); "
                  f"{result['headlab']:,.0f} tokens/s", "<= 1.00x", "ok" if result["ratio"] <= 1.0 else "SHORT")]


def decode_command(args: argparse.Namespace, out: Path) -> list[str]:
    shape = (["--model", "given", "--n-layer", "2", "--n-head", "2", "--n-embd", "64", "--vocab", "300", "--seq",
              "64", "--new-tokens", "24", "--rounds", "2"] if args.quick else ["--new-tokens", "128", "--rounds", "2"])
    return [sys.executable, str(ROOT / "bench_reference.py"), "generate", "--decoding", "all", "--batch", "8",
            *shape, "--device", args.device, "--dtype", args.dtype, "--json", str(out / "decode.json")]  # fmt: skip


def read_decode(args: argparse.Namespace, out: Path) -> list[Check]:
    """Each mode's rate (and share of the bandwidth limit) against transformers; the goals are graph decoding's (the
    default on CUDA), and compiled decoding's to be no slower than it; the tokens the modes agree on."""
    results = json.loads((out / "decode.json").read_text())["results"]
    rate = {(r["decoding"], r["batch"]): r["headlab"] for r in results}
    checks = []
    for r in results:
        share = "" if r["share"] is None else f", {r['share']:.1%} of the bandwidth limit"
        measured = (f"{r['headlab']:,.0f} tokens/s{share} ({r['ratio']:.3f}x transformers' time"
                    + (f"; {r['greedy_equal']}/{r['new_tokens']} greedy tokens equal" if not r["sampled"] else "")
                    + (f"; reading ahead {r['read_ahead_gain']:.3f}x the rate without"
                       if r.get("read_ahead_gain") else "")
                    + ")")  # fmt: skip
        goal, verdict = "", "said"
        if r["decoding"] == "graph" and r["batch"] in DECODE_GOALS:
            goal = f">= {DECODE_GOALS[r['batch']]:,} tokens/s" + (
                f", >= {BANDWIDTH_SHARE_GOAL:.0%} of the limit" if r["batch"] == 1 else "")
            verdict = "ok" if r["headlab"] >= DECODE_GOALS[r["batch"]] and (
                r["batch"] != 1 or (r["share"] or 0) >= BANDWIDTH_SHARE_GOAL) else "SHORT"
        if r["decoding"] == "compiled" and ("graph", r["batch"]) in rate:
            goal = f">= graph decoding's {rate['graph', r['batch']]:,.0f} tokens/s"
            verdict = "ok" if r["headlab"] >= rate["graph", r["batch"]] else "SHORT"
        checks.append(Check("decode", f"{r['decoding']} decoding, batch {r['batch']}, "
                            f"{'sampled' if r['sampled'] else 'greedy'}", measured, goal, verdict))  # fmt: skip
    greedy = {r["decoding"]: r["tokens"] for r in results if not r["sampled"]}
    if "eager" in greedy and len(greedy) > 1:
        agree = ", ".join(f"{mode} {sum(a == b for a, b in zip(tokens, greedy['eager']))}/{len(tokens)}"
                          for mode, tokens in greedy.items() if mode != "eager")  # fmt: skip
        checks.append(Check("decode", "greedy tokens equal to eager decoding's", agree,
                            "all (float32); bf16 parts at near-ties", "said"))  # fmt: skip
    return checks


def loss_command(args: argparse.Namespace, out: Path) -> list[str]:
    return lever_command(args, out / "loss.json", "--loss-chunk", "16" if args.quick else "4096")


def mode_command(args: argparse.Namespace, out: Path) -> list[str]:
    return lever_command(args, out / "mode.json", "--compile-mode", "reduce-overhead")


def lever_command(args: argparse.Namespace, json_path: Path, *lever: str) -> list[str]:
    """bench_reference.py levers: headlab's step with ``lever`` against the same step without it."""
    return [sys.executable, str(ROOT / "bench_reference.py"), "levers", *step_shape(args), *lever, "--device",
            args.device, "--dtype", args.dtype, "--json", str(json_path)]  # fmt: skip


def read_loss(args: argparse.Namespace, out: Path) -> list[Check]:
    return read_lever(out / "loss.json", "loss", "trainer.loss_chunk={loss_chunk}")


def read_mode(args: argparse.Namespace, out: Path) -> list[Check]:
    return read_lever(out / "mode.json", "mode", "trainer.compile_mode={compile_mode}")


def read_lever(path: Path, stage: str, option: str) -> list[Check]:
    (r,) = json.loads(path.read_text())["results"]
    memory = (f"; peak {r['peak_bytes'] / 2**30:.2f} GiB vs {r['reference_peak_bytes'] / 2**30:.2f} GiB"
              if r.get("peak_bytes") else "")
    return [Check(stage, f"{option.format(**r)}: the step with {r['lever']} vs {r['against']}",
                  f"{r['ratio']:.3f}x its time ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}); {r['headlab']:,.0f} "
                  f"tokens/s{memory}", "", "said")]  # fmt: skip


def optim_command(args: argparse.Namespace, out: Path) -> list[str]:
    """bench_reference.py optimizer: Muon (by Q/K/V, the split that keeps the layouts' steps equal) against AdamW."""
    return [sys.executable, str(ROOT / "bench_reference.py"), "optimizer", "--split", "qkv", *step_shape(args),
            "--device", args.device, "--dtype", args.dtype, "--json", str(out / "optim.json")]  # fmt: skip


def read_optim(args: argparse.Namespace, out: Path) -> list[Check]:
    """What Muon costs: the whole step's time and the optimizer step's alone, each as a ratio to AdamW's."""
    results = json.loads((out / "optim.json").read_text())["results"]
    return [Check("optim", f"{'training step' if r['part'] == 'step' else 'optimizer step alone'}: Muon (split "
                  f"{r['split']}) vs AdamW", f"{r['ratio']:.3f}x its time ({r['ratio_min']:.3f}-{r['ratio_max']:.3f});"
                  f" {r['headlab']:,.1f} {r['unit']} against {r['reference']:,.1f}", "", "said")
            for r in results]  # fmt: skip


STAGES = [
    Stage("tests", 0.20, tests_command, read_tests, gpu_only=True),
    Stage("sweep", 0.30, sweep_command, read_sweep),
    Stage("decode", 0.20, decode_command, read_decode),
    Stage("step", 0.08, step_command, read_step),
    Stage("loss", 0.04, loss_command, read_loss),
    Stage("mode", 0.04, mode_command, read_mode),
    Stage("plain", 0.08, plain_command, read_plain),
    Stage("optim", 0.06, optim_command, read_optim),
]
