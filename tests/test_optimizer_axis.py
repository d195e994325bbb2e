"""The optimizer and the learning-rate schedule as an axis of the comparison: Muon runs that resume exactly, a
warmup-stable-decay checkpoint that serves a larger budget exactly, a resume with another optimizer refused naming
the fix, every bad value refused in one line before work, and what the plan, the run names and the report say."""

from __future__ import annotations

import csv
import json
import shutil
import sys

import pytest
import torch
from helpers import ROOT, TINY, as_if_quiet, compose_train, read_metrics, run_cli, train_losses
from omegaconf import OmegaConf
from warm_python import run_python

import compare
from common.optim_label import optimizer_label, optimizer_text, schedule_label, schedule_text, training_label
from training.config import OptimConfig
from training.loop import train
from training.optim import described, lr_at, same_schedule
from training.plan import make_plan, planned_model
from training.run_log import run_name


def tiny(run_dir, data_cache, *overrides: str):
    return compose_train(*TINY, "logger=none", f"trainer.run_dir={run_dir}", f"data.cache_dir={data_cache}",
                         *overrides)  # fmt: skip


def lrs(run_dir, key: str = "lr") -> dict[int, float]:
    return {m["step"]: m[key] for m in read_metrics(run_dir) if key in m}


def test_the_schedules_warm_up_then_decay_as_they_say():
    cosine, wsd = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=4), OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=4,
                                                                                schedule="wsd")  # fmt: skip
    sqrt = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=4, schedule="wsd", decay_shape="1-sqrt", decay_fraction=0.5)
    constant = OptimConfig(lr=1.0, warmup_steps=4, schedule="constant")
    for cfg in (cosine, wsd, sqrt, constant):
        assert [lr_at(s, cfg, 100) for s in range(4)] == [0.25, 0.5, 0.75, 1.0], "one warmup for all"
    assert [lr_at(s, wsd, 100) for s in (4, 79)] == [1.0, 1.0], "stable until the last 20 steps"
    assert lr_at(80, wsd, 100) == pytest.approx(1 - 0.9 / 20) and lr_at(99, wsd, 100) == pytest.approx(0.1)
    assert lr_at(74, sqrt, 100) == pytest.approx(0.1 + 0.9 * (1 - 0.5**0.5)), "1 - sqrt of the decay's progress"
    assert lr_at(99, sqrt, 100) == pytest.approx(0.1) and lr_at(49, sqrt, 100) == 1.0
    assert lr_at(99, constant, 100) == 1.0 and lr_at(99, cosine, 100) == pytest.approx(0.1, abs=1e-3)
    half = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=4, schedule="wsd", decay_fraction=0.5)
    assert lr_at(2, half, 4) == pytest.approx(0.55), "a warmup that reaches into the decay meets it (not 0.75)"
    # Peaks of their own (Muon's): the same shape
    assert lr_at(80, wsd, 100, peak=0.02, floor=0.002) == pytest.approx(0.02 * lr_at(80, wsd, 100))
    # A checkpoint in wsd's stable phase is one of every larger budget's run; cosine's only up to its peak
    assert same_schedule(wsd, 60, 80, 200) and not same_schedule(wsd, 70, 80, 200)
    assert same_schedule(cosine, 5, 80, 200) and not same_schedule(cosine, 6, 80, 200)


def test_a_muon_run_resumes_exactly_its_momentum_with_it(tmp_path, data_cache):
    common = ("optim=muon_heads", "model.dropout=0.1", "trainer.max_steps=12")  # dropout: RNG state matters
    train(tiny(tmp_path / "whole", data_cache, *common))
    train(tiny(tmp_path / "part", data_cache, *common, "trainer.stop_at_step=5"))
    second = train(tiny(tmp_path / "rest", data_cache, *common, f"trainer.resume={tmp_path / 'part'}"))
    assert second["start_step"] == 5 and second["step"] == 12
    whole = train_losses(tmp_path / "whole")
    pieced = {**train_losses(tmp_path / "part"), **train_losses(tmp_path / "rest")}
    assert pieced == whole, "the same losses, step for step"
    assert lrs(tmp_path / "rest", "lr/muon") == {s: lrs(tmp_path / "whole", "lr/muon")[s] for s in range(6, 13)}
    assert lrs(tmp_path / "whole", "lr/muon")[12] == pytest.approx(0.02 * lrs(tmp_path / "whole")[12] / 3e-3)


