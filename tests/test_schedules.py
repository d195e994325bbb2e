"""A model as a schedule of layers (issue 37, item 4): ``model.layer_pattern`` names each layer's kind, and
``model.layer_kinds`` says what each kind's attention sets (window, position, rope_theta, key/value heads, the
modifications). Every bad schedule is refused before any work in one line naming the layer and the value; a
schedule trains, samples (cached decoding a full recomputation from every prompt length, each layer's ring its own
size), plans, converts and reports; a uniform schedule is the uniform model.
"""

from __future__ import annotations

import pytest
import torch
from helpers import GPT2_LAYOUTS, TINY, compose_train, read_metrics, run_script, tiny_run
from helpers import tiny_gpt_config as config
from omegaconf import OmegaConf

import sample
from analysis.report import build_rows, markdown_table
from analysis.runs import find_runs
from measuring import bench_command, cells
from model import GPT, KVCache, convert_attention_layout
from model.checkpoints.gpt2_export import what_gpt2_cannot_hold
from model.config import LAYER_FIELDS, attention_label, context_notes
from model.decoding.steps import StaticStep
from training.loop import train
from training.plan import activation_bytes, make_plan
from training.run_log import run_tags

# Three local layers with a window, then a global one (gpt-oss and Gemma 3 alternate so; nanochat's SSSL).
LLLG = dict(n_layer=4, layer_pattern="LLLG", layer_kinds={"L": {"window": 5, "n_kv_head": 1}, "G": {}})


@pytest.mark.parametrize(("options", "expected"), [
    (dict(n_layer=6, layer_pattern="LLLG", layer_kinds={"L": {}, "G": {}}),
     "model.layer_pattern=LLLG has 4 layers, which does not tile model.n_layer=6; use a pattern whose length "
     "divides 6"),
    (dict(n_layer=4, layer_pattern="LLLG", layer_kinds={"L": {"window": 5}}),
     "model.layer_pattern=LLLG: layer kind G is not in model.layer_kinds (has: L); add model.layer_kinds.G"),
    (dict(n_layer=4, layer_pattern="LLLG", layer_kinds={"L": {"windw": 5}, "G": {}}),
     f"model.layer_kinds.L (layers 0, 1, 2): windw=5 is not a field a layer sets; choose from "
     f"{', '.join(LAYER_FIELDS)}"),
    (dict(n_layer=4, layer_pattern="LLLG", layer_kinds={"L": {}, "G": {"window": -1}}),
     "model.layer_kinds.G (layer 3): model.window=-1 must be a positive number of positions"),  # 0: a share's
    (dict(n_layer=4, kernel="sdpa", layer_pattern="LLLG", layer_kinds={"L": {"softcap": 30.0}, "G": {}}),
     "model.layer_kinds.L (layers 0, 1, 2): model.softcap=30.0 changes the scores before the softmax, which "
     "kernel=sdpa cannot do; use kernel=manual or flex"),
    (dict(n_layer=4, n_head=4, layer_pattern="LG", layer_kinds={"L": {"n_kv_head": 3}, "G": {}}),
     "model.layer_kinds.L (layers 0, 2): model.n_kv_head=3 does not divide model.n_head=4"),
    (dict(n_layer=4, layer_pattern="LG", layer_kinds={"L": {"position": "rope"}, "G": {}}),
     "model.layer_kinds.L (layers 0, 2): position=rope with model.position=learned: layers' encodings may differ "
     "only among those without a table (rope, alibi, none, path)"),
    (dict(n_layer=4, position="rope", layer_pattern="LG", layer_kinds={"L": {"position": "spiral"}, "G": {}}),
     "model.layer_kinds.L (layers 0, 2): unknown model.position 'spiral'; choose one of: alibi, learned, none, path, "
     "rope"),
    (dict(n_layer=4, kernel="manual", layer_pattern="LG", layer_kinds={"L": {"softcap": "abc"}, "G": {}}),
     "model.layer_kinds.L (layers 0, 2): model.softcap='abc' must be a finite positive number"),
    (dict(n_layer=4, layer_pattern="LG", layer_kinds={"L": {"window": [1, 2]}, "G": {}}),
     "model.layer_kinds.L (layers 0, 2): model.window=[1, 2] must be a positive number of positions"),
    (dict(n_layer=4, layer_pattern="LG", layer_kinds={"L": 5, "G": {}}),
     "model.layer_kinds.L=5 must be the kind's fields, e.g. {window: 128}, or {} for none"),
    (dict(n_layer=4, layer_pattern="llg"), "model.layer_pattern='llg' must be capital letters"),
    (dict(n_layer=4, layer_kinds={"L": {}}), "model.layer_kinds names L but model.layer_pattern is not set"),
    (dict(n_layer=4, layer_pattern="LG", layer_kinds={"L": {}, "G": {}, "X": {}}),
     "model.layer_kinds.X is in no layer of model.layer_pattern=LG"),
])  # fmt: skip
def test_a_bad_schedule_is_refused_in_one_line_naming_the_layer_and_the_value(options, expected):
    with pytest.raises(ValueError) as err:
        config(**options)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_train_py_refuses_a_bad_schedule_before_any_work(tmp_path):
    # A kind's value is checked after the run's name is made from it (Hydra's run dir): spelled as given there.
    result = run_script("train.py", *TINY, "model.n_layer=4", "model.position=rope", "model.layer_pattern=LLLG",
                        "+model.layer_kinds.L.window=3", "+model.layer_kinds.G.rope_theta=x",
                        f"trainer.run_dir={tmp_path / 'run'}", "logger=none", cwd=tmp_path)  # fmt: skip
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "error: model.layer_kinds.G (layer 3): model.rope_theta='x' must be a finite number above 1 (10000: "
        "RoFormer's, Llama 2's; 500000: Llama 3's)"]
    assert not (tmp_path / "run").exists(), "refused before any work"


