"""Device and precision: shared by training, sampling, evaluation, analysis and benchmarks.

Also the GPU peak FLOP/s that MFU is measured against, and the peak memory bandwidth that decoding's share
of its limit is measured against, matched on whole words of the device's name, most specific entry first.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re

import torch

DTYPES = ("auto", "float32", "bfloat16", "float16")

# Dense (no sparsity) tensor-core peaks in TFLOP/s from the vendors' data sheets, as
# (bf16, fp16) with fp32 accumulation; None where the GPU has no such tensor cores.
# Keys are whole words of torch.cuda.get_device_name(); the longest key that matches wins.
PEAK_TFLOPS: dict[str, tuple[float | None, float]] = {
    "H200 NVL": (835.0, 835.0),
    "H200": (989.0, 989.0),  # SXM
    "H100 NVL": (835.0, 835.0),
    "H100 PCIe": (756.0, 756.0),
    "H100": (989.0, 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    "A100": (312.0, 312.0),  # SXM4 and PCIe alike
    "L40S": (362.0, 362.0),
    "L40": (181.0, 181.0),
    "L4": (121.0, 121.0),
    "A40": (149.7, 149.7),
    "A30": (165.0, 165.0),
    "A10": (125.0, 125.0),
    "RTX 4090": (165.2, 165.2),
    "RTX 3090": (71.0, 71.0),
    "V100": (None, 125.0),  # Volta: fp16 only (PCIe parts are ~10% lower)
    "T4": (None, 65.0),  # Turing: fp16 only
}


# Peak memory bandwidth in TB/s (10^12 bytes/s) from NVIDIA's data sheets, for the GPUs above; a GPU matched by no
# key has no known bandwidth (None), never a guessed one. Keys as above. An A100's name says its memory (40GB,
# 80GB) and form (SXM4, PCIe), which set its bandwidth: a bare "A100" is not guessed.
MEMORY_BANDWIDTH_TBS: dict[str, float] = {
    "H200 NVL": 4.8,
    "H200": 4.8,  # SXM
    "H100 NVL": 3.9,
    "H100 PCIe": 2.0,
    "H100": 3.35,  # SXM ("NVIDIA H100 80GB HBM3")
    "A100 SXM4 80GB": 2.039,
    "A100 80GB PCIe": 1.935,
    "A100 SXM4 40GB": 1.555,
    "A100 PCIE 40GB": 1.555,
    "L40S": 0.864,
    "L40": 0.864,
    "L4": 0.3,
    "A40": 0.696,
    "A30": 0.933,
    "A10": 0.6,
    "A10G": 0.6,
    "RTX 4090": 1.008,
    "RTX 3090 Ti": 1.008,
    "RTX 3090": 0.936,
    "V100": 0.9,  # SXM2 and PCIe (V100S: 1.134, another word)
    "T4": 0.32,
}


def _words(name: str) -> list[str]:
    return re.split(r"[\s\-_]+", name.upper().strip())


def _lookup(table: dict, device_name: str):
    """The entry of ``table`` whose key's words appear together in ``device_name``, the longest key first; or None."""
    words = _words(device_name)
    for key in sorted(table, key=lambda k: (-len(_words(k)), -len(k))):
        key_words = _words(key)
        n = len(key_words)
        if any(words[i : i + n] == key_words for i in range(len(words) - n + 1)):
            return table[key]
    return None


def peak_tflops(device_name: str, dtype: torch.dtype) -> float | None:
    """The dense peak of a GPU (by its name) for bf16 or fp16, or None when unknown or not applicable."""
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    peaks = _lookup(PEAK_TFLOPS, device_name)
    if peaks is None:
        return None
    bf16, fp16 = peaks
    return bf16 if dtype == torch.bfloat16 else fp16


def memory_bandwidth_tbs(device_name: str) -> float | None:
    """The peak memory bandwidth of a GPU (by its name) in TB/s, or None when unknown."""
    return _lookup(MEMORY_BANDWIDTH_TBS, device_name)


