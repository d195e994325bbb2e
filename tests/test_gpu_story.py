"""gpu_story.py, the GPU story in one command, run end to end at its toy shape on this CPU: every stage a process of
its own, its output read into one table of checks with verdicts, written where docs/results.md can quote it."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import run_script


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
