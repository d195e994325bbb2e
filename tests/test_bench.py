"""The attention benchmark runs a tiny grid and writes one CSV row per cell."""

from __future__ import annotations

import csv
import itertools
import re

import pytest

from measuring import bench_command, noise, step_figures
from measuring.plain_attention import PLAIN_KERNELS, PLAIN_LAYOUTS
from model.registry import MIXERS


@pytest.mark.parametrize("mode", ["block", "gpt"])
@pytest.mark.slow
def test_tiny_grid_writes_one_row_per_cell(mode, tmp_path, capfd):
    bench_command.main([
        "--mode", mode, "--seq-len", "8", "16", "--batch", "2", "--n-embd", "16", "--n-head", "2",
        "--n-layer", "1", "--vocab-size", "64", "--min-run-time", "0.01", "--device", "cpu",
        "--out", str(tmp_path),
    ])  # fmt: skip
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    cells = {(r["layout"], r["kernel"], r["compile"], r["seq_len"]) for r in rows}
    defaults = bench_command.parse_args([])  # the default grid: GPT-2's layouts x the default kernels
    expected = {(lay, ker, "eager", t) for lay in defaults.layouts for ker in defaults.kernels for t in ("8", "16")}
    assert len(rows) == len(expected) and cells == expected
    for r in rows:
        assert float(r["forward_ms"]) > 0 and float(r["step_ms"]) > 0 and r["peak_mem_mb"] == ""
        assert float(r["tokens_per_sec"]) == pytest.approx(2 * int(r["seq_len"]) / float(r["step_ms"]) * 1e3)
        # the profiler names the SDPA implementation that ran; the manual kernel runs none
        assert (r["sdpa_backend"] == "-") == (r["kernel"] == "manual"), r
        assert r["compile_s"] == "" and r["dtype"] == "float32"
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "bench.md").read_text().splitlines()
    assert re.search(r"\b\d+ threads?\b", table[0]), "the machine is named"
    assert len([line for line in table if line.startswith("| ")]) == 2 + len(expected), "a header, a rule, a row each"
    assert "USDT:" not in capfd.readouterr().err, "the profiler's start/stop notices stay off the console"


@pytest.mark.parametrize("layout", PLAIN_LAYOUTS)
@pytest.mark.parametrize("kernel", PLAIN_KERNELS)
def test_each_plain_reference_computes_its_blocks_function_with_its_weights(layout, kernel):
    # bench.py --mode plain times a block against the plainest code of its layout and kernel: the same function of
    # the same weights (the reference holds the block's own projections), at lengths 1 to past a few heads' widths.
    import torch

    from measuring.plain_attention import plain_twin
    from model import GPTConfig
    from model.attention import attention_of

    for n_head, n_embd, seq_len in ((1, 8, 1), (2, 16, 7), (3, 24, 13), (4, 32, 33)):
        torch.manual_seed(seq_len)
        config = GPTConfig(vocab_size=8, block_size=seq_len, n_layer=1, n_head=n_head, n_embd=n_embd,
                           attention=layout, kernel=kernel)  # fmt: skip
        block = attention_of(layout, config.attention_spec)
        plain = plain_twin(block, layout, kernel, seq_len)
        x = torch.randn(2, seq_len, n_embd, requires_grad=True)
        torch.testing.assert_close(plain(x), block(x), atol=1e-6, rtol=1e-5)
        assert {id(p) for p in plain.parameters()} <= {id(p) for p in block.parameters()}, "the block's own weights"


def test_plain_mode_prints_each_cells_ratios_with_their_range(tmp_path, capsys):
    rows = bench_command.main(["--mode", "plain", "--seq-len", "8", "--batch", "1", "--n-embd", "16", "--n-head", "2",
                               "--min-run-time", "0.01", "--repeats", "2", "--device", "cpu",
                               "--out", str(tmp_path)])  # fmt: skip
    cells = set(itertools.product(PLAIN_LAYOUTS, PLAIN_KERNELS))
    assert {(r["layout"], r["kernel"]) for r in rows} == cells
    for r in rows:
        for what in ("forward", "step"):
            assert r[f"{what}_ratio_min"] <= r[f"{what}_ratio"] <= r[f"{what}_ratio_max"], r
            assert r[f"{what}_ms"] > 0 and r[f"plain_{what}_ms"] > 0 and r["rounds"] == 2
    table = capsys.readouterr().out
    assert "plain references on" in table and re.search(r"\b\d+ threads?\b", table) and table.count("| eager |") == 6
    assert len(list(csv.DictReader((tmp_path / "bench.csv").open()))) == 6


