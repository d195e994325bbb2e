"""The README's and the guides' commands work as written: every `python` line of their bash blocks that
needs no network or GPU runs here (shortened by options appended after the document's own, placeholders
replaced by real runs), and fails on any refusal. A command the table below does not know fails too: a new
line is either run here or says why it cannot be.

The README's lines run as typed, each in a fresh interpreter; the guides' in processes forked from the warm
interpreter (tests/warm_python.py). A line that several documents hold runs once, under the first one's id (the
README's, as typed, where it has it). The guides' two-axis sweeps run with one axis pinned (FEWER_JOBS).
docs/results.md is not run: its commands are the recipes of its measurements (minutes each, with placeholders
for the runs they measured)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
from conftest import GPT2_RANKS, NO_GPT2_RANKS, R50K_URL
from helpers import ROOT, TINY, compose_train
from warm_python import run_python

from training.loop import train

NETWORK = "downloads from the network (Hugging Face hub or a URL)"
GPU = "needs GPUs"
SLURM = "needs a SLURM cluster: test_cluster_sweeps.py runs such sweeps against a real one"
# Commands that cannot run here, and why (matched by their start).
NOT_HERE = {
    "python3 -m venv .venv": "the install itself: .ci/run runs it in a fresh virtualenv",
    "python train.py model=mini data=tinyshakespeare": NETWORK,
    "python train.py experiment=gpt2_small": f"{GPU} and {NETWORK} (FineWeb-Edu)",
    "torchrun --standalone --nproc_per_node=8": GPU,
    "torchrun --nnodes=2": f"{GPU} on two machines",
    "python sample.py source=gpt2 ": NETWORK,
    "python train.py experiment=finetune_shakespeare": f"{GPU} and {NETWORK}",
    "python evaluate.py source=gpt2 ": NETWORK,
    "python -m data data=tinyshakespeare": NETWORK,
    "python heads.py source=gpt2 ": NETWORK,
    "python train.py -m hydra/launcher=submitit_slurm": SLURM,
    "HEADLAB_SLURM_PARTITION=gpu": SLURM,
    "python train.py -m hydra/launcher=submitit_local experiment=compare_attention_gpu": GPU,
    "python bench_reference.py prepare": "a benchmark of minutes (tokenizing the corpus twice per round); "
                                         "test_data_prepare.py covers its code",
    "python bench_reference.py generate": "a benchmark of GPT-2 small (124M) generation: minutes on a CPU; "
                                          "test_speed_paths.py and test_sample.py cover the code it times",
    "python bench_reference.py sample-process": "whole sample.py processes of GPT-2 small: minutes on a CPU",
    "python gpu_story.py --quick": "the story's stages at a toy shape, about 40 s: test_gpu_story.py runs this line",
    "python gpu_story.py": f"{GPU} (GPT-2 small's shape; its --quick line runs here in test_gpu_story.py)",
    "python evaluate.py source=runs/2026-11-21/10-00-00_fused_qkv-sdpa-rope lengths=":
        "a model without a position table: the placeholder run has a learned one (refused past it); "
        "test_long_context.py runs evaluate.py with lengths on a rope run",
}
# The README's runs, small: the placeholder run's shape (2 layers of 4 heads: heads.py layer=1 head=3).
SHAPE = ["model.n_layer=2", "model.n_head=4", "model.n_embd=32", "model.block_size=32", "trainer.batch_size=8"]
SHORT_TRAINING = [*SHAPE, "trainer.max_steps=2", "trainer.eval_interval=2", "trainer.eval_windows=2",
                  "trainer.sample_tokens=0", "trainer.device=cpu"]  # fmt: skip
PLACEHOLDER_STEPS = 4  # the placeholder runs' length; the resume line continues past it
# The guides' sweeps with an axis of their own beside the preset's: one of the two pinned, each job still a
# variant that no other line runs (the README's compare_attention runs whole, as typed).
FEWER_JOBS = {
    # 4 jobs, not 12: the line's seeds times the preset's kernels (its layouts: the README's sweep)
    "python train.py -m experiment=compare_attention trainer.seed=1,2": ["attention=fused_qkv"],
    # 3 jobs, not 6: 4, 2 and 1 key/value heads in the wrapper layout (fused_qkv's: compare_latent's line)
    "python train.py -m experiment=compare_kv_heads": ["attention=wrapper"],
    # 5 jobs, not 10: one seed of each variant, at the 4 layers their schedules of 4 kinds tile (DDDG, LLLG, ...)
    "python train.py -m experiment=compare_hybrid": ["trainer.seed=1", "model.n_layer=4"],
    "python train.py -m experiment=compare_schedules": ["trainer.seed=1", "model.n_layer=4"],
    "python train.py -m experiment=compare_attention_2026": ["trainer.seed=1", "model.n_layer=4"],
    # 3 jobs, not 18: AdamW, Muon as stored and by Q/K/V in the wrapper (test_optimizer_axis.py runs all 18)
    "python train.py -m experiment=compare_optimizers": ["trainer.seed=1", "attention=wrapper"],
    # one run, at the 4 layers its RRRN (KKKM) tiles
    "python train.py schedule=llama4": ["model.n_layer=4"],
    "python train.py mixing=kimi_linear": ["model.n_layer=4"],
}
# The benchmarks' smallest cell: one layout and kernel (test_bench.py runs the default grid), the shapes of
# test_bench.py's compiled cell (a compiled line reuses its inductor cache in a full run).
SMALL_BENCH = ["--min-run-time", "0.01", "--seq-len", "8", "--batch", "1", "--n-embd", "16", "--n-head", "2",
               "--layouts", "fused_qkv", "--kernels", "sdpa", "--out"]  # fmt: skip


GUIDES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md") if p.name != "results.md")


def readme_commands(document: str = "README.md") -> list[str]:
    """Every command line of the document's bash blocks that runs python (continuation lines joined)."""
    text = (ROOT / document).read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment
            if line and not line.startswith("#") and re.search(r"\b(python3?|torchrun)\b", line):
                commands.append(line)
    return commands


