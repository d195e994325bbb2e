"""model.k_eq_v, keys equal to values (Gemma 4's attention_k_eq_v): one key/value projection in every layout of
GPT-2's function, exact conversion between them, a KV cache of the keys alone where the encodings leave them as
projected, and the refusals. Its formula is tests/attention_reference.py's (the grids of
tests/test_attention_properties.py hold every layout to it, with cached decoding)."""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import assert_converts_exactly, tiny_gpt_config

from model import GPT, KVCache, same_function_layouts
from training.plan import cache_width

LAYOUTS = same_function_layouts("fused_qkv")
# 4 query heads, 2 key/value heads: the wrapper's first head of each group owns its key, no head a value
WEIGHT_NAMES = {"wrapper": {*(f"heads.{h}.query" for h in range(4)), "heads.0.key", "heads.2.key"},
                "separate_qkv": {"query", "key"}, "fused_qkv": {"c_attn_qk"}}  # fmt: skip


def keqv_gpt(layout: str, seed: int = 0, **options) -> GPT:
    torch.manual_seed(seed)
    config = tiny_gpt_config(attention=layout, n_head=4, n_kv_head=2, n_layer=2, k_eq_v=True, kernel="manual",
                             **options)  # fmt: skip
    return GPT(config).eval()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_projects_no_values(layout):
    attn = keqv_gpt(layout).transformer.h[0].attn
    names = {name.rsplit(".", 1)[0] for name in attn.state_dict()} - {"c_proj"}
    assert names == WEIGHT_NAMES[layout]


@pytest.mark.parametrize("src,dst", list(itertools.permutations(LAYOUTS, 2)))
def test_layouts_start_from_the_same_weights_and_convert_exactly(src, dst):
    """For a seed every layout draws the same weights (in the canonical form, converted); converting a state dict
    there and back is the identity, bit for bit, and the converted model computes the same logits."""
    a, b = keqv_gpt(src), keqv_gpt(dst)
    assert_converts_exactly(a, b, src, dst)


@pytest.mark.parametrize("options,tensors", [({}, 1), ({"position": "alibi"}, 1), ({"position": "rope"}, 2),
                                             ({"qk_norm": True}, 2), ({"position": "path"}, 2)])  # fmt: skip
def test_the_cache_keeps_the_keys_alone_where_they_are_the_values_and_the_plan_counts_it(options, tensors):
    """Under QK-norm or rotary the values are the keys before their encodings, which the cached keys are not: both
    are kept (as Gemma 4's cache does); so under PaTH, whose tokens turn the held keys. The cache's bytes are what
    the plan and the report count."""
    model = keqv_gpt("fused_qkv", **options)
    cache = KVCache(model.config.n_layer)
    with torch.inference_mode():
        model(torch.zeros(3, 8, dtype=torch.long), cache=cache)
    layers, positions, batch, float32, kv_dims = 2, 8, 3, 4, 2 * 4  # 2 key/value heads of 4 dims
    assert cache.nbytes() == layers * positions * batch * tensors * kv_dims * float32
    assert model.config.cache_widths == [tensors * kv_dims] * layers
    assert cache_width(model.config) == tensors * kv_dims


@pytest.mark.parametrize("layout,says", [
    ("mla", "model.k_eq_v=true is an option of attention=wrapper or attention=separate_qkv or attention=fused_qkv, "
            "but attention=mla; use"),
    ("gated_deltanet", "model.k_eq_v=true with attention=gated_deltanet in every layer: it is an option of "
                       "attention=wrapper"),
])  # fmt: skip
def test_a_layer_that_cannot_hold_it_refuses_it_in_one_line(layout, says):
    extra = {"kv_latent": 8} if layout == "mla" else {}
    with pytest.raises(ValueError) as err:
        tiny_gpt_config(attention=layout, k_eq_v=True, **extra)
    assert says in str(err.value) and "\n" not in str(err.value)



@pytest.mark.parametrize("layout", LAYOUTS)
def test_under_path_the_values_are_the_keys_before_the_tokens_turn_them_in_cached_decoding_too(layout):
    """PaTH turns the keys a KV cache holds by each new token: a cache that kept the keys alone would read turned
    keys back as values. Decoding token by token gives the full forward's logits."""
    model = keqv_gpt(layout, position="path")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    idx = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(2))
    cache = KVCache(model.config.n_layer)
    with torch.no_grad():
        full = model(idx, idx)[0]
        steps = [model(idx[:, :4], cache=cache)[0]]
        steps += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(4, 9)]
    torch.testing.assert_close(torch.cat([s[:, -1] for s in steps], dim=0),
                               torch.cat([full[:, t] for t in range(3, 9)], dim=0), atol=1e-4, rtol=0)  # fmt: skip