@pytest.mark.slow  # 6 s of compiling; test_compile.py compiles a GPT in the default tier
def test_compiled_cells_run(tmp_path):
    rows = bench_command.main(["--layouts", "fused_qkv", "--kernels", "sdpa", "--compile", "eager", "compiled",
                               "--seq-len", "8", "--batch", "1", "--n-embd", "16", "--n-head", "2",
                               "--min-run-time", "0.01", "--device", "cpu", "--out", str(tmp_path)])  # fmt: skip
    assert [r["compile"] for r in rows] == ["eager", "compiled"]
    assert rows[0]["compile_s"] is None and rows[1]["compile_s"] > 0, "compilation timed apart, per cell"
    assert "range over passes" not in (tmp_path / "bench.md").read_text(), "one pass: no range column"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--layouts", "fused"], f"unknown layout 'fused'; choose from {', '.join(sorted(MIXERS))}"),
        (["--kernels", "flash"], "unknown kernel 'flash'; choose from flex, manual, sdpa, sdpa_cudnn, "
                                 "sdpa_efficient, sdpa_flash, sdpa_math"),
        (["--kernels", "sdpa_efficient", "--device", "cpu"],
         "kernel=sdpa_efficient (model.sdpa_backend=efficient) cannot run this model's attention on cpu"),
        (["--kv-heads", "0"], "--kv-heads 0 must be at least 1"),
        (["--kv-heads", "3"], "--kv-heads 3 does not divide --n-head 8"),
        (["--window", "wide"], "--window wide: give a positive number of positions, or none"),
        (["--compile", "jit"], "unknown compile mode 'jit'; choose from compiled, eager"),
        (["--mode", "plain", "--kernels", "flex"], "--mode plain: --kernels flex has no plain reference; choose from "
                                                   "manual, sdpa"),
        (["--mode", "plain", "--layouts", "mla"], "--mode plain: --layouts mla has no plain reference"),
        (["--mode", "plain", "--sinks", "on"], "--mode plain times the plain multi-head block; leave out --sinks"),
    ],
)
def test_unknown_grid_values_are_refused(args, message, capsys):
    with pytest.raises(SystemExit):
        bench_command.main(args)
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, "one line, not the usage block first"


def test_noisy_passes_are_named_per_measurement_with_their_figures():
    quiet = {"forward_spread": 0.05, "step_spread": 0.02}
    assert noise.noise_warnings([quiet, quiet], "train step") == ""
    noisy = [quiet, {"forward_spread": 0.3, "step_spread": 0.12}, {"forward_spread": 0.01, "step_spread": 0.26}]
    assert noise.noise_warnings(noisy, "train step") == (
        "forward: interquartile range 30% of the median in 1 of 3 pass(es), a noisy measurement; "
        "train step: interquartile range 12%, 26% of the median in 2 of 3 pass(es), a noisy measurement"
    )


@pytest.fixture(scope="module")
def kernel_rows(tmp_path_factory):
    """A tiny real grid: the manual kernel and SDPA held to flash, with 1 and 2 key/value heads, for the figure's
    tests. On a busy machine a shape this small can measure its forward slower than its step, a cell the figure
    leaves out as invalid (``step_table.impossible``, tested in tests/test_axes_bench.py): here each forward is held
    below its step, so every cell is drawn whatever the load."""
    rows = bench_command.main(["--layouts", "fused_qkv", "--kernels", "manual", "sdpa_flash", "--kv-heads", "1", "2",
                               "--seq-len", "8", "16", "--batch", "1", "--n-embd", "16", "--n-head", "2",
                               "--min-run-time", "0.01", "--device", "cpu",
                               "--out", str(tmp_path_factory.mktemp("bench"))])  # fmt: skip
    return [{**r, "forward_ms": min(r["forward_ms"], r["step_ms"] / 2)} for r in rows]


def y_tick_labels(fig) -> list[str]:
    """The y axis's labelled ticks inside its limits, as drawn."""
    fig.canvas.draw()
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    return [t.get_text() for t in ax.get_yticklabels() if t.get_text() and low <= t.get_position()[1] <= high]


def test_the_plot_legend_names_cells_as_training_names_runs_with_handles_long_enough_to_show_dashes(kernel_rows):
    fig = step_figures.figure(kernel_rows, "tiny", "forward+backward")
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "fused_qkv-manual-kv1, eager", "fused_qkv-manual-kv2, eager",
        "fused_qkv-sdpa_flash-kv1, eager", "fused_qkv-sdpa_flash-kv2, eager",
    ]  # fmt: skip
    assert "dashed: manual kernel, solid: sdpa" in legend.get_title().get_text()
    assert legend.handlelength >= 4, "a handle holds a dash, a gap and the marker"
    styles = {text.get_text(): line.get_linestyle() for text, line in zip(legend.get_texts(), legend.get_lines())}
    assert styles["fused_qkv-manual-kv1, eager"] == "--" and styles["fused_qkv-sdpa_flash-kv1, eager"] == "-"


@pytest.mark.parametrize("low,high", [(10.0, 20.0), (10.2, 11.0), (0.4, 300.0)])
def test_the_log_time_axis_labels_at_least_four_values_whatever_the_range(kernel_rows, low, high):
    rows = [dict(r) for r in kernel_rows]
    for i, r in enumerate(rows):  # measured times spread over [low, high], to hold the axis to that range
        r["step_ms"] = low * (high / low) ** (i / (len(rows) - 1))
        r["forward_ms"] = r["step_ms"] / 2  # a valid cell (its forward below its step) at any time given
    labels = y_tick_labels(step_figures.figure(rows, "tiny", "forward+backward"))
    values = [float(t) for t in labels]
    assert len(labels) >= 4 and values == sorted(values), labels
    assert values[0] <= low * 1.6 and values[-1] >= high / 1.6, f"labels {labels} span the data {low}-{high}"
