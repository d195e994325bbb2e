"""Every registered mask's facts agree with its own predicate (``model.attention.masks``): the capacity a KV cache
gets, and the fast paths' answers (a new query sees a whole cache; the mask hides nothing the causal mask shows). The
kernels and the cache trust these instead of the predicate, so a fact that claims more than the predicate gives is a
wrong answer in decoding, and one that claims less a cache that keeps keys nobody sees: each is checked by brute force
over positions, for every mask registered (tomorrow's too), at its option's example value and more."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch

from model.attention import AttentionSpec
from model.attention.masks import Causal
from model.registry import MASKS

EXAMPLES = {f.name: f.metadata["example"] for f in fields(AttentionSpec) if "example" in f.metadata}


def values_of(mask) -> list:
    """Values to hold the mask at: always on (causal), or its option's example and a spread of others like it."""
    if mask.field is None:
        return [mask.value(None)]
    example = EXAMPLES[mask.field]
    return [example, *(n for n in (1, 2, 5, 8, 13) if isinstance(example, int) and n != example)]


def seen(mask, value, positions: int) -> torch.Tensor:
    """(positions, positions): whether query i sees key j, under the causal mask and this one."""
    i, j = torch.arange(positions)[:, None], torch.arange(positions)[None, :]
    return Causal.sees(i, j, True) & mask.sees(i, j, value)


def most_recent_needed(mask, value, positions: int) -> int:
    """The most recent positions any query among ``positions`` reaches back over: its oldest key seen, to itself."""
    keep = seen(mask, value, positions)
    oldest = torch.where(keep, torch.arange(positions)[None, :], positions).min(dim=1).values
    return int((torch.arange(positions) - oldest + 1).max())


CASES = [pytest.param(mask, value, id=f"{name}-{value}") for name, mask in MASKS.items() for value in values_of(mask)]


@pytest.mark.parametrize("mask,value", CASES)
def test_a_masks_capacity_is_the_most_recent_keys_its_queries_see(mask, value):
    """A cache of ``capacity`` keeps exactly what the queries need: not fewer (a wrong answer once the ring wraps),
    not more (memory kept for keys never seen); None only where the need grows with the sequence."""
    needs = [most_recent_needed(mask, value, n) for n in (64, 97)]
    capacity = mask.capacity(value)
    if capacity is None:
        assert needs == [64, 97], f"{mask.name}={value} says no capacity, but its queries need at most {needs}"
    else:
        assert needs == [capacity, capacity], f"{mask.name}={value}: capacity {capacity}, its queries need {needs}"


@pytest.mark.parametrize("mask,value", CASES)
def test_a_masks_fast_path_answers_are_its_predicates(mask, value):
    """``sees_whole_cache(c)``: a new query at any position sees each of the c most recent keys (itself included);
    ``narrows_causal(k)``: among k keys in position order, some query is hidden a key the causal mask shows."""
    for c in range(1, 40):
        for query in range(c - 1, 3 * 40):
            whole = bool(mask.sees(torch.tensor(query), torch.arange(query - c + 1, query + 1), value).all())
            if not whole:
                break
        assert mask.sees_whole_cache(value, c) == whole, f"{mask.name}={value}, a cache of {c}"
    for k in range(1, 40):
        narrows = bool((seen(Causal, True, k) & ~seen(mask, value, k)).any())
        assert mask.narrows_causal(value, k) == narrows, f"{mask.name}={value}, {k} keys in order"