def memory_bandwidth(device: torch.device) -> float | None:
    """The device's peak memory bandwidth in bytes/s, or None where it is not known (a CPU, an unlisted GPU)."""
    if device.type != "cuda":
        return None
    tbs = memory_bandwidth_tbs(torch.cuda.get_device_name(device))
    return None if tbs is None else tbs * 1e12


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The device's peak FLOP/s for ``dtype``, or None where MFU has no meaning (CPU, fp32, unknown GPU)."""
    if device.type != "cuda":
        return None
    tflops = peak_tflops(torch.cuda.get_device_name(device), dtype)
    return None if tflops is None else tflops * 1e12


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
    return f"{cpu}, {threads_text()}"


def threads_text(count: int | None = None) -> str:
    """``1 thread``, ``2 threads``: torch's intra-op threads (``count``, else torch's own)."""
    count = torch.get_num_threads() if count is None else count
    return f"{count} thread{'s' if count != 1 else ''}"


def device_id(device: torch.device) -> str:
    """Which physical device: ``cpu``, or a GPU's UUID (the same whatever CUDA_VISIBLE_DEVICES numbers it)."""
    if device.type != "cuda":
        return "cpu"
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return f"cuda:{uuid}" if uuid is not None else f"cuda:{device.index}"


def resolve_device(name: str, local_rank: int = 0, option: str = "trainer.device") -> torch.device:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``; ``option`` is how the user spelled the setting, for errors."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not isinstance(name, str) or not re.fullmatch(r"cuda(:\d+)?", name):
        raise ValueError(f"{option}={name!r}; choose auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ValueError(
            f"{option}={name} but no CUDA GPU is visible (torch.cuda.is_available() is False); "
            f"use {option}=cpu (or auto), or install a CUDA build of torch"
        )
    # A rank uses GPU local_rank; where the scheduler shows each task only its own GPU(s), counting wraps.
    device = torch.device(f"cuda:{local_rank % torch.cuda.device_count()}" if name == "cuda" else name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"{option}={name} but only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def available_memory(device: torch.device) -> int | None:
    """Bytes a run may still allocate: the GPU's free memory and what this process's allocator holds unused (an
    earlier job's cached blocks, which the run reuses), or the CPU's available RAM (Linux); None if unknown."""
    if device.type == "cuda":
        held_unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return torch.cuda.mem_get_info(device)[0] + held_unused
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None


def has_native_bf16(device: torch.device) -> bool:
    """bf16 tensor cores: compute capability 8.0 (Ampere) or later. Older GPUs only emulate bf16, slowly,
    although ``torch.cuda.is_bf16_supported()`` says True there."""
    if device.type != "cuda":
        return True  # CPU autocast supports bf16
    return torch.cuda.get_device_capability(device) >= (8, 0)


def resolve_dtype(name: str, device: torch.device, option: str = "trainer.dtype") -> torch.dtype:
    """The autocast dtype. ``auto``: bf16 on GPUs with native bf16, fp16 (with a GradScaler in
    training) on older GPUs, float32 on CPUs."""
    if name not in DTYPES:
        raise ValueError(f"{option}={name!r}; choose one of: {', '.join(DTYPES)}")
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if has_native_bf16(device) else torch.float16
    if name == "bfloat16" and not has_native_bf16(device):
        raise ValueError(
            f"{option}=bfloat16 but {torch.cuda.get_device_name(device)} has no native bf16 (compute capability "
            f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))} < 8.0; it would be emulated, slowly); "
            f"use {option}=float16 (or auto)"
        )
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """Mixed precision for matmuls in ``dtype`` (weights stay float32); nothing for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def inductor_cache_per_cpu_capability() -> None:
    """Give each ``ATEN_CPU_CAPABILITY`` its own inductor cache folder; call before torch.compile.

    Inductor picks its vector instructions from that variable, but its on-disk graph cache does not
    key the generated C++ on them (torch 2.13): code cached under AVX-512 then fails to build under
    ``ATEN_CPU_CAPABILITY=default`` ("'at::vec' has not been declared"). A ``TORCHINDUCTOR_CACHE_DIR``
    the user chose is left alone.
    """
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if not capability:
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR", default) == default:  # inductor writes its default back
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(default, f"cpu-capability-{capability}")
