"""compare.py tells the truth about odd sweeps (issue 35, item 8): mixed token budgets, repeated seeds, runs of one
variant, the position spelled as labels spell it, a label column, speed figures of runs that shared a machine,
hidden curves; and it reads damaged or odd run directories (a run failed before its log, bytes that are not
UTF-8, named pipes) without a traceback and without blocking.

The runs are copies of the session's trained run (its run.json and metrics.jsonl), edited into each case: no
training here."""

from __future__ import annotations

import csv
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import compare
from analysis.plots import throughput_figure, val_loss_figure
from analysis.report import SPEED_CAUTION, build_rows
from analysis.runs import find_runs


def make_run(root: Path, name: str, source: Path, slot: int, edit=None, metrics=None) -> Path:
    """A copy of ``source``'s run.json and metrics.jsonl as ``root/name``, with a segment of its own (slot: no
    two copies ran at the same time unless a test says so); ``edit(info)`` changes its run.json, ``metrics(records)``
    its records."""
    run = root / name
    run.mkdir(parents=True)
    info = json.loads((source / "run.json").read_text())
    info["segments"] = [{"host": "h", "device": "cpu", "pid": 1, "start": 1000.0 * slot, "end": 1000.0 * slot + 10}]
    if edit is not None:
        edit(info)
    (run / "run.json").write_text(json.dumps(info))
    records = [json.loads(line) for line in (source / "metrics.jsonl").read_text().splitlines()]
    for record in records:  # a quiet machine, whatever the suite's workers did while the source trained
        record.pop("perf/others_cores", None)
    if metrics is not None:
        records = metrics(records)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def setting(section: str, **values):
    def edit(info):
        info[section].update(values)

    return edit


def report_of(sweep: Path, *args: str) -> tuple[str, list[dict]]:
    out = compare.main([str(sweep), "--out", str(sweep / "report"), *args])
    with open(out / "report.csv") as f:
        return (out / "report.md").read_text(), list(csv.DictReader(f))


