"""gpu_story.py, the GPU story in one command, run end to end at its toy shape on this CPU: every stage a process of
its own, its output read into one table of checks with verdicts, written where docs/results.md can quote it."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers import run_script, user_env


@pytest.mark.slow
def test_the_story_runs_every_stage_and_writes_one_table_of_verdicts(tmp_path):
    out = tmp_path / "story"
    result = run_script("gpu_story.py", "--quick", "--device", "cpu", "--out", str(out), cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    story = json.loads((out / "gpu_story.json").read_text())
    checks = story["checks"]
    stages = {c["stage"] for c in checks}
    assert stages == {"tests", "sweep", "decode", "step", "loss", "mode", "plain", "optim"}, stages
    assert {c["verdict"] for c in checks} <= {"ok", "SHORT", "FAILED", "NOT RUN", "said"}
    assert not [c for c in checks if c["verdict"] == "FAILED"], [c for c in checks if c["verdict"] == "FAILED"]
    sweep = [c["check"] for c in checks if c["stage"] == "sweep"]
    assert {"fused_qkv-sdpa", "wrapper-manual", "losses of one function agree"} <= set(sweep)
    assert next(c for c in checks if c["check"] == "losses of one function agree")["verdict"] == "ok"
    decode = {c["check"] for c in checks if c["stage"] == "decode"}
    assert {"eager decoding, batch 1, greedy", "compiled decoding, batch 1, greedy"} <= decode
    loss = next(c for c in checks if c["stage"] == "loss")
    assert loss["check"].startswith("trainer.loss_chunk=16: the step with the head and loss in chunks of 16 tokens")
    assert "x its time" in loss["measured"]
    mode = next(c for c in checks if c["stage"] == "mode")
    assert mode["check"] == ("trainer.compile_mode=reduce-overhead: the step with inductor's mode reduce-overhead vs "
                             "the default mode")
    optim = [c["check"] for c in checks if c["stage"] == "optim" and c["check"] != "time"]
    assert optim == ["training step: Muon (split qkv) vs AdamW", "optimizer step alone: Muon (split qkv) vs AdamW"]
    if not torch.cuda.is_available():
        assert next(c for c in checks if c["stage"] == "tests")["verdict"] == "NOT RUN"
    table = (out / "gpu_story.md").read_text()
    assert "| stage | check | measured | goal | verdict |" in table and "--quick" in table
    assert not list((out / "sweep" / "sweep").glob("*/*.pt")), "the sweep's checkpoints are not the story"
    assert result.stdout.rstrip().endswith("(gpu_story.md, gpu_story.json, each stage's output)")


def test_a_story_that_measured_nothing_says_why_and_what_to_change_and_fails(tmp_path):
    """Out of time before any stage measured (a busy CPU killed every stage at its share): not a table of NOT RUN
    and exit 0 after the whole budget, but one line naming --budget and a quieter machine, and exit 1."""
    out = tmp_path / "story"
    result = run_script("gpu_story.py", "--quick", "--device", "cpu", "--budget", "0.5", "--stages", "step", "loss",
                        "--out", str(out), cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: nothing was measured (step: no time left of --budget 0.5 s; loss: "), line
    assert "step, loss ran out of --budget 0.5 s" in line and line.endswith("give it more time (--budget 1)"), line
    checks = json.loads((out / "gpu_story.json").read_text())["checks"]
    assert [c["verdict"] for c in checks] == ["NOT RUN", "NOT RUN"], "the table is written all the same"


def test_a_stage_killed_at_its_share_of_the_budget_keeps_its_output_as_text(tmp_path):
    """subprocess gives a killed process's output as bytes even with text=True: its log is that text, not a
    Python bytes literal."""
    from measuring import story, story_stages

    printing = [sys.executable, "-S", "-c", "import time; print('halfway there', flush=True); time.sleep(60)"]
    stage = story_stages.Stage("stalled", 1.0, lambda args, out: printing, lambda args, out: [])
    (check,) = story.run_stage(stage, story.parse_args([]), tmp_path, seconds=2)
    assert check.verdict == "NOT RUN" and check.measured == "still running after 2 s: killed"
    assert (tmp_path / "stalled" / "output.log").read_text() == "halfway there\n"


def test_a_stage_error_is_said_in_this_scripts_options():
    """The data's offline error (GPT-2's ranks cannot be fetched; the suite's tiktoken cache is empty) offers its
    offline tokenizer as gpu_story.py spells it: --tokenizer bytes, not data.tokenizer=bytes, which it refuses."""
    from data.tokenizers import get_tokenizer
    from measuring import story, story_stages

    with pytest.raises(RuntimeError) as err:
        get_tokenizer("gpt2")
    said = story_stages.last_line(f"some progress\nerror: {err.value}")
    assert said.startswith("tokenizer 'gpt2' needs its rank file") and "data.tokenizer" not in said, said
    assert said.endswith("offline, --tokenizer bytes needs no download"), said
    assert story.parse_args(["--tokenizer", "bytes"]).tokenizer == "bytes", "the option it names is this script's"


@pytest.mark.slow
def test_a_data_preparation_error_names_this_scripts_option_not_train_pys(tmp_path):
    """The same, end to end: gpu_story.py prepares its data with python -m data, offline."""
    result = run_script("gpu_story.py", "--device", "cpu", "--stages", "plain", "--out", str(tmp_path / "story"),
                        cwd=tmp_path, env=user_env(TIKTOKEN_CACHE_DIR=str(tmp_path / "empty")))  # fmt: skip
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: preparing the sweep's data (--data pystdlib --tokenizer gpt2) failed: tokenizer "
                           "'gpt2' needs its rank file"), line
    assert line.endswith("offline, --tokenizer bytes needs no download") and "data.tokenizer" not in line, line


def test_help_gives_each_options_default(capsys):
    from measuring import story

    with pytest.raises(SystemExit):
        story.parse_args(["--help"])
    said = " ".join(capsys.readouterr().out.split())  # argparse wraps its lines at the terminal's width
    for option, default in (("--device", "auto"), ("--dtype", "auto"), ("--budget", "600"), ("--steps", "30"),
                            ("--data", "pystdlib"), ("--tokenizer", "gpt2"),
                            ("--stages", "tests sweep decode step loss mode plain optim")):  # fmt: skip
        assert f"(default: {default})" in said.split(f" {option} ", 1)[1].split(" --", 1)[0], (option, said)
    assert "(default: None)" not in said and "(default: False)" not in said
