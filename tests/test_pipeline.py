"""One attention pipeline, of which a layout owns only its projection (issue 61, goal 1).

Every softmax layer runs the same stages from its input to its output (``model.attention.MultiHeadAttention``): the
projection (the layout's), the heads' encodings, the KV cache, the kernel with its score modifications and the
heads' combination, the gate, the output projection. A stage a layout re-implements is where an option goes silently
missing (fused_qkv once turned its queries by rotary itself and skipped their temperature). Two proofs, each over
every registered layer that runs a kernel:

- what a layout class defines: its projection and its facts, never a stage (by name, over its classes);
- each stage's probe: the stage made to scale what it returns changes every layout's output, on every path (a
  forward, a cached decode step, the attention maps), so no layout reaches the output around it.
"""

from __future__ import annotations

import pytest
import torch
from test_options import layout_defaults

from model import ATTENTION_LAYOUTS, GPT, GPTConfig, KVCache
from model.attention import MultiHeadAttention

SOFTMAX = sorted(name for name, cls in ATTENTION_LAYOUTS.items() if cls.takes_kernel)

# What a layout may define: its projection (and what the cache's contents become: keys_values), its weights' common
# form, and the facts it states. Anything else a layout class defined would be a stage of its own.
PROJECTION_AND_FACTS = {
    "project", "projections", "split_heads", "keys_values", "to_qkv", "from_qkv", "heads_in", "input_casts",
    "score_widths", "kv_width", "rotary_width", "query_parts", "key_parts", "initial_tensor", "check_spec",
    "name", "colour", "marker", "QKV_KEY", "QKV_EXAMPLE", "LINEARS", "canonical", "function", "computes", "applies",
    "__init__", "__module__", "__qualname__", "__doc__", "__annotations__", "__firstlineno__",
    "__static_attributes__", "__dict__", "__weakref__", "__parameters__", "_abc_impl",
}  # fmt: skip

# The pipeline's stages, each probed (with the options that make each act); keys_values is a projection's own hook
STAGES = ["encoded", "scale_queries", "attend_heads", "gated"]
# with QK-norm, and without (where a fused projection's queries and keys turn in one call): both paths probed
OPTIONS = {"qknorm": dict(position="rope", qk_norm=True, query_temperature=3, gate="headwise"),
           "plain": dict(position="rope", query_temperature=3, gate="elementwise")}


def classes_between(layout: type) -> list[type]:
    """A layout's own classes: its MRO up to the pipeline (``MultiHeadAttention``) and nn.Module."""
    return [cls for cls in layout.__mro__ if cls not in MultiHeadAttention.__mro__]


@pytest.mark.parametrize("layout", SOFTMAX)
def test_a_layout_defines_its_projection_and_its_facts_never_a_stage(layout):
    defined = {name for cls in classes_between(ATTENTION_LAYOUTS[layout]) for name in vars(cls)}
    assert defined <= PROJECTION_AND_FACTS, (
        f"attention={layout} defines {sorted(defined - PROJECTION_AND_FACTS)}: a stage of the pipeline belongs to "
        f"MultiHeadAttention (model/attention.py), which every layout runs; a layout owns only its projection")


def model(layout: str, options: dict) -> GPT:
    torch.manual_seed(0)
    fields = {**layout_defaults(layout), **options}
    if layout == "mla":
        fields |= {"rope_head_dim": 4}
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=4, n_embd=32, attention=layout,
                       kernel="manual", n_kv_head=None if layout == "mla" else 2, **fields)  # fmt: skip
    gpt = GPT(config).eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.add_(torch.randn(p.shape) * 0.3)
    return gpt


def forwards(gpt: GPT, idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """What each path gives: every position's hidden state, a cached decode of the last token, the maps."""
    block = gpt.transformer.h[0]
    with torch.no_grad():
        cache = KVCache(1, gpt.cache_capacities)
        gpt(idx[:, :-1], cache=cache)
        return {"forward": gpt.hidden_states(idx), "cached step": gpt(idx[:, -1:], cache=cache)[0],
                "maps": block.attn.attention_weights(block.ln_1(gpt.transformer.wte(idx)))}


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("layout", SOFTMAX)
@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_reaches_every_layouts_output_on_every_path(layout, stage, options, monkeypatch):
    gpt = model(layout, OPTIONS[options])
    idx = torch.randint(0, 32, (2, 9), generator=torch.Generator().manual_seed(1))
    plain = forwards(gpt, idx)
    original = getattr(MultiHeadAttention, stage)

    def probe(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        return tuple(t * 1.5 for t in out) if isinstance(out, tuple) else out * 1.5

    monkeypatch.setattr(MultiHeadAttention, stage, probe)
    probed = forwards(gpt, idx)
    for path, out in plain.items():
        if path == "maps" and stage in ("attend_heads", "gated"):  # the maps are the kernel's input, not its output
            continue
        assert not torch.allclose(out, probed[path]), f"attention={layout}'s {path} goes around the stage {stage}"
