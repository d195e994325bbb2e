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

from model import GPT, MIXERS, GPTConfig, KVCache
from model.attention import AttentionSpec, MultiHeadAttention

SOFTMAX = sorted(name for name, cls in MIXERS.items() if cls.takes_kernel)

# What a layout may define: its projection (and what the cache's contents become: keys_values), its weights' common
# form, and the facts it states. Anything else a layout class defined would be a stage of its own.
PROJECTION_AND_FACTS = {
    "project", "projections", "split_heads", "keys_values", "to_qkv", "from_qkv", "heads_in", "input_casts",
    "score_widths", "kv_width", "rotary_width", "query_parts", "key_parts", "initial_tensor", "check_spec",
    "projection_options", "cannot_hold", "matrix_rows",
    "name", "colour", "marker", "QKV_KEY", "QKV_EXAMPLE", "LINEARS", "canonical", "function", "computes", "applies",
    "caches_keys", "shares_kv",
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
    defined = {name for cls in classes_between(MIXERS[layout]) for name in vars(cls)}
    assert defined <= PROJECTION_AND_FACTS, (
        f"attention={layout} defines {sorted(defined - PROJECTION_AND_FACTS)}: a stage of the pipeline belongs to "
        f"MultiHeadAttention (model/attention/pipeline.py), which every layout runs; a layout owns only its projection")


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


def test_every_option_has_its_place_a_stage_a_projection_or_a_layer_of_its_own_form():
    """An option is applied where it is declared: by a stage of the pipeline (then by every pipeline layer, which the
    probes above prove reach the output), by a projection, by a layer that runs its own form, or by a position
    encoding (its fields). One declared nowhere would be refused everywhere: said here, before a user finds it."""
    from model.attention.options import option_fields
    from model.attention.pipeline import STAGE_OPTIONS
    from model.registry import POSITIONS

    placed = set().union(*STAGE_OPTIONS.values())
    placed |= {name for cls in MIXERS.values() for name in getattr(cls, "projection_options", ())}
    placed |= {name for cls in MIXERS.values() if not cls.takes_kernel for name in cls.applies}
    placed |= {name for cls in POSITIONS.values() for name in cls.fields}
    assert set(option_fields()) <= placed, f"options with no place: {sorted(set(option_fields()) - placed)}"


def keeps_a_state(layout: str) -> bool:
    """Whether a layer carries a fixed-size decoding state (``state_bytes``: a linear layer's)."""
    return MIXERS[layout].state_bytes(AttentionSpec(32, 4, **layout_defaults(layout)), 4) > 0


@pytest.mark.parametrize("layout", [name for name in sorted(MIXERS) if keeps_a_state(name)])
def test_a_layers_decoding_state_is_written_in_place_for_a_captured_step(layout):
    """A CUDA graph replays the buffers it captured: a layer's state must be written into them, never replaced
    (a reassigned state passes every CPU test). Every layer that keeps a state, through static decode steps."""
    from model.decoding.steps import StaticStep

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=4, n_embd=32, attention=layout,
                       **{"position": "none", **layout_defaults(layout)})  # fmt: skip
    gpt = GPT(config).eval()
    cache = KVCache(1, gpt.cache_capacities)
    idx = torch.randint(0, 32, (2, 8))
    with torch.inference_mode():
        gpt(idx[:, :4], cache=cache)
        held = [t.data_ptr() for t in cache.layers[0].slots[0]]
        step = StaticStep(gpt, cache, 2, torch.device("cpu"))
        for t in range(4, 8):
            step(idx[:, t : t + 1], t)
    assert [t.data_ptr() for t in cache.layers[0].slots[0]] == held, f"attention={layout} replaced its state"


