"""A schedule's run is reported as its preset and kinds (issue 60, item 6): ``python train.py mixing=kimi_linear``
is ``kimi_linear: KKKM, K=kda, M=mla/sdpa`` in run.json, its wandb tags and compare.py's table and plots, not
``mla`` / ``sdpa``, which three of its four layers do not run. A model whose layers are alike is reported as
before (tests/test_axes_names.py holds its tags, tests/test_run_names.py its names).

The report's runs are copies of the session's trained run, edited into each case (tests/test_compare_truth.py)."""

from __future__ import annotations

import json

import pytest
from helpers import CONFIGS, TINY, compose_train, run_cli
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_compare_truth import make_run, report_of, table_rows

import rebuild_wandb
import train as train_script
from analysis.plots import beside_schedule, throughput_figure, val_loss_figure
from analysis.report import build_rows
from analysis.runs import find_runs
from analysis.wandb_file import read_complete
from training.config import validate
from training.plan import attends
from training.run_log import open_run_log, run_name, run_tags

KIMI = "kimi_linear: KKKM, K=kda, M=mla/sdpa"


@pytest.mark.parametrize(("overrides", "preset"), [
    (["mixing=kimi_linear"], "kimi_linear"),
    (["attention_2026=kimi_linear"], "kimi_linear"),  # through mixing=kimi_linear, which it takes
    (["attention_2026=llama4"], "llama4"),
    (["length_variant=gemma3"], "gemma3"),
    (["schedule=gemma3", "mixing=kimi_linear"], "kimi_linear"),  # composed later: its layers won
    (["schedule=gemma3", "attention_2026=differential"], "gemma3"),  # differential sets no layers
    (["schedule=gemma3", "mixing=attention"], None),  # the later one made every layer alike
    (["length_variant=rope", "model.n_layer=2", "model.layer_pattern=LG", "+model.layer_kinds={L:{window:4},G:{}}"],
     None),  # a schedule the command line spelled: no preset chose it
    ([], None),
])  # fmt: skip
def test_the_preset_is_the_option_whose_layers_the_model_has(overrides, preset):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides, return_hydra_config=True)
    assert train_script.schedule_preset(cfg.hydra.runtime.choices, cfg.model.layer_pattern) == preset


def test_the_schedule_groups_are_in_the_order_the_defaults_list_composes_them():
    defaults = [next(iter(entry)) for entry in OmegaConf.load(CONFIGS / "train.yaml").defaults
                if not isinstance(entry, str)]  # fmt: skip
    assert sorted(train_script.SCHEDULE_GROUPS, key=defaults.index) == list(train_script.SCHEDULE_GROUPS)


def kimi(*overrides: str):
    return OmegaConf.to_object(compose_train(*TINY, "mixing=kimi_linear", "model.n_layer=4", "logger=none",
                                             "logger.preset=kimi_linear", *overrides))  # fmt: skip


def test_run_json_and_the_wandb_tags_name_a_schedule_by_its_preset_and_kinds(tmp_path):
    cfg = kimi()
    container = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    open_run_log(cfg, container, tmp_path, {}, None, "cpu", 0.0).close("finished")
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["schedule"] == KIMI and info["logger"]["preset"] == "kimi_linear"
    tags = run_tags(cfg)
    assert tags[:3] == ["kimi_linear", "K=kda", "M=mla/sdpa"], tags
    assert "mla" not in tags and "sdpa" not in tags, "a layout and kernel three of its four layers do not run"
    # its name opens with the preset, and each kind names its layout (a bare M read as a name cut short)
    assert run_name(cfg) == info["name"] == "kimi_linear-mla-sdpa-latent64-nopos-KKKM_K.kda_M.mla-nano"
    assert attends(cfg.model) == "KKKM: K=kda, M=mla/sdpa", "the plan says what each kind runs, not mla + sdpa"
    # a schedule whose every kind runs the model's layout leads with it, after its preset
    gemma = OmegaConf.to_object(compose_train(*TINY, "schedule=gemma3", "model.n_layer=4", "logger.preset=gemma3"))
    assert run_tags(gemma)[:3] == ["gemma3", "fused_qkv", "sdpa"]
    assert run_name(gemma).startswith("gemma3-fused_qkv-sdpa-") and attends(gemma.model) == "fused_qkv + sdpa"
    plain = OmegaConf.to_object(compose_train(*TINY, "logger=none"))
    (tmp_path / "plain").mkdir()
    open_run_log(plain, OmegaConf.to_container(OmegaConf.structured(plain)), tmp_path / "plain", {}, None, "cpu",
                 0.0).close("finished")  # fmt: skip
    assert "schedule" not in json.loads((tmp_path / "plain" / "run.json").read_text())


