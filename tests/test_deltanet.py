"""attention=gated_deltanet (Gated DeltaNet, arXiv 2412.06464) held to the paper, written here in float64 step by
step: the chunked form equals the recurrence at every length, chunk size and chunk boundary, with gradients;
the whole layer equals the paper's layer; cached decoding (eager and static steps) equals a full forward from
every prompt length, past block_size too; the state keeps the same bytes at every length; each bad value is
refused in one line; it trains."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
import yaml

from analysis.plots import legend_title, tick_label
from model import GPT, GPTConfig, KVCache, convert_attention_layout, load_model
from model.attention.modifications import spelled
from model.config import attention_label
from model.decoding.steps import StaticStep
from model.mixers.deltanet import CONV_SIZE, GatedDeltaNet, chunked_delta_rule
from model.registry import KERNELS, MODIFICATIONS
from tests.attention_reference import REFERENCES, deltanet_reference, recurrent_delta_rule
from tests.helpers import (
    assert_chunked_form_is_the_recurrence,
    assert_layer_is_its_formula,
    random_linear_layer,
    run_script,
    tiny_run,
    train_losses,
)


def delta_inputs(B, H, T, dk, dv, seed, state=True):
    """Random float64 inputs as the layer makes them: unit keys, scaled unit queries, betas in (0, 1), log decays
    from about -4 (forgets within a few tokens) to about 0 (keeps everything)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, H, T, dk, generator=gen, dtype=torch.float64), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(B, H, T, dk, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, T, dv, generator=gen, dtype=torch.float64)
    log_decay = -4 * torch.rand(B, H, T, generator=gen, dtype=torch.float64) ** 3
    beta = torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    s0 = torch.randn(B, H, dk, dv, generator=gen, dtype=torch.float64) if state else None
    return [t.requires_grad_() if t is not None else None for t in (q, k, v, log_decay, beta, s0)]


LENGTHS = [1, 2, 3, 4, 5, 7, 8, 9, 13, 16, 17, 31, 32, 33, 63, 64, 65, 97, 129]
CHUNKS = [1, 2, 3, 4, 7, 16, 64]
SHAPES = [(1, 1, 4, 4), (2, 3, 8, 6), (3, 2, 6, 8)]  # batch, heads, key and value widths


@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_chunked_form_is_the_recurrence_at_every_length_and_chunk_with_gradients(chunk):
    for i, T in enumerate(LENGTHS):
        B, H, dk, dv = SHAPES[i % len(SHAPES)]
        inputs = delta_inputs(B, H, T, dk, dv, seed=T * 100 + chunk, state=i % 2 == 0)
        assert_chunked_form_is_the_recurrence(chunked_delta_rule, recurrent_delta_rule, inputs, chunk,
                                              f"T={T} chunk={chunk}")


def test_a_sequence_in_pieces_carries_the_state_to_the_whole_sequences_result():
    q, k, v, g, beta, _ = delta_inputs(2, 2, 50, 8, 8, seed=7, state=False)
    whole, s_whole = chunked_delta_rule(q, k, v, g, beta, 16)
    state, outs = None, []
    for start, end in ((0, 1), (1, 17), (17, 18), (18, 50)):
        o, state = chunked_delta_rule(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end],
                                      g[:, :, start:end], beta[:, :, start:end], 16, state)  # fmt: skip
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=2), whole, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(state, s_whole, rtol=1e-10, atol=1e-12)


