"""Export to transformers, start a new run from existing weights, evaluate any model on any data."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from helpers import TINY, compose_train, read_metrics, save_tiny_hf_gpt2, tiny_gpt_config, write_text_corpus

import evaluate
import export
from data.config import DataConfig
from data.loader import PreparedData, validation_starts, windows
from data.prepare import prepare
from model import GPT, Checkpoint, load_model, same_function_layouts
from training.loop import train

transformers = pytest.importorskip("transformers")


def checkpoint_in_layout(trained_run: Path, layout: str, folder: Path) -> Path:
    """The trained run's weights saved as a checkpoint of ``layout``."""
    loaded = load_model(str(trained_run), attention=layout)
    path = folder / f"{layout}.pt"
    Checkpoint(model=loaded.model.state_dict(), model_config=asdict(loaded.model.config),
               tokenizer=loaded.tokenizer.name, step=loaded.step).save(path)  # fmt: skip
    return path


def assert_same_logits(ours: GPT, folder: Path) -> None:
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    ours.eval()
    idx = torch.randint(0, ours.config.vocab_size, (2, ours.config.block_size))
    with torch.no_grad():
        theirs = hf(idx).logits
        mine = ours.lm_head(ours.transformer.ln_f(_hidden(ours, idx)))[..., : ours.config.vocab_size]
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-4)


def _hidden(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.size(1)))
    for block in model.transformer.h:
        x = block(x)
    return x


@pytest.mark.parametrize("layout", same_function_layouts("fused_qkv"))
def test_export_of_each_layout_loads_in_transformers_with_the_same_logits(trained_run, tmp_path, layout):
    source = checkpoint_in_layout(trained_run, layout, tmp_path)
    out = export.run(export.ExportConfig(source=str(source), out=str(tmp_path / "hf")))
    info = json.loads((out / "headlab.json").read_text())
    assert info["tokenizer"] == "bytes" and "UTF-8 bytes" in info["tokenize"]
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 257, "the padding is cropped"
    assert_same_logits(load_model(str(source)).model, out)
    back = load_model(str(out))  # the exported folder is a source too, with the tokenizer it names
    assert back.tokenizer.name == "bytes" and back.model.config.vocab_size == 257


def test_a_model_without_biases_exports_with_zero_biases_exactly(tmp_path, data_cache):
    run = tmp_path / "nobias"
    train(compose_train(*TINY, "logger=none", "model.bias=false", "trainer.max_steps=5", f"trainer.run_dir={run}",
                        f"data.cache_dir={data_cache}"))  # fmt: skip
    out = export.run(export.ExportConfig(source=str(run), out=str(tmp_path / "hf")))
    assert_same_logits(load_model(str(run)).model, out)


def test_a_gpt2_tokenized_model_exports_gpt2_tokenizer_files(tmp_path, gpt2_tokenizer_offline):
    model = GPT(tiny_gpt_config(vocab_size=50257, attention="wrapper"))
    Checkpoint(model=model.state_dict(), model_config=asdict(model.config), tokenizer="gpt2").save(tmp_path / "g.pt")
    out = export.run(export.ExportConfig(source=str(tmp_path / "g.pt"), out=str(tmp_path / "hf")))
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "Hello world! def f(x):\n\treturn x ** 2  # naïve café"
    assert tokenizer(text)["input_ids"] == gpt2_tokenizer_offline.encode(text)
    assert_same_logits(model, out)


def test_export_refuses_an_unknown_tokenizer_and_a_missing_source(tmp_path):
    model = GPT(tiny_gpt_config())
    Checkpoint(model=model.state_dict(), model_config=asdict(model.config), tokenizer="gpt5").save(tmp_path / "x.pt")
    with pytest.raises(ValueError, match="unknown tokenizer 'gpt5'; choose one of"):
        export.run(export.ExportConfig(source=str(tmp_path / "x.pt"), out=str(tmp_path / "hf")))
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        export.run(export.ExportConfig(source=str(tmp_path / "nowhere"), out=str(tmp_path / "hf")))


