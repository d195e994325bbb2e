"""A sweep refuses a job's bad value before its first job trains (cli/sweep_start.py): every job's config is composed
and checked when the multirun starts."""

from __future__ import annotations

from helpers import TINY, run_script


def test_a_sweep_whose_later_job_the_config_refuses_starts_no_job_and_names_it(tmp_path):
    result = run_script("train.py", "-m", "model.window=8,0", *TINY, "logger=none", cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith("error: job 1 of 2 (model.window=0 ")
    assert "model.window=0 must be a positive number of positions" in result.stderr
    assert "no job of the sweep was started" in result.stderr
    assert not (tmp_path / "multirun").exists(), "nothing trained, nothing written"


def test_a_presets_sweep_is_checked_with_the_command_lines_values(tmp_path):
    result = run_script("train.py", "-m", "experiment=compare_attention_2026", "model.n_head=3", "model.n_embd=48",
                        "logger=none", cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0 and "error: job 4 of 30 (attention_2026=differential trainer.seed=1" in result.stderr
    assert "model.n_head=3 is odd" in result.stderr and not (tmp_path / "multirun").exists()