def reference_layer(block: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """The paper's layer from ``block``'s weights, step by step in float64 (``attention_reference``)."""
    return deltanet_reference(block, "gated_deltanet", x, {})


@pytest.mark.parametrize("n_embd,n_head", [(16, 1), (24, 3), (32, 4)])
def test_the_layer_is_the_papers_formula_at_every_length_with_gradients(n_embd, n_head):
    block = random_linear_layer("gated_deltanet", n_embd, n_head, seed=n_head)
    assert_layer_is_its_formula(block, reference_layer, (1, 2, 3, 4, 5, 17, 64, 65, 130))


@pytest.mark.parametrize("layout", ["gated_deltanet", "kda"])
def test_with_negative_eigenvalues_the_layer_in_float64_is_its_formula_across_chunk_edges(layout):
    """beta in (0, 2): the state's transition reflects. The float32 grid holds Gated DeltaNet's gradients to 6e-5
    (1 + scale) (tests/attention_reference.py), as reflections gather round-off; here, in float64, the code is the
    formula to 1e-9, so that margin is float32's round-off and not a wrong step. Lengths around the chunk of 64."""
    block = random_linear_layer(layout, 32, 4, seed=3, negative_eigenvalues=True)
    beta_rows = {"gated_deltanet": ("in_proj", slice(128, 132)), "kda": ("qkvb_proj", slice(96, 100))}[layout]
    with torch.no_grad():  # beta's rows (one a head) larger: betas near 0 and near 2
        getattr(block, beta_rows[0]).weight[beta_rows[1]].mul_(8.0)
    assert_layer_is_its_formula(block, lambda b, x: REFERENCES[layout](b, layout, x, {}), (1, 2, 17, 29, 63, 64, 65))


def deltanet_gpt(position: str = "none", n_layer: int = 2, seed: int = 0, **fields) -> GPT:
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=64, block_size=16, n_layer=n_layer, n_head=2, n_embd=16,
                       attention="gated_deltanet", position=position, **fields)  # fmt: skip
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)  # sharper than the 0.02 init: differences show
    return model


@pytest.mark.parametrize("position,static", [("none", False), ("none", True), ("learned", True), ("learned", False)])
def test_cached_decoding_is_a_full_forward_from_every_prompt_length(position, static):
    """Positions past block_size (16) without a table: the state goes on where softmax attention would keep a
    window of block_size keys."""
    model = deltanet_gpt(position)
    length = 16 if position == "learned" else 40
    idx = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(length))
    with torch.inference_mode():
        full, _ = model(idx, idx)
        for prompt in range(1, length, 3):
            cache = KVCache(model.config.n_layer)
            first = model(idx[:, :prompt], cache=cache)[0][:, -1]
            torch.testing.assert_close(first, full[:, prompt - 1], atol=1e-4, rtol=0)
            if static:
                step = StaticStep(model, cache, 2, torch.device("cpu"))
            else:
                step = lambda tokens, t, cache=cache: model(tokens, cache=cache)[0][:, -1]  # noqa: E731
            for t in range(prompt, min(length, prompt + 9)):
                torch.testing.assert_close(step(idx[:, t : t + 1], t), full[:, t], atol=1e-4, rtol=0,
                                           msg=f"prompt {prompt}, position {t}")  # fmt: skip


def hybrid_config(attention: str = "fused_qkv", **fields) -> GPTConfig:
    """Qwen3-Next's schedule at a test's size: a Gated DeltaNet layer to each layer of full attention (rope)."""
    return GPTConfig(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=16, attention=attention,
                     position="rope", layer_pattern="DG", layer_kinds={"D": {"attention": "gated_deltanet",
                     "position": "none"}, "G": {}}, **fields)  # fmt: skip


