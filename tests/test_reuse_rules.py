"""One "must match" rule for reusing a checkpoint (training/reuse.py), read from the config fields' metadata:
trainer.resume=<dir>, trainer.resume=auto and trainer.init_from each keep what it says, and refuse the rest in
one line naming the setting."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, fields

import pytest
from helpers import TINY, compose_train, read_metrics

from model.checkpoints.checkpoint import load_checkpoint
from model.config import GPTConfig
from training import reuse
from training.config import TrainConfig
from training.loop import train


def model(**changes) -> dict:
    return asdict(GPTConfig(**{**dict(vocab_size=256, block_size=32, n_layer=1, n_head=2, n_embd=32), **changes}))


def refused(how: str, saved: dict, now: dict) -> list[str]:
    return [d.key for d in reuse.differences(how, {"model": saved}, {"model": now})]


def test_every_field_says_what_a_change_means():
    kinds = reuse.field_kinds()
    assert set(kinds.values()) <= set(reuse.KINDS), {k: v for k, v in kinds.items() if v not in reuse.KINDS}
    undeclared = [f.name for f in fields(GPTConfig) if "reuse" not in f.metadata]
    assert not undeclared, f"GPTConfig fields without metadata={{'reuse': ...}}: {undeclared}"
    assert {key for key in kinds if key.startswith("model.")} == {f"model.{f.name}" for f in fields(GPTConfig)}
    assert {group.name for group in fields(TrainConfig)} == {key.split(".")[0] for key in kinds}


@pytest.mark.parametrize(("change", "resume", "init_from"), [
    ({"window": 8}, True, False),  # another function of the same weights: a resumed run must keep it
    ({"n_kv_head": 1}, True, True),  # another shape of the key/value weights
    ({"n_embd": 64}, True, True),
    ({"attention": "wrapper"}, True, False),  # weights convert, an optimizer state does not
    ({"kernel": "manual"}, False, False),  # the same function, computed another way
    ({"dropout": 0.1}, False, False),
    ({"name": "mine"}, False, False),
    ({"block_size": 16}, True, False),  # shorter: init_from crops the positions
    ({"block_size": 64}, True, True),
])  # fmt: skip
def test_resume_and_init_from_keep_what_the_metadata_says(change, resume, init_from):
    key = f"model.{next(iter(change))}"
    assert (key in refused("resume", model(), model(**change))) is resume
    assert (key in refused("init_from", model(), model(**change))) is init_from
    assert key in refused("continue", model(), model(**change)), "continuing in place keeps every model setting"


def test_continuing_in_place_may_change_the_budget_and_the_machine_but_not_the_losses():
    saved = asdict(compose_train_object())
    now = asdict(compose_train_object("trainer.max_steps=50", "data.cache_dir=/elsewhere", "data.num_proc=1",
                                      "trainer.device=cpu", "optim.lr=1e-3", "trainer.seed=7"))  # fmt: skip
    assert [d.key for d in reuse.differences("continue", saved, now)] == ["optim.lr", "trainer.seed"]
    assert reuse.differences("resume", saved, now) == [], "a resumed run may change the optimizer and the seed"


def compose_train_object(*overrides: str) -> TrainConfig:
    from omegaconf import OmegaConf

    return OmegaConf.to_object(compose_train(*TINY, *overrides))


def tiny(run_dir, data_cache, *overrides: str):
    return compose_train(*TINY, "logger=none", f"trainer.run_dir={run_dir}", f"data.cache_dir={data_cache}",
                         *overrides)  # fmt: skip


def test_a_resume_with_another_window_is_refused_in_one_line_naming_it(tmp_path, data_cache):
    train(tiny(tmp_path / "run", data_cache, "trainer.max_steps=2"))
    with pytest.raises(ValueError) as refusal:
        train(tiny(tmp_path / "other", data_cache, "trainer.max_steps=4", "model.window=4",
                   f"trainer.resume={tmp_path / 'run'}"))  # fmt: skip
    message = str(refusal.value)
    assert message.startswith(f"cannot resume from {tmp_path / 'run'}: this run's model.window=4 differs from the "
                              f"checkpoint's. Resume with the checkpoint's settings (add model.window=null)"), message
    assert "\n" not in message
    assert not (tmp_path / "other").exists(), "refused before any run directory"

    with pytest.raises(ValueError, match=r"this run's model.window=4 differs from the settings it was started with\. "
                                         r"Continue it with its own settings \(add model.window=null; its run.json"):
        train(tiny(tmp_path / "run", data_cache, "trainer.max_steps=4", "model.window=4", "trainer.resume=auto"))


def test_a_refused_resume_names_the_overrides_that_resume_it_inside_a_schedules_kinds(tmp_path, data_cache):
    """The fix is typed as the message gives it: a kind's field the run lacks (+...), one it adds (~...), each as a
    shell word."""
    schedule = ("model.n_layer=2", "model.layer_pattern=AB")
    train(tiny(tmp_path / "run", data_cache, "trainer.max_steps=2", *schedule, "+model.layer_kinds.A={}",
               "+model.layer_kinds.B={window:4}"))  # fmt: skip
    again = (*schedule, "+model.layer_kinds.A={window:8}", "+model.layer_kinds.B={}", "trainer.max_steps=3",
             f"trainer.resume={tmp_path / 'run'}")  # fmt: skip
    with pytest.raises(ValueError) as refusal:
        train(tiny(tmp_path / "other", data_cache, *again))
    fix = str(refusal.value).split("(add ")[1].split("), or start")[0]
    assert fix == '"~model.layer_kinds.A.window" +model.layer_kinds.B.window=4', str(refusal.value)
    assert ("this run's model.layer_kinds.A.window=8 no model.layer_kinds.B.window differ from the checkpoint's"
            in str(refusal.value))
    summary = train(tiny(tmp_path / "other", data_cache, *again, *shlex.split(fix)))
    assert summary["step"] == 3


@pytest.mark.parametrize("value,typed", [(None, "null"), (True, "true"), (16, "16"), (0.5, "0.5"), ("kda", "kda"),
                                         ("my notes.txt", "'my notes.txt'"), ("16", "'16'"), ("null", "'null'"),
                                         ({"K": {"attention": "kda", "kv_latent": None}},
                                          "{K:{attention:kda,kv_latent:null}}"), ([1, 2], "[1,2]")])  # fmt: skip
def test_a_value_is_spelled_as_hydra_reads_it_back(value, typed):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert reuse.hydra_value(value) == typed
    parsed = OverridesParser.create().parse_override(f"key={typed}").value()
    assert parsed == value or (isinstance(value, list) and list(parsed) == value)


def test_init_from_a_source_with_other_key_value_heads_is_refused_before_any_work(trained_run, tmp_path, data_cache):
    with pytest.raises(ValueError, match=r"does not fit this run: this run's model.n_kv_head=1 differs from "
                                         r"the source's model.n_kv_head=null\. "):
        train(tiny(tmp_path / "run", data_cache, "model.n_kv_head=1", f"trainer.init_from={trained_run}"))
    assert not (tmp_path / "run").exists()


def test_a_continuation_in_place_keeps_how_val_loss_is_measured(tmp_path, data_cache):
    """Its curve and its best would mix two measures: the windows val/loss averages over must stay."""
    run = tmp_path / "run"
    options = [*TINY, "logger=none", f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"]
    train(compose_train(*options, "trainer.stop_at_step=10"))
    with pytest.raises(ValueError, match=r"this run's trainer\.eval_windows=4 differs from the settings it"):
        train(compose_train(*options, "trainer.eval_windows=4", "trainer.resume=auto"))


@pytest.mark.slow
def test_a_run_resumed_elsewhere_that_measures_val_loss_otherwise_starts_its_curve_and_its_best_anew(
        tmp_path, data_cache, log_lines):  # fmt: skip
    first = tmp_path / "first"
    common = [*TINY, "logger.mode=offline", f"data.cache_dir={data_cache}"]
    train(compose_train(*common, "trainer.max_steps=10", f"trainer.run_dir={first}"))
    same, other = tmp_path / "same", tmp_path / "other"
    train(compose_train(*common, f"trainer.resume={first}", f"trainer.run_dir={same}"))
    train(compose_train(*common, f"trainer.resume={first}", "trainer.eval_windows=4", f"trainer.run_dir={other}"))
    wandb_id = {run: json.loads((run / "run.json").read_text())["wandb_id"] for run in (first, same, other)}
    assert wandb_id[same] == wandb_id[first], "the same measure: one curve, continued"
    assert wandb_id[other] != wandb_id[first], "another measure: a curve of its own"
    evals = [m["val/loss"] for m in read_metrics(other) if "val/loss" in m]
    assert load_checkpoint(other / "best.pt").best_val_loss == min(evals), "its best, by its own measure"
    assert any("val/loss is measured anew (trainer.eval_windows=4 (it was 8))" in line for line in log_lines())


def test_a_refusal_names_each_differing_setting_as_an_override_not_as_python():
    diffs = [reuse.Difference("model.window", "function", None, 4), reuse.Difference("optim.name", "optimizer", "muon",
                                                                                      "adamw")]  # fmt: skip
    assert reuse.differ(diffs) == "model.window=4 optim.name=adamw differ"
    assert reuse.settings(diffs, "saved") == "model.window=null optim.name=muon"
    assert reuse.differ(diffs[:1]) == "model.window=4 differs"
