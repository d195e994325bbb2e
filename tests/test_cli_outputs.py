"""Where the scripts put what they write, and who can read it: evaluate.py beside the weights it evaluated,
never loose in the current directory; export.py's files all follow the umask (safetensors wrote 0600)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest
from helpers import run_script


def script(name: str, *args: str, cwd: Path, umask: int = 0o022) -> subprocess.CompletedProcess:
    return run_script(name, *args, cwd=cwd, umask=umask)


def modes(folder: Path) -> dict[str, int]:
    return {path.name: stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir()}


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_every_exported_file_has_the_mode_the_umask_gives(trained_run, tmp_path, umask, mode):
    result = script("export.py", f"source={trained_run}", f"out={tmp_path / 'hf'}", cwd=tmp_path, umask=umask)
    assert result.returncode == 0, result.stderr
    written = modes(tmp_path / "hf")
    assert "model.safetensors" in written
    assert written == dict.fromkeys(written, mode), f"umask {umask:o}: {written}"


def test_evaluate_of_an_hf_folder_writes_into_that_folder_and_says_so(trained_run, tmp_path, data_cache):
    assert script("export.py", f"source={trained_run}", f"out={tmp_path / 'hf'}", cwd=tmp_path).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = script("evaluate.py", f"source={tmp_path / 'hf'}", "windows=2", "device=cpu",
                    f"data.cache_dir={data_cache}", cwd=elsewhere)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "hf" / "eval-pystdlib.json").is_file()
    assert f"written to {tmp_path / 'hf' / 'eval-pystdlib.json'}" in result.stdout
    assert list(elsewhere.iterdir()) == [], "nothing loose in the current directory"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder: nothing to fall back from")
def test_evaluate_of_a_read_only_folder_writes_to_eval_out(trained_run, tmp_path, data_cache):
    assert script("export.py", f"source={trained_run}", f"out={tmp_path / 'hf'}", cwd=tmp_path).returncode == 0
    (tmp_path / "hf").chmod(0o555)
    try:
        result = script("evaluate.py", f"source={tmp_path / 'hf'}", "windows=2", "device=cpu",
                        f"data.cache_dir={data_cache}", cwd=tmp_path)  # fmt: skip
    finally:
        (tmp_path / "hf").chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "eval-out" / "eval-hf-pystdlib.json").is_file()
    assert "is not writable: the result goes to eval-out/" in result.stderr


def test_evaluate_of_a_hub_name_writes_to_eval_out_not_the_current_directory():
    import evaluate
    from data.config import DataConfig

    cfg = evaluate.EvaluateConfig(source="openai-community/gpt2-medium", data=DataConfig(name="tinyshakespeare"))
    assert evaluate.default_out(cfg, None) == Path("eval-out/eval-gpt2-medium-tinyshakespeare.json")


@pytest.mark.parametrize("args,says", [
    (["model.n_head=5"], "error: n_embd=128 is not divisible by n_head=5"),  # refused
    (["trainer.plan=true"], "sampling's KV cache"),  # a plan: the whole answer is printed
    (["experiment=compare_attention"], "run it with -m"),  # a sweep preset without -m
    (["-m", "experiment=compare_attention", "trainer.plan=true"], "sampling's KV cache"),  # each job's plan
])  # fmt: skip
@pytest.mark.slow
def test_a_command_that_ends_without_a_run_leaves_no_run_folder(args, says, tmp_path):
    result = script("train.py", *args, "model=nano", "logger=none", cwd=tmp_path)
    assert says in result.stdout + result.stderr, result.stderr[-2000:]
    assert "the sweep has ended" not in result.stdout, "no runs to compare"
    assert [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")] == [], "nothing that looks like a run"


def test_a_refused_command_keeps_the_folders_of_earlier_runs(tmp_path):
    earlier = tmp_path / "runs" / "2026-01-01" / "00-00-00_fused_qkv-sdpa"
    earlier.mkdir(parents=True)
    (earlier / "run.json").write_text("{}")
    result = script("train.py", "model=nano", "logger=none", "model.n_head=5", cwd=tmp_path)
    assert result.returncode == 1
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["2026-01-01"] and (earlier / "run.json").exists()