@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
def test_a_hybrids_cached_decoding_is_a_full_forward_past_block_size(static):
    """The linear layers carry their state while the full-attention layers' KV cache is a ring of block_size."""
    torch.manual_seed(0)
    model = GPT(hybrid_config()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(6.0 if p.dim() > 1 else 1.0)
    idx = torch.randint(0, 64, (2, 36), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        full, _ = model(idx, idx)
        for prompt in (1, 6, 17):
            cache = KVCache(model.config.n_layer)
            model(idx[:, :prompt], cache=cache)
            step = StaticStep(model, cache, 2, torch.device("cpu")) if static else \
                (lambda tokens, t, cache=cache: model(tokens, cache=cache)[0][:, -1])  # fmt: skip
            for t in range(prompt, 36):
                torch.testing.assert_close(step(idx[:, t : t + 1], t), full[:, t], atol=1e-4, rtol=0,
                                           msg=f"prompt {prompt}, position {t}")  # fmt: skip


def test_a_hybrid_starts_from_the_same_weights_in_every_layout_and_converts_its_softmax_layers():
    x = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    fused = GPT(hybrid_config("fused_qkv"))
    assert [type(b.attn).__name__ for b in fused.transformer.h] == ["GatedDeltaNet", "FusedQKVAttention"] * 2
    for layout in ("separate_qkv", "wrapper"):
        torch.manual_seed(0)
        other = GPT(hybrid_config(layout))
        torch.testing.assert_close(other(x, x)[1], fused(x, x)[1], atol=1e-6, rtol=0)
        converted = GPT(hybrid_config(layout))
        converted.load_weights(fused.state_dict())  # the linear layers' weights pass through unchanged
        torch.testing.assert_close(converted(x, x)[0], fused(x, x)[0], atol=1e-6, rtol=0)
    assert fused.config.state_bytes(4) == 2 * GatedDeltaNet.state_bytes(fused.config.layer_config(0).attention_spec, 4)
    assert fused.config.cache_widths == [0, 2 * 16, 0, 2 * 16]
    cache = KVCache(4)
    with torch.inference_mode():
        fused(torch.zeros(3, 5, dtype=torch.long), cache=cache)  # a KV cache allocates its capacity at once
    # two attention layers x 32 numbers x 16 positions x float32, and two linear layers' states
    assert cache.nbytes() == 3 * fused.config.decoding_bytes(4) == 3 * (2 * 32 * 16 * 4 + fused.config.state_bytes(4))


@pytest.mark.parametrize("kernel", ["manual", "sdpa_math", "flex"])
def test_a_hybrids_softmax_layers_take_the_models_kernel_and_its_linear_layers_none(kernel):
    config = hybrid_config(kernel=kernel)
    kernels = [(layout.name, spec.kernel, spec.sdpa_backend) for layout, spec in config.layer_layouts]
    softmax = (config.attention, config.kernel, config.sdpa_backend)
    assert kernels == [("gated_deltanet", "sdpa", "auto"), softmax] * 2


def test_a_hybrid_is_named_by_its_kinds_and_a_kind_of_the_models_own_function_is_refused():
    assert attention_label(vars(hybrid_config())) == "fused_qkv-sdpa-rope-DG_D.gated_deltanet.nopos_G.fused_qkv"
    with pytest.raises(ValueError) as err:
        GPTConfig(**{**vars(hybrid_config()), "layer_kinds": {"D": {"attention": "wrapper"}, "G": {}}})
    assert str(err.value) == ("model.layer_kinds.D (layers 0, 2): attention=wrapper with model.attention=fused_qkv: "
                              "they are layouts of one function, chosen for the whole model; set "
                              "model.attention=wrapper, or give the layer another function (e.g. "
                              "attention=gated_deltanet)")  # fmt: skip
    with pytest.raises(ValueError, match=r"^model.position=rope reaches layer kind D \(layers 0, 2\), "
                                         r"attention=gated_deltanet, which cannot apply it: rotary turns "):
        GPTConfig(**{**vars(hybrid_config()), "layer_kinds": {"D": {"attention": "gated_deltanet"}, "G": {}}})


def test_a_cache_reused_after_reset_starts_from_an_empty_state():
    model = deltanet_gpt()
    idx = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        cache = KVCache(model.config.n_layer)
        model(idx[:, :7], cache=cache)
        cache.reset()
        again = model(idx[:, 7:], cache=cache)[0][:, -1]
        fresh = model(idx[:, 7:])[0][:, -1]
    torch.testing.assert_close(again, fresh, atol=1e-5, rtol=0)


def test_the_state_keeps_the_same_bytes_at_every_length():
    model = deltanet_gpt(n_layer=3)
    spec = model.config.attention_spec
    assert GatedDeltaNet.cache_width(spec) == 0
    assert GatedDeltaNet.state_bytes(spec, 4) == (2 * 8 * 8 + (CONV_SIZE - 1) * 3 * 16) * 4  # heads' states, conv
    sizes = []
    for length in (1, 5, 16, 40):
        cache = KVCache(3)
        with torch.inference_mode():
            model(torch.zeros(4, length, dtype=torch.long), cache=cache)
        sizes.append(cache.nbytes())
    assert sizes == [4 * model.config.state_bytes(4)] * 4  # a batch of 4, float32


def test_the_flops_of_its_mixing_do_not_grow_with_the_length():
    model = deltanet_gpt()
    at = {T: model.flops_per_token(T) for T in (64, 256, 4096)}
    assert at[64] == at[256] == at[4096]
    softmax = GPT(GPTConfig(**{**vars(model.config), "attention": "fused_qkv"}))
    assert softmax.flops_per_token(4096) > softmax.flops_per_token(64)


def test_initial_weights_are_drawn_as_the_paper_draws_them():
    torch.manual_seed(0)
    attn = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, attention="gated_deltanet",
                         position="none")).transformer.h[1].attn  # fmt: skip
    A = attn.A_log.exp()
    assert ((A >= 1) & (A <= 16)).all()
    dt = F.softplus(attn.dt_bias)
    assert ((dt >= 1e-3 - 1e-9) & (dt <= 0.1 + 1e-9)).all()
    assert attn.conv_weight.abs().max() <= 1 / math.sqrt(CONV_SIZE) and attn.conv_weight.std() > 0.1
    assert (attn.o_norm.weight == 1).all()
    assert abs(attn.in_proj.weight.std().item() - 0.02) < 0.002
    torch.manual_seed(0)
    again = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32, attention="gated_deltanet",
                          position="none")).transformer.h[1].attn  # fmt: skip
    assert torch.equal(again.A_log, attn.A_log) and torch.equal(again.conv_weight, attn.conv_weight)


