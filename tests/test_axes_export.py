"""export.py refuses, before it writes anything, a model GPT-2's format cannot hold (positions other than the
learned table, QK-norm, softcap, sinks, a latent, a window), naming each option and the fix; what GPT-2 holds
(grouped-query heads, written as multi-head, a schedule's kinds with their own key/value heads too) still exports,
computing the same logits in transformers."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from helpers import GPT2_LAYOUTS, TINY, compose_train, run_script, sharp_gpt, tiny_gpt_config

import export
from model import GPT, Checkpoint
from model.checkpoints.gpt2_export import check_gpt2_holds, export_hf_gpt2, what_gpt2_cannot_hold
from training.loop import train


@pytest.mark.parametrize(
    "options,named",
    [
        (dict(position="rope"), ["model.position=rope"]),
        (dict(position="alibi"), ["model.position=alibi"]),
        (dict(position="none"), ["model.position=none"]),
        (dict(qk_norm=True), ["model.qk_norm=true"]),
        (dict(kernel="manual", softcap=30.0), ["model.softcap=30.0"]),
        (dict(sinks=True), ["model.sinks=true"]),
        (dict(attention="mla", kv_latent=8), ["attention=mla"]),
        (dict(window=4), ["model.window=4"]),
        (dict(position="rope", qk_norm=True, sinks=True, window=4),
         ["model.window=4", "model.position=rope", "model.qk_norm=true", "model.sinks=true"]),
        (dict(n_kv_head=1), []),  # grouped-query: the same function in GPT-2's multi-head form
        (dict(k_eq_v=True), []),  # keys equal to values: the values written as the keys, the same function
        (dict(), []),
    ],
)  # fmt: skip
def test_every_option_gpt2_cannot_hold_is_named(options, named):
    config = tiny_gpt_config(**options)
    problems = what_gpt2_cannot_hold(config)
    assert [p.split(" (")[0] for p in problems] == named
    if named:
        with pytest.raises(ValueError, match="GPT-2's format cannot hold this model: model|GPT-2's format cannot hold "
                                             "this model: attention") as err:  # fmt: skip
            check_gpt2_holds(config)
        assert "Export a model trained with GPT-2's attention" in str(err.value)


def test_the_refusal_comes_before_the_folder_is_made(tmp_path):
    with pytest.raises(ValueError, match="model.sinks=true"):
        export_hf_gpt2(GPT(tiny_gpt_config(sinks=True)), tmp_path / "hf", eot_id=None)
    assert not (tmp_path / "hf").exists()


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, data_cache):
    run = tmp_path_factory.mktemp("rope") / "run"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=2", "model.position=rope", "model.qk_norm=true",
                        f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))  # fmt: skip
    return run


def test_export_of_a_rope_model_is_one_line_and_writes_nothing(rope_run, tmp_path):
    out = tmp_path / "hf"
    result = run_script("export.py", f"source={rope_run}", f"out={out}", cwd=tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "GPT-2's format cannot hold" in line]
    assert len(errors) == 1 and "model.position=rope" in errors[0] and "model.qk_norm=true" in errors[0], lines
    assert "Traceback" not in result.stderr
    assert not out.exists(), "nothing written"


# Layers whose kinds differ in key/value heads: GPT-2 has one attention shape, so each kind's heads are written
# repeated to n_head (the same function), as a uniform n_kv_head is.
KV_SCHEDULE = dict(n_layer=3, n_head=4, n_embd=32, layer_pattern="LLG",
                   layer_kinds={"L": {"n_kv_head": 1}, "G": {"n_kv_head": 2}})  # fmt: skip


@pytest.mark.parametrize("layout", GPT2_LAYOUTS)
def test_keys_equal_to_values_export_the_same_function(layout, tmp_path):
    """GPT-2 holds no encoding that turns keys before they serve as values (learned positions, no QK-norm): its
    c_attn holds model.k_eq_v with the values written as the keys, grouped-query heads repeated."""
    transformers = pytest.importorskip("transformers")
    model = sharp_gpt(attention=layout, n_layer=2, n_head=4, n_embd=32, n_kv_head=2, k_eq_v=True)
    export_hf_gpt2(model, tmp_path / "hf", eot_id=None)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx, idx)[0], rtol=0, atol=1e-4)


@pytest.mark.parametrize("layout", GPT2_LAYOUTS)
def test_a_schedule_of_key_value_heads_exports_the_same_function(layout, tmp_path):
    transformers = pytest.importorskip("transformers")
    model = sharp_gpt(attention=layout, **KV_SCHEDULE)
    assert [model.config.layer_config(i).kv_heads for i in range(3)] == [1, 1, 2]
    assert what_gpt2_cannot_hold(model.config) == []
    export_hf_gpt2(model, tmp_path / "hf", eot_id=None)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx, idx)[0], rtol=0, atol=1e-4)


def test_export_py_writes_a_schedule_of_key_value_heads_and_says_each_kind_s_heads(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    model = sharp_gpt(**{**KV_SCHEDULE, "vocab_size": 257})
    source = tmp_path / "run.pt"
    Checkpoint(model=model.state_dict(), model_config=asdict(model.config), tokenizer="bytes").save(source)
    export.run(export.ExportConfig(source=str(source), out=str(tmp_path / "hf")))
    assert "layer kind L's 1 and layer kind G's 2 key/value heads written as 4, the same function" in (
        capsys.readouterr().err)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    idx = torch.randint(0, 257, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(hf(idx).logits, model(idx, idx)[0][..., :257], rtol=0, atol=1e-4)
