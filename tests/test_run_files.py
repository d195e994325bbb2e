"""The run directory's one owner (common/run_files.py): its names are the files on disk, its lock is the one the
trainer takes and the reports read, and its writes never leave half a file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import TINY, compose_train
from warm_python import run_python

from analysis.runs import load_run
from common import run_files
from common.run_files import directory_in_use, remove_leftovers, temporary_name, write_atomically, write_json
from training.loop import train
from training.run_log import claim_run_dir


def test_the_names_are_the_files_a_run_writes_and_the_report_reads(trained_run):
    on_disk = {p.name for p in trained_run.iterdir()}
    names = {run_files.RUN_INFO, run_files.METRICS, run_files.LAST, run_files.BEST, run_files.OWNER}
    assert names == {"run.json", "metrics.jsonl", "last.pt", "best.pt", ".headlab-run"}, "the on-disk format"
    assert names <= on_disk
    assert not [name for name in on_disk if run_files.TMP_MARK in name], "no temporary left behind"
    run = load_run(trained_run)
    assert run.state == "finished" and run.last_step == 30


def test_a_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    path = write_json(tmp_path / "run.json", {"status": "running"})

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text('{"stat')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, half_then_fail)
    assert json.loads(path.read_text()) == {"status": "running"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


def test_a_figure_temporary_keeps_its_suffix_for_the_format():
    assert temporary_name(Path("out/loss.png"), keep_suffix=True).name == f".loss.tmp-{os.getpid()}.png"
    assert temporary_name(Path("out/last.pt")).name == f".last.pt.tmp-{os.getpid()}"


def test_only_a_dead_process_s_temporaries_are_removed(tmp_path):
    dead = run_python(["-c", "import os; print(os.getpid())"], cwd=tmp_path)
    gone = tmp_path / f".last.pt{run_files.TMP_MARK}{int(dead.stdout)}"
    mine = tmp_path / f".best.pt{run_files.TMP_MARK}{os.getpid()}"
    for path in (gone, mine):
        path.write_bytes(b"half a checkpoint")
    assert run_files.remove_stale_checkpoints(tmp_path) == [gone]
    assert mine.exists() and not gone.exists()
    assert remove_leftovers(tmp_path, "*") == [], "a live process's temporary is its own"


def test_the_reports_see_the_lock_the_trainer_takes(tmp_path):
    run_dir = tmp_path / "run"
    claim = claim_run_dir(str(run_dir))
    try:
        assert directory_in_use(run_dir)
    finally:
        claim.release()
    assert not directory_in_use(run_dir)


def test_a_run_killed_while_running_reads_as_killed_once_its_lock_is_gone(tmp_path, data_cache):
    run_dir = tmp_path / "run"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=2", f"trainer.run_dir={run_dir}",
                        f"data.cache_dir={data_cache}"))  # fmt: skip
    info = json.loads((run_dir / "run.json").read_text())
    write_json(run_dir / "run.json", {**info, "status": "running"})  # as a SIGKILL leaves it
    assert load_run(run_dir).state == "killed"
    held = claim_run_dir(str(run_dir), continuing=True)
    try:
        assert load_run(run_dir).state == "running"
    finally:
        held.release()


def test_the_profile_folder_holds_exactly_the_named_files_and_no_temporary(tmp_path):
    import torch

    from training.profiling import StepProfiler

    out = tmp_path / run_files.PROFILE
    profiler = StepProfiler(torch.device("cpu"), out, first_step=0, start=0, steps=1)
    step_ms: list[float] = []
    with profiler.around(1, step_ms):
        torch.randn(32, 32) @ torch.randn(32, 32)
        step_ms.append(1.0)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [run_files.PROFILE_SUMMARY, run_files.PROFILE_TABLE, run_files.PROFILE_TRACE])
    assert json.loads((out / run_files.PROFILE_SUMMARY).read_text()) == profiler.summary
    assert "traceEvents" in json.loads((out / run_files.PROFILE_TRACE).read_text())