BASE = dict(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="gated_deltanet",
            position="none")  # fmt: skip


@pytest.mark.parametrize("fields,says", [
    ({"window": 8}, "model.window=8 with attention=gated_deltanet in every layer: its state keeps a decayed "
                    "summary"),
    ({"n_kv_head": 1}, "model.n_kv_head=1 with attention=gated_deltanet in every layer: its state is per head"),
    ({"qk_norm": True}, "model.qk_norm=true with attention=gated_deltanet in every layer: it L2-normalises"),
    ({"gate": "headwise"}, "model.gate=headwise with attention=gated_deltanet in every layer: it gates its output "
                           "through its own gated RMSNorm; set model.gate=none"),
    ({"softcap": 30.0, "kernel": "manual"}, "model.softcap=30.0 with attention=gated_deltanet in every layer: it is "
                                            "linear attention, with no attention scores or softmax for it to change; "
                                            "set model.softcap=null"),
    ({"sinks": True}, "it is linear attention, with no attention scores or softmax for it to change"),
    ({"position": "rope"}, "model.position=rope with attention=gated_deltanet in every layer: rotary turns softmax "
                           "attention's queries and keys; it orders tokens by its convolution and state; set "
                           "model.position=learned or none"),
    ({"position": "alibi"}, "model.position=alibi with attention=gated_deltanet in every layer: it is linear "
                            "attention, with no attention scores or softmax"),
    ({"sdpa_backend": "math"}, "model.sdpa_backend=math chooses softmax attention's implementation"),
    ({"kv_latent": 8}, "model.kv_latent=8 with attention=gated_deltanet in every layer: it is an option of "
                       "attention=mla, not attention=gated_deltanet"),
    ({"kernel": "manual"}, "model.kernel=manual chooses softmax attention's kernel, but every layer is "
                           "attention=gated_deltanet, which runs its own form, no kernel; leave model.kernel=sdpa"),
    ({"kernel": "flex", "dropout": 0.1}, "model.kernel=flex chooses softmax attention's kernel, but every layer is "
                                         "attention=gated_deltanet"),  # not flex's lack of dropout: no layer runs it
    ({"linear_chunk": 0}, "model.linear_chunk=0 must be a positive number of positions per chunk"),
    ({"linear_chunk": True}, "model.linear_chunk=True must be a positive number"),
    ({"linear_chunk": 16, "attention": "fused_qkv", "position": "rope"}, "model.linear_chunk=16 is an option of "
                                                                         "attention=gated_deltanet or attention=kda, "
                                                                         "but attention=fused_qkv"),
])  # fmt: skip
def test_each_bad_value_is_refused_in_one_line_naming_it_and_the_fix(fields, says):
    with pytest.raises(ValueError) as err:
        GPTConfig(**{**BASE, **fields})
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_chunk_size_changes_the_arithmetic_not_the_function_and_names_the_run():
    x = torch.randint(0, 64, (2, 45), generator=torch.Generator().manual_seed(2))
    losses = []
    for chunk in (None, 1, 7, 45, 128):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**{**BASE, "block_size": 64, "linear_chunk": chunk}))
        losses.append(model(x, x)[1].item())
    assert max(losses) - min(losses) < 1e-5, losses
    assert attention_label(vars(GPTConfig(**BASE, linear_chunk=32))) == "gated_deltanet-sdpa-linchunk32-nopos"


