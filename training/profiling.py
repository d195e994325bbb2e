"""Where a training step's time goes, and which SDPA kernel the (compiled) graph really calls.

``trainer.profile=true`` runs a few steady steps (after the warm-up) under ``torch.profiler`` and writes
``<run dir>/profile/``: ``trace.json`` (open it in https://ui.perfetto.dev or chrome://tracing) and
``time_by_kind.json`` / ``.md``, the milliseconds per step by kind of work. Every op or kernel counts
its own time once (its self time: on a GPU, the device time of the kernels it launched), classified
by name:

- matrix products: the projections, the MLP and the LM head (``mm``, ``addmm``, inductor's mm templates);
- attention: the fused SDPA kernels (named by backend), and for the manual kernel the attention
  matrices (``bmm``), the mask and the softmax;
- loss: log-softmax and cross-entropy over the vocabulary;
- optimizer: everything inside ``optimizer.step``;
- copies and casts: ``copy_``, ``clone``, ``cat``, memcpy;
- communication: DDP's all-reduces;
- norms and elementwise: the rest (LayerNorm, GELU, residual adds, inductor's fused kernels);
- idle: on a GPU, the wall time no kernel ran (the host was launching or waiting); on a CPU, the
  time outside every op (Python, the framework's own dispatch).

The names are the profiler's; a kernel that fuses several kinds is counted under the first kind its
name matches, in the order above. The classification is a reading aid, not an exact accounting.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from common.run_files import PROFILE_SUMMARY, PROFILE_TABLE, PROFILE_TRACE, write_atomically, write_json, write_text
from common.tables import markdown_table

PROFILE_STEPS = 3  # steps profiled by trainer.profile, after the warm-up

KINDS = ("matrix products", "attention", "loss", "optimizer", "copies and casts", "communication",
         "norms and elementwise", "idle")  # fmt: skip

# The aten op each SDPA backend dispatches to: what the profiler shows actually ran.
SDPA_BACKENDS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (cpu)",
    "aten::_scaled_dot_product_efficient_attention": "mem-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}

# (kind, name fragments), matched in this order against lower-cased op and kernel names.
_KIND_PATTERNS = (
    ("attention", ("scaled_dot_product", "flash", "fmha", "efficient_attention", "cudnn_attention",
                   "aten::bmm", "aten::baddbmm", "softmax_backward_data", "aten::_softmax", "masked_fill",
                   "aten::triu")),  # fmt: skip
    ("loss", ("log_softmax", "nll_loss", "cross_entropy")),
    ("attention", ("softmax",)),  # a fused softmax that is not the loss's: the manual kernel's
    ("matrix products", ("aten::mm", "aten::addmm", "aten::_addmm_activation", "mkl_linear", "mkldnn",
                         "triton_tem_", "gemm", "cublas", "nvjet", "xmma", "wgmma", "cutlass")),  # fmt: skip
    ("optimizer", ("_foreach_", "_fused_adam", "multi_tensor", "adam")),
    ("copies and casts", ("aten::copy_", "aten::clone", "aten::cat", "aten::_to_copy", "memcpy", "memset",
                          "aten::contiguous", "copy_kernel")),  # fmt: skip
    ("communication", ("nccl", "gloo", "all_reduce", "allreduce", "c10d::")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, fragments in _KIND_PATTERNS:
        if any(fragment in lowered for fragment in fragments):
            return kind
    return "norms and elementwise"


def sdpa_backends(events) -> str:
    """The SDPA implementations that ran, by the aten op they dispatched to ("-": none ran)."""
    names = {event.name for event in events}
    return ", ".join(sorted({label for op, label in SDPA_BACKENDS.items() if op in names})) or "-"


def _in_optimizer_step(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("Optimizer.step"):
            return True
        parent = parent.cpu_parent
    return False


def _is_scope(event) -> bool:
    """Annotations (record_function scopes, compiled-graph regions) rather than ops or kernels."""
    return event.name.startswith(("Optimizer.", "## ", "Torch-Compiled", "CompiledFunction", "ProfilerStep",
                                  "DistributedDataParallel", "autograd::engine", "headlab:"))  # fmt: skip


def time_by_kind(events, device: torch.device, wall_ms: float, steps: int) -> dict[str, float]:
    """Milliseconds per step by kind (``KINDS``), from the profiler's events of ``steps`` steps.

    On a GPU each kernel is counted once, under the op that launched it when that is an aten op (so the
    manual kernel's ``bmm`` counts as attention), else by its own name (inductor's fused kernels, launched
    from a compiled region). On a CPU each op counts its self time.
    """
    on_gpu = device.type == "cuda"
    totals = dict.fromkeys(KINDS, 0.0)
    busy_us = 0.0
    for event in events:
        if event.device_type != torch.autograd.DeviceType.CPU:
            continue  # device-side records: counted through the op that launched them (event.kernels)
        optimizer = _in_optimizer_step(event)
        if on_gpu:
            for kernel in event.kernels:
                kind = "optimizer" if optimizer else kind_of(event.name if event.name.startswith("aten::")
                                                            else kernel.name)  # fmt: skip
                totals[kind] += kernel.duration / 1e3
                busy_us += kernel.duration
        elif event.self_cpu_time_total > 0 and not _is_scope(event):
            kind = "optimizer" if optimizer else kind_of(event.name)
            totals[kind] += event.self_cpu_time_total / 1e3
            busy_us += event.self_cpu_time_total
    # GPU: time no kernel ran (kernels of one stream do not overlap); CPU: time outside every op.
    totals["idle"] = max(0.0, wall_ms - busy_us / 1e3)
    return {kind: ms / steps for kind, ms in totals.items()}


def name_cpu_kernels() -> None:
    """Have inductor's C++ kernels appear in CPU profiles under their names (set before compiling)."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True


