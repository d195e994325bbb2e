"""The house's seams: one model loader for every script, old spellings named, ranks prepare data safely."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, TINY, compose_train, read_metrics, run_cli, run_script, save_tiny_hf_gpt2, write_text_corpus

import heads
from data.config import DataConfig
from model import load_model
from training.loop import train


@pytest.mark.parametrize(
    "script,arg,message",
    [
        ("train.py", "attention.kernel=manual", "attention.kernel=manual was renamed: use kernel=manual"),
        ("train.py", "attention.layout=wrapper", "attention.layout=wrapper was renamed: use attention=wrapper"),
        ("sample.py", "layout=wrapper", "layout=wrapper was renamed: use attention=wrapper"),
    ],
)
def test_old_spellings_are_a_one_line_error_naming_the_new_one(tmp_path, script, arg, message):
    result = run_script(script, arg, cwd=tmp_path, env=dict(os.environ), timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip() == f"error: {message}"


def test_the_loader_reads_run_directories_and_checkpoint_files_alike(trained_run):
    by_dir = load_model(str(trained_run), attention="wrapper", kernel="manual")
    by_file = load_model(str(trained_run / "last.pt"))
    assert by_dir.step == by_file.step and by_dir.tokenizer.name == "bytes"
    assert by_dir.model.config.attention == "wrapper" and by_file.model.config.attention == "fused_qkv"
    idx = torch.randint(0, 257, (2, 16))
    torch.testing.assert_close(by_dir.model(idx, idx)[1], by_file.model(idx, idx)[1], rtol=1e-5, atol=1e-5)
    assert load_model(str(trained_run), checkpoint="best.pt").path.name == "best.pt"


def test_heads_studies_a_save_pretrained_gpt2_through_the_same_loader(tmp_path, gpt2_tokenizer_offline):
    pytest.importorskip("transformers")
    save_tiny_hf_gpt2(tmp_path / "gpt2-tiny")
    corpus = write_text_corpus(tmp_path / "corpus", 30, "Document {i}: the quick brown fox jumps over a dog. " * 8)
    data = DataConfig(name="corpus", source="files", path=str(corpus), tokenizer="bytes", num_proc=1,
                      cache_dir=str(tmp_path / "cache"))  # fmt: skip
    out = heads.run(heads.HeadsConfig(source=str(tmp_path / "gpt2-tiny"), data=data, windows=2, device="cpu",
                                      attention="wrapper", out=str(tmp_path / "out")))  # fmt: skip
    assert (out / "maps.png").stat().st_size > 0
    assert len((out / "ablation.csv").read_text().splitlines()) == 1 + 2 * 2
    assert "gpt2-" in " ".join(p.name for p in (tmp_path / "cache").iterdir()), "tokenized with the model's gpt2"


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on loopback")
def test_two_gloo_ranks_prepare_an_unprepared_corpus_once_without_a_collective(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(40):
        (corpus / f"{i}.txt").write_text(f"def function_{i}(x):\n    return x * {i} + {i * i}\n" * 5)
    cache = tmp_path / "cache"
    args = [*TINY, "logger=none", "data=files", f"data.path={corpus}", "data.tokenizer=bytes", "data.num_proc=1",
            f"data.cache_dir={cache}", "trainer.batch_size=16", "trainer.max_steps=4",
            f"trainer.run_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(ROOT / "train.py"), *args]  # fmt: skip
    result = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    prepared = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert len(prepared) == 1 and (prepared[0] / "meta.json").exists()
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name], "no half-written directory left"
    assert len([m for m in read_metrics(tmp_path / "run") if "train/loss" in m]) == 4


def test_a_run_directory_holding_another_run_is_refused(tmp_path, data_cache):
    cfg = compose_train(*TINY, "logger=none", "trainer.max_steps=2", f"trainer.run_dir={tmp_path / 'run'}",
                        f"data.cache_dir={data_cache}")  # fmt: skip
    train(cfg)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"already holds another run.*trainer.resume=.*run"):
        train(cfg)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before, "nothing appended"


def test_a_resume_with_nothing_left_to_do_says_so(tmp_path, data_cache):
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=3", f"trainer.run_dir={tmp_path / 'run'}",
                        f"data.cache_dir={data_cache}"))  # fmt: skip
    with pytest.raises(ValueError, match="nothing to resume: .* is at step 3, trainer.max_steps=3"):
        train(compose_train(*TINY, "logger=none", "trainer.max_steps=3", f"trainer.resume={tmp_path / 'run'}",
                            f"trainer.run_dir={tmp_path / 'again'}", f"data.cache_dir={data_cache}"))  # fmt: skip


def test_help_of_train_names_the_new_spellings(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert "attention=wrapper kernel=manual" in result.stdout


_CLOSE_SCRIPT = """
import os, sys, time
import torch
import torch.distributed as dist
from training.distributed import from_environment, init_distributed
state = from_environment()
init_distributed(state, torch.device("cpu"))
if sys.argv[1] == "failed" and state.rank == 1:
    os._exit(0)  # a rank that died: it never reaches the barrier
start = time.monotonic()
state.close(finished=sys.argv[1] == "finished")
print(f"rank {state.rank} closed in {time.monotonic() - start:.1f} s; group left: {not dist.is_initialized()}")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="gloo on loopback")
@pytest.mark.parametrize("how", ["finished", "failed"])
def test_ranks_leave_the_process_group_together_and_a_failed_rank_does_not_wait(tmp_path, how):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}  # fmt: skip
    ranks = [subprocess.Popen([sys.executable, "-c", _CLOSE_SCRIPT, how], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]  # fmt: skip
    # On the failed path a barrier would wait for a dead peer (or fail when its connection drops).
    outs = [rank.communicate(timeout=120) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], outs
    printed = [out.strip() for out, _ in outs]
    assert printed[0].startswith("rank 0 closed") and printed[0].endswith("group left: True")
    if how == "finished":
        assert printed[1].startswith("rank 1 closed") and printed[1].endswith("group left: True")
