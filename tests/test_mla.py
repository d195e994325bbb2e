"""attention=mla (multi-head latent attention, DeepSeek-V2 section 2.1) held to its formula, written here in
float64 from the paper, and to its promises: cached and static decoding equal to full recomputation (past
block_size with rope and a window too), a cache of kv_latent + rope_head_dim numbers per token per layer,
weights that refuse to convert to or from the other layouts (another function), each bad option refused."""

from __future__ import annotations

import math

import pytest
import torch

from model import (
    GPT,
    GPTConfig,
    KVCache,
    build_attention,
    convert_attention_layout,
    detect_attention_layout,
    load_model,
)
from model.attention.latent import LatentAttention
from model.decoding.steps import CompiledStep, StaticStep
from tests.attention_reference import latent_reference, mask_values
from tests.helpers import FLEX_ON_CPU_UNAVAILABLE, TINY, run_cli, train_losses

LENGTHS = (1, 2, 7, 16, 33, 70)  # 70: past block_size (64), where a rope model's context acts as a window
BLOCK = 64

# (n_head, position, kv_latent, rope_head_dim, options): the shapes and options the formula is held over.
CASES = {
    "2heads-learned": (2, "learned", 12, None, {}),
    "3heads-rope": (3, "rope", 10, 6, {}),
    "4heads-rope-qknorm-window": (4, "rope", 16, 4, {"qk_norm": True, "window": 9}),
    "2heads-alibi-sinks": (2, "alibi", 8, None, {"sinks": True}),
    "2heads-none-softcap": (2, "none", 8, None, {"softcap": 3.0}),
}
WIDTH = 24  # n_embd: 12, 8 or 6 dims a head


def mla_module(name: str, kernel: str, dtype=torch.float64, seed: int = 0) -> LatentAttention:
    """The case's attention block, its parameters drawn wide (N(0, 0.4)) so every term of the formula counts."""
    heads, position, latent, rope, options = CASES[name]
    torch.manual_seed(seed)
    attn = build_attention("mla", WIDTH, heads, kernel, kv_latent=latent, rope_head_dim=rope, position=position,
                           block_size=BLOCK, **options)  # fmt: skip
    with torch.no_grad():
        for name_, p in attn.named_parameters():
            p.normal_(1.0, 0.2) if "norm" in name_ else p.normal_(0.0, 0.4)  # norms' scales near 1
    return attn.to(dtype).eval()


