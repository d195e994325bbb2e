"""The batch loader: shifted targets, determinism from (seed, step), distinct ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data.loader import BatchLoader, validation_starts, windows

TOKENS = np.arange(10_000, dtype=np.uint16) % 997  # position-revealing, within a small vocabulary


def loader(**overrides) -> BatchLoader:
    return BatchLoader(**{**dict(tokens=TOKENS, block_size=32, batch_size=4, seed=1), **overrides})


def test_targets_are_the_inputs_shifted_by_one():
    x, y = loader().batch(step=3)
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row, start in zip(x, loader().starts(step=3)):
        assert torch.equal(row, torch.from_numpy(TOKENS[start : start + 32].astype(np.int64)))


def test_same_seed_and_step_give_identical_batches():
    for step in (0, 1, 57):
        assert torch.equal(loader().batch(step)[0], loader().batch(step)[0])
    assert not torch.equal(loader().batch(0)[0], loader().batch(1)[0])
    assert not torch.equal(loader().batch(0)[0], loader(seed=2).batch(0)[0])


def test_ranks_draw_different_windows():
    starts = [set(loader(rank=r, world_size=4).starts(5).tolist()) for r in range(4)]
    assert all(a != b for i, a in enumerate(starts) for b in starts[i + 1 :])


def test_ranks_together_see_what_one_process_sees_with_accumulation():
    # 2 ranks x 1 micro-step == 1 rank x 2 micro-steps, batch for batch.
    for rank in range(2):
        distributed = loader(rank=rank, world_size=2).batch(step=9, micro_step=0)[0]
        single = loader(rank=0, world_size=1).batch(step=9, micro_step=rank)[0]
        assert torch.equal(distributed, single)


def test_windows_stay_inside_the_tokens():
    small = np.arange(40, dtype=np.uint16)
    for step in range(50):
        x, y = BatchLoader(small, block_size=32, batch_size=8, seed=step).batch(step)
        assert int(y.max()) <= 39


def test_validation_windows_are_fixed_and_cover_the_split():
    starts = validation_starts(n_tokens=10_000, block_size=32, n_windows=20)
    assert np.array_equal(starts, validation_starts(10_000, 32, 20))
    assert starts[0] == 0 and starts[-1] == 10_000 - 33
    x, y = windows(TOKENS, starts, 32, torch.device("cpu"))
    assert x.shape == (20, 32) and torch.equal(x[:, 1:], y[:, :-1])


def test_too_few_tokens_for_one_window_is_a_clear_error():
    with pytest.raises(ValueError, match=r"32 tokens are fewer than block_size \+ 1 = 33"):
        BatchLoader(np.arange(32, dtype=np.uint16), block_size=32, batch_size=1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_batches_arrive_on_the_device():
    x, y = loader(device="cuda").batch(0)
    assert x.is_cuda and y.is_cuda and torch.equal(x.cpu(), loader().batch(0)[0])
