"""One GPU per job when several jobs start together on one machine (Hydra's submitit_local launcher).

submitit's local executor starts every job of a multirun at once and shows each the same GPUs. A job
then takes the first GPU that no other job holds: an exclusive lock on a file named by the GPU's UUID
(the same whatever CUDA_VISIBLE_DEVICES numbers it). Jobs beyond the number of GPUs wait for a GPU to
free up. The lock lasts as long as the process: a job that ends or dies frees its GPU.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger("headlab.train")
LOCKS = Path(tempfile.gettempdir()) / "headlab-gpu-locks"
_held: list[int] = []  # the descriptors of the locks this process holds, until it exits


def shares_gpus_with_other_jobs() -> bool:
    """A job of Hydra's submitit_local launcher: its sibling jobs run at the same time on this machine."""
    return os.environ.get("SUBMITIT_EXECUTOR") == "local"


def claim_free_slot(names: list[str], poll_s: float = 5.0, locks: Path = LOCKS) -> int:
    """The index of the first of ``names`` (one per GPU) that no other process holds, once one is free."""
    locks.mkdir(parents=True, exist_ok=True)
    waiting_said = False
    while True:
        for index, name in enumerate(names):
            fd = os.open(locks / f"{name.replace('/', '_')}.lock", os.O_CREAT | os.O_WRONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            _held.append(fd)
            return index
        if not waiting_said:
            log.info("all %d GPUs are taken by other jobs of this machine: waiting for one to free up", len(names))
            waiting_said = True
        time.sleep(poll_s)
