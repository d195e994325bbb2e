"""compare.py: a tiny real sweep becomes a table with one row per run, and valid PNGs."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
from helpers import TINY, as_if_quiet, compose_train, read_metrics

import compare
from training.loop import train

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, data_cache):
    root = tmp_path_factory.mktemp("sweep")
    for i, layout in enumerate(["wrapper", "fused_qkv"]):
        train(compose_train(*TINY, "logger=none", f"attention={layout}", "trainer.max_steps=20",
                            "trainer.eval_interval=5", f"trainer.run_dir={root / f'{i}_{layout}'}",
                            f"data.cache_dir={data_cache}"))  # fmt: skip
        as_if_quiet(root / f"{i}_{layout}")
    return root


@pytest.mark.slow
def test_report_has_one_row_per_run_with_values_from_its_metrics(sweep, capsys):
    out = compare.main([str(sweep)])
    with open(out / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["layout"] for r in rows] == ["wrapper", "fused_qkv"]
    for row in rows:
        metrics = read_metrics(row["run"])
        vals = [m["val/loss"] for m in metrics if "val/loss" in m]
        steps = [m for m in metrics if "train/loss" in m]
        assert float(row["best_val_loss"]) == pytest.approx(min(vals))
        assert float(row["final_train_loss"]) == pytest.approx(statistics.fmean(s["train/loss"] for s in steps[-2:]))
        steady = steps[2:]  # the first 10% of 20 steps are warm-up
        assert float(row["tokens_per_sec"]) == pytest.approx(
            statistics.median(s["perf/tokens_per_sec"] for s in steady)
        )
        assert int(row["params"]) == json.loads((sweep / row["run"].split("/")[-1] / "run.json").read_text())["params"]
        assert float(row["time_to_target_s"]) > 0, "the default target is a loss every run reached"
    for name in ("val_loss_vs_step.png", "val_loss_vs_time.png", "throughput.png"):
        assert (out / name).read_bytes()[:8] == PNG
    report = (out / "report.md").read_text()
    assert "| wrapper | sdpa |" in report and "| fused_qkv | sdpa |" in report
    assert "A run is flagged (last column) for final_train_loss differing" in report
    assert "wrapper" in capsys.readouterr().out


def test_a_variant_far_outside_the_noise_is_flagged(sweep, tmp_path):
    import shutil

    for name in ("0_wrapper", "1_fused_qkv"):
        shutil.copytree(sweep / name, tmp_path / name)
    metrics = tmp_path / "0_wrapper" / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    for m in lines:
        if "train/loss" in m:
            m["train/loss"] += 1.0  # a variant that trains much worse
    metrics.write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = compare.main([str(tmp_path), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        flags = {r["layout"]: r["flag"] for r in csv.DictReader(f)}
    assert flags["wrapper"].startswith("final_train_loss +")
    assert flags["fused_qkv"].startswith("final_train_loss -")


def test_a_directory_with_no_runs_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no runs found in .*run.json and metrics.jsonl"):
        compare.main([str(tmp_path)])


@pytest.mark.slow
def test_runs_of_different_token_budgets_are_refused_unless_forced(sweep, tmp_path, data_cache):
    longer = tmp_path / "longer"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=25", f"trainer.run_dir={longer}",
                        f"data.cache_dir={data_cache}"))  # fmt: skip
    args = [str(sweep / "0_wrapper"), str(longer), "--out", str(tmp_path / "report")]
    with pytest.raises(ValueError, match="not comparable: token budgets differ.*--force"):
        compare.main(args)
    out = compare.main([*args, "--force"])
    assert (out / "report.csv").exists()
    report = (out / "report.md").read_text()  # one function (two layouts of it) on two budgets: not compared, said so
    assert "those here that compute one function (" in report and "trained on other token budgets or data" in report
    assert "none here computes the same function as another" not in report


def test_the_kv_heads_and_window_columns_appear_when_a_run_departs_from_plain_attention():
    from analysis.report import shown_columns

    def columns(*rows):
        return [key for key, _ in shown_columns(list(rows))]

    plain = {"n_head": 4, "kv_heads": 4, "window": None}  # every row carries its count: 4 of 4 shows "4"
    assert "kv_heads" not in columns(plain, plain) and "window" not in columns(plain, plain)
    assert "kv_heads" in columns(plain, {**plain, "kv_heads": 1})
    assert "window" in columns(plain, {**plain, "window": 32})


@pytest.mark.parametrize("difference,flagged", [(3e-5, False), (0.01, True)])
def test_where_no_noise_is_measured_round_off_is_not_flagged(sweep, tmp_path, difference, flagged):
    import shutil

    for name in ("0_wrapper", "1_fused_qkv"):
        shutil.copytree(sweep / name, tmp_path / name)
    for name, loss in (("0_wrapper", 3.0), ("1_fused_qkv", 3.0 + difference)):
        metrics = tmp_path / name / "metrics.jsonl"
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        for m in lines:
            if "train/loss" in m:
                m["train/loss"] = loss  # flat final steps: their batch noise measures 0
        metrics.write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = compare.main([str(tmp_path), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        flags = {r["layout"]: r["flag"] for r in csv.DictReader(f)}
    assert bool(flags["fused_qkv"]) == flagged and bool(flags["wrapper"]) == flagged, flags


def test_variants_of_different_functions_are_not_flagged_for_their_loss(sweep, tmp_path):
    """A sweep over what the model computes (a position encoding) differs in loss by design: no flag. The same
    loss gap between two layouts of one function is flagged (the test above)."""
    import shutil

    for name in ("0_wrapper", "1_fused_qkv"):
        shutil.copytree(sweep / name, tmp_path / name)
    info = json.loads((tmp_path / "0_wrapper" / "run.json").read_text())
    info["model"]["position"] = "rope"  # as if this run had rotary positions: another function
    (tmp_path / "0_wrapper" / "run.json").write_text(json.dumps(info))
    metrics = tmp_path / "0_wrapper" / "metrics.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    for m in lines:
        if "train/loss" in m:
            m["train/loss"] += 1.0
    metrics.write_text("".join(json.dumps(m) + "\n" for m in lines))
    out = compare.main([str(tmp_path), "--out", str(tmp_path / "report")])
    with open(out / "report.csv") as f:
        flags = {r["layout"]: r["flag"] for r in csv.DictReader(f)}
    assert flags == {"wrapper": "", "fused_qkv": ""}
    assert "none here computes the same function as another" in (out / "report.md").read_text()


@pytest.mark.parametrize("model,name,cell", [
    ({"window": 8}, "window", 8),  # a uniform model: its value
    ({"window": None, "layer_pattern": "LLLG", "layer_kinds": {"L": {"window": 32}, "G": {}}}, "window", "L 32"),
    ({"sparse_topk": None, "layer_pattern": "KKKM", "layer_kinds": {"K": {}, "M": {"sparse_topk": 16}}},
     "sparse_topk", "M 16"),
    ({"sparse_topk": 16, "layer_pattern": "DG", "layer_kinds": {"D": {"sparse_topk": None}, "G": {}}},
     "sparse_topk", "G 16"),  # the model's value, turned off for one kind
    ({"sparse_topk": None, "layer_pattern": "AB", "layer_kinds": {"A": {"sparse_topk": 8}, "B": {"sparse_topk": 8}}},
     "sparse_topk", 8),  # every kind alike: the value
    ({"attention_chunk": None, "layer_pattern": "AB", "layer_kinds": {"A": {}, "B": {}}}, "attention_chunk", None),
])  # fmt: skip
def test_a_per_layer_option_set_by_a_schedules_kinds_shows_in_its_column(model, name, cell):
    from analysis.report import by_kind

    assert by_kind(model, name) == cell
