"""A speed figure says the conditions it was taken in, and the report flags those that make it not the variant's own
(issue 50 item 3, issue 51 items 10-11): a busy machine (the cores other processes used, measured for real), another
split of the batch, fewer tokens seen, a compile read from the compile cache.

The report's runs are copies of the session's trained run, edited into each case (tests/test_compare_truth.py)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest
import torch
from test_compare_truth import make_run, report_of, setting, table_rows

from analysis.plots import throughput_figure, val_loss_figure
from analysis.report import SPEED_CAUTION, build_rows, speed_cautions
from analysis.runs import find_runs
from common.machine_load import OthersLoad, busy_cores, is_busy
from model.device import device_name
from training.speed_conditions import LoadWatch, busy_advice

SPEED = ("tokens/s", "step ms", "time to target s")


def others_at(cores: float):
    """A run whose every step recorded ``cores`` used by other processes."""

    def edit(records):
        for record in records:
            if "train/loss" in record:
                record["perf/others_cores"] = cores
        return records

    return edit


def marked(report: str) -> list[bool]:
    """Per row of the table: whether its speed figures carry the mark (all of them, or none: asserted)."""
    cells = table_rows(report)
    speed = [cells[0].index(title) for title in SPEED]
    marks = [[row[i].endswith(SPEED_CAUTION) for i in speed] for row in cells[2:]]
    assert all(len(set(m)) == 1 for m in marks), marks
    return [m[0] for m in marks]


def test_a_run_on_a_busy_machine_is_flagged_with_what_the_others_used(trained_run, tmp_path):
    def cores(info):
        info.update(cores=2)

    make_run(tmp_path, "0_quiet", trained_run, 0, cores, others_at(0.1))
    make_run(tmp_path, "1_busy", trained_run, 1, lambda i: (cores(i), i["model"].update(attention="wrapper")),
             others_at(1.8))  # fmt: skip
    report, rows = report_of(tmp_path, "--target-loss", "100")
    assert marked(report) == [False, True]
    flags = {row["layout"]: row["flag"] for row in rows}
    assert flags["wrapper"] == "a busy machine (other processes used 1.8 of 2 cores): its speed is not comparable"
    assert flags["fused_qkv"] == ""
    runs = find_runs([tmp_path])
    labels = [t.get_text() for t in throughput_figure(runs, build_rows(runs, None)[0]).axes[0].texts]
    assert sorted(text.endswith(SPEED_CAUTION) for text in labels) == [False, True]
    # Against time its curve is pale, as its bar is, and its legend entry says why: it ranks nothing there.
    cautioned = speed_cautions(runs, build_rows(runs, None)[0])
    assert cautioned == {"wrapper-sdpa": "busy machine"}
    for against, pale in (("time", {"wrapper-sdpa": True, "fused_qkv-sdpa": False}), ("step", {})):
        ax = val_loss_figure(runs, against, cautioned).axes[0]
        alphas = {line.get_label().split(" ")[0]: line.get_alpha() for line in ax.get_lines()}
        assert {name: alpha is not None and alpha < 1 for name, alpha in alphas.items()} == {
            "wrapper-sdpa": False, "fused_qkv-sdpa": False, **pale}, alphas  # fmt: skip
        legend = sorted(t.get_text() for t in ax.get_legend().get_texts())
        assert legend == ["fused_qkv-sdpa", f"wrapper-sdpa {SPEED_CAUTION} busy machine" if pale else "wrapper-sdpa"]


def test_variants_that_split_their_batch_differently_are_flagged_with_each_split(trained_run, tmp_path):
    make_run(tmp_path, "0_whole", trained_run, 0)
    make_run(tmp_path, "1_halves", trained_run, 1, lambda i: (i["trainer"].update(micro_batch_size=4),
                                                              i["model"].update(attention="wrapper")))  # fmt: skip
    report, rows = report_of(tmp_path)
    assert marked(report) == [True, True]
    flags = {row["layout"]: row["flag"] for row in rows}
    every = "where the runs split their batch as 4 x 2 accumulation step(s), 8 x 1 accumulation step(s)"
    assert flags["fused_qkv"] == f"micro-batch 8 x 1 accumulation step(s) {every}: its speed is not comparable"
    assert flags["wrapper"] == f"micro-batch 4 x 2 accumulation step(s) {every}: its speed is not comparable"


def test_one_split_and_one_machine_for_all_flags_nothing(trained_run, tmp_path):
    make_run(tmp_path, "0_a", trained_run, 0)
    make_run(tmp_path, "1_b", trained_run, 1, setting("model", attention="wrapper"))
    report, rows = report_of(tmp_path)
    assert marked(report) == [False, False] and [row["flag"] for row in rows] == ["", ""]
    assert SPEED_CAUTION not in report


def test_a_run_that_saw_fewer_tokens_is_flagged(trained_run, tmp_path):
    make_run(tmp_path, "0_all", trained_run, 0)
    make_run(tmp_path, "1_part", trained_run, 1, setting("model", attention="wrapper"),
             lambda records: [r for r in records if r["step"] <= 20])  # fmt: skip
    _, rows = report_of(tmp_path)
    per_step = json.loads((trained_run / "run.json").read_text())["tokens_per_step"]
    flags = {row["layout"]: row["flag"] for row in rows}
    assert flags["wrapper"] == (f"{20 * per_step:,} tokens seen where another run saw {30 * per_step:,}: its speed is "
                                f"not comparable")  # fmt: skip
    assert flags["fused_qkv"] == ""


def test_a_compile_read_from_the_cache_says_so_in_its_cell(trained_run, tmp_path):
    def compiled(hits):
        return lambda records: [{"step": 0, "perf/compile_s": 4.0 if hits else 13.7, "perf/compile_cache_hits": hits,
                                 "perf/compile_cache_misses": 4 - hits}, *records]  # fmt: skip

    make_run(tmp_path, "0_cold", trained_run, 0, None, compiled(0))
    make_run(tmp_path, "1_warm", trained_run, 1, setting("model", attention="separate_qkv"), compiled(2))
    report, rows = report_of(tmp_path)
    cells = table_rows(report)
    column = cells[0].index("compile s")
    assert [row[column] for row in cells[2:]] == ["13.7 (0/4 cached)", "4.0 (2/4 cached)"]
    flags = {row["layout"]: row["flag"] for row in rows}
    assert flags["separate_qkv"] == ("compile s read 2 of 4 graphs from the compile cache (an earlier run or job "
                                     "compiled them): not a cold compile")  # fmt: skip
    assert flags["fused_qkv"] == "" and "only times with 0 cached are cold compiles" in report


def test_the_busy_threshold_is_a_share_of_the_cores_and_at_least_half_a_core():
    assert busy_cores(2) == 0.5 and busy_cores(16) == 4.0
    assert is_busy(0.5, 2) and not is_busy(0.4, 2) and not is_busy(3.9, 16) and not is_busy(None, 2)


def spinning(n: int):
    """``n`` processes that each keep a core busy."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


