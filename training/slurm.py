"""Running under SLURM (e.g. through Hydra's submitit launcher): the DDP world from SLURM's variables,
and preemption or a time limit that ends in a requeue instead of a job reported finished.

SLURM starts every task of a job with ``SLURM_PROCID`` (global rank), ``SLURM_LOCALID`` (rank on the
node), ``SLURM_NTASKS`` (world size) and the job's node list; torchrun's ``RANK``/``WORLD_SIZE``/
``MASTER_ADDR`` are not set. The rendezvous is the job's first node, on a port derived from the job id
(the same on every task), unless ``MASTER_ADDR``/``MASTER_PORT`` say otherwise.

A job is told to stop by SIGTERM (preemption, ``scontrol requeue``, scancel, the time limit) or by the
launcher's warning signal SIGUSR2 shortly before its time limit (``--signal=USR2@<seconds>``). The run
saves at the end of its step; then:
- after SIGUSR2, rank 0 asks SLURM to requeue the job (``scontrol requeue``);
- after SIGTERM, the job was requeued if SLURM already counts one more restart than this run saw
  (slurmctld raises ``Restarts`` before it signals), else it was cancelled or ran out of time.
A requeued job exits without a result, so the launcher waits for its rerun, which continues from
``last.pt`` in the same run directory (``training.continuation``).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time

REQUEUE_POLL_S = 10.0  # how long a rank waits to see the requeue that rank 0 asked for


def in_slurm_job() -> bool:
    return "SLURM_JOB_ID" in os.environ


def job_id() -> str | None:
    return os.environ.get("SLURM_JOB_ID")


def restart_count() -> int:
    """How many times this job was requeued before this run (0 on its first run)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def is_requeued_run() -> bool:
    """A rerun of a requeued job: it continues its own run directory."""
    return in_slurm_job() and restart_count() > 0


def slurm_world() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) of a multi-task SLURM job, or None outside one."""
    if "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_NTASKS") or 1) <= 1:
        return None
    return int(os.environ["SLURM_PROCID"]), int(os.environ.get("SLURM_LOCALID") or 0), int(os.environ["SLURM_NTASKS"])


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact host list (``gpu[01-03,07],login1``) as host names."""
    hosts: list[str] = []
    for prefix, ranges, single in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", nodelist):
        if single:
            hosts.append(single)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            for number in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{number:0{len(low)}d}")
    return hosts


def rendezvous() -> tuple[str, int]:
    """The job's first node and a port every task derives alike from the job id."""
    nodes = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST") or "127.0.0.1"
    addr = os.environ.get("MASTER_ADDR") or expand_nodelist(nodes)[0]
    port = int(os.environ.get("MASTER_PORT") or 20000 + int(re.sub(r"\D", "", job_id() or "0") or 0) % 40000)
    return addr, port


def _restarts_now() -> int | None:
    """SLURM's current restart count of this job (``scontrol show job``), or None if it cannot be read."""
    try:
        out = subprocess.run(["scontrol", "show", "job", "-o", job_id()], capture_output=True, text=True,
                             timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\bRestarts=(\d+)", out)
    return int(match.group(1)) if match else None


def request_requeue() -> bool:
    """Ask SLURM to requeue this job (rank 0, after the time-limit warning); True if it accepted."""
    try:
        result = subprocess.run(["scontrol", "requeue", job_id()], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0


def requeued_after(signal_name: str | None, rank: int) -> bool:
    """Whether this job is being requeued, after the run stopped on ``signal_name`` and saved.

    After SIGUSR2 rank 0 asks for the requeue itself; then every rank looks for SLURM's raised restart
    count (the other ranks may have to wait a moment for rank 0's request).
    """
    if not in_slurm_job() or signal_name is None:
        return False
    if signal_name == "SIGUSR2" and rank == 0:
        request_requeue()
    deadline = time.monotonic() + (REQUEUE_POLL_S if signal_name == "SIGUSR2" else 0)
    while True:
        restarts = _restarts_now()
        if restarts is not None and restarts > restart_count():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.5)


def use_the_cpus_given() -> None:
    """In a SLURM job, torch's threads match the CPUs the job was given (``SLURM_CPUS_PER_TASK``), not the
    node's core count: jobs that share a node would otherwise oversubscribe it (spinning OpenMP threads
    then slow small steps down a hundredfold). ``OMP_NUM_THREADS`` set by the user wins."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if in_slurm_job() and cpus and cpus.isdigit() and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(int(cpus))


def job_facts() -> dict:
    """What run.json records of the SLURM job (nothing outside one)."""
    if not in_slurm_job():
        return {}
    facts = {"job_id": job_id(), "restart": restart_count()}
    for key, name in (("SLURM_ARRAY_JOB_ID", "array_job_id"), ("SLURM_ARRAY_TASK_ID", "array_task_id"),
                      ("SLURM_JOB_PARTITION", "partition"), ("SLURM_NTASKS", "tasks")):  # fmt: skip
        if os.environ.get(key):
            facts[name] = os.environ[key]
    return facts


class _SacctNotice(logging.Filter):
    """Lets submitit's first "Bypassing sacct error" warning through, explained, and drops the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "Bypassing sacct error" not in record.getMessage():
            return True
        if self.seen:
            return False
        self.seen = True
        record.msg, record.args = (
            "sacct cannot read job states here (SLURM accounting is off); submitit follows the jobs by their "
            "results, and says this only once"), ()  # fmt: skip
        return True


def quiet_sacct_polling() -> None:
    """On a cluster without accounting, submitit warns at every status poll (three lines each); keep one."""
    logging.getLogger("submitit").addFilter(_SacctNotice())