def rope(t: torch.Tensor, positions: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """RoFormer's rotation, "rotate half" pairing: dims i and i + d/2 turned by position x theta^(-2i/d). The
    angles' cos and sin in float32, as headlab's (and Llama's) rotary makes them whatever the model's dtype."""
    half = t.size(-1) // 2
    angle = positions[:, None].float() * theta ** (-2.0 * torch.arange(half, dtype=torch.float32) / t.size(-1))
    cos, sin = angle.cos().double(), angle.sin().double()
    a, b = t[..., :half], t[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def reference(attn: LatentAttention, name: str, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's equations (9)-(19), head by head, in float64 from the module's weights
    (``attention_reference.latent_reference``: the output (B, T, C) and the attention weights (B, H, T, T)), its
    rotary angles' cos and sin in float32, as headlab's (and Llama's) rotary makes them whatever the model's dtype."""
    return latent_reference(attn, "mla", x, mask_values(attn.spec), rotation=rope, weights_too=True)


def kernels_of(name: str) -> list[str]:
    return ["manual"] if CASES[name][4].get("softcap") else ["manual", "sdpa"]  # sdpa cannot cap scores


CELLS = [(name, kernel) for name in CASES for kernel in kernels_of(name)]


@pytest.mark.parametrize("name,kernel", CELLS)
def test_the_module_computes_the_papers_formula_at_every_length(name, kernel):
    attn = mla_module(name, kernel)
    for T in LENGTHS:
        x = torch.randn(2, T, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(T))
        want, probs = reference(attn, name, x)
        torch.testing.assert_close(attn(x), want, atol=1e-10, rtol=1e-10, msg=f"T={T}")
        if T == LENGTHS[-2]:  # what heads.py draws: the same weights, with the rotary part
            torch.testing.assert_close(attn.attention_weights(x), probs, atol=1e-12, rtol=0)


def test_sdpa_held_to_flash_takes_the_wider_queries_and_keys():
    # PyTorch's flash implementation wants values as wide as queries: mla pads them (and cuts the padding off)
    torch.manual_seed(0)
    attn = build_attention("mla", WIDTH, 3, "sdpa", kv_latent=10, rope_head_dim=6, position="rope", block_size=BLOCK,
                           sdpa_backend="flash").eval()  # fmt: skip
    attn.load_state_dict(mla_module("3heads-rope", "manual", dtype=torch.float32).state_dict())
    x = torch.randn(2, 33, WIDTH)
    with torch.no_grad():
        want, _ = reference(attn, "3heads-rope", x.double())
        torch.testing.assert_close(attn(x).double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name,kernel", [("3heads-rope", "sdpa"), ("4heads-rope-qknorm-window", "manual"),
                                         ("2heads-alibi-sinks", "sdpa")])  # fmt: skip
def test_gradients_of_every_weight_and_the_input_are_the_formulas(name, kernel):
    attn = mla_module(name, kernel)
    x = torch.randn(3, 33, WIDTH, dtype=torch.float64, requires_grad=True)
    got = torch.autograd.grad(attn(x).sum(), [x, *attn.parameters()])
    want = torch.autograd.grad(reference(attn, name, x)[0].sum(), [x, *attn.parameters()], allow_unused=True)
    names = ["x", *(n for n, _ in attn.named_parameters())]
    for n, g, w in zip(names, got, want):
        torch.testing.assert_close(g, w if w is not None else torch.zeros_like(g), atol=1e-9, rtol=1e-9, msg=n)


@pytest.mark.skipif(FLEX_ON_CPU_UNAVAILABLE is not None, reason=str(FLEX_ON_CPU_UNAVAILABLE))
@pytest.mark.slow  # flex compiles 10 s of graphs on a fresh CPU; test_attention_properties.py runs flex by default
@pytest.mark.parametrize("name", ["3heads-rope", "2heads-alibi-sinks"])
def test_flex_forward_computes_the_formula(name):
    attn = mla_module(name, "flex", dtype=torch.float32)
    for T in (7, 33):
        x = torch.randn(2, T, WIDTH, generator=torch.Generator().manual_seed(T))
        with torch.no_grad():  # flex has no backward on a CPU
            want, _ = reference(attn, name, x.double())
            torch.testing.assert_close(attn(x).double(), want, atol=1e-4, rtol=1e-4, msg=f"T={T}")


def mla_gpt(seed: int = 0, **overrides) -> GPT:
    fields = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="mla", kv_latent=12,
                  position="rope", rope_head_dim=4, kernel="manual")  # fmt: skip
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**{**fields, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)  # sharper than the 0.02 init: differences show
    return model


def decodes_like_full_recomputation(model: GPT, length: int, prompt: int, static: bool, compiled: bool = False):
    """Fill the cache with a prompt, decode one position at a time to ``length`` (past block_size allowed):
    each step's logits must be those of the full sequence at that position."""
    idx = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(length + prompt))
    with torch.inference_mode():
        full, _ = model(idx, idx)
        cache = KVCache(model.config.n_layer)
        first = model(idx[:, :prompt], cache=cache)[0][:, -1]
        torch.testing.assert_close(first, full[:, prompt - 1], atol=1e-4, rtol=0)
        if static:
            step = (CompiledStep if compiled else StaticStep)(model, cache, 2, torch.device("cpu"))
        else:
            step = lambda tokens, t: model(tokens, cache=cache)[0][:, -1]  # noqa: E731
        for t in range(prompt, length):
            torch.testing.assert_close(step(idx[:, t : t + 1], t), full[:, t], atol=1e-4, rtol=0, msg=f"position {t}")


DECODE_OPTIONS = {"rope": {}, "rope-window5": {"window": 5}, "learned": {"position": "learned", "rope_head_dim": None},
                  "alibi-sinks": {"position": "alibi", "rope_head_dim": None, "sinks": True}}  # fmt: skip
# Each option set with both kernels and both kinds of step, in two cells
DECODE_CELLS = [(name, kernel, static) for i, name in enumerate(DECODE_OPTIONS)
                for kernel, static in ((("manual", False), ("sdpa", True)), (("manual", True), ("sdpa", False)))[i % 2]]


@pytest.mark.parametrize("options,kernel,static", DECODE_CELLS,
                         ids=[f"{o}-{k}-{'static' if s else 'eager'}" for o, k, s in DECODE_CELLS])  # fmt: skip
def test_cached_decoding_is_a_full_recomputation_past_block_size(options, kernel, static):
    options = DECODE_OPTIONS[options]
    model = mla_gpt(kernel=kernel, n_layer=1, **options)
    length = 16 if options.get("position") == "learned" else 28  # a position table ends at block_size (16)
    for prompt in (1, 7):
        decodes_like_full_recomputation(model, length, prompt, static)


@pytest.mark.slow
def test_the_compiled_static_step_is_a_full_recomputation_past_block_size():
    decodes_like_full_recomputation(mla_gpt(window=5, n_layer=1), 20, 3, static=True, compiled=True)


@pytest.mark.parametrize("options,width", [({}, 12 + 4), ({"position": "none", "rope_head_dim": None}, 12)])
def test_the_cache_keeps_the_latent_and_the_rotary_key_per_token(options, width):
    model = mla_gpt(**options)
    assert LatentAttention.cache_width(model.config.attention_spec) == width
    cache = KVCache(model.config.n_layer)
    with torch.inference_mode():
        model(torch.zeros(3, 16, dtype=torch.long), cache=cache)  # fills every position (block_size 16)
    layers, positions, batch, float32 = 2, 16, 3, 4
    assert cache.nbytes() == layers * positions * batch * width * float32
    mha = GPT(GPTConfig(**{**vars(model.config), "attention": "fused_qkv", "kv_latent": None, "rope_head_dim": None,
                           "position": "rope"}))  # fmt: skip
    mha_cache = KVCache(2)
    with torch.inference_mode():
        mha(torch.zeros(3, 16, dtype=torch.long), cache=mha_cache)
    assert mha_cache.nbytes() == layers * positions * batch * (2 * 16) * float32  # keys and values, 16 wide each


def test_weights_do_not_convert_to_or_from_another_layout_but_load_into_mla():
    model = mla_gpt()
    state = model.state_dict()
    assert detect_attention_layout(state) == "mla"
    message = ("attention=mla computes another function (keys and values through a kv_latent-wide latent), so its "
               "weights do not convert to/from fused_qkv; train it, or init_from a checkpoint of "
               "attention=mla")  # fmt: skip
    with pytest.raises(ValueError) as err:
        convert_attention_layout(state, "mla", "fused_qkv")
    assert str(err.value) == message
    fused = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, position="rope"))
    with pytest.raises(ValueError) as err:
        mla_gpt(seed=1).load_weights(fused.state_dict())
    assert str(err.value) == message
    other = mla_gpt(seed=1)
    idx = torch.randint(0, 64, (2, 16))
    assert not torch.allclose(other(idx, idx)[0], model(idx, idx)[0])
    other.load_weights(state)
    torch.testing.assert_close(other(idx, idx)[0], model(idx, idx)[0], atol=0, rtol=0)


def test_initial_weights_follow_the_gpt2_rule_in_mla_s_own_form():
    torch.manual_seed(3)
    a = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=4, n_embd=64, attention="mla", kv_latent=64))
    torch.manual_seed(3)
    b = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=4, n_embd=64, attention="mla", kv_latent=64))
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name  # one seed, one set of weights
    attn = a.transformer.h[0].attn
    assert torch.equal(attn.kv_norm.weight, torch.ones(64)) and not attn.wkv_a.bias.any()
    for weight in (attn.wq.weight, attn.wkv_a.weight, attn.wkv_b.weight):
        assert abs(weight.std().item() - 0.02) < 0.002
    assert abs(attn.c_proj.weight.std().item() - 0.02 / math.sqrt(2 * 4)) < 0.001