@pytest.mark.skipif(sys.platform != "linux", reason="the machine's load is read from /proc")
def test_the_cores_others_use_are_measured_and_a_busy_run_gets_a_hint(caplog):
    watch = LoadWatch()
    watch.HINT_AFTER_S = 0.6
    quiet_own = OthersLoad()
    spinners = spinning(1)
    try:
        time.sleep(0.2)  # the spinner has started
        measured, watch.window_start = OthersLoad(), time.monotonic()
        watch.window.since_last()
        time.sleep(0.8)
        others = measured.since_last()
        with caplog.at_level(logging.WARNING, logger="headlab.train"):
            row = watch.step()
    finally:
        for p in spinners:
            p.kill()
    assert others >= 0.8, "one spinning process: a core's worth, whatever else the machine does"
    assert row["perf/others_cores"] >= 0.0 and quiet_own.since_start() is not None
    hints = [r.getMessage() for r in caplog.records if "the machine is busy" in r.getMessage()]
    assert len(hints) == 1 and "over the last 1 s" in hints[0] and hints[0].endswith(busy_advice()), hints
    assert "(the machine was busy: other processes used" in watch.caution()



def test_one_thread_is_counted_in_the_singular_and_gets_no_advice_to_use_fewer():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert device_name(torch.device("cpu")).endswith(", 1 thread")
    finally:
        torch.set_num_threads(before)
    assert busy_advice(1) == "Run one job at a time"
    assert busy_advice(2) == ("Run one job at a time, or give concurrent jobs fewer threads (OMP_NUM_THREADS=1): "
                              "torch's 2 threads slow down most when other work shares the cores")


@pytest.mark.slow
def test_a_compile_that_reads_the_cache_an_earlier_job_warmed_is_flagged_as_such(tmp_path, data_cache):
    """Two compiled jobs in one process, the second of another layout: it compiles its blocks anew and reads the
    graphs the first compiled (the final norm, head and loss), and the report says so."""
    from helpers import TINY, as_if_quiet, compose_train
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    from analysis.runs import load_run
    from training.loop import train

    with temporary_cache_dir(str(tmp_path / "inductor")):  # an empty compile cache: the first job compiles cold
        for i, layout in enumerate(("fused_qkv", "separate_qkv")):
            train(compose_train(*TINY, "logger=none", "trainer.max_steps=3", "trainer.compile=true",
                                f"attention={layout}", f"trainer.run_dir={tmp_path / 'sweep' / f'{i}_{layout}'}",
                                f"data.cache_dir={data_cache}"))  # fmt: skip
            as_if_quiet(tmp_path / "sweep" / f"{i}_{layout}")
    first, second = (load_run(tmp_path / "sweep" / name).compile_cache_hits for name in ("0_fused_qkv",
                                                                                         "1_separate_qkv"))  # fmt: skip
    assert first[0] == 0 and first[1] > 0, first
    assert 0 < second[0] < second[1], second
    report, _ = report_of(tmp_path / "sweep")
    assert f"({second[0]}/{second[1]} cached)" in report and f"(0/{first[1]} cached)" in report
