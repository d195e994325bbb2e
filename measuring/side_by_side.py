"""What bench_reference.py's comparisons share: transformers' GPT-2 holding a model's weights,
the two sides timed in turn (CUDA synchronised), and each comparison's figures printed and kept for --json."""

from __future__ import annotations

import statistics
import time

import torch

from model import GPT
from model.checkpoints.gpt2_export import hf_gpt2_config, hf_gpt2_state_dict


def hf_twin(model: GPT):
    """transformers' GPT2LMHeadModel holding exactly ``model``'s weights."""
    import transformers

    config = transformers.GPT2Config(**{k: v for k, v in hf_gpt2_config(model, None).items()
                                        if k not in ("architectures", "model_type")})  # fmt: skip
    hf = transformers.GPT2LMHeadModel(config)
    missing, unexpected = hf.load_state_dict(hf_gpt2_state_dict(model), strict=False)
    assert not unexpected and all("lm_head" in k or "attn.bias" in k or "masked_bias" in k for k in missing), missing
    return hf


def timed(fn) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()  # CUDA runs asynchronously: the clock stops when the GPU is done
    return time.perf_counter() - start


def sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def interleave(ours, theirs, rounds: int) -> tuple[list[float], list[float]]:
    a, b = [], []
    for _ in range(rounds):
        a.append(timed(ours))
        b.append(timed(theirs))
    return a, b


RESULTS: list[dict] = []  # what each comparison measured, for --json (gpu_story.py reads it)


def report(what: str, a: list[float], b: list[float], unit_work: float, unit: str, **facts) -> None:
    ratios = [x / y for x, y in zip(a, b)]
    print(f"{what}: headlab {unit_work / statistics.median(a):,.1f} {unit}, reference "
          f"{unit_work / statistics.median(b):,.1f} {unit}; time ratio headlab/reference: median "
          f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) over {len(a)} rounds")
    RESULTS.append({"what": what, "unit": unit, "headlab": unit_work / statistics.median(a),
                    "reference": unit_work / statistics.median(b), "ratio": statistics.median(ratios),
                    "ratio_min": min(ratios), "ratio_max": max(ratios), "rounds": len(a), **facts})  # fmt: skip