@contextlib.contextmanager
def without_profiler_notices() -> Iterator[None]:
    """Drop the "USDT: ... profiler_start/stop" lines that the profiler's C++ side (kineto) writes to
    stderr at every start and stop, which would break into a progress bar; pass anything else on."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(True)
                    if not line.startswith("USDT:")]  # fmt: skip
            sys.stderr.write("".join(kept))


def activities(device: torch.device) -> list[ProfilerActivity]:
    return [ProfilerActivity.CPU, ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]


class StepProfiler:
    """Profiles training steps: the first step this process runs, lightly (which SDPA kernel runs),
    and with ``steps`` > 0 a window of that many steps from ``start`` on, fully (``trainer.profile``).

    ``around(step)`` wraps one step; it returns whether that step ran under the profiler, whose
    overhead makes its time unrepresentative.
    """

    def __init__(self, device: torch.device, out: Path, first_step: int, start: int, steps: int) -> None:
        self.device, self.out = device, out
        self.first_step, self.window = first_step + 1, range(start + 1, start + 1 + steps)
        self.sdpa_backend: str | None = None
        self.summary: dict | None = None
        self._prof: profile | None = None
        self._wall_ms, self._done = 0.0, 0

    def profiled(self, step: int) -> bool:
        """Whether step ``step`` (1-based, as logged) runs under the profiler."""
        return step == self.first_step or step in self.window

    @contextlib.contextmanager
    def around(self, step: int, step_ms: list[float]) -> Iterator[None]:
        """Wrap step ``step`` (1-based); the caller appends the step's time to ``step_ms`` within the block."""
        if step == self.first_step and step not in self.window:
            with without_profiler_notices(), profile(activities=[ProfilerActivity.CPU]) as prof:
                yield
            self.sdpa_backend = sdpa_backends(prof.events())
            return
        if step not in self.window:
            yield
            return
        if step == self.window.start:
            with without_profiler_notices():
                self._prof = profile(activities=activities(self.device), record_shapes=False)
                self._prof.start()
        yield
        self._wall_ms += step_ms[-1]
        self._done += 1
        if step == self.window[-1]:
            self.finish()

    def finish(self) -> None:
        """Stop the window's profiler (also when the run ends inside it) and write what it saw."""
        if self._prof is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        with without_profiler_notices():
            self._prof.stop()
        events, steps = self._prof.events(), max(1, self._done)
        self.sdpa_backend = self.sdpa_backend or sdpa_backends(events)
        self.summary = {"steps": list(self.window)[:steps], "device": str(self.device),
                        "wall_ms_per_step": self._wall_ms / steps, "sdpa_backend": sdpa_backends(events),
                        "ms_per_step": time_by_kind(events, self.device, self._wall_ms, steps)}  # fmt: skip
        self.out.mkdir(parents=True, exist_ok=True)
        prof = self._prof
        write_atomically(self.out / PROFILE_TRACE, lambda tmp: prof.export_chrome_trace(str(tmp)))
        write_json(self.out / PROFILE_SUMMARY, self.summary)
        write_text(self.out / PROFILE_TABLE, summary_table(self.summary) + "\n")
        self._prof = None


IDLE_MEANING = {
    "cuda": "idle: no kernel running (the host launching, syncing or waiting)",
    "cpu": "idle: time outside every op (Python, the framework's dispatch)",
}


def summary_table(summary: dict) -> str:
    """Milliseconds per step by kind (kinds that took no time left out), with each kind's share of the step."""
    wall = summary["wall_ms_per_step"]
    rows = [[kind, f"{ms:,.2f}", f"{ms / wall:.0%}" if wall else "-"]
            for kind, ms in summary["ms_per_step"].items() if ms > 0]  # fmt: skip
    device_type = summary["device"].split(":")[0]
    head = (f"Steps {summary['steps'][0]}-{summary['steps'][-1]} on {summary['device']}: {wall:,.1f} ms per step "
            f"(profiled); SDPA kernel: {summary['sdpa_backend']}.\n\n")  # fmt: skip
    return head + markdown_table(["kind", "ms per step", "share"], rows) + f"\n\n{IDLE_MEANING.get(device_type, '')}"