@pytest.fixture(scope="module")
def places(tmp_path_factory, data_cache):
    """What the README's placeholders stand for: a trained run, a sweep, files to read."""
    tmp = tmp_path_factory.mktemp("readme")
    sweep = tmp / "sweep"
    for layout in ("wrapper", "fused_qkv"):
        train(compose_train(*SHAPE, *TINY[6:], "logger=none", f"attention={layout}",
                            *(f"trainer.{key}={PLACEHOLDER_STEPS}" for key in ("max_steps", "eval_interval",
                                                                                 "checkpoint_interval")),
                            f"trainer.run_dir={sweep / layout}", f"data.cache_dir={data_cache}"))  # fmt: skip
    (tmp / "prompt.txt").write_text("def ")
    (tmp / "notes" / "a").mkdir(parents=True)
    for i in range(40):  # enough documents for a validation split
        (tmp / "notes" / "a" / f"{i}.md").write_text(f"# note {i}\n\nSome text of note {i}.\n" * 20)
    return {"run": sweep / "fused_qkv", "sweep": sweep, "cwd": tmp, "cache": data_cache, "count": iter(range(10**6))}


def prepared(command: str, places: dict) -> tuple[list[str], str | None]:
    """argv (placeholders replaced, the work shortened) and the text for standard input."""
    stdin, line = None, command
    if command.startswith("echo "):
        echoed, command = command.split("|", 1)
        stdin = shlex.split(echoed)[1] + "\n"
        command = command.strip()
    run, sweep = str(places["run"]), str(places["sweep"])
    command = re.sub(r"runs/\.\.\./best\.pt", f"{run}/best.pt", command)
    command = re.sub(r"runs/(\d{4}-\d\d-\d\d/[\w-]+|\.\.\.)", run, command)
    command = re.sub(r"multirun/\d{4}-\d\d-\d\d/[\d-]+", sweep, command)
    argv = shlex.split(command)
    launcher = []
    if argv[0] == "torchrun":  # torchrun's own options, then the script: the ranks are real processes (gloo)
        at = next(i for i, a in enumerate(argv) if a.endswith(".py"))
        launcher, argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:at]], ["python", *argv[at:]]
    script, args = argv[1], argv[2:]
    cache, out = f"data.cache_dir={places['cache']}", places["cwd"]
    if script == "train.py":
        multirun = "-m" in args
        where = f"hydra.sweep.dir={out / 'sweeps' / str(next(places['count']))}" if multirun else \
            f"hydra.run.dir={out / 'runs' / str(next(places['count']))}"  # fmt: skip
        args += [*SHORT_TRAINING, cache, where] + ([] if any(a.startswith("logger") for a in args) else ["logger=none"])
        args += FEWER_JOBS.get(line, [])
        if any(a.startswith("trainer.resume=") for a in args):
            args.append(f"trainer.max_steps={PLACEHOLDER_STEPS + 2}")  # past the placeholder run's steps
    elif script in ("sample.py",):
        args += ["max_new_tokens=5", "device=cpu"]
    elif script in ("heads.py", "evaluate.py"):
        # evaluate.py's out= names its JSON (its plots go beside it); heads.py's names a folder
        args += [cache, f"out={out / 'out' / str(next(places['count']))}{'.json' if script == 'evaluate.py' else ''}"]
        if script == "heads.py":
            # statistics and ablation (prune=true: 32 evaluations) over 2 windows, not 16; without a prompt, maps of
            # 8 tokens, not 24 (their tick labels are most of the time: matplotlib lays out each one)
            args += ["windows=2", "map_tokens=8"]
    elif script == "export.py":
        args = [a if not a.startswith("out=") else f"out={out / 'exported'}" for a in args]
    elif argv[1:3] == ["-m", "data"]:
        args = argv[3:] + [cache]
        return [sys.executable, "-m", "data", *args], stdin
    elif script == "bench.py":
        args += [*SMALL_BENCH, str(out / "bench" / str(next(places["count"])))]
        if "gpt" in args:
            args += ["--n-layer", "1", "--vocab-size", "64"]
    elif script == "bench_reference.py":
        args += ["--rounds", "1", "--steps", "1", "--new-tokens", "2", "--batch", "2", "--seq", "16", "--n-layer", "1",
                 "--n-head", "2", "--n-embd", "32"]  # fmt: skip
    elif script == "compare.py":
        args += ["--out", str(out / "report" / str(next(places['count'])))]
    return [*(launcher or [sys.executable]), str(ROOT / script), *args], stdin