def test_every_modification_states_its_stage_and_a_modification_of_the_scores_is_the_kernels():
    """The modifications registry holds each modification of softmax attention with the stage that applies it (QK-norm
    of the encodings, the output gate, the scores' ALiBi bias, softcap, sinks and forget gate of the kernel): named for
    what it holds, so none is read as another's kind."""
    from model.attention.pipeline import STAGE_OPTIONS
    from model.registry import MODIFICATIONS

    for name, mod in MODIFICATIONS.items():
        assert mod.stage in STAGE_OPTIONS, f"{name} states no stage of the pipeline: {mod.stage!r}"
        assert (mod.stage == "kernel") == mod.on_scores, f"{name}: on the scores exactly when the kernel applies it"
    assert {MODIFICATIONS["qk_norm"].stage, MODIFICATIONS["gate"].stage} == {"encodings", "gate"}


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("time_major", [False, True])
def test_the_encodings_fast_path_over_whole_heads_equals_the_general_one(qk_norm, time_major):
    # A layout's parts are WHOLE, which the encodings apply by calling QK-norm and rotary directly (a decode step's
    # cost was the general path's closures); the same parts as another object take the general path (on_dims):
    # the same numbers, bit for bit, heads-major (B, H, T, d) and time-major (B, T, H, d) alike.
    from model.attention.pipeline import WHOLE, Parts

    block = model("separate_qkv", dict(position="rope", qk_norm=qk_norm)).transformer.h[0].attn
    if qk_norm:
        with torch.no_grad():
            block.q_norm.weight.add_(torch.randn(block.q_norm.weight.shape, generator=torch.Generator().manual_seed(2)))
    t = torch.randn(2, 5, 4, 8, generator=torch.Generator().manual_seed(3))  # (B, T, H, d)
    t = t if time_major else t.transpose(1, 2)
    positions = torch.arange(3, 8)
    time_dim = -3 if time_major else -2
    fast = block.encoded(t, positions, block.q_norm, WHOLE, time_dim)
    general = block.encoded(t, positions, block.q_norm, Parts(slice(None), slice(None)), time_dim)
    assert torch.equal(fast, general)
    assert not torch.equal(fast, t), "the encodings act"


def test_a_key_selection_registers_its_own_plan_terms_and_the_pipeline_names_none():
    """A key selection (MoBA, sparse attention; NSA to come) is its own module: registered with its options, its call
    and its plan terms (``model.attention.selection``), none inherited (a selection priced as dense attention is refused
    as it registers), and the pipeline asks the registry: pipeline.py names no selection's option or attribute."""
    import re
    from pathlib import Path

    from model.attention.selection import KeySelection
    from model.registry import SELECTIONS, register

    assert set(SELECTIONS) >= {"sparse", "moba"}

    class Priced(KeySelection):  # a selection whose FLOPs would be dense attention's
        name, field, attribute, per_call = "priced_as_dense", "moba_block", "priced", True

        @classmethod
        def build(cls, spec, rotary_width, widths):
            return cls()

        @classmethod
        def attended(cls, spec, keys):
            return keys

        def select_heads(self, q, k, keys, positions, documents):
            return None

    with pytest.raises(ValueError, match="key selection priced_as_dense states no flops of its own"):
        register(dict(SELECTIONS))(Priced)
    source = Path("model/attention/pipeline.py").read_text()
    named = {name for cls in SELECTIONS.values() for name in (cls.field, cls.attribute)}
    assert not [m for m in re.findall(r"\.(\w+)\b", source) if m in named], "pipeline.py names a key selection"


def test_a_mixer_of_its_own_form_holds_only_the_positions_it_declares_and_its_familys_options():
    """A linear layer names the position encodings it holds (``positions``), never those left after excluding what
    turns or biases (which took PaTH until it was excluded by hand): a new encoding is refused until it says so. And
    every mixer that runs the delta rule applies the options declared of that stage (one declaration reaches both)."""
    from model.attention.options import stage_options
    from model.attention.positions import PositionEncoding
    from model.registry import POSITIONS

    linear = [cls for cls in MIXERS.values() if not cls.takes_kernel]

    def refused(cls, position: str) -> bool:
        return any(name == "position" for name, *_ in cls.unapplied(AttentionSpec(32, 4, position=position)))

    class AnotherTable(PositionEncoding):  # neither turns, biases nor transforms: the rule by exclusion took it
        name = "another_table"

    POSITIONS[AnotherTable.name] = AnotherTable
    try:
        for cls in linear:
            assert {name for name in POSITIONS if not refused(cls, name)} == set(cls.positions), cls.name
    finally:
        del POSITIONS[AnotherTable.name]
    for cls in linear:
        assert stage_options("delta rule") <= cls.applies, cls.name
