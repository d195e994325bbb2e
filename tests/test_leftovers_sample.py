"""sample.py says a kernel compiles before the first tokens exactly when a pass of this sampling compiles it:
the kernel answers for each pass (flex: a one-token step that sees every key runs as SDPA, uncompiled)."""

from __future__ import annotations

import pytest

import sample
from model import registry
from model.attention import AttentionSpec


@pytest.mark.parametrize(("prompt_len", "window", "use_cache", "max_new_tokens", "expected"), [
    (4, None, True, 8, True),  # the prompt's pass: four queries under a causal mask
    (1, None, True, 8, False),  # one query sees its one key; every later step is one query over the cache
    (1, 2, True, 8, False),  # ... a windowed cache never holds more than the window
    (1, None, False, 8, True),  # without the cache the second pass has two queries
    (1, None, False, 1, False),  # ... unless there is no second pass
])  # fmt: skip
def test_flex_compiles_on_the_passes_its_routing_does_not_send_to_sdpa(prompt_len, window, use_cache,
                                                                      max_new_tokens, expected):  # fmt: skip
    flex, masks = registry.kernel("flex"), AttentionSpec(16, 2, window=window).masks
    assert sample.compiles_before_first_tokens(flex, masks, prompt_len, use_cache, max_new_tokens) is expected


@pytest.mark.parametrize("name", ["manual", "sdpa"])
def test_a_kernel_that_does_not_compile_itself_is_never_announced(name):
    kernel, masks = registry.kernel(name), AttentionSpec(16, 2).masks
    assert not any(sample.compiles_before_first_tokens(kernel, masks, n, cache, 8) for n in (1, 4, 64)
                   for cache in (True, False))  # fmt: skip