def test_every_command_is_run_here_or_says_why_not():
    commands = [c for document in ("README.md", *GUIDES) for c in readme_commands(document)]
    assert len(commands) > 40
    unknown = [c for c in commands if not any(c.startswith(k) for k in NOT_HERE) and not c.startswith(
        ("python train.py", "torchrun --standalone --nproc_per_node=2 train.py", "python sample.py",
         "python export.py", "python evaluate.py", "python -m data",
         "python compare.py", "python bench", "python heads.py", "echo "))]  # fmt: skip
    assert not unknown, f"commands this test does not know how to run or why not: {unknown}"


RUN_HERE = [(document, c) for document in ("README.md", *GUIDES) for c in readme_commands(document)
            if not any(c.startswith(k) for k in NOT_HERE)]  # fmt: skip


def once_each(lines: list[tuple[str, str]]) -> list[tuple[str, tuple[str, ...], str]]:
    """Each distinct line once: (its id, the documents that hold it, the line). The id is its first place in
    ``lines`` (the README's, where it has it: it runs as typed), so a line keeps its id while others change."""
    holders: dict[str, list[str]] = {}
    ids = {}
    for i, (document, command) in enumerate(lines):
        ids.setdefault(command, f"{document}-{i}")
        holders.setdefault(command, []).append(document)
    return [(ids[c], tuple(dict.fromkeys(documents)), c) for c, documents in holders.items()]


DISTINCT = once_each(RUN_HERE)


def test_most_commands_run_here():
    assert len(RUN_HERE) >= 25, RUN_HERE
    assert sum(document == "README.md" for document, _ in RUN_HERE) >= 5, "the README's own lines run as typed"


# The README's main job (its first line, `python train.py`) runs in the README's test command; its other lines and
# the guides' in the slow tier (pytest --slow), which CI runs too: the default tier keeps within its 5 minutes.
@pytest.mark.parametrize("documents,command", [
    pytest.param(d, c, id=i, marks=() if i == "README.md-0" else pytest.mark.slow) for i, d, c in DISTINCT])
def test_a_command_that_needs_no_network_or_gpu_works(documents, command, places, tmp_path):
    """The README's lines each in a fresh interpreter, as typed; the guides' forked from the warm one. A test id
    each, so pytest -n spreads them over the cores."""
    document = " and ".join(documents)
    env = {**os.environ, "WANDB_MODE": "offline", "HYDRA_FULL_ERROR": "0"}
    if GPT2_RANKS is None and "tokenizer=gpt2" in command:  # GPT-2's BPE, offline: only from a rank file at hand
        pytest.skip(NO_GPT2_RANKS)
    if GPT2_RANKS is not None:  # bench_reference sample-process: GPT-2's tokenizer, offline
        import hashlib
        import shutil

        cache = tmp_path / "tiktoken"
        cache.mkdir()
        shutil.copy(GPT2_RANKS, cache / hashlib.sha1(R50K_URL.encode()).hexdigest())
        env["TIKTOKEN_CACHE_DIR"] = str(cache)
    argv, stdin = prepared(command, places)
    if "README.md" in documents or argv[0] != sys.executable:  # torchrun: its own processes
        r = subprocess.run(argv, input=stdin, cwd=places["cwd"], env=env, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    else:
        r = run_python(argv[1:], cwd=places["cwd"], env=env, input=stdin, timeout=600)
    assert r.returncode == 0, f"{document}: {command}\n  exit {r.returncode}: {(r.stderr or r.stdout).strip()[-800:]}"