def test_a_wsd_checkpoint_of_its_stable_phase_continues_to_a_larger_budget_as_the_run_planned_for_it(
        tmp_path, data_cache, log_lines):  # fmt: skip
    """One run serves many budgets: stopped at step 6 of a 12-step wsd run (its decay starts at step 10), continued in
    place to 20 steps, it is the 20-step run, loss for loss and lr for lr, and it says so."""
    common = ("optim.schedule=wsd", "optim=muon")
    train(tiny(tmp_path / "planned", data_cache, *common, "trainer.max_steps=20"))
    run = tmp_path / "run"
    train(tiny(run, data_cache, *common, "trainer.max_steps=12", "trainer.stop_at_step=6"))
    train(tiny(run, data_cache, *common, "trainer.max_steps=20", "trainer.resume=auto"))
    assert (f"continuing {run} from step 6 to 20: the learning-rate schedule (wsd) over 20 steps, as a run planned "
            f"for 20 from the start, exactly: its 6 steps so far had the same learning rates under both budgets "
            f"(lr at step 7: 3.00e-03)") in log_lines()  # fmt: skip
    assert ("optimizer: Muon as stored for 4 matrices (12,288 parameters; lr 0.02, momentum 0.95, Nesterov, 5 "
            "Newton-Schulz steps in float32, lr adjusted by shape: original, weight decay 0), AdamW for the rest "
            "(11,744; lr 0.003); schedule wsd: warmup 2 steps, the peak until step 16, then a linear decay to 0.0002 "
            "at step 20") in log_lines()  # fmt: skip
    assert train_losses(run) == train_losses(tmp_path / "planned")
    assert lrs(run) == lrs(tmp_path / "planned") and lrs(run, "lr/muon") == lrs(tmp_path / "planned", "lr/muon")
    # Past the start of its decay the schedule is re-planned, and the continuation says that instead
    train(tiny(tmp_path / "decaying", data_cache, *common, "trainer.max_steps=12", "trainer.stop_at_step=11"))
    train(tiny(tmp_path / "decaying", data_cache, *common, "trainer.max_steps=20", "trainer.resume=auto"))
    assert any("the learning-rate schedule (wsd) is re-planned over 20 steps (it spanned 12 steps" in line
               for line in log_lines())  # fmt: skip


def test_a_resume_with_another_optimizer_is_refused_naming_init_from(tmp_path, data_cache):
    train(tiny(tmp_path / "run", data_cache, "optim=muon", "trainer.max_steps=2"))
    with pytest.raises(ValueError) as refusal:
        train(tiny(tmp_path / "other", data_cache, "trainer.max_steps=4", f"trainer.resume={tmp_path / 'run'}"))
    message = str(refusal.value)
    assert message == (f"cannot resume from {tmp_path / 'run'}: this run's optim.name=adamw differs from the "
                       f"checkpoint's. Resume with the checkpoint's settings (add optim.name=muon), or start a new run "
                       f"(trainer.init_from={tmp_path / 'run'} starts one from its weights with a new optimizer: a "
                       f"resume continues its optimizer's state)")  # fmt: skip
    assert not (tmp_path / "other").exists(), "refused before any run directory"
    with pytest.raises(ValueError, match=r"this run's optim.name=adamw differs from the settings it was started "
                                         r"with\. Continue it with its own settings \(add optim.name=muon"):
        train(tiny(tmp_path / "run", data_cache, "trainer.max_steps=4", "trainer.resume=auto"))
    # Its split and learning rate may change on a resume (the same state: a momentum per matrix), and init_from
    # starts AdamW from its weights
    resumed = train(tiny(tmp_path / "split", data_cache, "optim=muon_qkv", "optim.muon_lr=0.01",
                         "trainer.max_steps=4", f"trainer.resume={tmp_path / 'run'}"))  # fmt: skip
    assert resumed["start_step"] == 2 and lrs(tmp_path / "split", "lr/muon")[3] == pytest.approx(0.01), "its own lr"
    fresh = train(tiny(tmp_path / "fresh", data_cache, "trainer.max_steps=2", f"trainer.init_from={tmp_path / 'run'}"))
    assert fresh["start_step"] == 0