def test_a_uniform_schedule_is_the_uniform_model_bit_for_bit():
    plain = config(n_layer=4, position="rope", window=5, sinks=True, kernel="manual")
    scheduled = config(n_layer=4, position="rope", window=5, sinks=True, kernel="manual", layer_pattern="AB",
                       layer_kinds={"A": {}, "B": {"window": 5, "sinks": True}})  # fmt: skip
    models = []
    for c in (plain, scheduled):
        torch.manual_seed(0)
        models.append(GPT(c).eval())
    (a, b), idx = models, torch.randint(0, 50, (2, 8))
    assert all(torch.equal(a.state_dict()[k], t) for k, t in b.state_dict().items())
    assert torch.equal(a(idx, idx)[0], b(idx, idx)[0])
    assert b.flops_per_token() == a.flops_per_token()


@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
@pytest.mark.parametrize("position", ["learned", "rope"])
@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
def test_cached_decoding_of_a_schedule_is_a_full_recomputation_each_layer_ring_its_own_size(kernel, position,
                                                                                          static):  # fmt: skip
    torch.manual_seed(0)
    block = 12
    model = GPT(config(**LLLG, n_head=2, kernel=kernel, position=position, block_size=block)).eval()
    total = block if position == "learned" else 3 * block  # a rotary model reads past its context
    capacities = model.config.cache_capacities
    assert capacities == [5, 5, 5, block]
    gen = torch.Generator().manual_seed(1)
    for prompt in (1, 4, 5, 6, 11, block):
        B = 1 + prompt % 3
        idx = torch.randint(0, 50, (B, total), generator=gen)
        with torch.inference_mode():
            full = model(idx, idx)[0]
            cache = KVCache(model.config.n_layer)
            first = model(idx[:, :prompt], cache=cache)[0][:, -1]
            torch.testing.assert_close(first, full[:, prompt - 1], atol=1e-5, rtol=0)
            held = [{t.size(2) for pair in layer.slots.values() for t in pair} for layer in cache.layers]
            assert held == [{c} for c in capacities], "each layer's ring holds its own window (or the context)"
            step = StaticStep(model, cache, B, torch.device("cpu")) if static else None
            for t in range(prompt, total):
                logits = step(idx[:, t : t + 1], t) if static else model(idx[:, t : t + 1], cache=cache)[0][:, -1]
                torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=0, msg=f"prompt {prompt}, pos {t}")