def test_its_weights_convert_to_no_other_layout():
    state = deltanet_gpt().state_dict()
    with pytest.raises(ValueError, match=r"^attention=gated_deltanet computes another function .* to/from "
                                         r"fused_qkv; train it"):  # fmt: skip
        convert_attention_layout(state, "gated_deltanet", "fused_qkv")
    with pytest.raises(ValueError, match="has no attention weights"):
        deltanet_gpt().transformer.h[0].attn.attention_weights(torch.zeros(1, 3, 16))


@pytest.mark.slow
def test_a_short_run_lowers_the_loss_and_loads_as_itself(tmp_path, data_cache):
    run = tiny_run(tmp_path / "run", data_cache, "attention=gated_deltanet", "model.position=none")
    losses = train_losses(run)
    assert sum(losses[s] for s in (18, 19, 20)) / 3 < losses[1] - 0.3, losses
    loaded = load_model(str(run))
    assert isinstance(loaded.model.transformer.h[0].attn, GatedDeltaNet)
    with pytest.raises(ValueError, match=r"^attention=gated_deltanet computes another function .* to/from wrapper"):
        load_model(str(run), attention="wrapper")
    heads = run_script("heads.py", f"source={run}", f"out={tmp_path / 'heads'}", cwd=tmp_path)
    assert heads.returncode != 0 and not (tmp_path / "heads").exists()
    assert "attention=gated_deltanet layers have no attention maps" in heads.stderr, heads.stderr[-1000:]
    assert len(heads.stderr.strip().splitlines()) == 1, heads.stderr
    export = run_script("export.py", f"source={run}", f"out={tmp_path / 'hf'}", cwd=tmp_path)
    assert export.returncode != 0 and "attention=gated_deltanet" in export.stderr and not (tmp_path / "hf").exists()


def test_a_hybrids_label_reads_in_the_reports_legend_and_bars():
    label = attention_label(vars(hybrid_config(gate="none")))
    assert legend_title([label]).endswith("-<layer pattern>_<kind>.<what it sets>")
    assert tick_label(label).splitlines() == ["fused_qkv", "sdpa", "rope", "DG", "D.gated_deltanet.nopos",
                                              "G.fused_qkv"]  # fmt: skip


