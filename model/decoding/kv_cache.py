"""The KV cache: every layer's keys and values, and the one place that knows which positions they hold.

The GPT asks the cache for the positions of the tokens it is given (``positions``) and tells it when they
are processed (``advance``); attention stores and reads keys and values through ``LayerCache.update``; a
static decode step (``model.decoding.steps``) opens and closes its step here (``open_step`` / ``close_step`` /
``stepped``). Eager, CUDA-graph and compiled decoding share this one bookkeeping.
"""

from __future__ import annotations

import torch

from model.attention.masks import HeldKeys


class LayerCache:
    """One layer's keys and values for the positions processed so far (a batch of sequences).

    Buffers are (batch, kv_heads, capacity, head_dim) (attention=mla's: (batch, 1, capacity, kv_latent)
    latents and (batch, 1, capacity, rope_head_dim) rotary keys), allocated at the first write and written in place
    (no copy of the past per token): slot 0 serves the multi-head layouts, one slot per key/value group
    the wrapper; slot ``STATES_SLOT`` (-1) the token biases' states per key and head, (batch, heads, capacity, 1)
    (``model.attention.modifications``). The capacity is the context, or the window when shorter: then
    the buffer is a ring (position p in slot p % capacity) and one new query sees all of it, exactly its window.
    """

    def __init__(self, owner: KVCache, index: int) -> None:
        self.owner = owner  # the KVCache: how many positions are cached, the capacities, a static step's state
        self.index = index  # the layer's: its capacity is its own (a local layer's ring, its window)
        self.slots: dict[int, tuple[torch.Tensor, ...]] = {}  # per slot: its tensors' buffers (keys, values, ...)

    @property
    def capacity(self) -> int:
        return self.owner.capacities[self.index]

    def keep_state(self, slot: int, *tensors: torch.Tensor) -> None:
        """Keep a layer's fixed-size decoding state (a linear layer's matrix state, its convolution's last inputs) in
        ``slot``: copied into place once made, never replaced, since a captured decode step (a CUDA graph) reads
        the buffers it was captured with. The one way a layer keeps a state: reassigning one would pass on a CPU."""
        held = self.slots.get(slot)
        if held is None:
            self.slots[slot] = tuple(t.clone() for t in tensors)
            return
        for buffer, t in zip(held, tensors, strict=True):
            buffer.copy_(t)

    def update(self, slot: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Store the new positions' per-token tensors (keys and values, each its own width: attention=mla's latents
        and rotary keys; a modification's state per key, ``Modification.cache_width``), each (batch, heads, new, width);
        return the ones the new queries attend over, in the same order, then, where they are not in position order
        from 0, the positions they hold (``HeldKeys``: a ring that has wrapped, a static decode step's whole cache;
        the kernels' masks read them, ``model.attention.masks``), else None."""
        start, new, capacity = self.owner.length, tensors[0].size(2), self.capacity
        if self.owner.position is not None:  # a static decode step: one position, given as a tensor
            where = (self.owner.position % capacity).view(1)
            for held, t in zip(self.slots[slot], tensors, strict=True):
                held.index_copy_(2, where, t)
            return *self.slots[slot], self.owner.held[capacity]  # every slot, at the positions the step says they hold
        if slot not in self.slots:
            # Zeros, not uninitialised memory: a static decode step reads every slot (masked: weight 0), and
            # 0 x NaN would be NaN.
            # Each its own width: attention=mla keeps latents and rotary keys (no rotary part: zero wide).
            self.slots[slot] = tuple(t.new_zeros((t.size(0), t.size(1), capacity, t.size(3))) for t in tensors)
        buffers = self.slots[slot]
        if start + new <= capacity:  # in position order
            for held, t in zip(buffers, tensors, strict=True):
                held[:, :, start : start + new] = t
            return *(held[:, :, : start + new] for held in buffers), None
        # Past the capacity: a windowed cache, which only ever needs the last `capacity` positions.
        if new == 1:
            for held, t in zip(buffers, tensors, strict=True):
                held[:, :, start % capacity] = t[:, :, 0]
            return *buffers, self.owner.ring(capacity, tensors[0].device)
        if start > 0:
            raise ValueError(f"a windowed KV cache takes one position at a time once it holds {capacity}; "
                             f"refill it from the window's tokens")  # fmt: skip
        kept = torch.arange(new - capacity, new, device=tensors[0].device)  # a first fill longer than the window
        for held, t in zip(buffers, tensors, strict=True):
            held[:, :, kept % capacity] = t[:, :, -capacity:]
        return *tensors, None


class KVCache:
    """Keys and values of every layer for the positions processed so far (a batch of sequences).

    ``capacity`` positions are preallocated per layer (a number for every layer, or one per layer): unless given,
    the model's context, or each layer's attention window when shorter (``GPTConfig.cache_capacities``); with
    ``n_kv_head`` key/value heads.
    """

    def __init__(self, n_layer: int, capacity: int | list[int] | None = None) -> None:
        self.layers = [LayerCache(self, i) for i in range(n_layer)]
        self.length = 0
        self.capacities: list[int] | None = None
        if capacity is not None:
            self.size_layers(capacity)
        # During a static decode step: the new position as a 0-d tensor, and for each capacity the positions its
        # slots hold (an empty slot's negative). Static shapes: a CUDA graph can replay it.
        self.position: torch.Tensor | None = None
        self.held: dict[int, HeldKeys] = {}
        self.slot_ids: torch.Tensor | None = None  # 0 .. capacity-1: the slots whose positions a static step computes
        self.rings: dict[int, HeldKeys] = {}  # a wrapped ring's positions at the current length, per capacity
        # Document masking: (B,) where the next token's document starts, carried from call to call, written in place
        self.document_starts: torch.Tensor | None = None

    def size_layers(self, capacity: int | list[int]) -> None:
        """Each layer's capacity: one number for all, or one per layer."""
        self.capacities = [capacity] * len(self.layers) if isinstance(capacity, int) else list(capacity)

    @property
    def capacity(self) -> int | None:
        """The largest layer's capacity (every layer's, without a schedule of layers)."""
        return None if self.capacities is None else max(self.capacities)

    @property
    def in_static_step(self) -> bool:
        return self.position is not None

    def positions(self, count: int, device: torch.device, capacity: int | list[int]) -> torch.Tensor:
        """The positions of ``count`` new tokens after the cached ones, (count,); in a static step its position
        tensor (no Python number of it: one captured step serves every position). ``capacity`` (one, or one
        per layer) sizes a cache made without one."""
        if self.in_static_step:
            return self.position.view(1)
        if self.capacities is None:
            self.size_layers(capacity)
        return torch.arange(self.length, self.length + count, device=device)

    def advance(self, count: int) -> None:
        """``count`` new positions were processed (a static step says its own: ``stepped``)."""
        if not self.in_static_step:
            self.length += count
            self.rings = {}

    def reset(self) -> None:
        """Empty the cache, keeping its buffers (a captured decode step refers to them): refilled in place."""
        self.length, self.rings = 0, {}
        if self.document_starts is not None:
            self.document_starts.zero_()

    def next_document_starts(self, batch: int, device: torch.device) -> torch.Tensor:
        """(B,): where the document of the token after the cached ones starts (``GPT.document_starts`` updates it in
        place: a captured decode step reads and writes this one tensor; its update is idempotent, so a graph's
        warm-up that runs a step twice leaves it as once)."""
        if self.document_starts is None:
            self.document_starts = torch.zeros(batch, dtype=torch.long, device=device)
        return self.document_starts

    def ring(self, capacity: int, device: torch.device) -> HeldKeys:
        """The positions a wrapped ring of ``capacity`` slots holds as the new position (``length``) is written:
        slot s the latest position congruent to s, every slot full. Made once per step for all its layers."""
        if capacity not in self.rings:
            newest = self.length
            slots = torch.arange(capacity, device=device)
            self.rings[capacity] = HeldKeys(newest - (newest - slots).remainder(capacity), full=True)
        return self.rings[capacity]

    def nbytes(self) -> int:
        """Bytes the cache's buffers hold."""
        return sum(t.nbytes for t in self.buffers())

    def buffers(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for held in layer.slots.values() for t in held]

    def prepare_static_steps(self, device: torch.device) -> list[torch.Tensor]:
        """Before static steps (the cache filled by a prompt): make the slot numbers whose positions a step computes;
        returns every tensor of the cache a step reads, which stays at its address (graphs may keep them)."""
        self.slot_ids = torch.arange(self.capacity, device=device)
        return [self.slot_ids, *self.buffers()]

    def open_step(self, position: torch.Tensor) -> None:
        """A static step at ``position`` (a 0-d tensor) writes its keys there and attends over every slot: slot s
        holds the latest position up to ``position`` congruent to s modulo its capacity, negative where none is
        (each capacity its own: a schedule's local layers wrap before its global ones); the masks
        (``model.attention.masks``) say which its query sees."""
        self.held = {c: HeldKeys(position - (position - self.slot_ids[:c]).remainder(c), full=False)
                     for c in dict.fromkeys(self.capacities)}  # fmt: skip
        self.position = position

    def close_step(self) -> None:
        self.position, self.held = None, {}

    def stepped(self, position: int) -> None:
        """A static step at ``position`` has run: the cache holds every position up to it."""
        self.length = position + 1
