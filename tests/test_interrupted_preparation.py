"""Data preparation stops cleanly: Ctrl-C and SIGTERM leave no process and no half-written directory;
after SIGKILL the tokenizer processes die with their parent and the next preparation sweeps the leftovers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT

from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for child processes")


def big_corpus(folder: Path) -> Path:
    folder.mkdir()
    line = "".join(f"def function_{i}(value):\n    return value * {i} + {i * i}  # a line of code\n" for i in range(40))
    for i in range(300):
        (folder / f"{i:03d}.txt").write_text(line * 40)  # ~300 files of ~120 kB: seconds of tokenizing
    return folder


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def start_preparation(tmp_path: Path) -> tuple[subprocess.Popen, Path, list[int]]:
    corpus = big_corpus(tmp_path / "corpus")
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "data", "data=files", f"data.path={corpus}", "data.tokenizer=bytes",
           "data.num_proc=2", f"data.cache_dir={cache}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    workers: list[int] = []
    while time.time() < deadline and len(workers) < 2:
        assert proc.poll() is None, proc.communicate()
        workers = children(proc.pid)
        time.sleep(0.05)
    assert len(workers) >= 2, "the tokenizer processes started"
    return proc, cache, workers


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_ends_preparation_promptly_with_no_process_or_partial_left(tmp_path, sig):
    proc, cache, workers = start_preparation(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert err.strip().splitlines()[-1].startswith("interrupted: data preparation interrupted by signal")
    time.sleep(0.5)
    assert not [w for w in workers if alive(w)], "no tokenizer process left"
    assert not [p.name for p in cache.iterdir() if ".tmp-" in p.name], "no half-written directory"
    assert not list(cache.glob("*/meta.json")), "nothing that looks prepared"


def test_after_sigkill_workers_die_and_the_next_run_sweeps_the_partial_directory(tmp_path):
    proc, cache, workers = start_preparation(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.time() + 10
    while time.time() < deadline and any(alive(w) for w in workers):
        time.sleep(0.1)
    assert not [w for w in workers if alive(w)], "the tokenizer processes died with their parent"
    leftovers = [p for p in cache.iterdir() if ".tmp-" in p.name]
    assert leftovers, "SIGKILL cannot clean up: a partial directory is left"
    prepared = PreparedData(prepare(DataConfig(name="files", source="files", path=str(tmp_path / "corpus"),
                                               tokenizer="bytes", num_proc=1, cache_dir=str(cache))))  # fmt: skip
    assert prepared.meta["splits"]["train"]["tokens"] > 0
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name], "the dead process's partial directory is gone"
