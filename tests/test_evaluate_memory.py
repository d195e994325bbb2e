"""A length whose forward cannot fit is refused before any work, naming what would (issue 51).

evaluate.py plans each reading with the plan's bytes (``training/plan.py``'s ``eval_bytes``, through
``training/evaluate.py``'s ``reading_bytes``) against the device's available memory; the budget is an argument,
so these tests refuse with a tiny one, through a real model config, without allocating anything. Running out
anyway (the estimate is an estimate) ends in the same kind of one line, not the allocator's message.
"""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
import torch
from helpers import tiny_gpt_config

import evaluate
from data.config import DataConfig
from model import registry
from training.evaluate import (
    Evaluator,
    LengthEvaluator,
    ReadingOutOfMemory,
    check_memory,
    reading_bytes,
)

CPU = torch.device("cpu")
# A small GPT-2-like width: the manual kernel's length x length weights dominate past a few hundred tokens.
CONFIG = tiny_gpt_config(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64, position="rope")
KEEPS = [name for name in registry.KERNELS if registry.kernel(name).keeps_scores()]
FUSED = [name for name in registry.KERNELS if not registry.kernel(name).keeps_scores()]


def refusal(config, length: int, budget: int, batch_tokens: int = 512, most: int = 8) -> str:
    with pytest.raises(ValueError) as err:
        check_memory(config, [("lengths=[1x,64x]", length, most)], batch_tokens, "full", budget, CPU, torch.float32)
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("kernel", KEEPS)
def test_a_length_past_the_budget_is_refused_naming_its_bytes_and_fixes_that_do_fit(kernel):
    config = replace(CONFIG, kernel=kernel)
    length = 4096
    need = reading_bytes(config, length, 512, "full")[1]
    budget = need // 8
    message = refusal(config, length, budget)
    assert message.startswith(f"lengths=[1x,64x]: reading 4,096 tokens (1 sequence per forward, kernel={kernel}) "
                              f"needs an estimated ")  # fmt: skip
    assert f"this machine has {budget / 2**20:,.1f} MiB of RAM available; what fits: " in message
    for name in FUSED:  # a kernel that keeps no length x length weights reads it within the budget
        assert f"kernel={name} (" in message
        assert reading_bytes(replace(config, kernel=name), length, 512, "full")[1] <= budget
    longest = int(message.rsplit("lengths up to ", 1)[1].split()[0].replace(",", ""))
    assert reading_bytes(config, longest, 512, "full")[1] <= budget < reading_bytes(config, longest + 1, 512, "full")[1]


def test_fewer_sequences_per_forward_is_named_where_they_fit():
    config = replace(CONFIG, kernel=KEEPS[0])
    need = reading_bytes(config, 256, 64 * 64, "full")[1]  # 16 sequences of 256 tokens at once
    message = refusal(config, 256, need // 3, batch_tokens=64 * 64, most=16)
    batch = int(message.split("batch_size=")[1].split()[0])
    sequences, nbytes = reading_bytes(config, 256, batch * 64, "full")
    assert f"batch_size={batch} ({sequences} sequences per forward" in message and 1 < sequences < 16
    assert nbytes <= need // 3 < reading_bytes(config, 256, (batch + 4) * 64, "full")[1]


def test_what_fits_the_budget_is_not_refused_and_an_unknown_budget_refuses_nothing():
    need = reading_bytes(CONFIG, 1024, 512, "full")[1]
    check_memory(CONFIG, [("lengths=[16x]", 1024, 8)], 512, "full", need, CPU, torch.float32)
    check_memory(CONFIG, [("lengths=[16x]", 1024, 8)], 512, "full", None, CPU, torch.float32)


def test_evaluate_refuses_a_length_that_cannot_fit_before_any_work(trained_run, tmp_path, data_cache, monkeypatch,
                                                                    capsys):  # fmt: skip
    (tmp_path / "run").mkdir()
    shutil.copy(trained_run / "last.pt", tmp_path / "run" / "last.pt")
    monkeypatch.setattr(evaluate, "available_memory", lambda device: 2**18)  # 0.25 MiB of RAM
    cfg = evaluate.EvaluateConfig(source=str(tmp_path / "run"), device="cpu", lengths=["1x"], batch_size=4,
                                  kernel=KEEPS[0], data=DataConfig(cache_dir=str(data_cache)))  # fmt: skip
    with pytest.raises(ValueError) as err:
        evaluate.run(cfg)
    message = str(err.value)
    assert message.startswith(f"batch_size=4: reading 32 tokens (4 sequences per forward, kernel={KEEPS[0]}) needs "
                              f"an estimated ") and "this machine has 0.2 MiB of RAM available" in message, message
    assert capsys.readouterr().out == "" and list((tmp_path / "run").iterdir()) == [tmp_path / "run" / "last.pt"]


class RunsOut(torch.nn.Module):
    """A GPT whose forward fails as an allocator does (``error``)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.config, self.error = replace(CONFIG, kernel=KEEPS[0]), error
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, y):
        raise self.error

    token_losses = forward  # the per-token losses a reading past the trained length asks for


CUDA_OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 160.00 GiB (GPU 0; 79.1 GiB total)")
CPU_OOM = RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you "
                       "tried to allocate 171798691840 bytes. Error code 12 (Cannot allocate memory)")  # fmt: skip


@pytest.mark.parametrize("error", [CUDA_OOM, CPU_OOM], ids=["cuda", "cpu"])
def test_running_out_of_memory_anyway_is_one_line_naming_the_reading_and_what_to_try(error):
    tokens = np.arange(2000) % 256
    reader = LengthEvaluator(tokens, 512, "chunks", 1024, None, 1024, 1.0, CPU, torch.float32)
    with pytest.raises(ReadingOutOfMemory) as err:
        reader(RunsOut(error))
    message = str(err.value)
    assert "\n" not in message and isinstance(err.value, torch.OutOfMemoryError), "the trainer still catches it"
    assert message.startswith(f"out of memory reading 512 tokens (2 sequences per forward, kernel={KEEPS[0]}, "
                              f"planned ")  # fmt: skip
    assert "); try a smaller batch_size, or shorter lengths, or kernel=" in message
    assert f"({type(error).__name__}: {str(error)[:40]}" in message, "the allocator's words last, shortened"
    with pytest.raises(ReadingOutOfMemory) as err:
        Evaluator(tokens, 64, 4, 4, 1.0, CPU, torch.float32)(RunsOut(error))
    assert str(err.value).startswith("out of memory reading 64 tokens (4 sequences per forward")


def test_an_error_that_is_not_memory_passes_through_unchanged():
    tokens = np.arange(2000) % 256
    reader = LengthEvaluator(tokens, 512, "chunks", 1024, None, 1024, 1.0, CPU, torch.float32)
    with pytest.raises(RuntimeError, match="^shape mismatch$") as err:
        reader(RunsOut(RuntimeError("shape mismatch")))
    assert not isinstance(err.value, ReadingOutOfMemory)

