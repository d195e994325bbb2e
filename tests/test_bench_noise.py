"""bench.py says when a figure is noisy (an outlier the interquartile range hides, passes far apart, decode
ratios from one generation), and its default plot (one sequence length) is a labelled bar per cell, not a dot per
variant (issue 35, items 8 and 9)."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from measuring import bench_command, cells, decode_speed, noise, step_figures, step_table, timing

TINY = ["--seq-len", "8", "--batch", "1", "--n-embd", "16", "--n-head", "2", "--n-layer", "1", "--vocab-size", "64",
        "--device", "cpu"]  # fmt: skip


def quiet_pass(ms: float = 10.0) -> dict:
    return {"forward_ms": ms, "step_ms": 2 * ms, "forward_spread": 0.01, "step_spread": 0.01, "forward_range": 1.05,
            "step_range": 1.05}  # fmt: skip


def test_a_timing_2_5x_the_others_in_a_pass_is_measured_and_flagged():
    calls = itertools.count()

    def slow_once():  # 20 ms a call; one call, well inside the timed blocks, takes 50 ms
        time.sleep(0.05 if next(calls) == 10 else 0.02)

    median, _, iqr, spread = timing.median_ms(slow_once, 0.3, torch.device("cpu"))
    assert spread > noise.NOISY_RANGE, f"slowest / fastest timing {spread:.2f} (interquartile range {iqr:.0%})"
    measured = {**quiet_pass(median), "forward_spread": iqr, "forward_range": spread}
    assert "forward: " in noise.noise_warnings([measured], "train step")


def test_an_outlier_the_interquartile_range_hides_flags_the_cell():
    outlier = {**quiet_pass(), "step_range": 2.5}  # the interquartile range is 1%: a median-relative measure
    assert noise.noise_warnings([outlier], "train step") == (
        "train step: slowest timing 2.5x the fastest in 1 of 1 pass(es), a noisy measurement"
    )


def test_passes_whose_medians_lie_2_5x_apart_flag_the_cell():
    passes = [quiet_pass(10.0), quiet_pass(10.0), quiet_pass(25.0)]  # each pass quiet, one of them slowed down
    assert noise.noise_warnings(passes, "train step") == (
        "forward: pass medians 10-25 ms (2.5x), a noisy measurement; "
        "train step: pass medians 20-50 ms (2.5x), a noisy measurement"
    )
    assert noise.noise_warnings([quiet_pass(10.0), quiet_pass(11.0)], "train step") == ""


def test_decode_mode_measures_several_generations_by_default():
    assert bench_command.parse_args(["--mode", "decode"]).repeats == decode_speed.DECODE_REPEATS >= 3
    assert bench_command.parse_args([]).repeats == 1
    assert bench_command.parse_args(["--mode", "decode", "--repeats", "5"]).repeats == 5


def test_decode_ratios_are_medians_of_each_generations_own_ratio_with_their_range(tmp_path):
    rows = bench_command.main([*TINY, "--mode", "decode", "--layouts", "fused_qkv", "--kernels", "sdpa",
                               "--context-multiples", "1", "2", "--out", str(tmp_path)])  # fmt: skip
    first, second = rows
    assert first["passes"] == second["passes"] == decode_speed.DECODE_REPEATS
    assert first["speed_ratio"] == first["speed_ratio_min"] == first["speed_ratio_max"] == 1.0
    assert second["speed_ratio_min"] <= second["speed_ratio"] <= second["speed_ratio_max"]
    text = (tmp_path / "bench.md").read_text()
    assert (f"tokens/s at 2x block_size is {second['speed_ratio']:.2f} x that at 1x (median of "
            f"{decode_speed.DECODE_REPEATS} generations' own ratios, range {second['speed_ratio_min']:.2f}-"
            f"{second['speed_ratio_max']:.2f})") in text  # fmt: skip
    header = (tmp_path / "bench.csv").read_text().splitlines()[0].split(",")
    assert header == decode_speed.DECODE_FIELDS and "warnings" in header


@pytest.mark.parametrize(
    "speeds,ratios,noisy",
    [([100.0, 102.0, 99.0], [1.0, 1.02, 0.98], False), ([100.0, 250.0, 104.0], [1.0, 1.0, 1.0], True),
     ([100.0, 101.0, 99.0], [0.9, 2.4, 1.0], True)],
)  # fmt: skip
def test_a_decode_cell_whose_generations_disagree_is_flagged(speeds, ratios, noisy):
    warning = decode_speed.decode_noise(speeds, ratios, 4, 1)
    assert bool(warning) == noisy and (not noisy or warning.endswith("a noisy measurement")), warning


def test_a_single_generation_says_it_measured_no_spread():
    assert "one generation: no spread measured" in decode_speed.decode_noise([100.0], [1.0], 4, 1)


def grid_rows(seq_lens, noisy=()) -> list[dict]:
    """Benchmark rows as step_times.measure makes them, for the figures: the default grid's cells."""
    return [dict(mode="block", layout=layout, kernel=kernel, kv_heads=8, window=None, compile="eager", seq_len=n,
                 n_head=8, forward_ms=1.0 + i, step_ms=3.0 + i, step_ms_min=2.5 + i, step_ms_max=3.5 + i,
                 noisy=set(noisy) if i == 0 else set())
            for i, (layout, kernel, n) in enumerate(itertools.product(cells.default_layouts(), ["manual", "sdpa"],
                                                                      seq_lens))]  # fmt: skip


