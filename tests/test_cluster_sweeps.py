"""Sweeps through Hydra's submitit launcher: on a real (single-node) SLURM, and in parallel on one machine.

The SLURM tests start slurmctld, slurmd and munged for the session (the ``slurm`` fixture) and skip, with
the reason, where they cannot (not root, or no ``apt-get install -y slurm-wlm munge``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TINY, compose_train, read_metrics, run_cli, train_losses
from warm_python import WarmProcess, start_python

import compare
from training import slurm as slurm_support
from training.distributed import from_environment
from training.gpu_slots import _held, claim_free_slot
from training.loop import train

pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="Hydra's submitit launcher (the cluster extra)")

# One CPU and a little memory per job, no GPU: what the test cluster has.
ON_TEST_CLUSTER = ["hydra/launcher=submitit_slurm", "hydra.launcher.gpus_per_node=null",
                   "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", "logger=none"]  # fmt: skip


def sweep(cwd: Path, env: dict, *args: str) -> WarmProcess:
    """``python train.py -m *args``, forked from the warm interpreter (tests/warm_python.py). This process only
    submits the jobs and waits for them; each job is a fresh process that SLURM (or submitit_local) starts. The
    env differs from the warm interpreter's in PATH (the sacct shim, looked up when sacct runs) or in
    OMP_NUM_THREADS (read by the jobs' own fresh interpreters), nothing the sweep's imports read."""
    return start_python([str(ROOT / "train.py"), "-m", *args], cwd=cwd, env=env)


@pytest.fixture
def slurm(slurm):
    """The session's cluster, with no job of this test left queued or running after it (a test that fails
    mid-sweep would leave one to the next test)."""
    yield slurm
    for job in slurm.job_ids():
        slurm.run("scancel", job, check=False)


def finish(proc: WarmProcess, timeout: int = 240) -> tuple[int, str, str]:
    done = proc.wait(timeout)
    return done.returncode, done.stdout, done.stderr


@contextlib.contextmanager
def one_thread():
    """As each SLURM task computes (cpus_per_task=1). Under pytest -n 0 this process has a thread per core, and
    on a busy 2-core machine those threads spin more than they compute (ten times the CPU per step, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def spans_overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


@pytest.mark.slow
def test_a_slurm_sweep_runs_its_jobs_in_parallel_and_the_report_flags_that_they_shared_a_machine(
        slurm, tmp_path, data_cache):  # fmt: skip
    env = {**os.environ, **slurm.env}
    code, out, err = finish(sweep(tmp_path, env, *ON_TEST_CLUSTER, *TINY, "attention=wrapper,fused_qkv",
                                  "trainer.max_steps=60", f"data.cache_dir={data_cache}",
                                  f"hydra.sweep.dir={tmp_path / 'sweep'}"))  # fmt: skip
    assert code == 0, err[-3000:]
    infos = [json.loads((tmp_path / "sweep" / name / "run.json").read_text())
             for name in ("0_wrapper-sdpa", "1_fused_qkv-sdpa")]  # fmt: skip
    assert [i["status"] for i in infos] == ["finished", "finished"]
    (a,), (b,) = (i["segments"] for i in infos)
    assert a["slurm"]["job_id"] != b["slurm"]["job_id"] and spans_overlap(a, b), "two SLURM jobs at the same time"
    report = (compare.main([str(tmp_path / "sweep")]) / "report.md").read_text()
    for variant, other in (("wrapper-sdpa", "fused_qkv-sdpa"), ("fused_qkv-sdpa", "wrapper-sdpa")):
        row = next(line for line in report.splitlines() if line.startswith(f"| {variant} |"))
        assert f"ran alongside {other} (seed 1337)" in row and "its speed is not comparable" in row


@pytest.mark.slow
def test_a_slurm_job_of_two_tasks_is_one_ddp_run(slurm, tmp_path, data_cache):
    common = [*TINY, "trainer.batch_size=16", "trainer.micro_batch_size=8", "trainer.max_steps=6",
              "trainer.eval_interval=3", "trainer.eval_windows=3", f"data.cache_dir={data_cache}"]  # fmt: skip
    env = {**os.environ, **slurm.env}
    code, out, err = finish(sweep(tmp_path, env, *ON_TEST_CLUSTER, *common, "hydra.launcher.tasks_per_node=2",
                                  f"hydra.sweep.dir={tmp_path / 'sweep'}"))  # fmt: skip
    assert code == 0, err[-3000:]
    (run_dir,) = [p for p in (tmp_path / "sweep").iterdir() if (p / "run.json").exists()]
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 2
    with one_thread():
        train(compose_train(*common, "logger=none", f"trainer.run_dir={tmp_path / 'single'}"))  # accumulation 2
    for key in ("train/loss", "val/loss"):
        ddp = [m[key] for m in read_metrics(run_dir) if key in m]
        single = [m[key] for m in read_metrics(tmp_path / "single") if key in m]
        assert len(ddp) == len(single) > 0 and ddp == pytest.approx(single, abs=1e-5), key


def last_step(run_dir: Path) -> int:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    return max((json.loads(line)["step"] for line in lines if "train/loss" in line), default=0)


def restarts_seen(run_dir: Path) -> int | None:
    try:
        return json.loads((run_dir / "run.json").read_text())["segments"][-1]["slurm"]["restart"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def wait_for_steps(metrics: Path, at_least: int, proc: WarmProcess, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.running(), finish(proc)[2][-3000:]
        if last_step(metrics.parent) >= at_least:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{metrics} did not reach step {at_least}")


STEPS = 600


@pytest.mark.slow
def test_a_preempted_job_and_one_warned_of_its_time_limit_are_requeued_and_end_as_if_never_stopped(
        slurm, tmp_path, data_cache):  # fmt: skip
    # 600 steps: an idle machine runs this model at 150+ steps/s, and a run of 100 steps could finish its last
    # step before the second signal came (then nothing is requeued): the signals must come mid-run on any machine.
    common = [*TINY, "model.n_layer=2", "model.n_embd=64", f"trainer.max_steps={STEPS}", "trainer.eval_interval=300",
              "trainer.checkpoint_interval=1000", f"data.cache_dir={data_cache}"]  # fmt: skip
    env = {**os.environ, **slurm.env}
    proc = sweep(tmp_path, env, *ON_TEST_CLUSTER, *common, f"hydra.sweep.dir={tmp_path / 'sweep'}")
    run_dir = tmp_path / "sweep" / "0_fused_qkv-sdpa"
    wait_for_steps(run_dir / "metrics.jsonl", 15, proc)
    job = slurm.run("squeue", "-h", "-o", "%i").stdout.split()[0]
    slurm.run("scontrol", "requeue", job)  # preemption: SIGTERM, then SLURM requeues the job
    slurm.start_requeued_now(job, restarts=1)
    while restarts_seen(run_dir) != 1:  # the rerun has claimed its run directory
        assert proc.running(), finish(proc)[2][-3000:]
        time.sleep(0.2)
    # Signalled only once its training loop runs (a USR2 any earlier would end the process, its default).
    wait_for_steps(run_dir / "metrics.jsonl", last_step(run_dir) + 10, proc)
    slurm.run("scancel", "--signal=USR2", job)  # the launcher's warning before the time limit
    slurm.start_requeued_now(job, restarts=2)  # the job requeued itself
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]

    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "finished" and [s["slurm"]["restart"] for s in info["segments"]] == [0, 1, 2]
    log = (run_dir / "train.log").read_text()
    assert "stopped by SIGTERM" in log and "stopped by SIGUSR2" in log and log.count("continuing ") == 2
    with one_thread():
        train(compose_train(*common, "logger=none", f"trainer.run_dir={tmp_path / 'whole'}"))
    requeued, whole = train_losses(run_dir), train_losses(tmp_path / "whole")
    assert sorted(requeued) == list(range(1, STEPS + 1)), "every step once: the records after a checkpoint were dropped"
    assert [requeued[s] for s in sorted(whole)] == pytest.approx([whole[s] for s in sorted(whole)], abs=1e-5)


@pytest.mark.slow
def test_a_job_requeued_while_it_prepares_its_data_is_waited_for_and_its_rerun_finishes_the_sweep(slurm, tmp_path):
    env = {**os.environ, **slurm.env}
    cache = tmp_path / "cache"  # unprepared: the job tokenizes the corpus first (seconds)
    proc = sweep(tmp_path, env, *ON_TEST_CLUSTER, *TINY, f"data.cache_dir={cache}",
                 f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    deadline = time.time() + 120
    # its partial folder: made once the preparation takes stop signals (its lock file comes a moment before that)
    while not any(".tmp-" in p.name for p in cache.glob(".*")) and time.time() < deadline:
        assert proc.running(), finish(proc)[2][-3000:]
        time.sleep(0.05)
    (job,) = slurm.run("squeue", "-h", "-o", "%i").stdout.split()
    assert not (tmp_path / "sweep" / "0_fused_qkv-sdpa" / "run.json").exists(), "still preparing"
    slurm.run("scontrol", "requeue", job)
    slurm.start_requeued_now(job, restarts=1)
    code, _, err = finish(proc)
    assert code == 0, err[-3000:]
    info = json.loads((tmp_path / "sweep" / "0_fused_qkv-sdpa" / "run.json").read_text())
    assert info["status"] == "finished" and [s["slurm"]["restart"] for s in info["segments"]] == [1]


@pytest.mark.slow
def test_a_job_cancelled_mid_run_ends_the_sweep_with_an_error_not_its_half_trained_loss(slurm, tmp_path, data_cache):
    env = {**os.environ, **slurm.env, "HYDRA_FULL_ERROR": "0"}
    proc = sweep(tmp_path, env, *ON_TEST_CLUSTER, *TINY, "trainer.max_steps=100000", "trainer.eval_interval=100000",
                 f"data.cache_dir={data_cache}", f"hydra.sweep.dir={tmp_path / 'sweep'}")  # fmt: skip
    run_dir = tmp_path / "sweep" / "0_fused_qkv-sdpa"
    wait_for_steps(run_dir / "metrics.jsonl", 3, proc)
    (job,) = slurm.job_ids()  # this sweep's one job
    slurm.run("scancel", job)
    code, _, err = finish(proc)
    assert code != 0, "a cancelled job is no completed job"
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: job 0 (") and "was stopped by SIGTERM at step" in line and "Traceback" not in err
    assert f"hydra.sweep.dir={tmp_path / 'sweep'} trainer.resume=auto" in line
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


@pytest.mark.slow
def test_a_user_error_in_a_slurm_job_ends_the_sweep_with_its_message_instead_of_a_wait(slurm, tmp_path):
    env = {**os.environ, **slurm.env, "HYDRA_FULL_ERROR": "0"}  # as a user runs it: no full tracebacks
    code, out, err = finish(sweep(tmp_path, env, *ON_TEST_CLUSTER, *TINY, "trainer.eval_windows=0",
                                  f"hydra.sweep.dir={tmp_path / 'sweep'}"), timeout=120)  # fmt: skip
    assert code != 0 and err.strip().splitlines()[-1] == "error: trainer.eval_windows=0 must be at least 1"
    assert "Traceback" not in err, "the same one line as a local run, not the launcher's traceback"


@pytest.mark.slow
def test_a_batch_that_does_not_split_in_a_slurm_job_is_the_one_line_a_local_run_prints(slurm, tmp_path):
    env = {**os.environ, **slurm.env, "HYDRA_FULL_ERROR": "0"}  # as a user runs it: no full tracebacks
    args = [*TINY, "trainer.micro_batch_size=3"]
    code, _, err = finish(sweep(tmp_path, env, *ON_TEST_CLUSTER, *args, f"hydra.sweep.dir={tmp_path / 'sweep'}"),
                          timeout=120)  # fmt: skip
    local = run_cli(*args, "logger=none", cwd=tmp_path, env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    line = local.stderr.strip().splitlines()[-1]
    assert line.startswith("error: trainer.micro_batch_size=3 does not divide a rank's share of the batch")
    assert code != 0 and err.strip().splitlines()[-1] == line and "Traceback" not in err


@pytest.mark.slow
def test_one_gpu_per_job_asked_of_a_cluster_without_gpus_is_one_line_naming_the_fix(slurm, tmp_path):
    env = {**os.environ, **slurm.env, "HYDRA_FULL_ERROR": "0"}  # as a user runs it: no full tracebacks
    on_cpus = [a for a in ON_TEST_CLUSTER if not a.startswith("hydra.launcher.gpus_per_node")]  # the default: 1
    code, _, err = finish(sweep(tmp_path, env, *on_cpus, *TINY, f"hydra.sweep.dir={tmp_path / 'sweep'}"), timeout=120)
    assert code != 0 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "error: sbatch refused the jobs (Invalid generic resource (gres) specification): each job asks for 1 GPU "
        "(hydra.launcher.gpus_per_node=1) and this cluster or partition has none; on a CPU cluster add "
        "hydra.launcher.gpus_per_node=0, or choose a GPU partition (hydra.launcher.partition=...)")


@pytest.mark.slow
def test_a_local_parallel_sweep_runs_every_job_at_once(tmp_path, data_cache):
    # submitit_local: each job its own process, started together (on a GPU machine, each takes a free GPU).
    one_thread_each = {**os.environ, "OMP_NUM_THREADS": "1"}  # two jobs on two cores
    proc = sweep(tmp_path, one_thread_each, "hydra/launcher=submitit_local", "logger=none", *TINY,
                 "attention=wrapper,fused_qkv", f"data.cache_dir={data_cache}", f"hydra.sweep.dir={tmp_path / 'sw'}")
    code, out, err = finish(proc)
    assert code == 0, err[-3000:]
    (a,), (b,) = (json.loads((tmp_path / "sw" / name / "run.json").read_text())["segments"]
                  for name in ("0_wrapper-sdpa", "1_fused_qkv-sdpa"))  # fmt: skip
    assert spans_overlap(a, b) and a["pid"] != b["pid"]


def test_a_gpu_is_claimed_by_one_job_at_a_time_and_freed_when_it_ends(tmp_path):
    names = ["cuda:GPU-aaaa", "cuda:GPU-bbbb"]
    held_before = len(_held)
    assert claim_free_slot(names, locks=tmp_path) == 0
    assert claim_free_slot(names, locks=tmp_path) == 1
    threading.Timer(0.5, lambda: os.close(_held.pop(held_before))).start()  # the first job ends
    start = time.monotonic()
    assert claim_free_slot(names, poll_s=0.1, locks=tmp_path) == 0, "the freed GPU"
    assert time.monotonic() - start >= 0.4, "it waited while both were taken"
    while len(_held) > held_before:
        os.close(_held.pop())


def test_slurm_tasks_form_the_ddp_world_where_torchrun_set_none(monkeypatch):
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07-08]")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    state = from_environment()
    assert (state.rank, state.local_rank, state.world_size, state.launcher) == (3, 1, 4, "slurm")
    assert slurm_support.rendezvous() == ("gpu07", 20000 + 4242)
    monkeypatch.setenv("WORLD_SIZE", "2")  # torchrun inside a SLURM job: torchrun's ranks win
    monkeypatch.setenv("RANK", "1")
    assert from_environment().launcher == "torchrun"
    assert slurm_support.expand_nodelist("a[1-2,09],b") == ["a1", "a2", "a09", "b"]


def test_the_sacct_warnings_of_a_cluster_without_accounting_are_said_once(caplog):
    logger = logging.getLogger("submitit")
    slurm_support.quiet_sacct_polling()
    with caplog.at_level(logging.WARNING, logger="submitit"):
        for call in range(1, 5):
            logger.warning(f"Call #{call} - Bypassing sacct error Command '['sacct']' returned non-zero exit status 1.")
        logger.warning("another warning")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and "SLURM accounting is off" in messages[0] and messages[1] == "another warning"


def test_stop_signals_name_the_first_and_absorb_the_next():
    from training.signals import StopSignals

    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C while saving: no KeyboardInterrupt
        time.sleep(0.1)
    assert stop.requested and stop.signal == "SIGTERM"
