"""Cross-layer KV sharing (``+model.layer_kinds.S.kv_from=X``: CLA, YOCO, Gemma's shared-KV layers): a layer of kind
S projects no keys or values and keeps no KV cache; it reads those of the nearest earlier layer of kind X, as that layer
encoded and cached them. Held here: the whole GPT against its float64 formula (tests/attention_reference.py's
``gpt_reference``) at several lengths, gradients included; cached decoding against the full forward from every prompt
length, eager and static steps, past block_size on a ring (the decoding grid's own check, which holds the cache's bytes
to the plan's); fewer parameters, FLOPs and cache bytes, as the plan says; exact conversion between the layouts; the
label, heads.py's maps, the GPT-2 export's refusal; and every bad value refused in one line naming it and the fix."""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch
from attention_reference import gpt_reference
from helpers import assert_converts_exactly, tiny_gpt_config
from test_attention_properties import assert_decodes_like_full_recomputation, eager_or_static

from model import GPT, KVCache, same_function_layouts
from model.config import attention_label, schedule_text
from training.plan import layer_rows

LAYOUTS = same_function_layouts("fused_qkv")
CLA = {"layer_pattern": "GS", "layer_kinds": {"G": {}, "S": {"kv_from": "G"}}}  # adjacent pairs, as CLA's
# Each layout meets a set of the options on the keys' side (what the reader must share with its source) and the
# reader's own (a smaller window than its source's, sinks, a gate)
CELLS = {
    "fused_qkv": dict(position="rope", n_kv_head=2, kernel="sdpa"),
    "separate_qkv": dict(position="learned", qk_norm=True, kernel="manual", n_layer=3, layer_pattern="GSS",
                         layer_kinds={"G": {}, "S": {"kv_from": "G", "window": 3, "sinks": True}}),
    "wrapper": dict(position="alibi", k_eq_v=True, n_kv_head=2, kernel="manual", gate="headwise", window=5),
}  # fmt: skip


def shared_gpt(layout: str, n_layer: int = 4, seed: int = 0, perturbed: bool = True, **options) -> GPT:
    torch.manual_seed(seed)
    options = {**CLA, **options}
    config = tiny_gpt_config(vocab_size=64, block_size=16, n_layer=n_layer, n_head=4, n_embd=32, attention=layout,
                             **options)  # fmt: skip
    model = GPT(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    if not perturbed:
        return model
    with torch.no_grad():
        for p in model.parameters():  # away from the init: every weight matters, sinks included
            p.add_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() > 1 else 0.5))
    return model


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_gpt_is_its_formula_with_the_readers_keys_and_values_its_sources(layout):
    """The model's logits and every parameter's gradient are ``gpt_reference``'s, in which layer S's keys and values
    are layer j's (projected from layer j's input by its weights, normed and turned there), at lengths across the
    windows. The source's key projection gets its gradient from both layers."""
    model = shared_gpt(layout, **CELLS[layout])
    n_layer = model.config.n_layer
    assert all((j is None) == (model.config.layer_kind_names[i] == "G") for i, j in enumerate(model.kv_sources))
    gen = torch.Generator().manual_seed(5)
    for T in (1, 6, 16):
        idx = torch.randint(0, 64, (2, T), generator=gen)
        model.zero_grad()
        logits, _ = model(idx, idx)
        logits.double().square().mean().backward()
        got = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        want = gpt_reference(model, idx)
        want.square().mean().backward()
        torch.testing.assert_close(logits.double(), want, atol=2e-5, rtol=1e-4, msg=f"logits at T={T}")
        scale = max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None)
        for name, p in model.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(got[name].double(), p.grad.double(), atol=2e-5 * (1 + scale), rtol=1e-4,
                                           msg=f"d/d{name} at T={T}")  # fmt: skip
    readers = [i for i, j in enumerate(model.kv_sources) if j is not None]
    assert readers and len(readers) < n_layer


def test_the_formula_is_not_the_model_without_sharing():
    """The formula tells sharing from a model whose readers had keys of their own: the same weights in a model where
    each reader reads another source (GSGS read by pairs vs every S reading layer 0) give other logits."""
    model = shared_gpt("fused_qkv", position="rope")
    idx = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(2))
    want = gpt_reference(model, idx)
    model.kv_sources = [None, 0, None, 0]  # layer 3 reading layer 0's keys instead of layer 2's
    wrong, _ = model(idx, idx)
    assert (wrong.double() - want).abs().max() > 1e-2