def test_init_from_a_run_starts_at_its_loss_level_in_a_new_run(trained_run, tmp_path, data_cache):
    source_losses = [m["train/loss"] for m in read_metrics(trained_run) if "train/loss" in m]
    common = (*TINY, "logger=none", f"data.cache_dir={data_cache}", "trainer.max_steps=3")
    train(compose_train(*common, f"trainer.init_from={trained_run}", "attention=wrapper", "kernel=manual",
                        "model.dropout=0.1", f"trainer.run_dir={tmp_path / 'tuned'}"))  # fmt: skip
    train(compose_train(*common, f"trainer.run_dir={tmp_path / 'fresh'}"))
    tuned = [m["train/loss"] for m in read_metrics(tmp_path / "tuned") if "train/loss" in m]
    fresh = [m["train/loss"] for m in read_metrics(tmp_path / "fresh") if "train/loss" in m]
    assert abs(tuned[0] - source_losses[-1]) < 0.5 and tuned[0] < fresh[0] - 1.0, (tuned, fresh, source_losses[-1])
    assert load_model(str(tmp_path / "tuned")).step == 3, "a new run, counting from step 0"


def test_init_from_a_save_pretrained_gpt2_in_another_layout_crops_positions(tmp_path, gpt2_tokenizer_offline):
    save_tiny_hf_gpt2(tmp_path / "gpt2-tiny", n_layer=1)
    corpus = write_text_corpus(tmp_path / "corpus", 30, "Story {i}: once upon a time a little model learned. " * 6)
    run = tmp_path / "run"
    train(compose_train(*TINY, "logger=none", "data=files", f"data.path={corpus}", "data.tokenizer=gpt2",
                        "data.num_proc=1", f"data.cache_dir={tmp_path / 'cache'}", "attention=separate_qkv",
                        f"trainer.init_from={tmp_path / 'gpt2-tiny'}", "trainer.max_steps=1", "optim.lr=1e-12",
                        "optim.min_lr=0", "optim.warmup_steps=0", "optim.weight_decay=0",
                        f"trainer.run_dir={run}"))  # fmt: skip
    tuned = load_model(str(run), attention="fused_qkv").model.state_dict()
    source = load_model(str(tmp_path / "gpt2-tiny")).model.state_dict()
    assert tuned["transformer.wpe.weight"].shape[0] == 32
    wpe = "transformer.wpe.weight"
    torch.testing.assert_close(tuned[wpe], source[wpe][:32], atol=1e-6, rtol=0)
    torch.testing.assert_close(tuned["transformer.h.0.attn.c_attn.weight"],
                               source["transformer.h.0.attn.c_attn.weight"], atol=1e-6, rtol=0)  # fmt: skip


def test_init_from_a_source_of_another_shape_is_refused_before_training(trained_run, tmp_path, data_cache):
    cfg = compose_train(*TINY, "logger=none", "model.n_embd=64", f"trainer.init_from={trained_run}",
                        f"trainer.run_dir={tmp_path / 'run'}", f"data.cache_dir={data_cache}")  # fmt: skip
    with pytest.raises(ValueError, match=r"does not fit this run: this run's model.n_embd=64 differs from the "
                                         r"source's model.n_embd=32"):
        train(cfg)
    assert not (tmp_path / "run").exists(), "refused before any run directory or training"


def test_evaluate_reproduces_the_runs_last_validation_loss(trained_run, data_cache, tmp_path):
    last = [m for m in read_metrics(trained_run) if "val/loss" in m][-1]
    result = evaluate.run(evaluate.EvaluateConfig(source=str(trained_run), data=DataConfig(cache_dir=str(data_cache)),
                                                  device="cpu", out=str(tmp_path / "eval.json")))  # fmt: skip
    assert result["val/loss"] == pytest.approx(last["val/loss"], abs=1e-4)
    assert result["val/bpb"] == pytest.approx(last["val/bpb"], abs=1e-4)
    assert json.loads((tmp_path / "eval.json").read_text())["windows"] == 8


def test_evaluate_a_save_pretrained_gpt2_gives_transformers_loss(tmp_path, gpt2_tokenizer_offline):
    hf = save_tiny_hf_gpt2(tmp_path / "gpt2-tiny", n_positions=32)
    corpus = write_text_corpus(tmp_path / "corpus", 40, "Chapter {i}. The rain in Spain stays in the plain. " * 4)
    data = DataConfig(name="corpus", source="files", path=str(corpus), tokenizer="gpt2", num_proc=1,
                      cache_dir=str(tmp_path / "cache"))  # fmt: skip
    cfg = evaluate.EvaluateConfig(source=str(tmp_path / "gpt2-tiny"), data=data, windows=6, batch_size=4,
                                  device="cpu", out=str(tmp_path / "e.json"))  # fmt: skip
    result = evaluate.run(cfg)
    val = PreparedData(prepare(replace(data))).tokens["val"]
    x, y = windows(val, validation_starts(len(val), 32, 6), 32, torch.device("cpu"))
    with torch.no_grad():
        logits = hf(x).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).item()
    assert result["val/loss"] == pytest.approx(expected, abs=1e-4)