def test_one_sequence_length_draws_a_labelled_bar_per_cell_with_its_time_written():
    rows = grid_rows([256], noisy={"step"})
    fig = step_figures.figure(rows, "default grid", "forward+backward")
    fig.canvas.draw()
    ax = fig.axes[0]
    names = [t.get_text() for t in ax.get_yticklabels()]
    assert names == [f"{cells.cell_label(r, [])}, eager" for r in rows], "every bar named on its tick"
    assert len(ax.patches) == len(rows)
    assert sorted(p.get_width() for p in ax.patches) == sorted(r["step_ms"] for r in rows)
    written = [t.get_text() for t in ax.texts]
    assert written[0] == "3 ms, noisy" and written[1:] == [f"{r['step_ms']:.3g} ms" for r in rows[1:]]
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert len(ticks) >= 3, f"the time axis is labelled: {ticks}"
    assert "at sequence length 256" in ax.get_xlabel() and "whiskers: range over passes" in ax.get_xlabel()


def test_only_the_measurement_drawn_is_called_noisy_on_its_bar():
    fig = step_figures.figure(grid_rows([256], noisy={"forward"}), "default grid", "forward+backward")
    assert not any("noisy" in t.get_text() for t in fig.axes[0].texts), "the bars draw forward+backward"


def test_several_sequence_lengths_keep_the_line_plot():
    ax = step_figures.figure(grid_rows([128, 256]), "grid", "forward+backward").axes[0]
    assert len(ax.get_lines()) == 6 and ax.get_legend() is not None


def test_a_cell_slowed_as_a_whole_on_a_busy_machine_is_said_with_what_the_others_used():
    """A whole cell 7x slower has no spread to show it: the load beside its timings says it (issue 51, item 10)."""
    from common.machine_load import busy_cores, cores

    quiet, busy = busy_cores() / 2, busy_cores() + 0.3
    passes = [{**quiet_pass(70.0), "others_cores": busy}, {**quiet_pass(72.0), "others_cores": quiet}]
    assert noise.noise_warnings(passes, "train step") == "", "uniformly slow: no noise to see"
    assert noise.busy_note(passes) == (f"a busy machine in 1 of 2 pass(es) (other processes used {busy:.1f} of "
                                       f"{cores()} cores): not this cell's own speed")  # fmt: skip
    assert noise.busy_note([{**quiet_pass(), "others_cores": quiet}, quiet_pass()]) == ""
    row = {"mode": "block", "layout": "fused_qkv", "kernel": "sdpa", "kv_heads": 2, "window": None,
           "compile": "eager", "seq_len": 8, "n_head": 2, "forward_ms": 70.0, "step_ms": 140.0, "step_ms_min": 139.0,
           "step_ms_max": 144.0, "tokens_per_sec": 57.0, "peak_mem_mb": None, "sdpa_backend": "math",
           "compile_s": None, "others_cores": busy, "warnings": noise.busy_note(passes)}  # fmt: skip
    quiet_row = {**row, "layout": "wrapper", "others_cores": quiet, "warnings": ""}
    table = step_table.markdown([row, quiet_row], "t", "step", 2)
    assert f"| 57 {noise.BUSY_MARK} |" in table and "| 57 |" in table
    assert f"{noise.BUSY_MARK} timed on a busy machine" in table and "not this cell's own speed" in table


def test_a_cell_whose_forward_outlasts_its_step_is_invalid_in_the_table_and_absent_from_the_figure():
    """The newcomer's pass: wrapper+sdpa at a tiny shape measured forward 2.9 ms and forward+backward 1.0 ms, and
    bench.png drew it as the fastest cell by 10x, with the only warning far below the table."""
    from common.machine_load import busy_cores

    rows = [{**r, "tokens_per_sec": 1000.0 / r["step_ms"], "peak_mem_mb": None, "sdpa_backend": "math",
             "compile_s": None, "warnings": ""} for r in grid_rows([32])]  # fmt: skip
    rows[1].update(forward_ms=2.9, step_ms=1.0, step_ms_min=0.9, step_ms_max=1.1)
    rows[2]["others_cores"] = busy_cores() + 0.3
    table = step_table.markdown(rows, "t", "forward+backward", 2)
    invalid = next(line for line in table.splitlines() if "1.000 (invalid)" in line)
    assert "| invalid |" in invalid and "1,000" not in invalid
    fig = step_figures.figure(rows, "grid", "forward+backward")
    fig.canvas.draw()
    ax = fig.axes[0]
    assert len(ax.patches) == len(rows) - 1 and 1.0 not in [p.get_width() for p in ax.patches], "no bar for it"
    assert any("(invalid: its forward measured slower than its step)" in t.get_text().replace("\n", " ")
               for t in fig.texts)  # fmt: skip
    pale = [p.get_alpha() for p in ax.patches]
    assert pale.count(0.35) == 1 and f"{noise.BUSY_MARK}" in ax.get_yticklabels()[1].get_text()
