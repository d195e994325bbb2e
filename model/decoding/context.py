"""What a model attends to past the length it was trained at (``past_context``).

- ``ring``: each position sees its last ``block_size`` keys (and its window's, where shorter): the model
  only ever sees the context it was trained at, as a sliding window. What sample.py does today.
- ``full``: each position sees every earlier key (its window still applies: that is the layer's function).

A model without a position table (rope, alibi, none) has no weight that depends on ``block_size``: ``full`` is
the same weights in a model whose context is the evaluated length. A learned table has ``block_size`` rows,
so such a model is refused past it.
"""

from __future__ import annotations

from dataclasses import replace

from model import registry
from model.gpt import GPT

PAST_CONTEXTS = ("ring", "full")


def check_past_context(value: str) -> None:
    if value not in PAST_CONTEXTS:
        raise ValueError(f"past_context={value!r}; choose one of: {', '.join(PAST_CONTEXTS)} (ring: each position "
                         f"sees its last block_size keys; full: every earlier key)")  # fmt: skip


def check_reaches(config, length: int, fix: str = "") -> None:
    """Refuse, in one line, a length past a learned position table (``fix``: what to do instead; by default,
    lengths up to the table's)."""
    if length > config.block_size and not registry.position(config.position).runs_past_context:
        tableless = ", ".join(n for n, p in registry.POSITIONS.items() if p.runs_past_context)
        raise ValueError(f"length {length} is past this model's learned position table (block_size="
                         f"{config.block_size} rows): only a model without a table ({tableless}) reads past "
                         f"its block_size; {fix or f'use lengths up to {config.block_size}'}")  # fmt: skip


def with_context(model: GPT, length: int, past_context: str) -> GPT:
    """``model`` to read sequences of ``length`` tokens by ``past_context``'s rule: the model itself (within
    its block size, or ``ring``), or the same weights with every earlier key in view (``full``)."""
    check_past_context(past_context)
    if past_context == "ring" or length <= model.config.block_size:
        return model
    check_reaches(model.config, length, "leave past_context=ring: a learned model re-encodes its last block_size "
                                        "tokens past it")  # fmt: skip
    first = next(model.parameters())
    config = model.config
    if config.rope_scaling == "yarn":  # YaRN's trained length stays the trained one
        config = replace(config, rope_original_length=config.rope_original_length or config.block_size)
    wide = GPT(replace(config, block_size=length))
    wide = wide.to(device=first.device, dtype=first.dtype)
    wide.load_state_dict(model.state_dict())
    return wide.train(model.training)


def with_rope_scaling(model: GPT, scaling: str | None, factor: float) -> GPT:
    """The same weights with rotary scaled at inference (``model.attention.positions.scaled``): position interpolation,
    NTK-aware or YaRN by ``factor``, YaRN counting turns over the model's trained length."""
    config = model.config
    original = (config.rope_original_length or config.block_size) if scaling == "yarn" else None  # YaRN's alone
    scaled = GPT(replace(config, rope_scaling=scaling, rope_factor=factor, rope_original_length=original))
    first = next(model.parameters())
    scaled = scaled.to(device=first.device, dtype=first.dtype)
    scaled.load_state_dict(model.state_dict())
    return scaled.train(model.training)