@pytest.mark.parametrize("other", [name for name in GPT2_LAYOUTS if name != "fused_qkv"])
def test_a_schedule_starts_from_the_same_weights_and_converts_per_layer_in_every_layout(other):
    options = dict(**LLLG, n_head=4, kernel="manual", position="rope")
    options["layer_kinds"] = {"L": {"window": 5, "n_kv_head": 1}, "G": {"n_kv_head": 2, "qk_norm": True}}
    models = {}
    for layout in ("fused_qkv", other):
        torch.manual_seed(4)
        models[layout] = GPT(config(**options, attention=layout)).eval()
    fused = models["fused_qkv"].state_dict()
    there = convert_attention_layout(fused, "fused_qkv", other, n_head=4)
    assert there.keys() == models[other].state_dict().keys()
    assert all(torch.equal(there[k], t) for k, t in models[other].state_dict().items()), "same initial weights"
    back = convert_attention_layout(there, other, "fused_qkv", n_head=4)
    assert all(torch.equal(back[k], t) for k, t in fused.items())
    idx = torch.randint(0, 50, (2, 8))
    torch.testing.assert_close(models[other](idx, idx)[0], models["fused_qkv"](idx, idx)[0], atol=1e-5, rtol=0)


def test_the_plan_counts_each_layer_as_its_kind_and_names_the_kinds():
    scheduled = config(**LLLG, n_head=2, block_size=16)
    layers = [scheduled.layer_config(i) for i in range(4)]
    plan = make_plan(OmegaConf.to_object(compose_train(*TINY)), scheduled, 1, torch.float32)
    with torch.device("meta"):
        model = GPT(scheduled)
    assert plan.params == model.num_params()
    local, global_ = (GPT(config(**{**vars(c), "n_layer": 1})).flops_per_token() for c in (layers[0], layers[3]))
    all_local = GPT(config(**{**vars(layers[0]), "n_layer": 4})).flops_per_token()
    assert plan.flops_per_token == all_local - local + global_, "each layer's FLOPs at its own window and heads"
    assert scheduled.cache_widths == [16, 16, 16, 32] and plan.kv_cache_bytes_per_token == 4 * 80
    parts = activation_bytes(scheduled, 2, torch.float32)
    each = [activation_bytes(c, 2, torch.float32) for c in layers]
    assert parts["attention projections"] == sum(e["attention projections"] for e in each) // 4
    text = plan.text()
    assert "layers (LLLG repeated over 4), by kind:" in text
    assert "L x 3 (layers 0, 1, 2; kv1, window5)" in text and "G x 1 (layer" in text
    assert "up to 5 positions" in text and "up to 16 positions" in text


def test_a_schedule_is_named_in_its_label_and_each_kind_refused_for_gpt2_as_a_uniform_model_would_be():
    c = config(n_layer=4, n_head=4, position="rope", sinks=True, kernel="manual", layer_pattern="LLLG",
               layer_kinds={"L": {"window": 5, "sinks": False}, "G": {"position": "none"}})
    assert attention_label(vars(c)) == "fused_qkv-manual-rope-sinks-LLLG_L.window5.nosinks_G.nopos"
    problems = what_gpt2_cannot_hold(c)
    assert problems == [  # each named where it is set: the kind's fields, the model's
        "model.layer_kinds.L.window=5 (GPT-2 has no sliding-window attention: it attends over its whole context)",
        "model.position=rope (GPT-2 holds learned positions only: a table of block_size vectors)",
        "model.layer_kinds.G.position=none (GPT-2 holds learned positions only: a table of block_size vectors)",
        "model.sinks=true (GPT-2's softmax has no sink)"]


