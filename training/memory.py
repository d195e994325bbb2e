"""Peak memory of this run alone: a multirun's jobs share one process, so all-time peaks would leak."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from pathlib import Path

import torch

_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


class MemoryMeter:
    """CUDA: peak allocated and reserved bytes since ``reset``. CPU (Linux): the peak resident set
    since ``reset`` (``VmHWM``, reset by writing 5 to ``/proc/self/clear_refs``); nothing elsewhere."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu_peak_resets = False
        self.reset()

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):  # glibc: hand memory freed by earlier jobs back to the OS,
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # or it would count in this run's resident set
        with contextlib.suppress(OSError):
            _CLEAR_REFS.write_text("5")
            self.cpu_peak_resets = True

    def read(self) -> dict[str, float]:
        if self.device.type == "cuda":
            return {
                "perf/peak_mem_mb": torch.cuda.max_memory_allocated(self.device) / 2**20,
                "perf/peak_reserved_mb": torch.cuda.max_memory_reserved(self.device) / 2**20,
            }
        if not self.cpu_peak_resets:
            return {}  # an all-time peak would include earlier jobs of a multirun: report none
        return {"perf/max_rss_mb": _status_kb("VmHWM") / 1024}


def _status_kb(field: str) -> float:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return float("nan")
