"""The conditions a run's speed figures were taken in, recorded beside them: the cores other processes used (a
busy machine) and how much of the compile was read from the compile cache (a warm compile). The reports flag
figures whose conditions differ between the variants they compare (analysis/report.py)."""

from __future__ import annotations

import logging
import sys
import time

import torch

from common.machine_load import OthersLoad, busy_text, is_busy
from model.device import threads_text

log = logging.getLogger("headlab.train")


def compile_cache_counts() -> tuple[int, int]:
    """Graphs inductor has read from its compile cache and compiled anew in this process so far: a compile that
    read some was warmed by an earlier run or job, and its time is not a cold compile's."""
    if "torch._dynamo" not in sys.modules:
        return 0, 0
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]



def busy_advice(threads: int | None = None) -> str:
    """What to do about a busy machine with torch's ``threads`` (its own count where None): fewer threads only
    where there is more than one."""
    threads = torch.get_num_threads() if threads is None else threads
    if threads == 1:
        return "Run one job at a time"
    return (f"Run one job at a time, or give concurrent jobs fewer threads (OMP_NUM_THREADS=1): torch's "
            f"{threads_text(threads)} slow down most when other work shares the cores")

class LoadWatch:
    """The cores other processes use while the run trains: ``step()`` gives each step's row its
    ``perf/others_cores`` (the average since the previous row: reports weigh them by time), the first span of
    ``HINT_AFTER_S`` seconds on a busy machine logs a one-time hint, and ``caution()`` says it in the summary."""

    HINT_AFTER_S = 2.0

    def __init__(self, is_main: bool = True) -> None:
        self.per_step, self.window, self.whole = OthersLoad(), OthersLoad(), OthersLoad()
        self.is_main, self.hinted = is_main, False
        self.window_start = time.monotonic()

    def step(self) -> dict[str, float]:
        others = self.per_step.since_last()
        if time.monotonic() - self.window_start >= self.HINT_AFTER_S:
            self.hint(self.window.since_last())
            self.window_start = time.monotonic()
        return {} if others is None else {"perf/others_cores": others}

    def hint(self, others: float | None) -> None:
        if self.hinted or not self.is_main or not is_busy(others):
            return
        self.hinted = True
        log.warning("the machine is busy: %s over the last %.0f s, so this run's speed is not its own (compare.py "
                    "flags its figures). %s", busy_text(others), self.HINT_AFTER_S, busy_advice())  # fmt: skip

    def caution(self) -> str:
        """`` (the machine was busy: other processes used 1.9 of 2 cores)``, or "" on a quiet machine."""
        others = self.whole.since_start()
        return f" (the machine was busy: {busy_text(others)})" if is_busy(others) else ""
