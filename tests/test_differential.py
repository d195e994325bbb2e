"""Differential attention (``model.differential``, the Diff Transformer, arXiv 2410.05258).

Its float64 formula is ``differential_heads`` in tests/attention_reference.py (written from the paper: the maps'
difference taken on the weights, where the model takes it on the outputs), and the property grid holds every layout
that applies it, in every kernel, with decoding (test_attention_properties.py's encoding cells, from the option's
declaration). Here: its refusals, its label, lambda's parametrisation and initial draw, and conversion between the
layouts that hold it."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import CONFIGS, TINY, compose_train, run_script, tiny_run, train_losses
from helpers import tiny_gpt_config as config
from omegaconf import OmegaConf

from model import GPT, build_attention, convert_attention_layout, load_model
from model.attention.differential import LAMBDA_STD
from model.checkpoints.gpt2_export import what_gpt2_cannot_hold
from model.config import attention_label


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.2, 1.5, float("nan"), float("inf")])
def test_a_lambda_init_outside_zero_to_one_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match=r"model.lambda_init=.* must be a number between 0 and 1"):
        config(differential=True, lambda_init=bad)


def test_what_cannot_hold_it_is_refused_in_one_line():
    with pytest.raises(ValueError, match="model.lambda_init=0.5 is differential attention's lambda: set "
                                         "model.differential=true"):  # fmt: skip
        config(lambda_init=0.5)
    with pytest.raises(ValueError, match=r"model.n_head=3 is odd; use an even number of heads \(model.n_head=4 or 2\)"):
        config(differential=True, n_head=3, n_embd=48)
    for layout, extra in (("wrapper", {}), ("mla", {"kv_latent": 16}), ("gated_deltanet", {"position": "none"})):
        with pytest.raises(
            ValueError,
            match=r"model.differential=true.*is an option of attention=separate_qkv or attention=fused_qkv"
            r"(, but|, not) attention=",
        ):
            config(attention=layout, differential=True, **extra)
    assert any("model.differential=true" in p for p in what_gpt2_cannot_hold(config(differential=True)))


def test_the_label_names_it_and_a_lambda_init_of_its_own():
    assert attention_label(vars(config(differential=True))) == "fused_qkv-sdpa-diff"
    assert attention_label(vars(config(differential=True, lambda_init=0.5))) == "fused_qkv-sdpa-diff0.5"


def test_lambda_is_the_papers_and_its_vectors_start_drawn_so_that_they_learn():
    torch.manual_seed(0)
    model = GPT(config(differential=True, vocab_size=64, n_layer=2, n_head=4, n_embd=32, block_size=16))
    diffs = [block.attn.diff for block in model.transformer.h]
    for diff in diffs:
        vectors = [diff.lambda_q1, diff.lambda_k1, diff.lambda_q2, diff.lambda_k2]
        assert all(0.02 < v.std().item() < 5 * LAMBDA_STD for v in vectors), "N(0, 0.1), not zeros (which never move)"
        with torch.no_grad():
            want = math.exp(diff.lambda_q1 @ diff.lambda_k1) - math.exp(diff.lambda_q2 @ diff.lambda_k2) + 0.8
        want = float(want)
        assert abs(diff.weight().item() - want) < 1e-6
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx)[1].backward()
    assert all(d.lambda_q1.grad is not None and d.lambda_q1.grad.abs().sum() > 0 for d in diffs)


def test_fused_and_separate_start_from_the_same_weights_and_convert_exactly():
    torch.manual_seed(3)
    fused = GPT(config(differential=True, vocab_size=64, n_head=4, n_embd=32, block_size=16, kernel="manual"))
    torch.manual_seed(3)
    separate = GPT(config(differential=True, vocab_size=64, n_head=4, n_embd=32, block_size=16, kernel="manual",
                          attention="separate_qkv"))  # fmt: skip
    converted = convert_attention_layout(fused.state_dict(), "fused_qkv", "separate_qkv", n_head=4)
    assert converted.keys() == separate.state_dict().keys()
    assert all(torch.equal(converted[name], t) for name, t in separate.state_dict().items())
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(fused(idx, idx)[0], separate(idx, idx)[0], atol=1e-5, rtol=0)


def test_a_block_with_two_identical_maps_per_pair_weighs_its_keys_by_one_minus_lambda():
    """Heads 2h and 2h+1 with the same queries and keys (one map twice): the difference is (1 - lambda) A [v_2h,
    v_2h+1], plain attention's over the pair's values scaled, then normalised and scaled by (1 - lambda_init)."""
    torch.manual_seed(0)
    block = build_attention("separate_qkv", 32, 4, "manual", differential=True, bias=False).eval()
    with torch.no_grad():
        for proj in (block.query, block.key):
            w = proj.weight.view(4, 8, 32)
            w[1::2] = w[0::2]
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(block.diff, name).zero_()  # lambda = lambda_init = 0.8
    x = torch.randn(1, 9, 32)
    q = block.query(x).view(1, 9, 4, 8).transpose(1, 2)
    k = block.key(x).view(1, 9, 4, 8).transpose(1, 2)
    v = block.value(x).view(1, 9, 4, 8).transpose(1, 2)
    mask = torch.ones(9, 9).tril().bool()
    weights = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~mask, float("-inf")), dim=-1)
    heads = [weights[:, 2 * h] @ torch.cat((v[:, 2 * h], v[:, 2 * h + 1]), dim=-1) for h in range(2)]
    heads = [torch.nn.functional.rms_norm((1 - 0.8) * o, (16,), eps=1e-5) * (1 - 0.8) for o in heads]
    want = block.c_proj(torch.cat(heads, dim=-1))
    with torch.no_grad():
        torch.testing.assert_close(block(x), want, atol=1e-5, rtol=0)


# Grouped key/value heads (issue 60, item 3): (query heads, key/value heads), one group to several, each pair's group
# of two key heads and a value two heads wide
GROUPED = [(4, 2), (8, 4), (8, 2), (12, 6), (12, 2), (6, 6)]


@pytest.mark.parametrize("layout", ["fused_qkv", "separate_qkv"])
@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
@pytest.mark.parametrize("n_head,n_kv", GROUPED, ids=[f"{h}h{kv}kv" for h, kv in GROUPED])
def test_grouped_differential_heads_are_the_papers_formula_at_every_length(layout, kernel, n_head, n_kv):
    """Each differential head h of group g reads key heads 2g and 2g+1 with its two maps and the value [v_2g, v_2g+1]
    (attention_reference.differential_heads): outputs and every gradient, lengths 1 to past a few blocks."""
    from test_attention_properties import assert_block_is_the_formula, seeded_block

    block = seeded_block(layout, kernel, n_head, 4, n_kv, None, "cpu", differential=True, position="rope")
    assert_block_is_the_formula(block, layout, kernel, n_head, n_kv, None, "cpu", [1, 2, 3, 7, 13])


@pytest.mark.parametrize("n_head,n_kv", [(4, 2), (8, 2), (8, 4)])
def test_with_grouped_heads_the_two_halves_of_a_differential_head_differ(n_head, n_kv):
    """The old reading gave both maps of a pair one key and one value head: the two halves of every differential
    head's output were exactly equal (half of each head's width wasted)."""
    block = build_attention("fused_qkv", 8 * n_head, n_head, "manual", differential=True, n_kv_head=n_kv).eval()
    captured = []
    hook = block.c_proj.register_forward_pre_hook(lambda m, args: captured.append(args[0]))
    with torch.no_grad():
        block(torch.randn(2, 9, 8 * n_head))
    hook.remove()
    heads = captured[0].view(2, 9, n_head // 2, 16)
    assert (heads[..., :8] - heads[..., 8:]).abs().amax(dim=(0, 1, 3)).min() > 1e-3, "a head's halves are equal"


def test_an_odd_number_of_key_value_heads_is_refused_naming_the_even_ones():
    for kv in (1, 3):
        with pytest.raises(ValueError, match=rf"model.differential=true pairs key/value heads too .* but "
                                             rf"model.n_kv_head={kv} is odd; use an even model.n_kv_head \(2, 6\)$"):
            config(differential=True, n_head=6, n_embd=48, n_kv_head=kv)


@pytest.mark.parametrize("n_head,n_kv", [(4, 4), (4, 2), (8, 4), (8, 2)])
def test_it_is_diffllamas_function_with_its_heads_permuted(n_head, n_kv):
    """transformers' DiffLlama pairs query heads i and i + H/2 and key/value heads j and j + KV/2 (headlab, as the
    paper: 2h, 2h+1 and 2g, 2g+1): with the heads' rows permuted, one function, at every position."""
    from transformers import DiffLlamaConfig
    from transformers.models.diffllama.modeling_diffllama import DiffLlamaAttention, DiffLlamaRotaryEmbedding

    d, T = 8, 11
    C = n_head * d
    hf_config = DiffLlamaConfig(hidden_size=C, num_attention_heads=n_head, num_key_value_heads=n_kv,
                                rms_norm_eps=1e-5, attention_bias=False, head_dim=d)  # fmt: skip
    hf_config._attn_implementation = "eager"
    theirs = DiffLlamaAttention(hf_config, layer_idx=2).double().eval()
    ours = build_attention("separate_qkv", C, n_head, "manual", bias=False, n_kv_head=n_kv, differential=True,
                           position="rope", lambda_init=theirs.lambda_init).double().eval()  # fmt: skip

    def interleaved(heads: int) -> torch.Tensor:  # our head of each of theirs: i -> 2i, i + heads/2 -> 2i + 1
        return torch.tensor([2 * i if i < heads // 2 else 2 * (i - heads // 2) + 1 for i in range(heads)])

    with torch.no_grad():
        for proj, heads in (("q_proj", n_head), ("k_proj", n_kv), ("v_proj", n_kv)):
            rows = getattr(ours, {"q_proj": "query", "k_proj": "key", "v_proj": "value"}[proj]).weight
            rows = rows.view(heads, d, C)
            getattr(theirs, proj).weight.copy_(rows[interleaved(heads)].reshape(heads * d, C))
        theirs.o_proj.weight.copy_(ours.c_proj.weight)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(theirs, name).copy_(getattr(ours.diff, name))
    x = torch.randn(2, T, C, dtype=torch.float64)
    cos, sin = DiffLlamaRotaryEmbedding(hf_config)(x, torch.arange(T)[None])
    causal = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    with torch.no_grad():
        want = theirs(x, (cos.double(), sin.double()), attention_mask=causal)[0]
        got = ours(x)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)  # both take rotary's angles and lambda in float32


@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
def test_grouped_differential_decodes_as_its_full_forward(static):
    from test_attention_properties import assert_decodes_like_full_recomputation, decode_model, eager_or_static

    model = decode_model("fused_qkv", "sdpa", 2, 7, "cpu", differential=True, position="rope")
    assert_decodes_like_full_recomputation(model, eager_or_static(static, "cpu"), [1, 5, 13, 23], "cpu")


@pytest.mark.slow
def test_a_short_run_lowers_the_loss_loads_samples_and_is_refused_by_heads_and_export(tmp_path, data_cache):
    run = tiny_run(tmp_path / "run", data_cache, "model.differential=true", "model.n_head=2")
    losses = train_losses(run)
    assert sum(losses[s] for s in (18, 19, 20)) / 3 < losses[1] - 0.3, losses
    loaded = load_model(str(run), attention="separate_qkv")  # converts exactly, lambda vectors and all
    assert loaded.model.config.differential and loaded.model.transformer.h[0].attn.diff is not None
    with pytest.raises(ValueError, match=r"^attention=wrapper cannot hold this checkpoint: its model sets "
                                         r"model.differential=true, which only attention=separate_qkv or "
                                         r"attention=fused_qkv applies; load it as attention=fused_qkv"):  # fmt: skip
        load_model(str(run), attention="wrapper")
    sampled = run_script("sample.py", f"source={run}", "max_new_tokens=5", cwd=tmp_path)
    assert sampled.returncode == 0, sampled.stderr[-1000:]
    heads = run_script("heads.py", f"source={run}", f"out={tmp_path / 'heads'}", cwd=tmp_path)
    assert heads.returncode != 0 and not (tmp_path / "heads").exists()
    assert "layer 0 is differential attention (model.differential)" in heads.stderr, heads.stderr[-1000:]
    export = run_script("export.py", f"source={run}", f"out={tmp_path / 'hf'}", cwd=tmp_path)
    assert export.returncode != 0 and "model.differential=true" in export.stderr and not (tmp_path / "hf").exists()


def test_the_2026_presets_variants_are_the_baseline_llama4s_schedule_and_differential_attention():
    configs = {name: OmegaConf.to_object(compose_train(*TINY, "model.n_layer=4", f"attention_2026={name}"))
               for name in ("full", "llama4", "differential", "kimi_linear", "documents", "sparse")}  # fmt: skip
    models = {name: config.model for name, config in configs.items()}
    labels = {name: attention_label(vars(m)) for name, m in models.items()}
    assert labels == {"full": "fused_qkv-sdpa-rope", "llama4": "fused_qkv-sdpa-rope-RRRN_R.chunked8_N.nopos.qtemp8",
                      "differential": "fused_qkv-sdpa-rope-diff",
                      "kimi_linear": "mla-sdpa-latent64-nopos-KKKM_K.kda_M.mla",
                      "documents": "fused_qkv-sdpa-rope-docs", "sparse": "fused_qkv-sdpa-rope-top16"}  # fmt: skip
    assert configs["sparse"].trainer.indexer_warmup == 30 and configs["full"].trainer.indexer_warmup == 0
    preset = OmegaConf.load(CONFIGS / "experiment" / "compare_attention_2026.yaml").hydra.sweeper.params
    gpu = OmegaConf.load(CONFIGS / "experiment" / "compare_attention_2026_gpu.yaml").hydra.sweeper.params
    assert preset.attention_2026 == gpu.attention_2026 == ("full,llama4,differential,kimi_linear,documents,sparse,"
                                                           "ssmax,k_eq_v,path,moba,kimi_negeig,nsa,cla,hca,csa")
    assert preset["trainer.seed"] == gpu["trainer.seed"] == "1,2"


@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
def test_attention_dropout_drops_the_same_weights_for_both_halves_of_a_pairs_values(kernel):
    """With dropout every map must lose one set of weights: its outputs over v_2h and v_2h+1 are then the same
    dropped map times each half. Values equal in both halves of a pair make the two halves of each output head equal
    (before the norm, which keeps that) only if one mask served both."""
    torch.manual_seed(0)
    block = build_attention("separate_qkv", 32, 4, kernel, differential=True, dropout=0.5, bias=False).train()
    with torch.no_grad():
        w = block.value.weight.view(4, 8, 32)
        w[1::2] = w[0::2]  # v_2h+1 = v_2h
    captured = []
    hook = block.c_proj.register_forward_pre_hook(lambda m, args: captured.append(args[0]))
    block(torch.randn(2, 10, 32))
    hook.remove()
    heads = captured[0].view(2, 10, 2, 16)
    torch.testing.assert_close(heads[..., :8], heads[..., 8:], atol=1e-6, rtol=0)


def test_a_kinds_differential_must_be_a_bool_and_the_models_lambda_init_reaches_its_differential_layers():
    with pytest.raises(ValueError, match=r"model.layer_kinds.L \(layer 0\): model.differential='no' must be true or"):
        config(n_layer=2, layer_pattern="LG", layer_kinds={"L": {"differential": "no"}, "G": {}})
    mixed = config(n_layer=2, lambda_init=0.5, layer_pattern="LG", layer_kinds={"L": {"differential": True}, "G": {}})
    assert [mixed.layer_config(i).lambda_init for i in (0, 1)] == [0.5, 0.8]
    with pytest.raises(ValueError, match="model.lambda_init=0.5 is differential attention's lambda, but no layer is "
                                         "differential"):  # fmt: skip
        config(n_layer=2, lambda_init=0.5, layer_pattern="LG", layer_kinds={"L": {}, "G": {}})


def test_a_presets_plan_names_the_variant_the_config_refuses_in_one_line(tmp_path):
    result = run_script("train.py", "experiment=compare_attention_2026", "trainer.plan=true", "model.n_head=3",
                        "model.n_embd=48", cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip() == ("error: attention_2026=differential trainer.seed=1: model.differential=true pairs "
                                     "heads 2h and 2h+1 into one, but model.n_head=3 is odd; use an even number of "
                                     "heads (model.n_head=4 or 2)")  # fmt: skip


def test_compare_shows_a_column_for_each_new_option_only_where_some_run_sets_it():
    from analysis.report import shown_columns

    plain = {"label": "fused_qkv-sdpa", "differential": None, "attention_chunk": None, "query_temperature": None}
    assert not {"differential", "attention_chunk", "query_temperature"} & {k for k, _ in shown_columns([plain])}
    rows = [plain, {**plain, "differential": 0.8}, {**plain, "attention_chunk": 32, "query_temperature": 32}]
    assert {"differential", "attention_chunk", "query_temperature"} <= {k for k, _ in shown_columns(rows)}


def test_bench_takes_each_new_option_as_an_axis_and_refuses_a_bad_value_in_one_line(capsys):
    from measuring.bench_command import parse_args
    from measuring.cells import attention_cells, config_of

    args = parse_args(["--differential", "off", "on", "--attention-chunk", "none", "8", "--query-temperature",
                       "16", "--layouts", "fused_qkv", "--kernels", "sdpa", "--seq-len", "32"])  # fmt: skip
    cells = attention_cells(args)
    assert [(c["differential"], c["attention_chunk"], c["query_temperature"]) for c in cells] == [
        (False, None, 16), (True, None, 16), (False, 8, 16), (True, 8, 16)]  # fmt: skip
    assert config_of(args, cells[3], 32).differential and config_of(args, cells[3], 32).attention_chunk == 8
    for bad in (["--differential", "maybe"], ["--attention-chunk", "0"], ["--query-temperature", "x"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
        assert f"{bad[0]} {bad[1]}: give" in capsys.readouterr().err


def test_a_layout_that_cannot_hold_a_kinds_differential_layers_names_the_kinds_option():
    from model import GPTConfig
    from model.checkpoints.load import check_holds

    config = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=4, n_embd=32, attention="fused_qkv",
                       layer_pattern="AB", layer_kinds={"A": {}, "B": {"differential": True}})  # fmt: skip
    with pytest.raises(ValueError, match=r"^attention=wrapper cannot hold this checkpoint: its model sets "
                                         r"model.layer_kinds.B.differential=true, which only"):  # where it is set
        check_holds(config, "wrapper")
