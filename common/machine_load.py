"""How busy the machine was while something was timed: the CPU cores other processes used.

A speed figure taken while other processes ran is not the code's speed: on a 2-core machine a second job halves
it, and torch's threads, each waiting for the others at every parallel region, can make it 2-18x slower. So every
timed run and bench pass records, beside its times, the cores the rest of the machine used meanwhile (Linux:
``/proc/stat``'s busy time, the hypervisor's steal included, minus this process's own CPU time), and every report
flags a figure taken on a busy machine. Written by the trainer and bench.py, read by the reports.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_STAT, _SELF = Path("/proc/stat"), Path("/proc/self/stat")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# Other processes used at least this share of the cores (and half a core) on average: the machine was busy.
BUSY_SHARE = 0.25


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def busy_cores(n_cores: int | None = None) -> float:
    """Cores that others' use must reach for a machine of ``n_cores`` (this process's, unset) to count as busy."""
    return max(0.5, BUSY_SHARE * (n_cores or cores()))


def is_busy(others: float | None, n_cores: int | None = None) -> bool:
    return others is not None and others >= busy_cores(n_cores)


def busy_text(others: float, n_cores: int | None = None) -> str:
    """``other processes used 1.9 of 2 cores``: what a flag or a hint says."""
    return f"other processes used {others:.1f} of {n_cores or cores()} cores"


def _machine_busy_ticks() -> int | None:
    """Every core's busy time since boot (user, nice, system, irq, softirq, steal), in clock ticks."""
    try:
        fields = _STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (values + [0] * 8)[:8]
    return user + nice + system + irq + softirq + steal


def _own_ticks(children: bool = False) -> int | None:
    """This process's CPU time (every thread, user and system), in clock ticks; with ``children``, that of the
    child processes it has waited for too (a script whose work is its children's: gpu_story.py's stages)."""
    try:
        fields = _SELF.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    own = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return own + (int(fields[13]) + int(fields[14]) if children else 0)  # cutime, cstime (16 and 17)


class OthersLoad:
    """Cores used by other processes between readings: ``since_last()`` is their average since the previous
    reading (or the start), ``since_start()`` over the whole span; None where the system does not say (not
    Linux). With ``children``, the child processes this one has waited for are not others."""

    def __init__(self, children: bool = False) -> None:
        self.children = children
        self.start = self.last = self._sample()

    def _sample(self) -> tuple[float, int, int] | None:
        machine, own = _machine_busy_ticks(), _own_ticks(self.children)
        return None if machine is None or own is None else (time.monotonic(), machine, own)

    @staticmethod
    def _between(a, b) -> float | None:
        if a is None or b is None or b[0] <= a[0]:
            return None
        others = (b[1] - a[1]) - (b[2] - a[2])
        return max(0.0, others / _TICKS / (b[0] - a[0]))

    def since_last(self) -> float | None:
        now = self._sample()
        others, self.last = self._between(self.last, now), now
        return others

    def since_start(self) -> float | None:
        return self._between(self.start, self._sample())