DECODE_CELLS = [("fused_qkv", dict(kernel="sdpa", position="rope", window=7)),  # past block_size on a ring
                ("separate_qkv", dict(kernel="manual", n_kv_head=1)),
                ("wrapper", dict(kernel="manual", position="alibi", n_kv_head=2, window=7))]  # fmt: skip


@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
@pytest.mark.parametrize("layout,options", DECODE_CELLS, ids=[layout for layout, _ in DECODE_CELLS])
def test_cached_decoding_is_the_full_forward_and_the_cache_holds_the_plans_bytes(layout, options, static):
    """The decoding grid's check (tests/test_attention_properties.py): from each prompt length, every step's logits
    are the full forward's; the cache holds exactly the plan's decoding_bytes (the readers none); past block_size on
    a ring for a model without a position table."""
    torch.manual_seed(0)
    config = tiny_gpt_config(vocab_size=64, block_size=12, n_layer=4, n_head=4, n_embd=32, attention=layout,
                             **CLA, **options)  # fmt: skip
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    total = 20 if config.runs_past_context else 12
    assert_decodes_like_full_recomputation(model, eager_or_static(static, "cpu"), [1, 5, 8, 11], "cpu", total=total)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sharing_keeps_fewer_cache_bytes_parameters_and_flops_as_the_plan_says(layout):
    """Measured: the readers' caches hold nothing, so a GS model's cache is half the same model's without sharing;
    the readers have no key/value projections (fewer parameters, fewer FLOPs per token); the plan's figures are these,
    and its rows say the readers keep no cache of their own."""
    shared = shared_gpt(layout, n_kv_head=2, position="rope")
    plain = shared_gpt(layout, n_kv_head=2, position="rope", layer_kinds={"G": {}, "S": {"window": None}})
    caches = []
    for model in (shared, plain):
        cache = KVCache(4)
        with torch.no_grad():
            model(torch.zeros(1, 16, dtype=torch.long), cache=cache)
        caches.append(cache.nbytes())
        assert cache.nbytes() == model.config.decoding_bytes(4)
    assert caches[0] * 2 == caches[1] == 4 * 16 * 2 * 2 * 8 * 4  # layers x positions x (k, v) x kv heads x dim x 4 B
    kv_params = 2 * 2 * (2 * 8 * 32 + 2 * 8)  # the 2 readers' key and value projections (2 heads of 8), with biases
    assert plain.num_params() - shared.num_params() == kv_params
    assert plain.flops_per_token() - shared.flops_per_token() == 6 * kv_params
    rows = layer_rows(shared.config, torch.float32)
    assert "no KV cache of its own" in rows[1] and f"{shared.num_params() // 1:,}" not in rows[1], rows


@pytest.mark.parametrize("src,dst", list(itertools.permutations(LAYOUTS, 2)))
def test_layouts_start_from_the_same_weights_and_convert_exactly(src, dst):
    a, b = shared_gpt(src, n_kv_head=2, perturbed=False), shared_gpt(dst, n_kv_head=2, perturbed=False)
    assert_converts_exactly(a, b, src, dst)


def test_the_label_says_the_sharing_and_heads_reads_the_sources_keys():
    model = shared_gpt("fused_qkv", position="rope")
    label = attention_label(vars(model.config))
    assert label == "fused_qkv-sdpa-rope-GS_G_S.kvfromG", label
    assert schedule_text(vars(model.config), "cla") == ("cla: GS, G=fused_qkv/sdpa, S=fused_qkv/sdpa on G's keys and "
                                                        "values")
    from analysis.heads import attention_maps

    idx = torch.randint(0, 64, (1, 10), generator=torch.Generator().manual_seed(3))
    maps = attention_maps(model, idx)
    assert maps.shape == (4, 1, 4, 10, 10)
    torch.testing.assert_close(maps.sum(-1), torch.ones(4, 1, 4, 10))
    with pytest.raises(ValueError, match="reads layer kind G's keys"):
        model.transformer.h[1].attn.attention_weights(torch.zeros(1, 4, 32))


