"""Device, precision and the GPU peak FLOPs that MFU is measured against."""

from __future__ import annotations

import contextlib
import platform

import torch

# Dense bf16 tensor-core peaks (TFLOP/s) from the vendors' data sheets; more specific names first.
PEAK_BF16_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10", 125.0),
    ("RTX 4090", 165.2),
)


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model and thread count: what measurements are quoted against."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:  # Linux names the CPU model here; platform.processor() often says only "x86_64"
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not name.startswith("cuda"):
        raise ValueError(f"trainer.device={name!r}; choose auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(
            f"trainer.device={name} but no CUDA GPU is visible (torch.cuda.is_available() is False); "
            f"use trainer.device=cpu (or auto), or install a CUDA build of torch"
        )
    device = torch.device(f"cuda:{local_rank}" if name == "cuda" else name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"trainer.device={name} but only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The autocast dtype: bf16 on GPUs that have it when ``auto``; float32 otherwise."""
    bf16_ok = device.type == "cpu" or torch.cuda.is_bf16_supported()
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and bf16_ok else torch.float32
    if name == "bfloat16" and not bf16_ok:
        raise ValueError(
            f"trainer.dtype=bfloat16 but {torch.cuda.get_device_name(device)} has no bf16 support; "
            f"use trainer.dtype=float32"
        )
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def autocast(device: torch.device, dtype: torch.dtype):
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The device's bf16 peak in FLOP/s, or None where MFU has no meaning here (CPU, fp32, unknown GPU)."""
    if device.type != "cuda" or dtype != torch.bfloat16:
        return None
    name = torch.cuda.get_device_name(device)
    return next((tflops * 1e12 for key, tflops in PEAK_BF16_TFLOPS if key in name), None)