def test_a_schedule_spelled_in_hydra_trains_samples_converted_and_reports(tmp_path, data_cache):
    run_dir = tmp_path / "sched"
    cfg = compose_train(*TINY, "model.n_layer=4", "model.position=rope", "model.layer_pattern=LLLG",
                        "+model.layer_kinds.L.window=4", "+model.layer_kinds.G={}", "trainer.max_steps=4",
                        "trainer.eval_interval=2", "logger=none", f"trainer.run_dir={run_dir}",
                        f"data.cache_dir={data_cache}")  # fmt: skip
    train(cfg)
    assert len([m for m in read_metrics(run_dir) if "train/loss" in m]) == 4
    texts = [sample.run(sample.SampleConfig(source=str(run_dir), prompt="def ", max_new_tokens=40, temperature=0.0,
                                            device="cpu", attention=layout)) for layout in GPT2_LAYOUTS]  # fmt: skip
    assert all(text == texts[0] for text in texts), "every layout samples the same greedy text from the weights"
    rows, _ = build_rows(find_runs([tmp_path]), None)
    assert rows[0]["label"] == "fused_qkv-sdpa-rope-LLLG_L.window4_G" and rows[0]["layers"] == "LLLG_L.window4_G"
    assert "| layers |" in markdown_table(rows) and "| LLLG_L.window4_G |" in markdown_table(rows)


def test_bench_times_a_schedule_as_a_whole_model_and_names_it(tmp_path, capsys):
    kinds = '{"L": {"window": 4}, "G": {}}'
    rows = bench_command.main(["--mode", "gpt", "--layouts", "fused_qkv", "--kernels", "manual", "--seq-len", "8",
                               "--batch", "1", "--n-embd", "16", "--n-head", "2", "--n-layer", "4", "--vocab-size",
                               "64", "--layer-pattern", "LLLG", "--layer-kinds", kinds, "--min-run-time", "0.01",
                               "--device", "cpu", "--out", str(tmp_path)])  # fmt: skip
    assert [(r["layer_pattern"], r["layer_kinds"]) for r in rows] == [("LLLG", kinds)]
    assert "| LLLG | " + kinds + " |" in capsys.readouterr().out
    assert cells.cell_label(rows[0], []) == "fused_qkv-manual-LLLG_L.window4_G"
    for argv, expected in ((["--layer-pattern", "LLLG"], "--mode block times one attention block"),
                           (["--mode", "gpt", "--layer-kinds", "{}"], "--layer-kinds needs --layer-pattern"),
                           (["--mode", "gpt", "--layer-pattern", "LG", "--layer-kinds", "[1]"], "a JSON object")):
        with pytest.raises(SystemExit):
            bench_command.parse_args(argv)
        assert expected in capsys.readouterr().err


def test_a_long_schedule_is_tagged_in_wandb_by_its_pattern_and_kinds_each_under_wandbs_limit():
    kinds = ", ".join(f"{k}: {{window: {w}, rope_theta: {t}}}" for k, w, t in (("A", 16, 20000), ("B", 24, 30000),
                                                                             ("C", 8, 40000)))  # fmt: skip
    cfg = OmegaConf.to_object(compose_train(*TINY, "model.n_layer=3", "model.position=rope",
                                            "model.layer_pattern=ABC", f"+model.layer_kinds={{{kinds}}}"))  # fmt: skip
    tags = run_tags(cfg)
    assert "ABC" in tags and "A.window16.rope20000" in tags and all(len(tag) <= 64 for tag in tags)


