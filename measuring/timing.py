"""The clock of bench.py's modes: a module's forward and step as closures, a median of timings after
warm-up (torch.utils.benchmark, which synchronises CUDA), and which SDPA implementation a call ran."""

from __future__ import annotations

import time

import torch
import torch.utils.benchmark as benchmark

from model.device import autocast, inductor_cache_per_cpu_capability
from training.profiling import sdpa_backends, without_profiler_notices


def closures(module, inputs: tuple, loss_of, optimizer, compiled: bool, device, dtype):
    """(forward, step) of ``module`` on ``inputs``: forward without gradients; step is forward, backward of
    ``loss_of(output)``, the optimizer's step if any, and the gradients cleared."""
    if compiled:
        inductor_cache_per_cpu_capability()
    run = torch.compile(module) if compiled else module

    def forward():
        with torch.no_grad(), autocast(device, dtype):
            return run(*inputs)

    def step():
        with autocast(device, dtype):
            loss = loss_of(run(*inputs))
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        module.zero_grad(set_to_none=True)
        for x in inputs:
            x.grad = None  # the block's input gradient would otherwise accumulate across calls

    return forward, step


def median_ms(fn, min_run_time: float, device: torch.device) -> tuple[float, float, float, float]:
    """(median ms, seconds of the first call, which holds any compilation, interquartile range / median, slowest
    timing / fastest): the range catches an outlier that the interquartile range, a median-relative measure,
    hides."""
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    first_s = time.perf_counter() - start
    for _ in range(2):  # more warm-up: allocator, kernel selection, autotuning
        fn()
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    measurement = timer.blocked_autorange(min_run_time=min_run_time)
    times = measurement.times
    return measurement.median * 1e3, first_s, measurement.iqr / measurement.median, max(times) / min(times)


def sdpa_backend(fn) -> str:
    """Which SDPA implementation one call ran, from the profiler's op names ("-" when none ran)."""
    with without_profiler_notices(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sdpa_backends(prof.events())
