"""The house's seams: one model loader for every script, old spellings named, ranks prepare data safely."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
from helpers import TINY, compose_train, run_cli, run_script, save_tiny_hf_gpt2, write_text_corpus
from warm_python import run_python

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
@pytest.mark.slow
def test_old_spellings_are_a_one_line_error_naming_the_new_one(tmp_path, script, arg, message):
    result = run_script(script, arg, cwd=tmp_path, env=dict(os.environ), timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip() == f"error: {message}"


@pytest.mark.slow
def test_the_loader_reads_run_directories_and_checkpoint_files_alike(trained_run):
    by_dir = load_model(str(trained_run), attention="wrapper", kernel="manual")
    by_file = load_model(str(trained_run / "last.pt"))
    assert by_dir.step == by_file.step and by_dir.tokenizer.name == "bytes"
    assert by_dir.model.config.attention == "wrapper" and by_file.model.config.attention == "fused_qkv"
    idx = torch.randint(0, 257, (2, 16))
    torch.testing.assert_close(by_dir.model(idx, idx)[1], by_file.model(idx, idx)[1], rtol=1e-5, atol=1e-5)
    assert load_model(str(trained_run), checkpoint="best.pt").path.name == "best.pt"


@pytest.mark.slow
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


# That two gloo ranks prepare an unprepared corpus once, without a collective, is proven by the torchrun run of
# tests/test_train_run.py::test_two_gloo_ranks_match_one_process_with_another_split_of_the_batch (one torchrun for
# both).


@pytest.mark.slow
def test_a_run_directory_holding_another_run_is_refused(tmp_path, data_cache):
    cfg = compose_train(*TINY, "logger=none", "trainer.max_steps=2", f"trainer.run_dir={tmp_path / 'run'}",
                        f"data.cache_dir={data_cache}")  # fmt: skip
    train(cfg)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"already holds another run.*trainer.resume=.*run"):
        train(cfg)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before, "nothing appended"


@pytest.mark.slow
def test_a_resume_with_nothing_left_to_do_says_so(tmp_path, data_cache):
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=3", f"trainer.run_dir={tmp_path / 'run'}",
                        f"data.cache_dir={data_cache}"))  # fmt: skip
    with pytest.raises(ValueError, match="nothing to resume: .* is at step 3, trainer.max_steps=3"):
        train(compose_train(*TINY, "logger=none", "trainer.max_steps=3", f"trainer.resume={tmp_path / 'run'}",
                            f"trainer.run_dir={tmp_path / 'again'}", f"data.cache_dir={data_cache}"))  # fmt: skip


@pytest.mark.slow
def test_help_of_train_names_the_new_spellings(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert "attention=wrapper kernel=manual" in result.stdout


# Two ranks in two processes: the warm interpreter's fork of this script (tests/warm_python.py) forks rank 1, so
# neither pays for importing torch; each joins the gloo group on its own connection, as torchrun's ranks do.
_CLOSE_SCRIPT = """
import os, sys, time
import torch
import torch.distributed as dist
from training.distributed import from_environment, init_distributed
how, port = sys.argv[1:]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2")
joined, join = os.pipe()  # rank 1 says it has joined: rank 0 leaving earlier would fail rank 1's own joining
peer = os.fork()
os.environ["RANK"] = "1" if peer == 0 else "0"
state = from_environment()
init_distributed(state, torch.device("cpu"))
if how == "failed" and state.rank == 1:
    os.write(join, b"1")
    os._exit(0)  # a rank that died: it never reaches the barrier
if how == "failed":
    os.read(joined, 1)
start = time.monotonic()
state.close(finished=how == "finished")
said = f"rank {state.rank} closed in {time.monotonic() - start:.1f} s; group left: {not dist.is_initialized()}\\n"
os.write(1, said.encode())  # one write: the ranks share stdout, and print may write the line and its end apart
if state.rank == 1:
    os._exit(0)
print(f"rank 1 exited with {os.waitstatus_to_exitcode(os.waitpid(peer, 0)[1])}")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="gloo on loopback")
@pytest.mark.parametrize("how", [pytest.param("finished", marks=pytest.mark.slow), "failed"])
def test_ranks_leave_the_process_group_together_and_a_failed_rank_does_not_wait(tmp_path, how):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # On the failed path a barrier would wait for a dead peer (or fail when its connection drops).
    result = run_python(["-c", _CLOSE_SCRIPT, how, str(port)], cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    printed = result.stdout.strip().splitlines()
    assert printed[-1] == "rank 1 exited with 0", (printed, result.stderr[-3000:])
    (rank0,) = [line for line in printed if line.startswith("rank 0 closed")]
    assert rank0.endswith("group left: True")
    if how == "finished":
        (rank1,) = [line for line in printed if line.startswith("rank 1 closed")]
        assert rank1.endswith("group left: True")