@pytest.mark.parametrize(("options", "notes"), [
    (dict(block_size=8, window=8),
     ["model.window=8 covers the whole context (block_size=8): the same function as model.window=null"]),
    (dict(block_size=8, n_layer=4, layer_pattern="LG", layer_kinds={"L": {"window": 12}, "G": {}}),
     ["model.layer_kinds.L.window=12 covers the whole context (block_size=8) in its layers (layers 0, 2): the "
      "same function as no window there (model.layer_kinds.L.window=null)"]),
    (dict(block_size=8, n_layer=4, window=8, layer_pattern="LG", layer_kinds={"L": {"window": 4}, "G": {}}),
     ["model.window=8 covers the whole context (block_size=8): the same function as model.window=null"]),
    (dict(block_size=8, n_layer=4, window=9, layer_pattern="LG", layer_kinds={"L": {"window": 4}, "G": {"window": 2}}),
     []),  # every kind sets its own window: the model's reaches no layer
    (dict(block_size=8, n_layer=4, layer_pattern="LG", layer_kinds={"L": {"window": 1}, "G": {}}),
     ["model.layer_kinds.L.window=1 lets each position of its layers (layers 0, 2) see only itself: they mix no "
      "tokens (where it is a schedule's share of the context, model.block_size=8 is too short for the schedule's "
      "local attention)"]),
    (dict(block_size=8, window=1), ["model.window=1 lets each position see only itself: attention mixes no tokens"]),
    (dict(block_size=8, window=7, n_layer=4, layer_pattern="LG", layer_kinds={"L": {"window": 2}, "G": {}}), []),
    (dict(block_size=8), []),
])  # fmt: skip
def test_context_notes_say_a_window_that_covers_the_context_or_sees_only_itself_for_the_model_and_each_kind(
        options, notes):  # fmt: skip
    assert context_notes(config(**options)) == notes


def test_a_schedules_share_of_a_small_context_is_said_at_one_key_and_refused_at_none():
    tiny = [*TINY, "model.n_layer=2", "schedule=gpt_oss"]
    eighth = OmegaConf.to_object(compose_train(*tiny, "model.block_size=8")).model
    assert eighth.layer_kinds["L"] == {"window": 1}
    assert [note.split(" lets ")[0] for note in context_notes(eighth)] == ["model.layer_kinds.L.window=1"]
    assert context_notes(OmegaConf.to_object(compose_train(*tiny, "model.block_size=16")).model) == []
    with pytest.raises(ValueError) as err:
        OmegaConf.to_object(compose_train(*tiny, "model.block_size=7"))
    assert ("model.layer_kinds.L.window is a schedule's share of the context, model.block_size=7 / 8, which rounds "
            "down to 0 (configs/schedule's windows and chunks are such shares); use model.block_size=8 or more, or set "
            "model.layer_kinds.L.window to a positive number of positions") in str(err.value)


@pytest.mark.parametrize("name", ["window", "attention_chunk", "query_temperature"])
def test_a_zero_typed_in_a_kind_is_refused_as_typed_not_blamed_on_a_share_of_the_context(name):
    """Issue 60, item 8: a 0 the user typed is not a share that rounded down (nor is a longer block_size its fix)."""
    with pytest.raises(ValueError) as err:
        config(block_size=64, n_layer=2, layer_pattern="AB", layer_kinds={"A": {}, "B": {name: 0}})
    message = str(err.value)
    assert message.startswith(f"model.layer_kinds.B.{name}=0 (layer 1) ") and "set it to a positive number" in message
    assert "block_size" not in message and "share" not in message, message


def test_a_kinds_window_past_the_context_is_said_when_training_starts(tmp_path, data_cache, log_lines):
    tiny_run(tmp_path / "run", data_cache, "model.n_layer=2", "model.position=rope", "model.layer_pattern=LG",
             "+model.layer_kinds.L.window=64", "+model.layer_kinds.G={}", "trainer.max_steps=2")  # fmt: skip
    assert ("model.layer_kinds.L.window=64 covers the whole context (block_size=32) in its layers (layer 0): the "
            "same function as no window there (model.layer_kinds.L.window=null)") in log_lines()
