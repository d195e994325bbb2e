"""Memory of this run alone: a multirun's jobs share one process, so an earlier job's memory and all-time peaks
would leak into the next job's plan and figures."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from pathlib import Path

import torch

from model.attention.kernels import forget_forward_masks

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


def release_memory(device: torch.device, compiled: bool = False) -> None:
    """Hand back what a job of this process left (at its end, and again before the next job's plan): its
    unreachable objects (collected), its ``compiled`` graphs, and on a GPU the allocator's cached blocks and
    cuBLAS's workspaces (allocated through the caching allocator, they count as memory in use: 33 MiB on a
    Hopper GPU). A job's plan then reads the memory it would read alone, and its figures start from zero."""
    forget_forward_masks()  # the masks a forward's layers shared, kept until the next forward
    gc.collect()
    if compiled:  # compiled graphs and their guards hold the job's code and constants
        torch._dynamo.reset()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)