@pytest.mark.parametrize("overrides,message", [
    ("optim.lr=-0.001", r"optim.lr=-0.001, optim.min_lr=0.0002: need 0 <= min_lr <= lr and lr > 0"),
    ("optim=muon optim.muon_lr=-0.02", r"optim.muon_lr=-0.02, optim.muon_weight_decay=0.0: Muon's peak learning rate "
                                       r"must be > 0"),
    ("optim.name=lion", r"optim.name='lion'; choose one of: adamw, muon \(or the group: optim=adamw, muon, muon_qkv, "
                        r"muon_heads\)"),
    ("optim=muon optim.muon_split=columns", r"optim.muon_split='columns'; choose one of: as_stored, qkv, heads"),
    ("optim.muon_split=qkv", r"optim.muon_split=qkv is an option of Muon, but optim.name=adamw; use optim=muon, or "
                             r"leave optim.muon_split at its default \(as_stored\)"),
    ("optim.schedule=linear", r"optim.schedule='linear'; choose one of: cosine, wsd, constant"),
    ("optim.decay_fraction=0.5", r"optim.decay_fraction=0.5 shapes the wsd schedule's decay, but "
                                 r"optim.schedule=cosine; set optim.schedule=wsd"),
    ("optim.schedule=wsd optim.decay_fraction=0", r"optim.decay_fraction=0.0: the share of trainer.max_steps"),
    ("optim.schedule=wsd optim.decay_shape=cosine", r"optim.decay_shape='cosine'; choose one of: linear, 1-sqrt"),
    ("optim.schedule=constant optim.min_lr=0", r"optim.min_lr=0.0 is where a decay ends, but "
                                               r"optim.schedule=constant has none"),
    ("optim=muon optim.muon_momentum=1", r"optim.muon_momentum=1.0 must be in \[0, 1\)"),
    ("optim=muon optim.muon_ns_steps=0", r"optim.muon_ns_steps=0: Newton-Schulz iterations, a whole number in 1..99"),
    ("optim=muon optim.muon_adjust_lr=spectral", r"optim.muon_adjust_lr='spectral'; choose one of: original, "
                                                 r"match_rms_adamw, none"),
])  # fmt: skip
def test_bad_optimizer_values_are_refused_in_one_line_before_any_work(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=f"^{message}") as refusal:
        train(compose_train(*TINY, *overrides.split(), "logger=none", f"trainer.run_dir={tmp_path / 'run'}",
                            f"data.cache_dir={tmp_path / 'cache'}"))  # fmt: skip
    assert "\n" not in str(refusal.value)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_the_plan_counts_one_momentum_buffer_for_muons_matrices_and_two_moments_for_the_rest():
    plans = {}
    for optim in ("adamw", "muon"):
        cfg = OmegaConf.to_object(compose_train(f"optim={optim}", "trainer.device=cpu"))
        plans[optim] = make_plan(cfg, planned_model(cfg), 1, torch.float32)
    muon = plans["muon"].muon_params
    assert 0 < muon < plans["muon"].params and plans["adamw"].muon_params == 0
    assert plans["adamw"].static_bytes - plans["muon"].static_bytes == 4 * muon, "4 bytes less per Muon parameter"
    assert "weights + gradients + AdamW: " in plans["adamw"].text()
    assert (f"weights + gradients + optimizer (Muon's momentum for {muon:,} parameters, AdamW's two moments for "
            f"{plans['muon'].params - muon:,}): ") in plans["muon"].text()


@pytest.mark.parametrize("overrides,name", [
    ((), "fused_qkv-sdpa-nano"),  # AdamW and cosine: the names every run had
    (("optim=muon",), "fused_qkv-sdpa-nano-muon"),
    (("optim=muon_qkv", "optim.schedule=wsd"), "fused_qkv-sdpa-nano-muon_qkv-wsd"),
    (("optim=muon_heads", "optim.muon_lr=0.01", "optim.muon_nesterov=false", "optim.muon_ns_steps=3"),
     "fused_qkv-sdpa-nano-muon_heads-lr0.01-nonesterov-ns3"),
    (("optim.schedule=wsd", "optim.decay_fraction=0.4", "optim.decay_shape=1-sqrt"),
     "fused_qkv-sdpa-nano-wsd0.4_1sqrt"),
    (("optim.schedule=constant", "optim.lr=0.001"), "fused_qkv-sdpa-nano-constant"),  # AdamW's lr: a sweep's suffix
])  # fmt: skip
def test_a_run_name_spells_the_optimizer_and_schedule_only_where_they_differ(overrides, name):
    cfg = OmegaConf.to_object(compose_train(*overrides))
    assert run_name(cfg) == name