# Each bad value, and a fragment of its one-line refusal (the value named, the fix)
BAD = {
    "unknown kind": ({"S": {"kv_from": "Q"}}, "GS", {}, "kv_from='Q' (layers 1, 3) names no layer kind"),
    "its own kind": ({"S": {"kv_from": "S"}}, "GS", {}, "cannot read their own kind's"),
    "a reader's reader": ({"S": {"kv_from": "G"}, "R": {"kv_from": "S"}}, "GSR", {"n_layer": 3},
                          "name the kind that makes them: kv_from=G"),
    "the first layer": ({"S": {"kv_from": "G"}}, "SG", {}, "layer 0 has no earlier layer of kind G"),
    "a linear source": ({"G": {"attention": "gated_deltanet", "position": "none"}, "S": {"kv_from": "G"}}, "GS",
                        {"position": "none"}, "attention=gated_deltanet"),
    "latent source": ({"S": {"kv_from": "G"}}, "GS", {"attention": "mla", "kv_latent": 8, "position": "none"},
                      "a layer of its own layout, one of"),
    "key/value heads": ({"S": {"kv_from": "G", "n_kv_head": 1}}, "GS", {}, "n_kv_head=1 in kind S's layers but 4"),
    "keys equal to values": ({"S": {"kv_from": "G", "k_eq_v": True}}, "GS", {}, "k_eq_v=true in kind S's"),
    "qk norm": ({"S": {"kv_from": "G", "qk_norm": True}}, "GS", {}, "+model.layer_kinds.S.qk_norm=false"),
    "position": ({"S": {"kv_from": "G", "position": "none"}}, "GS", {"position": "rope"},
                 "position=none in kind S's layers but rope"),
    "rotary base": ({"S": {"kv_from": "G", "rope_theta": 500.0}}, "GS", {"position": "rope"}, "rope_theta=500"),
    "path": ({"S": {"kv_from": "G"}}, "GS", {"position": "path"}, "model.position=path turns the held keys"),
    "forget gate": ({"S": {"kv_from": "G", "forget_gate": True}}, "GS", {"kernel": "manual"},
                    "forget_gate=true keeps numbers per key"),
    "sparse": ({"S": {"kv_from": "G", "sparse_topk": 2}}, "GS", {}, "sparse_topk=2 keeps numbers per key"),
    "a longer window": ({"G": {"window": 4}, "S": {"kv_from": "G"}}, "GS", {},
                        "+model.layer_kinds.S.window=4"),
    "the model's field": ({"S": {}}, "GS", {"kv_from": "G"}, "is a layer kind's option"),
}  # fmt: skip


@pytest.mark.parametrize("name", BAD)
def test_every_bad_value_is_refused_in_one_line_naming_it_and_the_fix(name):
    kinds, pattern, model, fragment = BAD[name]
    kinds = {"G": {}, **kinds}
    options = {**dict(vocab_size=64, block_size=16, n_layer=4, n_head=4, n_embd=32, layer_pattern=pattern,
                      layer_kinds=kinds), **model}  # fmt: skip
    with pytest.raises(ValueError) as refused:
        tiny_gpt_config(**options)
    message = str(refused.value)
    assert fragment in message and "\n" not in message, message


def test_a_uniform_model_and_the_gpt2_export_refuse_it():
    with pytest.raises(ValueError, match=r"model.kv_from='G' makes a layer read .* set it on a layer kind"):
        GPT(tiny_gpt_config(kv_from="G"))
    from model.checkpoints.gpt2_export import what_gpt2_cannot_hold

    problems = what_gpt2_cannot_hold(shared_gpt("fused_qkv").config)
    assert problems == ["model.layer_kinds.S.kv_from=G (GPT-2's layers each project their own keys and values: none "
                        "reads another layer's)"], problems


# The walk over the relation between layers: every option (tests/test_option_pairs.py's settings, from the
# declarations) set on the reader's kind alone, on the source's alone, and on both (the model's own field), in a
# reader and its source. A kind's field only where a kind may set it (LAYER_FIELDS); the model's own on both sides.
SIDES = ("reader", "source", "both")


def relation_cells() -> list[tuple[str, object, dict, str]]:
    from test_option_pairs import SETTINGS

    from model.config import LAYER_FIELDS

    return [(name, value, needs, side) for name, value, needs in SETTINGS for side in SIDES
            if side == "both" or (name in LAYER_FIELDS and all(n in LAYER_FIELDS for n in needs))]  # fmt: skip


