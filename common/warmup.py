"""Which steps count as warm-up: left out of steady-state speed by the reports, and skipped before the
trainer's profiler starts, so both measure the same steps."""

from __future__ import annotations

WARMUP_FRACTION = 0.1  # steps left out of steady-state speed: allocator, caches, autotuning
MAX_WARMUP_STEPS = 20