def test_the_report_cells_say_the_optimizer_its_split_and_the_schedule():
    assert (optimizer_text(None), schedule_text(None), training_label(None)) == ("AdamW", "cosine", "")
    assert optimizer_text({"name": "muon"}) == "Muon as stored"
    assert optimizer_text({"name": "muon", "muon_split": "qkv", "muon_lr": 0.01}) == "Muon by Q/K/V (lr0.01)"
    assert schedule_text({"schedule": "wsd", "decay_shape": "1-sqrt"}) == "wsd (decay 20%, 1-sqrt)"
    assert optimizer_label({"name": "muon", "muon_momentum": 0.9, "muon_weight_decay": 0.1,
                            "muon_adjust_lr": "none"}) == "muon-mom0.9-adj_none-wd0.1"  # fmt: skip
    assert schedule_label({"schedule": "wsd", "decay_fraction": 0.2}) == "wsd"
    from analysis.plots import legend_title

    assert legend_title(["fused_qkv-sdpa", "fused_qkv-sdpa-muon_qkv-wsd0.4_1sqrt"]) == ("layout-kernel-<optimizer>"
                                                                                       "[-<its options>]-<lr schedule>")
    assert legend_title(["fused_qkv-sdpa", "wrapper-sdpa-kv2"]) == "layout-kernel-kv<key/value heads>"


@pytest.fixture(scope="module")
def optimizer_runs(tmp_path_factory, data_cache):
    """Two layouts under AdamW, Muon as stored and Muon by Q/K/V (8 steps each), as a sweep would leave them."""
    root = tmp_path_factory.mktemp("optimizers")
    for layout in ("wrapper", "fused_qkv"):
        for optim in ("adamw", "muon", "muon_qkv"):
            run = root / f"{layout}-{optim}"
            train(tiny(run, data_cache, f"attention={layout}", f"optim={optim}", "trainer.max_steps=8",
                       "trainer.eval_interval=4"))  # fmt: skip
            as_if_quiet(run)
    return root