def test_a_preset_named_for_a_model_whose_layers_are_alike_is_refused_in_one_line():
    cfg = OmegaConf.to_object(compose_train(*TINY, "logger.preset=kimi_linear"))
    with pytest.raises(ValueError) as err:
        validate(cfg)
    assert str(err.value) == ("logger.preset=kimi_linear names a schedule of layers, but every layer of this model is "
                              "alike (model.layer_pattern=null): set model.layer_pattern, or drop logger.preset")


def as_kimi_linear(info: dict) -> None:
    """The trained run's run.json as a mixing=kimi_linear run's (its model's fields as the preset sets them)."""
    info["model"].update(attention="mla", position="none", kv_latent=64, n_layer=4, layer_pattern="KKKM",
                         layer_kinds={"K": {"attention": "kda", "kv_latent": None}, "M": {}})  # fmt: skip
    info["logger"]["preset"] = "kimi_linear"


def test_the_report_gives_a_schedules_layouts_and_kernels_by_kind_and_its_preset(trained_run, tmp_path):
    make_run(tmp_path, "0_fused", trained_run, 0)
    make_run(tmp_path, "1_kimi", trained_run, 1, as_kimi_linear)
    report, rows = report_of(tmp_path)
    cells = table_rows(report)
    column = {title: i for i, title in enumerate(cells[0])}
    plain, scheduled = cells[2], cells[3]
    assert [scheduled[column[c]] for c in ("layout", "kernel", "schedule")] == ["K kda, M mla", "M sdpa", KIMI]
    assert [plain[column[c]] for c in ("layout", "kernel", "schedule")] == ["fused_qkv", "sdpa", "-"]
    assert [row["schedule"] for row in rows] == ["", KIMI], "report.csv too"
    runs = find_runs([tmp_path])
    legend = [t.get_text() for t in val_loss_figure(runs, "step").axes[0].get_legend().get_texts()]
    # under its preset and kinds, the label's parts that line does not say already: not KKKM, kda, mla twice
    assert legend == ["fused_qkv-sdpa-learned", f"{KIMI}\nlatent64-nopos"]
    ticks = [t.get_text() for t in throughput_figure(runs, build_rows(runs, None)[0]).axes[0].get_xticklabels()]
    assert ticks[1].splitlines() == ["kimi_linear: KKKM", "K=kda", "M=mla/sdpa", "latent64", "nopos"]


@pytest.mark.parametrize("label,rest", [
    ("fused_qkv-sdpa-rope-DG_D.gated_deltanet.nopos_G", "rope-D.nopos"),
    ("fused_qkv-sdpa-LLLG_L.window128.nosinks_G.nopos", "L.window128.nosinks-G.nopos"),
    ("fused_qkv-sdpa-DG_D.gated_deltanet", ""),
])  # fmt: skip
def test_what_a_kind_sets_besides_its_layout_stays_beside_the_schedules_line(label, rest):
    assert beside_schedule(label) == rest


@pytest.mark.slow
def test_a_preset_chosen_on_the_command_line_is_in_run_json_the_wandb_run_and_its_rebuild(tmp_path, data_cache):
    run = tmp_path / "run"
    result = run_cli(*TINY, "mixing=hybrid", "model.n_layer=4", "trainer.max_steps=2", "trainer.eval_interval=2",
                     "logger.mode=offline", f"data.cache_dir={data_cache}", f"hydra.run.dir={run}",
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    info = json.loads((run / "run.json").read_text())
    hybrid = "hybrid: DDDG, D=gated_deltanet, G=fused_qkv/sdpa"
    assert info["logger"]["preset"] == "hybrid" and info["schedule"] == hybrid
    assert info["name"].startswith("hybrid-fused_qkv-sdpa-") and "_D.gated_deltanet" in info["name"], info["name"]
    (trained,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    (record,) = [r.run for r in read_complete(trained) if r.WhichOneof("record_type") == "run"]
    tags = list(record.tags)
    assert tags[:3] == ["hybrid", "D=gated_deltanet", "G=fused_qkv/sdpa"], tags
    config = {item.key: json.loads(item.value_json) for item in record.config.update}
    assert config["schedule"] == hybrid, "wandb's config has run.json's facts"
    (rebuilt,) = rebuild_wandb.main([str(run)]).glob("run-*.wandb")
    (again,) = [r.run for r in read_complete(rebuilt) if r.WhichOneof("record_type") == "run"]
    assert list(again.tags) == [*tags, "rebuilt"], "the rebuilt run is tagged as training tagged it"
