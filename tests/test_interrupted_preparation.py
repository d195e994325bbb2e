"""Data preparation stops cleanly: Ctrl-C and SIGTERM end it promptly, leave no process and no half-written
directory; after SIGKILL the next preparation sweeps the dead process's partial directory."""

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
    for i in range(600):
        (folder / f"{i:03d}.txt").write_text(line * 40)  # ~600 files of ~120 kB: seconds of tokenizing
    return folder


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def start_preparation(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """``python -m data`` on a large corpus, returned once it is writing its partial directory."""
    corpus = big_corpus(tmp_path / "corpus")
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "data", "data=files", f"data.path={corpus}", "data.tokenizer=bytes",
           "data.num_proc=2", f"data.cache_dir={cache}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (cache.exists() and any(".tmp-" in p.name for p in cache.iterdir())):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.3)  # into loading and tokenizing
    assert proc.poll() is None, "still preparing when the signal comes"
    return proc, cache


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_ends_preparation_promptly_with_no_process_or_partial_left(tmp_path, sig):
    proc, cache = start_preparation(tmp_path)
    helpers_before = children(proc.pid)
    sent = time.time()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert time.time() - sent < 10, "promptly"
    assert proc.returncode != 0
    assert err.strip().splitlines()[-1].startswith("interrupted: data preparation interrupted by signal")
    assert helpers_before == [], "tokenizing runs on threads: there is no process to leave behind"
    assert not [p.name for p in cache.iterdir() if ".tmp-" in p.name], "no half-written directory"
    assert not list(cache.glob("*/meta.json")), "nothing that looks prepared"


def test_after_sigkill_the_next_preparation_sweeps_the_partial_directory(tmp_path):
    proc, cache = start_preparation(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    leftovers = [p for p in cache.iterdir() if ".tmp-" in p.name]
    assert leftovers, "SIGKILL cannot clean up: a partial directory is left"
    prepared = PreparedData(prepare(DataConfig(name="files", source="files", path=str(tmp_path / "corpus"),
                                               tokenizer="bytes", num_proc=1, cache_dir=str(cache))))  # fmt: skip
    assert prepared.meta["splits"]["train"]["tokens"] > 0
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name], "the dead process's partial directory is gone"