def relation_gpt(name: str, value, needs: dict, side: str, on: bool = True, shared: bool = True) -> GPT:
    """A source layer G and its reader S (S.kv_from=G), width 16, 4 heads, block size 8, with the option (and what it
    needs) on ``side``; weights drawn away from the init, the same for a seed whatever the option."""
    options = {**needs, name: value} if on else {}
    kinds = {"G": dict(options if side == "source" else {}),
             "S": {**({"kv_from": "G"} if shared else {}), **(options if side == "reader" else {})}}  # fmt: skip
    # a kind's own encoding needs the model's to be one without a table (rotary, ALiBi or none: not learned)
    model_wide = options if side == "both" else {"position": "alibi" if (name, value) == ("position", "none") else
                                                                "none"}  # fmt: skip
    if model_wide.get("document_masking"):
        model_wide["document_end"] = 0
    torch.manual_seed(0)
    config = tiny_gpt_config(vocab_size=32, block_size=8, n_layer=2, n_head=4, attention="fused_qkv",
                             kernel="manual", layer_pattern="GS", layer_kinds=kinds, **model_wide)  # fmt: skip
    model = GPT(config).eval()
    with torch.no_grad():  # each from a seed of its name: a parameter both models have is the same in both
        for key, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(zlib.crc32(key.encode()))) * 0.5)
    return model


@pytest.mark.parametrize("name,value,needs,side", relation_cells(),
                         ids=lambda x: x if isinstance(x, str) else None)  # fmt: skip
def test_every_option_on_a_reader_its_source_or_both_is_refused_naming_kv_from_or_decodes_as_the_full_forward(
        name, value, needs, side):  # fmt: skip
    """An option on either side of the relation is refused in one line naming kv_from and the option (keys encoded
    otherwise than the reader's queries, a cache the reader would keep) or built; built, the pair's cached decoding (a
    prompt, then steps past block_size where the model runs there) gives the full forward's logits, and the option
    set on the reader (or both) changes the reader's output: the reader applies it. The cache then holds the plan's
    bytes: a reader that kept numbers of its own (in its source's cache) would hold more."""
    try:
        model = relation_gpt(name, value, needs, side)
    except ValueError as refusal:
        try:
            relation_gpt(name, value, needs, side, shared=False)
        except ValueError:
            return  # refused without the relation too: the single option walk's (tests/test_options.py)
        message = str(refusal)  # naming the option, or one it needs (rotary's base: rotary positions)
        assert "\n" not in message and "kv_from" in message, message
        assert any(f"{n}=" in message for n in (name, *needs)), message
        return
    total = model.config.block_size + (4 if model.config.runs_past_context else 0)
    idx = torch.randint(1, 32, (2, total), generator=torch.Generator().manual_seed(3))
    idx[:, 3] = 0  # an end of text: a document boundary where documents are masked
    with torch.inference_mode():
        full = model(idx, idx)[0]
        cache = KVCache(model.config.n_layer)
        torch.testing.assert_close(model(idx[:, :3], cache=cache)[0][:, -1], full[:, 2], rtol=1e-5, atol=1e-5)
        for t in range(3, total):
            torch.testing.assert_close(model(idx[:, t : t + 1], cache=cache)[0][:, -1], full[:, t], rtol=1e-5,
                                       atol=1e-5, msg=f"model.{name} on the {side}: position {t}")  # fmt: skip
        size = cache.buffers()[0].element_size()
        assert cache.nbytes() == 2 * model.config.decoding_bytes(size), \
            f"model.{name} on the {side}: the cache holds {cache.nbytes()} bytes, the plan counts " \
            f"{2 * model.config.decoding_bytes(size)}"  # fmt: skip
    if side != "source" and name != "dropout":  # dropout: eval mode, where it drops nothing
        without = relation_gpt(name, value, needs, side, on=False)
        idx = idx[:, : model.config.block_size]  # the model without it may have a position table
        with torch.inference_mode():
            assert not torch.allclose(model(idx, idx)[0], without(idx, idx)[0], atol=1e-6), \
                f"model.{name}={value} on the {side} changes nothing"  # fmt: skip