def table_rows(report: str) -> list[list[str]]:
    """The main table's cells, header first."""
    lines = [line for line in report.split("## Where")[0].splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_the_header_gives_each_token_budget_as_it_is(trained_run, tmp_path):
    make_run(tmp_path, "0_wrapper", trained_run, 0, setting("model", attention="wrapper"))
    make_run(tmp_path, "1_fused", trained_run, 1, setting("trainer", max_steps=60))  # twice the budget
    report, rows = report_of(tmp_path, "--force")
    per_step = json.loads((trained_run / "run.json").read_text())["tokens_per_step"]
    short, long = 30 * per_step, 60 * per_step
    header = report.split("\n\n")[1]
    assert f"{short:,} to {long:,} tokens per run: each run's in the table" in header
    assert f", {short:,} tokens per run." not in header, "one number, false for the longer run"
    assert [int(row["token_budget"]) for row in rows] == [short, long]
    cells = table_rows(report)
    column = cells[0].index("token budget")
    assert [row[column] for row in cells[2:]] == [f"{short:,}", f"{long:,}"]


def test_a_sweep_of_one_budget_has_no_budget_column(trained_run, tmp_path):
    make_run(tmp_path, "0_wrapper", trained_run, 0, setting("model", attention="wrapper"))
    make_run(tmp_path, "1_fused", trained_run, 1)
    report, rows = report_of(tmp_path)
    assert "token budget" not in table_rows(report)[0] and "token_budget" not in rows[0]


def test_the_legend_counts_seeds_not_runs(trained_run, tmp_path):
    for i in range(3):
        make_run(tmp_path / "repeats", f"{i}_run", trained_run, i)  # one seed, three times
    for i, seed in enumerate((1, 2, 2)):
        make_run(tmp_path / "seeds", f"{i}_run", trained_run, i, setting("trainer", seed=seed))
    for folder, note in (("repeats", "3 runs of seed 1337"), ("seeds", "3 runs, 2 seeds")):
        legend = val_loss_figure(find_runs([tmp_path / folder]), "step").axes[0].get_legend()
        assert [t.get_text() for t in legend.get_texts()] == [f"fused_qkv-sdpa, {note}"]


def test_runs_of_one_variant_are_not_said_to_compute_different_functions(trained_run, tmp_path):
    make_run(tmp_path / "one", "0_a", trained_run, 0)
    make_run(tmp_path / "one", "1_b", trained_run, 1)
    make_run(tmp_path / "two", "0_a", trained_run, 0)
    make_run(tmp_path / "two", "1_b", trained_run, 1)
    make_run(tmp_path / "two", "2_rope", trained_run, 2, setting("model", position="rope"))
    for folder, truth in (("one", "every run here is one variant (2 runs of fused_qkv-sdpa, one function)"),
                          ("two", "the 2 runs of fused_qkv-sdpa-learned compute one function")):  # fmt: skip
        report, _ = report_of(tmp_path / folder)
        assert truth in report
        assert "none here computes the same function as another" not in report


def test_repeats_of_one_seed_are_not_a_seed_to_seed_spread(trained_run, tmp_path):
    for i, layout in enumerate(("wrapper", "wrapper", "fused_qkv", "fused_qkv")):
        make_run(tmp_path, f"{i}_{layout}", trained_run, i, setting("model", attention=layout))
    report, _ = report_of(tmp_path)
    assert "seed-to-seed spread" not in report
    assert "the batch noise of the final train loss; no variant has several seeds (runs repeating one seed" in report


def last_train_step_only(records):
    trained = [r for r in records if "train/loss" in r]
    return [r for r in records if "train/loss" not in r or r is trained[-1]]


def test_a_final_stretch_of_one_step_is_said_to_measure_no_noise_not_a_noise_of_zero(trained_run, tmp_path):
    """The newcomer's pass: 'by more than 3 x 0.0000' read as a measured noise of nothing."""
    for i, layout in enumerate(("wrapper", "fused_qkv")):
        make_run(tmp_path, f"{i}_{layout}", trained_run, i, setting("model", attention=layout), last_train_step_only)
    report, _ = report_of(tmp_path)
    assert "x 0.0000" not in report
    assert "no noise was measured, since each run's final stretch is one step and no variant has several" in report


def test_the_table_and_the_legend_spell_the_position_as_the_label_does(trained_run, tmp_path):
    make_run(tmp_path, "0_learned", trained_run, 0)
    make_run(tmp_path, "1_nopos", trained_run, 1, setting("model", position="none"))
    report, rows = report_of(tmp_path)
    cells = table_rows(report)
    position = cells[0].index("position")
    assert [row[position] for row in cells[2:]] == ["learned", "nopos"]
    runs = find_runs([tmp_path])
    legend = [t.get_text() for t in val_loss_figure(runs, "step").axes[0].get_legend().get_texts()]
    assert legend == ["fused_qkv-sdpa-learned", "fused_qkv-sdpa-nopos"]
    assert [row["position"] for row in rows] == ["learned", "none"], "the CSV keeps the option's value"


def test_each_row_carries_the_runs_label_as_its_directory_and_legend_do(trained_run, tmp_path):
    make_run(tmp_path, "0_wrapper-sdpa", trained_run, 0, setting("model", attention="wrapper"))
    make_run(tmp_path, "1_fused_qkv-manual", trained_run, 1, setting("model", kernel="manual"))
    report, rows = report_of(tmp_path)
    cells = table_rows(report)
    assert cells[0][0] == "label"
    assert [row[0] for row in cells[2:]] == ["wrapper-sdpa", "fused_qkv-manual"]
    assert [row["label"] for row in rows] == ["wrapper-sdpa", "fused_qkv-manual"]
    legend = [t.get_text() for t in val_loss_figure(find_runs([tmp_path]), "step").axes[0].get_legend().get_texts()]
    assert sorted(legend) == sorted(row["label"] for row in rows)


def test_every_speed_figure_of_a_run_that_shared_its_machine_is_marked(trained_run, tmp_path):
    make_run(tmp_path, "0_wrapper", trained_run, 0, setting("model", attention="wrapper"))
    make_run(tmp_path, "1_fused", trained_run, 0)  # the same slot: at the same time on the same host
    make_run(tmp_path, "2_alone", trained_run, 5, setting("model", attention="separate_qkv"))
    report, _ = report_of(tmp_path, "--target-loss", "100")  # a target every run reached: a time in every row
    cells = table_rows(report)
    speed = [cells[0].index(title) for title in ("tokens/s", "step ms", "time to target s")]
    for row, shared in zip(cells[2:], (True, True, False)):
        assert all(row[i].endswith(SPEED_CAUTION) == shared for i in speed), row
        assert all(SPEED_CAUTION not in cell for i, cell in enumerate(row) if i not in speed), row
    assert f"\n{SPEED_CAUTION} not the variant's own speed (its flag says why: it ran alongside another run" in report
    runs = find_runs([tmp_path])
    labels = [t.get_text() for t in throughput_figure(runs, build_rows(runs, None)[0]).axes[0].texts]
    assert sorted(text.endswith(SPEED_CAUTION) for text in labels) == [False, True, True]


def test_a_run_that_failed_before_its_log_opened_is_a_failed_row_and_the_report_goes_on(trained_run, tmp_path):
    failed = tmp_path / "0_failed"
    failed.mkdir()
    info = json.loads((trained_run / "run.json").read_text())
    # What the trainer writes when a run fails before its log opens: the resolved config alone.
    (failed / "run.json").write_text(json.dumps({k: info[k] for k in ("model", "trainer", "data", "optim", "name")}))
    (failed / "failure.json").write_text(json.dumps({"reason": "out of memory at trainer.micro_batch_size=8"}))
    make_run(tmp_path, "1_ok", trained_run, 1)
    report, rows = report_of(tmp_path)
    assert [row["state"] for row in rows] == ["FAILED", "finished"]
    assert rows[0]["flag"] == "FAILED: out of memory at trainer.micro_batch_size=8"
    assert f"{30 * info['tokens_per_step']:,} tokens per run." in report


def test_bytes_that_are_not_utf8_skip_their_line_with_a_warning_naming_it(trained_run, tmp_path, capsys):
    run = make_run(tmp_path, "0_run", trained_run, 0)
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    lines.insert(2, b'{"step": 2, "train/loss": 9.0, "note": "\xff\xfe"}\n')
    (run / "metrics.jsonl").write_bytes(b"".join(lines))
    _, rows = report_of(tmp_path)
    assert f"{run / 'metrics.jsonl'}:3 is not UTF-8 text" in capsys.readouterr().err
    assert rows[0]["state"] == "finished" and float(rows[0]["best_val_loss"]) > 0


class PipeWatch:
    """Whether anything opens a named pipe for reading while the watch lasts: it tries the pipe's writing end
    without waiting (which only succeeds while a reader holds it), and then closes it, so that a reader that
    opened it sees the end of the pipe instead of waiting forever."""

    def __init__(self, *pipes: Path):
        self.pipes, self.opened, self.done = pipes, [], threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)

    def watch(self):
        while not self.done.is_set():
            for pipe in self.pipes:
                try:
                    fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
                except OSError:  # no reader
                    continue
                self.opened.append(pipe)
                os.close(fd)
            time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def test_named_pipes_are_never_opened_but_named_and_skipped(trained_run, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    make_run(sweep, "0_ok", trained_run, 0)
    piped_metrics = make_run(sweep, "1_metrics", trained_run, 1, setting("model", attention="wrapper"))
    (piped_metrics / "metrics.jsonl").unlink()
    os.mkfifo(piped_metrics / "metrics.jsonl")
    piped_info = sweep / "2_info"
    piped_info.mkdir()
    os.mkfifo(piped_info / "run.json")
    (piped_info / "metrics.jsonl").write_text("")
    running = make_run(sweep, "3_running", trained_run, 3, setting("model", attention="separate_qkv"))
    info = json.loads((running / "run.json").read_text())
    (running / "run.json").write_text(json.dumps({**info, "status": "running"}))
    os.mkfifo(running / ".headlab-run")  # the owner file, which says whether a process writes the run
    os.mkfifo(tmp_path / "pipe")
    pipes = [piped_metrics / "metrics.jsonl", piped_info / "run.json", running / ".headlab-run", tmp_path / "pipe"]
    with PipeWatch(*pipes) as watch:
        _, rows = report_of(sweep)
        with pytest.raises(ValueError, match="no runs found"):
            compare.main([str(tmp_path / "pipe"), "--out", str(tmp_path / "report")])
    assert watch.opened == [], "a pipe was opened for reading: a report would wait for a writer forever"
    err = capsys.readouterr().err
    for pipe in pipes[:3]:
        assert f"{pipe} is not a regular file" in err
    assert f"{tmp_path / 'pipe'} is not a directory: skipped" in err
    assert [row["label"] for row in rows] == ["fused_qkv-sdpa", "wrapper-sdpa", "separate_qkv-sdpa"]
    assert rows[2]["state"].startswith("killed"), "no process holds it"


def hidden_curves(ax) -> list[str]:
    """The curves every point of which is a point of another curve: drawn with it, one hides the other."""
    lines = {line.get_label(): np.asarray(line.get_xydata()) for line in ax.get_lines()}
    hidden = []
    for name, points in lines.items():
        for other, other_points in lines.items():
            if other != name and len(points) <= len(other_points) and all(
                    np.isclose(other_points, p, atol=1e-4).all(axis=1).any() for p in points):  # fmt: skip
                hidden.append(name)
                break
    return hidden


@pytest.mark.parametrize("against", ["step", "time"])
def test_every_curve_that_lies_on_another_is_named_beside_the_legend(trained_run, tmp_path, against):
    def up_to_step_20(records):  # a run stopped at step 20: its curve lies on the finished runs' curve
        return [r for r in records if r["step"] <= 20]

    def worse(records):
        return [{**r, "val/loss": r["val/loss"] + 0.1} if "val/loss" in r else r for r in records]

    def timed(records):  # steps that slow down: a run stopped early has a median step time of its own (the
        # trained run's own times may give 20 steps and 30 the same median, and the curves then coincide)
        return [{**r, "perf/step_ms": 10.0 + r["step"]} if "perf/step_ms" in r else r for r in records]

    make_run(tmp_path, "0_wrapper", trained_run, 0, setting("model", attention="wrapper"), timed)
    make_run(tmp_path, "1_fused", trained_run, 1, None, timed)
    make_run(tmp_path, "2_separate", trained_run, 2, setting("model", attention="separate_qkv"),
             lambda records: up_to_step_20(timed(records)))  # fmt: skip
    make_run(tmp_path, "3_rope", trained_run, 3, setting("model", position="rope"),
             lambda records: worse(timed(records)))  # fmt: skip
    ax = val_loss_figure(find_runs([tmp_path]), against).axes[0]
    hidden = hidden_curves(ax)
    assert "wrapper-sdpa-learned" in hidden and "fused_qkv-sdpa-rope" not in hidden
    # Against steps, the stopped run lies on them too (against time its warm-up steps count its own median).
    assert ("separate_qkv-sdpa-learned" in hidden) == (against == "step")
    (note,) = [t.get_text() for t in ax.texts]
    for name in hidden:
        assert name in note, f"{name} lies on another curve and the note does not say so: {note!r}"


def test_the_step_axis_of_a_short_run_has_whole_steps_only(trained_run, tmp_path):
    def evaluated_at_2_and_4(records):
        evals = [r for r in records if "val/loss" in r][:2]
        return [r for r in records if "val/loss" not in r] + [{**r, "step": 2 * (i + 1)} for i, r in enumerate(evals)]

    make_run(tmp_path, "0_short", trained_run, 0, None, evaluated_at_2_and_4)
    ticks = val_loss_figure(find_runs([tmp_path]), "step").axes[0].get_xticks()
    assert len(ticks) >= 2 and all(t == int(t) for t in ticks), ticks


def test_records_and_segments_missing_what_a_report_reads_are_reported_without_them(trained_run, tmp_path):
    """A metrics row without its speed, an evaluation without its bpb, a run.json segment without its device (edited by
    hand, or cut): the report goes on without them, no KeyError."""
    def cut(records):
        for record in records:
            if record.get("step") in (10, 11) and "train/loss" in record:
                del record["perf/tokens_per_sec"]
            record.pop("val/bpb", None)
        return records

    make_run(tmp_path, "0_cut", trained_run, 0, lambda info: info["segments"][0].pop("device"), cut)
    make_run(tmp_path, "1_whole", trained_run, 1, setting("model", attention="wrapper"))
    report, rows = report_of(tmp_path)
    cut_row = next(row for row in rows if row["layout"] == "fused_qkv")
    assert float(cut_row["tokens_per_sec"]) > 0 and cut_row["best_val_bpb"] == "nan"
    assert float(cut_row["best_val_loss"]) == float(next(r for r in rows if r["layout"] == "wrapper")["best_val_loss"])