BASE = dict(vocab_size=64, block_size=16, n_layer=1, n_head=2, n_embd=16)


@pytest.mark.parametrize("fields,says", [
    ({"attention": "mla"}, "attention=mla needs model.kv_latent=<the keys' and values' latent width>, a positive "
                           "integer, not None; e.g. model.kv_latent=32"),
    ({"attention": "mla", "kv_latent": 0}, "a positive integer, not 0"),
    ({"attention": "mla", "kv_latent": True}, "a positive integer, not True"),
    ({"attention": "mla", "kv_latent": 8, "n_kv_head": 1}, "model.n_kv_head=1 groups key/value heads, but "
                                                           "attention=mla compresses keys and values its own way"),
    ({"attention": "mla", "kv_latent": 8, "position": "rope"},
     "attention=mla with model.position=rope needs model.rope_head_dim=<the decoupled rotary key's width>, a positive "
     "even integer, not None; e.g. model.rope_head_dim=4"),
    ({"attention": "mla", "kv_latent": 8, "position": "rope", "rope_head_dim": 5}, "a positive even integer, not 5"),
    ({"attention": "mla", "kv_latent": 8, "rope_head_dim": 4}, "model.rope_head_dim=4 is attention=mla's rotary key "
                                                               "width, but model.position=learned turns nothing"),
    ({"attention": "fused_qkv", "kv_latent": 8}, "model.kv_latent=8 is an option of attention=mla, but "
                                                 "attention=fused_qkv; use attention=mla, or model.kv_latent=null"),
    ({"attention": "wrapper", "position": "rope", "rope_head_dim": 4}, "model.rope_head_dim=4 is an option of "
                                                                       "attention=mla, but attention=wrapper"),
])  # fmt: skip
def test_each_bad_option_is_refused_in_one_line_naming_the_value_and_the_fix(fields, says):
    with pytest.raises(ValueError) as err:
        GPTConfig(**{**BASE, **fields})
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_short_training_run_through_train_py_lowers_the_loss(tmp_path, data_cache):
    run = tmp_path / "run"
    result = run_cli(*TINY, "logger=none", "attention=mla", "model.kv_latent=16", "model.position=rope",
                     "model.rope_head_dim=8", "trainer.max_steps=10", "trainer.eval_interval=10",
                     "trainer.checkpoint_interval=10", f"data.cache_dir={data_cache}", f"hydra.run.dir={run}",
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "mla" in result.stdout.splitlines()[0] or "mla" in result.stderr
    losses = train_losses(run)
    assert sorted(losses) == list(range(1, 11))
    assert sum(losses[s] for s in (8, 9, 10)) / 3 < losses[1] - 0.3
    loaded = load_model(str(run))  # what sample.py and evaluate.py load: mla, no conversion
    assert isinstance(loaded.model.transformer.h[0].attn, LatentAttention)
    with pytest.raises(ValueError, match=r"^attention=mla computes another function .* to/from wrapper; train it"):
        load_model(str(run), attention="wrapper")  # sample.py attention=wrapper: refused before a model is built


def test_gpt2_weights_are_refused_as_mla_before_any_download():
    with pytest.raises(ValueError, match=r"^attention=mla computes another function .* to/from fused_qkv"):
        load_model("gpt2", attention="mla")


def test_dynamo_traces_an_mla_gpt_in_one_graph():
    torch._dynamo.reset()
    model = mla_gpt(kernel="sdpa")
    idx = torch.randint(0, 64, (2, 16))
    explanation = torch._dynamo.explain(model)(idx, idx)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1