def test_the_report_has_optimizer_columns_and_compares_layouts_only_under_one_optimizer(optimizer_runs, tmp_path):
    """Each run's label and row say its optimizer; the layouts trained alike (AdamW, Muon by Q/K/V) are held to each
    other, and those that Muon stepped as stored are not (other matrices: other optimizers in effect). A loss gap
    between the two Muon-by-Q/K/V layouts is flagged; the same gap as stored is not."""
    for run in optimizer_runs.iterdir():
        shutil.copytree(run, tmp_path / run.name)
    for name in ("fused_qkv-muon_qkv", "fused_qkv-muon"):  # as if these had trained to a lower loss
        metrics = tmp_path / name / "metrics.jsonl"
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        for m in lines:
            for key in ("train/loss", "val/loss"):
                if key in m:
                    m[key] -= 0.5
        metrics.write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = compare.main([str(tmp_path), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        rows = {(r["layout"], r["optimizer"]): r for r in csv.DictReader(f)}
    assert set(rows) == {(layout, optimizer) for layout in ("wrapper", "fused_qkv")
                         for optimizer in ("AdamW", "Muon as stored", "Muon by Q/K/V")}  # fmt: skip
    assert "lr_schedule" not in rows["wrapper", "AdamW"], "every run cosine: no column for it"
    assert rows["fused_qkv", "Muon by Q/K/V"]["label"] == "fused_qkv-sdpa-muon_qkv"
    assert rows["fused_qkv", "Muon by Q/K/V"]["flag"] and rows["wrapper", "Muon by Q/K/V"]["flag"]
    assert not rows["fused_qkv", "Muon as stored"]["flag"] and not rows["wrapper", "Muon as stored"]["flag"]
    assert not rows["fused_qkv", "AdamW"]["flag"]
    report = (out / "report.md").read_text()
    assert "| kernel | optimizer | seed |" in report and "| sdpa | Muon by Q/K/V | 1337 |" in report


def test_bench_reference_times_a_muon_step_against_an_adamw_step_interleaved(tmp_path, capsys):
    from measuring import reference_command

    out = tmp_path / "optim.json"
    reference_command.main(["optimizer", "--split", "qkv", "--batch", "2", "--seq", "16", "--n-layer", "1", "--n-head",
                            "2", "--n-embd", "32", "--vocab", "64", "--steps", "1", "--rounds", "2", "--device", "cpu",
                            "--json", str(out)])  # fmt: skip
    results = json.loads(out.read_text())["results"]
    assert [(r["comparison"], r["part"], r["split"], r["rounds"]) for r in results] == [
        ("optimizer", "step", "qkv", 2), ("optimizer", "optimizer", "qkv", 2)]
    assert all(r["ratio"] > 0 for r in results)
    printed = capsys.readouterr().out
    assert "training step with Muon split qkv (reference: with AdamW; fused_qkv" in printed
    assert "the optimizer's step alone, Muon split qkv (reference: AdamW;" in printed


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on loopback")
@pytest.mark.slow
def test_two_gloo_ranks_under_muon_give_the_single_process_losses(tmp_path, data_cache):
    """Muon steps on the all-reduced gradients: each rank orthogonalises the same matrices, and the ranks' run is the
    one process's (another split of the batch), by Q/K/V and with the momentum it carries."""
    common = [*TINY, "logger=none", "optim=muon_qkv", f"data.cache_dir={data_cache}", "trainer.batch_size=16",
              "trainer.max_steps=6", "trainer.eval_interval=3", "trainer.eval_windows=4"]  # fmt: skip
    result = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ROOT / "train.py"),
                         *common, "trainer.micro_batch_size=8", f"trainer.run_dir={tmp_path / 'ddp'}",
                         f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=tmp_path, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    train(compose_train(*common, "trainer.micro_batch_size=4", f"trainer.run_dir={tmp_path / 'single'}"))
    single, ddp = read_metrics(tmp_path / "single"), read_metrics(tmp_path / "ddp")
    for key in ("train/loss", "val/loss", "lr/muon"):
        a, b = [m[key] for m in single if key in m], [m[key] for m in ddp if key in m]
        assert len(a) == len(b) == {"train/loss": 6, "val/loss": 2, "lr/muon": 6}[key]
        assert a == pytest.approx(b, abs=2e-4), key
    losses = train_losses(tmp_path / "single")
    assert losses[6] < losses[1] - 0.3, "it learned"


@pytest.mark.slow
def test_a_compiled_muon_run_trains_as_the_eager_one(tmp_path, data_cache):
    """trainer.compile compiles the model's blocks; Muon steps the weights they share, eagerly."""
    losses = {}
    for compiled in ("false", "true"):
        run = tmp_path / compiled
        train(tiny(run, data_cache, "optim=muon_qkv", f"trainer.compile={compiled}", "trainer.max_steps=8"))
        losses[compiled] = train_losses(run)
    assert sorted(losses["true"]) == list(range(1, 9))
    assert losses["true"] == pytest.approx(losses["false"], abs=1e-4)


@pytest.mark.slow
def test_the_optimizer_preset_names_each_run_by_its_layout_optimizer_and_seed(tmp_path, data_cache):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "experiment=compare_optimizers", *TINY, "logger=none", "trainer.max_steps=2",
                     "trainer.eval_interval=2", f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}",
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    dirs = sorted((p for p in sweep.iterdir() if (p / "run.json").exists()), key=lambda p: int(p.name.split("_")[0]))
    expected = [f"{layout}-sdpa{optim}-trainer.seed={seed}" for layout in ("wrapper", "separate_qkv", "fused_qkv")
                for optim in ("", "-muon", "-muon_qkv") for seed in (1, 2)]  # fmt: skip
    assert [p.name.split("_", 1)[1] for p in dirs] == expected
    names = [json.loads((p / "run.json").read_text())["name"] for p in dirs]
    assert names[:6] == [f"wrapper-sdpa-nano{optim}-trainer.seed={seed}" for optim in ("", "-muon", "-muon_qkv")
                         for seed in (1, 2)]  # fmt: skip
    out = compare.main([str(sweep), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [row["optimizer"] for row in rows[:6]] == [o for o in ("AdamW", "Muon as stored", "Muon by Q/K/V")
                                                       for _ in (1, 2)]  # fmt: skip


def test_a_sweep_whose_later_job_has_a_bad_split_is_refused_before_its_first_job_trains(tmp_path, data_cache):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *TINY, "logger=none", "optim=muon", "optim.muon_split=as_stored,columns",
                     f"data.cache_dir={data_cache}", f"hydra.sweep.dir={sweep}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: job 1 of 2 (") and " optim=muon optim.muon_split=columns " in last, last
    assert last.endswith("): optim.muon_split='columns'; choose one of: as_stored, qkv, heads; no job of the sweep was "
                         "started"), last
    assert not list(sweep.rglob("metrics.jsonl"))


@pytest.mark.parametrize("schedule", ["cosine", "constant"])  # wsd's line says where its warmup meets the decay
def test_a_run_that_ends_in_its_warmup_says_so_as_it_starts(schedule):
    """The newcomer's pass: trainer.max_steps=10 under the default 30 warm-up steps ended at a third of the peak
    learning rate, never decayed, and nothing said so."""
    cfg = OptimConfig(schedule=schedule)
    line = described(None, cfg, 10)
    assert line is not None and ("the run ends in its warm-up (optim.warmup_steps=30, trainer.max_steps=10): the "
                                 "learning rate ends at 0.000667, 33% of its peak 0.002, and never decays; set "
                                 "optim.warmup_steps below 10") in line, line  # fmt: skip
    assert "warm-up" not in (described(None, cfg, 31) or ""), "a run past its warm-up says nothing of it"
