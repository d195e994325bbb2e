"""Masks: which keys a query sees, as predicates over positions, in one registry that every kernel, the KV cache and
its fast paths read.

A mask is a class registered in ``model.registry.MASKS`` that states (``Mask``): the ``AttentionSpec`` field that
sets it and its value for a spec (``value``); ``sees(query, key, value)``, whether a query at absolute position
``query`` sees the key at position ``key``, elementwise over tensors (and over the index tensors of flex's mask_mod,
traced); ``capacity(value)``, the most recent keys a query may need, which sizes a layer's KV cache; and
``sees_whole_cache(value, capacity)``, whether a new query sees every key a cache of ``capacity`` most recent
positions holds, which a kernel's fast path asks before it drops the mask.

A block attends under the masks its spec sets (``AttentionSpec.masks``: causal always, a window, ...): the manual
kernel and sdpa's boolean or float mask AND them over the queries' and keys' positions (``seen``, keys in position
order; ``seen_at``, keys at explicit positions: a ring that has wrapped, a static step's whole cache), flex ANDs
them in its block mask. A mask registered here is therefore right in training, in eager decoding and in static
steps past every wrap of the ring; the property grid holds every registered mask to its float64 formula
(``tests/attention_reference.py``).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from model.registry import MASKS, register

Masks = tuple  # ((mask class, value), ...): a block's masks, hashable (cached masks are keyed by it)


class Mask:
    name: ClassVar[str]
    field: ClassVar[str | None] = None  # the AttentionSpec field that sets it; None: always on

    @classmethod
    def value(cls, spec) -> Any | None:
        """Its value for ``spec`` (None: off)."""
        return getattr(spec, cls.field)

    @classmethod
    def sees(cls, query, key, value):
        """Whether a query at position ``query`` sees the key at ``key`` (both broadcast; ``value`` a number, or a
        tensor inside flex's mask_mod)."""
        raise NotImplementedError

    @classmethod
    def capacity(cls, value) -> int | None:
        """The most recent positions a query may need (None: every earlier one)."""
        return None

    @classmethod
    def sees_whole_cache(cls, value, capacity: int) -> bool:
        """Whether a new query sees every key of a cache holding the ``capacity`` most recent positions."""
        return False

    @classmethod
    def narrows_causal(cls, value, k_len: int) -> bool:
        """Whether, among ``k_len`` keys in position order, it hides a key the causal mask shows (a window shorter
        than them): where no mask does, a kernel takes its causal fast path."""
        return not cls.sees_whole_cache(value, k_len)

    @classmethod
    def everything(cls, n: int):
        """A value under which it hides nothing among ``n`` positions: flex's one block mask for every model (one
        compiled graph) holds every registered mask, those a model does not set at this value."""
        raise NotImplementedError


@register(MASKS)
class Causal(Mask):
    """Every earlier key and itself, never a later one."""

    name = "causal"

    @classmethod
    def value(cls, spec) -> bool:
        return True

    @classmethod
    def sees(cls, query, key, value):
        return key <= query

    @classmethod
    def sees_whole_cache(cls, value, capacity: int) -> bool:
        return True  # a cache holds earlier positions only

    @classmethod
    def narrows_causal(cls, value, k_len: int) -> bool:
        return False  # it is the causal mask

    @classmethod
    def everything(cls, n: int) -> bool:
        return True  # always on


@register(MASKS)
class Window(Mask):
    """A sliding window: itself and the ``window - 1`` positions before it. Its value is the block's context
    (``AttentionSpec.context``): the window, or a model without a position table's block size past it."""

    name, field = "window", "window"

    @classmethod
    def value(cls, spec) -> int | None:
        return spec.context

    @classmethod
    def sees(cls, query, key, value):
        return query - key < value

    @classmethod
    def capacity(cls, value) -> int | None:
        return value

    @classmethod
    def sees_whole_cache(cls, value, capacity: int) -> bool:
        return capacity <= value

    @classmethod
    def everything(cls, n: int) -> int:
        return n  # a window of n keys hides nothing among n positions


@register(MASKS)
class Chunked(Mask):
    """Llama 4's chunked attention: the context cut into chunks of ``value`` positions (0..C-1, C..2C-1, ...), a
    query seeing the keys of its own chunk only (with causal: itself and the earlier ones there)."""

    name, field = "chunked", "attention_chunk"

    @classmethod
    def sees(cls, query, key, value):
        return query // value == key // value

    @classmethod
    def capacity(cls, value) -> int | None:
        return value  # a query at the end of a chunk sees its whole chunk, C keys

    @classmethod
    def sees_whole_cache(cls, value, capacity: int) -> bool:
        # The chunk's start moves with the query: past the first chunk, the most recent keys straddle a boundary
        # (a query at the start of a chunk sees itself alone), so only a cache of one key is always seen.
        return capacity <= 1

    @classmethod
    def narrows_causal(cls, value, k_len: int) -> bool:
        return k_len > value  # keys from 0: all in the first chunk unless there are more than C

    @classmethod
    def everything(cls, n: int) -> int:
        return n  # one chunk of n positions hides nothing among them


@dataclass(frozen=True)
class HeldKeys:
    """The positions of the keys a KV cache gives a kernel where they are not in position order from 0: a ring that
    has wrapped (every slot holding a key: ``full``), or a static decode step's whole cache (an empty slot at a
    negative position). Keys in position order from 0 (training, a cache that has not wrapped) need none."""

    positions: torch.Tensor  # (k_len,)
    full: bool


def of_spec(spec) -> Masks:
    """The masks ``spec`` sets, with their values, in the registry's order."""
    return tuple((mask, value) for mask in MASKS.values() if (value := mask.value(spec)) not in (None, False))


def options_set(spec) -> Masks:
    """The masks whose option ``spec`` (an AttentionSpec or a GPTConfig) sets, with the option's value as typed: a
    window, a chunk; not causal, nor the context a model without a position table reads past (``of_spec`` has both)."""
    return tuple((mask, value) for mask in MASKS.values() if mask.field and (value := getattr(spec, mask.field)))


def capacity(masks: Masks, context: int | None = None) -> int | None:
    """The most recent positions a query needs under ``masks`` (at most ``context``); None: every earlier one."""
    needs = [n for n in (mask.capacity(value) for mask, value in masks) if n is not None]
    needs += [context] if context is not None else []
    return min(needs) if needs else None


def sees(masks: Masks, query, key):
    """The masks' predicates ANDed: whether ``query`` sees ``key`` (broadcast tensors)."""
    keep = None
    for mask, value in masks:
        seen = mask.sees(query, key, value)
        keep = seen if keep is None else keep & seen
    return keep


def in_order(q_len: int, k_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The positions of ``q_len`` queries, the last of ``k_len`` keys held in position order from 0 (training, a
    cache that has not wrapped): (q_len, 1) and (1, k_len)."""
    return (torch.arange(k_len - q_len, k_len, device=device)[:, None],
            torch.arange(k_len, device=device)[None, :])  # fmt: skip


def seen(q_len: int, k_len: int, masks: Masks, device: torch.device) -> torch.Tensor:
    """(q_len, k_len), True where query i (the last q_len of k_len positions, keys in position order) sees key j.

    Cached in eager mode: a training run asks for the same mask in every layer of every step. Under
    torch.compile the graph builds it (the compiler ignores an lru_cache, and warns that it does). A mask past
    ``CACHED_MASK_ELEMENTS`` (a reading at 16x the context: 256 MB a mask at 16k tokens) is built each time, not
    kept: 32 of them would hold gigabytes after the reading.
    """
    if torch.compiler.is_compiling() or q_len * k_len > CACHED_MASK_ELEMENTS:
        return _build_seen(q_len, k_len, masks, device)
    return _cached_seen(q_len, k_len, masks, device)


CACHED_MASK_ELEMENTS = 1 << 22  # 4 MiB of booleans: a training context of 2,048 tokens is kept


def _build_seen(q_len: int, k_len: int, masks: Masks, device: torch.device) -> torch.Tensor:
    return sees(masks, *in_order(q_len, k_len, device)).expand(q_len, k_len)


@functools.lru_cache(maxsize=32)
def _cached_seen(q_len: int, k_len: int, masks: Masks, device: torch.device) -> torch.Tensor:
    # A mask first built while generating (inference mode) would be an inference tensor, which a later training
    # step could not save for backward: the cached one is always an ordinary tensor.
    with ordinary_tensors():
        return _build_seen(q_len, k_len, masks, device).contiguous()


def hidden(q_len: int, k_len: int, masks: Masks, device: torch.device) -> torch.Tensor:
    """``~seen``: True where a query may not look at a key (where its score is masked), cached as it is."""
    if torch.compiler.is_compiling() or q_len * k_len > CACHED_MASK_ELEMENTS:
        return ~_build_seen(q_len, k_len, masks, device)
    return _cached_hidden(q_len, k_len, masks, device)


@functools.lru_cache(maxsize=32)
def _cached_hidden(q_len: int, k_len: int, masks: Masks, device: torch.device) -> torch.Tensor:
    with ordinary_tensors():
        return ~_cached_seen(q_len, k_len, masks, device)


def seen_at(queries: torch.Tensor, keys: torch.Tensor, masks: Masks) -> torch.Tensor:
    """(q_len, k_len): whether each query at ``queries`` (q_len,) sees each key at ``keys`` (k_len,), a key at a
    negative position being an empty slot of the cache (seen by none)."""
    query, key = queries[:, None], keys[None, :]
    return (key >= 0) & sees(masks, query, key)


def sees_every_key(q_len: int, k_len: int, masks: Masks, full_cache: bool = True) -> bool:
    """Whether one new query sees every key given (no mask needed): the ``k_len`` most recent positions, each slot
    holding one (``full_cache``: a ring that has wrapped, or keys in position order; a static step's cache may hold
    empty slots)."""
    return q_len == 1 and full_cache and all(mask.sees_whole_cache(value, k_len) for mask, value in masks)


def within_documents(keep: torch.Tensor, document_starts: torch.Tensor | None, keys: torch.Tensor) -> torch.Tensor:
    """Document masking (``model.document_masking``): ``keep`` (q_len, k_len) ANDed, row by row, with each query's
    document: a key at a position of ``keys`` (k_len,) before the query's document start (``document_starts``,
    (B, q_len) absolute positions) is hidden -> (B, 1, q_len, k_len). Without starts (one document), ``keep``.

    Not a registered mask: those are predicates over positions alone, the same for every row of a batch; where a
    document starts is in the tokens (after each end-of-text), so the model computes it per row and forward
    (``GPT.document_starts``) and the kernels AND it in beside the masks."""
    if document_starts is None:
        return keep
    return keep & (keys[None, None, None, :] >= document_starts[:, None, :, None])


@contextlib.contextmanager
def ordinary_tensors():
    """Outside inference mode, in the caller's grad mode (leaving inference mode would turn gradients on): what is
    made here is an ordinary tensor whatever the caller's mode, so a cache or a compiled graph serves both."""
    grad = torch.is_grad_enabled()
    with torch.inference_mode(False), torch.set_grad_enabled(grad):
        yield
