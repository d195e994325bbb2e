"""bench.py over the new axes (--position, --qk-norm, --softcap, --sinks, --layouts mla --kv-latent) and its decode
mode (generation tokens/s at multiples of block_size); a default grid's CSV keeps its columns."""

from __future__ import annotations

import csv
import re

import pytest

from measuring import bench_command, cells, decode_speed, step_figures, step_table, step_times

TINY = ["--seq-len", "8", "--batch", "1", "--n-embd", "16", "--n-head", "2", "--n-layer", "1", "--vocab-size", "64",
        "--min-run-time", "0.01", "--device", "cpu"]  # fmt: skip


def read_csv(folder) -> tuple[list[str], list[dict]]:
    with open(folder / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    with open(folder / "bench.csv") as f:
        return next(csv.reader(f)), rows


def test_a_default_grid_writes_the_columns_it_always_had(tmp_path):
    bench_command.main([*TINY, "--layouts", "fused_qkv", "--kernels", "sdpa", "--out", str(tmp_path)])
    header, _ = read_csv(tmp_path)
    assert header == step_times.FIELDS
    table = (tmp_path / "bench.md").read_text()
    assert "position" not in table and "sinks" not in table and "latent" not in table


def test_a_figure_whose_every_cell_is_invalid_is_drawn_naming_them(tmp_path):
    """A tiny shape on a busy machine can measure every forward slower than its step: the figure draws no bar and
    says why, where it raised on an empty maximum after the table was written."""
    rows = bench_command.main([*TINY, "--layouts", "fused_qkv", "--kernels", "sdpa", "--out", str(tmp_path)])
    rows = [{**r, "forward_ms": 2 * r["step_ms"]} for r in rows]
    fig = step_figures.figure(rows, "tiny", "forward+backward")
    texts = " ".join(" ".join(t.get_text().split()) for t in fig.texts)  # the note's lines joined
    assert "invalid: its forward measured slower than its step" in texts, texts


def test_the_new_axes_are_a_grid_with_one_labelled_row_per_cell(tmp_path):
    rows = bench_command.main([*TINY, "--layouts", "fused_qkv", "mla", "--kernels", "manual", "--position", "learned",
                               "rope", "--qk-norm", "off", "on", "--sinks", "on", "--softcap", "30", "--kv-latent", "8",
                               "--out", str(tmp_path)])  # fmt: skip
    assert len(rows) == 2 * 2 * 2, "layout x position x qk-norm"
    labels = [cells.cell_label(r, cells.varied(rows)) for r in rows]
    assert labels == [
        "fused_qkv-manual-learned-softcap30-sinks", "fused_qkv-manual-learned-qknorm-softcap30-sinks",
        "fused_qkv-manual-rope-softcap30-sinks", "fused_qkv-manual-rope-qknorm-softcap30-sinks",
        "mla-manual-latent8-learned-softcap30-sinks", "mla-manual-latent8-learned-qknorm-softcap30-sinks",
        "mla-manual-latent8-ropedim4-rope-softcap30-sinks", "mla-manual-latent8-ropedim4-rope-qknorm-softcap30-sinks",
    ]  # fmt: skip
    header, csv_rows = read_csv(tmp_path)
    assert header[: len(step_times.FIELDS)] == step_times.FIELDS
    assert header[len(step_times.FIELDS) :] == ["position", "qk_norm", "softcap", "sinks", "kv_latent", "rope_head_dim"]
    assert [r["kv_latent"] for r in csv_rows] == [""] * 4 + ["8"] * 4
    assert all(float(r["step_ms"]) > 0 for r in csv_rows)
    table = (tmp_path / "bench.md").read_text().splitlines()
    assert table[2].startswith("| layout | kernel | position | qk norm | softcap | sinks | kv latent | rope head dim |")
    # One sequence length: a bar per cell, its label on its tick; the axis says what a label's parts are.
    ax = step_figures.figure(rows, "tiny", "forward+backward").axes[0]
    # a cell timed on a busy machine is marked † (bench.md and bench.png alike): the label is what precedes it; a
    # cell whose forward measured slower than its step (a tiny shape on a busy machine) is left out as invalid
    drawn = [label for r, label in zip(rows, labels) if not step_table.impossible(r)]
    assert [t.get_text().removesuffix(" †") for t in ax.get_yticklabels()] == [f"{label}, eager" for label in drawn]
    assert ax.get_ylabel().startswith("layout-kernel-latent<dims>-ropedim<dims>-<position>-qknorm")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--kernels", "sdpa", "--softcap", "30"],
         "cell fused_qkv-sdpa-softcap30: model.softcap=30.0 changes the scores before the softmax, which "
         "kernel=sdpa cannot do; use kernel="),
        (["--position", "rotary"], "--position: unknown position encoding 'rotary'; choose from learned, rope, alibi"),
        (["--qk-norm", "maybe"], "--qk-norm maybe: give off and/or on"),
        (["--softcap", "-1"], "--softcap -1: give a positive number"),
        (["--kv-latent", "0"], "--kv-latent 0 must be at least 1"),
        (["--position", "rope", "--n-embd", "18", "--n-head", "2"], "head dim n_embd/n_head = 18/2 = 9 is odd"),
    ],
)  # fmt: skip
def test_a_cell_the_model_refuses_is_one_line_before_any_work(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit):
        bench_command.main([*TINY, *args, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_decode_mode_reports_tokens_per_second_at_each_context_multiple(tmp_path):
    rows = bench_command.main([*TINY, "--mode", "decode", "--layouts", "fused_qkv", "--kernels", "sdpa", "--position",
                               "learned", "rope", "--window", "4", "--context-multiples", "1", "2", "4", "--repeats",
                               "2", "--out", str(tmp_path)])  # fmt: skip
    assert [(r["position"], r["context_multiple"], r["position_at"]) for r in rows] == [
        (p, m, 8 * m) for p in ("learned", "rope") for m in (1, 2, 4)]
    for r in rows:
        assert r["tokens_per_sec_min"] <= r["tokens_per_sec"] <= r["tokens_per_sec_max"] and r["passes"] == 2
        assert r["ms_per_token"] == pytest.approx(1e3 / r["tokens_per_sec"]) and r["median_step_ms"] > 0
    header, csv_rows = read_csv(tmp_path)
    assert header == decode_speed.DECODE_FIELDS and len(csv_rows) == 6
    text = (tmp_path / "bench.md").read_text()
    first = text.splitlines()[0]
    assert text.startswith("decode on ") and re.search(r"\b\d+ threads?\b", first), "the machine is named"
    assert "- fused_qkv-sdpa-window4-rope, block_size 8: tokens/s at 4x block_size is " in text
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# issue 63's options as bench axes, every one declared since the second wave's (the test below holds that): each flag,
# a value that sets it (and the layer that takes it), a bad value
THIRD_WAVE = {
    "ssmax": ("--ssmax", "0.43", 0.43, "fused_qkv", "0"),
    "k_eq_v": ("--k-eq-v", "on", True, "fused_qkv", "yes"),
    "moba_block": ("--moba-block", "4", 4, "fused_qkv", "-4"),
    "nsa_block": ("--nsa-block", "4", 4, "fused_qkv", "x"),
    "compress_ratio": ("--compress-ratio", "4", 4, "fused_qkv", "0.5"),
    "negative_eigenvalues": ("--negative-eigenvalues", "on", True, "gated_deltanet", "2"),
}


@pytest.mark.parametrize("field", THIRD_WAVE)
def test_each_third_wave_option_is_an_axis_set_in_the_model_and_a_bad_value_is_one_line(field, capsys):
    flag, typed, value, layout, bad = THIRD_WAVE[field]
    off = "off" if isinstance(value, bool) else "none"
    args = bench_command.parse_args([*TINY, "--layouts", layout, "--kernels", "sdpa", flag, off, typed])
    grid = cells.attention_cells(args)
    assert [cell[field] for cell in grid] == [cells.AXES[field][1], value]
    assert getattr(cells.config_of(args, grid[1], 16), field) == value
    with pytest.raises(SystemExit):
        bench_command.parse_args([*TINY, flag, bad])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{flag} {bad}: give" in line, line


def test_every_declared_bench_axis_of_the_third_wave_is_tested():
    """An option declared with ``bench=`` after the second wave's axes has its row above: a flag, a value, a refusal."""
    second_wave = {"attention_chunk", "query_temperature", "differential", "sparse_topk"}
    assert set(cells.AXES) - second_wave <= set(THIRD_WAVE), sorted(set(cells.AXES) - second_wave - set(THIRD_WAVE))
