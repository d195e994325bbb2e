"""Data preparation stops cleanly: Ctrl-C and SIGTERM end it promptly, leave no process and no half-written
directory; after SIGKILL the next preparation sweeps the dead process's partial directory."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT
from warm_python import WarmProcess, start_python

import data.prepare
from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import PreparationInterrupted, prepare

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for child processes")


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory) -> Path:
    """~600 files of ~120 kB: seconds of tokenizing. Written once; each test prepares it into a cache of its own."""
    folder = tmp_path_factory.mktemp("big") / "corpus"
    folder.mkdir()
    line = "".join(f"def function_{i}(value):\n    return value * {i} + {i * i}  # a line of code\n" for i in range(40))
    for i in range(600):
        (folder / f"{i:03d}.txt").write_text(line * 40)
    return folder


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def start_preparation(corpus: Path | str, tmp_path: Path) -> tuple[WarmProcess, Path]:
    """``python -m data`` on a large corpus (a folder or a glob), in a process of its own (forked from the warm
    interpreter: tests/warm_python.py), returned once it is writing its partial directory."""
    cache = tmp_path / "cache"
    cmd = ["-m", "data", "data=files", f"data.path='{corpus}'", "data.tokenizer=bytes", "data.num_proc=2",
           f"data.cache_dir={cache}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = start_python(cmd, cwd=ROOT, env=env)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (cache.exists() and any(".tmp-" in p.name for p in cache.iterdir())):
            assert proc.running(), proc.wait()
            time.sleep(0.05)
        time.sleep(0.3)  # into loading and tokenizing
        assert proc.running(), "still preparing when the signal comes"
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()  # the warm interpreter serves the next command only once this one is reaped
        raise
    return proc, cache


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_ends_preparation_promptly_with_no_process_or_partial_left(big_corpus, tmp_path, sig):
    proc, cache = start_preparation(big_corpus, tmp_path)
    helpers_before = children(proc.pid)
    sent = time.time()
    os.kill(proc.pid, sig)
    ended = proc.wait(timeout=30)
    err = ended.stderr
    assert time.time() - sent < 10, "promptly"
    assert ended.returncode != 0
    assert err.strip().splitlines()[-1].startswith("interrupted: data preparation interrupted by signal")
    assert helpers_before == [], "tokenizing runs on threads: there is no process to leave behind"
    assert not [p.name for p in cache.iterdir() if ".tmp-" in p.name], "no half-written directory"
    assert not list(cache.glob("*/meta.json")), "nothing that looks prepared"


@pytest.mark.parametrize("library", ["swallows it", "raises another error"])
def test_a_stop_signal_that_a_library_catches_still_interrupts(tmp_path, monkeypatch, library):
    # datasets did both while loading (CI, stop 58): an import caught the interruption and loading went on to
    # prepare everything; listing files turned it into "FileNotFoundError: Unable to find ...".
    (tmp_path / "a.txt").write_text("some text\n" * 50)
    real_load = data.prepare.load_documents

    def loading_that_catches(cfg):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler runs here, at once
        except KeyboardInterrupt as caught:
            if library == "raises another error":
                raise FileNotFoundError("Unable to find a.txt") from caught
        return real_load(cfg)

    monkeypatch.setattr(data.prepare, "load_documents", loading_that_catches)
    cache = tmp_path / "cache"
    cfg = DataConfig(name="files", source="files", path=str(tmp_path / "a.txt"), tokenizer="bytes", num_proc=1,
                     cache_dir=str(cache))  # fmt: skip
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(PreparationInterrupted, match="interrupted by signal 2; nothing was kept"):
        prepare(cfg)
    assert not [p.name for p in cache.iterdir() if ".tmp-" in p.name], "no half-written directory"
    assert not list(cache.glob("*/meta.json")), "nothing that looks prepared"
    assert signal.getsignal(signal.SIGINT) is before, "the handler before it is back"


@pytest.mark.slow
def test_after_sigkill_the_next_preparation_sweeps_the_partial_directory(big_corpus, tmp_path):
    # A third of the corpus (files 000-199, ~24 MB): still a second or more of preparing when the kill comes, and
    # the next preparation, which prepares it all, has a third of the work.
    corpus = str(big_corpus / "[01]*.txt")
    proc, cache = start_preparation(corpus, tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30).returncode == -signal.SIGKILL
    leftovers = [p for p in cache.iterdir() if ".tmp-" in p.name]
    assert leftovers, "SIGKILL cannot clean up: a partial directory is left"
    prepared = PreparedData(prepare(DataConfig(name="files", source="files", path=corpus,
                                               tokenizer="bytes", num_proc=1, cache_dir=str(cache))))  # fmt: skip
    assert prepared.meta["splits"]["train"]["tokens"] > 0
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name], "the dead process's partial directory is gone"


def test_a_stop_signal_after_the_rename_says_the_prepared_directory_was_kept(tmp_path, monkeypatch):
    # The rename is the last step: a signal that lands after it (before the handlers are restored) still interrupts,
    # but the directory is complete and stays, and the message says so instead of "nothing was kept".
    (tmp_path / "a.txt").write_text("some text\n" * 50)
    real_rename = os.rename

    def rename_then_signal(source, destination):
        real_rename(source, destination)
        if Path(destination).parent == tmp_path / "cache":  # the prepared directory's (not datasets' own renames)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs here, at once

    monkeypatch.setattr(data.prepare.os, "rename", rename_then_signal)
    cfg = DataConfig(name="files", source="files", path=str(tmp_path / "a.txt"), tokenizer="bytes", num_proc=1,
                     cache_dir=str(tmp_path / "cache"))  # fmt: skip
    with pytest.raises(PreparationInterrupted, match=r"as data preparation finished; .* was kept$"):
        prepare(cfg)
    (kept,) = (tmp_path / "cache").glob("*/meta.json")
    assert PreparedData(kept.parent).meta["splits"]["train"]["tokens"] > 0
