"""A name chosen from a table (a tokenizer, an attention layout, a kernel), with the one-line error that lists
the valid names: shared by data (tokenizers) and model (the attention registry), so data needs no model."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def lookup(registry: dict[str, T], kind: str, name: str) -> T:
    """Return ``registry[name]``, or raise a ValueError naming the valid choices."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(registry))
        raise ValueError(f"unknown {kind} {name!r}; choose one of: {valid}") from None
