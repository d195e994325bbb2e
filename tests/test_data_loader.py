"""The batch loader: shifted targets, determinism from (seed, step), the same windows for every split."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from data.loader import BatchLoader, step_starts, validation_starts, windows

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


def splits(batch_size: int):
    """Every (ranks, micro-batch) that splits ``batch_size`` evenly."""
    for world in range(1, batch_size + 1):
        if batch_size % world == 0:
            share = batch_size // world
            yield from ((world, micro) for micro in range(1, share + 1) if share % micro == 0)


@pytest.mark.parametrize("batch_size", [1, 2, 6, 8, 12, 30])
def test_every_split_of_a_step_trains_on_the_same_windows_in_the_same_order(batch_size):
    """Ranks x micro-steps, read rank by rank and micro-step by micro-step, are the step's windows, whatever the
    split: a micro-batch, an accumulation count or a number of ranks never changes the data."""
    for step in (0, 1, 57):
        whole = step_starts(1, step, batch_size, len(TOKENS), 32)
        for world, micro in splits(batch_size):
            read = [loader(batch_size=batch_size, micro_batch_size=micro, rank=rank, world_size=world)
                    .starts(step, m) for rank in range(world) for m in range(batch_size // world // micro)]  # fmt: skip
            assert all(len(part) == micro for part in read)
            assert np.array_equal(np.concatenate(read), whole), (world, micro)


def test_ranks_draw_different_windows_of_one_step():
    starts = [loader(batch_size=16, rank=r, world_size=4).starts(5) for r in range(4)]
    assert np.array_equal(np.concatenate(starts), step_starts(1, 5, 16, len(TOKENS), 32))
    assert len({tuple(s) for s in starts}) == 4


def test_a_batch_that_does_not_split_is_refused():
    with pytest.raises(ValueError, match=r"batch_size=8 does not split into 2 rank\(s\) x micro-batches of 3"):
        loader(batch_size=8, world_size=2, micro_batch_size=3)


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