# Every field a Gated DeltaNet layer cannot apply, at a value that uses it: those it has a mechanism of its own
# for, rotary, and every registered score modification (ALiBi, QK-norm, softcap, sinks, the gate).
UNAPPLIED = [("window", 4), ("n_kv_head", 1), ("position", "rope"),
             *((mod.field, mod.example) for mod in MODIFICATIONS.values())]  # fmt: skip
# A hybrid whose linear kind D takes every attention field from the model (positions: none, so D may differ).
HYBRID = dict(vocab_size=64, block_size=16, n_layer=4, n_head=2, n_embd=16, position="none", layer_pattern="DG")


def refusal(**fields) -> str:
    with pytest.raises(ValueError) as err:
        GPTConfig(**fields)
    message = str(err.value)
    assert "\n" not in message and "kernel" not in message, "no kernel gives a linear layer scores"
    return message


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("name,value", UNAPPLIED)
def test_what_a_linear_model_cannot_apply_is_refused_for_its_linear_layers_never_for_the_kernel(name, value,
                                                                                               kernel):  # fmt: skip
    shown = spelled(value)
    message = refusal(**{**BASE, name: value, "kernel": kernel})
    assert message.startswith(f"model.{name}={shown} with attention=gated_deltanet in every layer: ")
    assert f"; set model.{name}=" in message


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("name,value", UNAPPLIED)
def test_a_hybrids_linear_kind_is_named_with_the_fixes_for_the_models_field_and_for_its_own(name, value, kernel):
    shown = spelled(value)
    kinds = {"D": {"attention": "gated_deltanet"}, "G": {}}
    message = refusal(**{**HYBRID, name: value, "kernel": kernel, "layer_kinds": kinds})
    assert message.startswith(f"model.{name}={shown} reaches layer kind D (layers 0, 2), attention=gated_deltanet, "
                              f"which cannot apply it: ")  # fmt: skip
    assert f"set it on the softmax kinds only (model.{name}=" in message
    assert f" +model.layer_kinds.G.{name}={shown}), or turn it off for kind D" in message
    off = yaml.safe_load(re.search(rf"\+model\.layer_kinds\.D\.{name}=(\S+)\)$", message).group(1))
    fixed = {"D": {"attention": "gated_deltanet", name: off}, "G": {}}  # the fix, read as Hydra reads it
    GPTConfig(**{**HYBRID, name: value, "kernel": "manual", "layer_kinds": fixed})

    message = refusal(**{**HYBRID, "kernel": kernel, "layer_kinds": {"D": {**kinds["D"], name: value}, "G": {}}})
    assert message.startswith(f"model.layer_kinds.D.{name}={shown}: layer kind D (layers 0, 2) is "
                              f"attention=gated_deltanet, which cannot apply it: ")  # fmt: skip
    assert f"; set model.layer_kinds.D.{name}=" in message and f"+model.layer_kinds.G.{name}={shown}" in message


def test_the_issues_hybrid_softcap_with_kernel_manual_names_the_linear_layers_not_the_kernel():
    message = refusal(**{**vars(hybrid_config(kernel="manual")), "softcap": 30.0})
    assert message == ("model.softcap=30.0 reaches layer kind D (layers 0, 2), attention=gated_deltanet, which cannot "
                       "apply it: it is linear attention, with no attention scores or softmax for it to change; set it "
                       "on the softmax kinds only (model.softcap=null +model.layer_kinds.G.softcap=30.0), or turn it "
                       "off for kind D (+model.layer_kinds.D.softcap=null)")  # fmt: skip
    softmax_only = {"D": {"attention": "gated_deltanet", "position": "none"}, "G": {"softcap": 30.0}}
    capped = GPTConfig(**{**vars(hybrid_config(kernel="manual")), "layer_kinds": softmax_only})
    assert [spec.softcap for spec in capped.layer_specs] == [None, 30.0, None, 30.0]
