"""Evaluation lengths and protocols as options spell them: what the config, the plan and the evaluators share
(one vocabulary, checked before any work)."""

from __future__ import annotations

from typing import Any

LENGTH_HINT = "each length is a number of tokens, at least 1 (512), or a multiple of block_size (4x)"


def length_spellings(lengths: Any) -> list:
    """``lengths`` as given (one value or a list), each checked for its spelling: an int, or ``<number>x``."""
    values = list(lengths) if isinstance(lengths, (list, tuple)) else [lengths]
    if not values:
        raise ValueError(f"lengths=[] names no length; {LENGTH_HINT}, e.g. lengths=[1x,4x,16x]")
    for value in values:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if isinstance(value, str) and value.endswith("x"):
            try:
                ok = float(value[:-1]) > 0
            except ValueError:
                ok = False
        if not ok:
            raise ValueError(f"lengths={values}: {value!r} is not a length; {LENGTH_HINT}")
    return values


def resolve_lengths(lengths: Any, block_size: int) -> list[int]:
    """Token counts of ``lengths``: a multiple ``4x`` is 4 x block_size (rounded; at least 1)."""
    resolved = []
    for value in length_spellings(lengths):
        tokens = value if isinstance(value, int) else max(1, round(float(value[:-1]) * block_size))
        if tokens not in resolved:
            resolved.append(tokens)
    return resolved


PROTOCOLS = ("chunks", "sliding")


def check_protocol(protocol: str, stride: int | None) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol={protocol!r}; choose one of: {', '.join(PROTOCOLS)} (chunks: independent "
                         f"chunks of the length, ALiBi's; sliding: a window moved by `stride`, YaRN's)")  # fmt: skip
    if stride is not None and (isinstance(stride, bool) or not isinstance(stride, int) or stride < 1):
        raise ValueError(f"stride={stride!r} must be a whole number of tokens, at least 1 (e.g. stride=64)")
