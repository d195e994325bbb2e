"""The attention benchmark runs a tiny grid and writes one CSV row per cell."""

from __future__ import annotations

import csv

import pytest

import bench


@pytest.mark.parametrize("mode", ["block", "gpt"])
def test_tiny_grid_writes_one_row_per_cell(mode, tmp_path, capfd):
    bench.main([
        "--mode", mode, "--seq-len", "8", "16", "--batch", "2", "--n-embd", "16", "--n-head", "2",
        "--n-layer", "1", "--vocab-size", "64", "--min-run-time", "0.01", "--device", "cpu",
        "--out", str(tmp_path),
    ])  # fmt: skip
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    cells = {(r["layout"], r["kernel"], r["compile"], r["seq_len"]) for r in rows}
    expected = {(lay, ker, "eager", t) for lay in ("fused_qkv", "separate_qkv", "wrapper")
                for ker in ("manual", "sdpa") for t in ("8", "16")}  # fmt: skip
    assert len(rows) == 12 and cells == expected
    for r in rows:
        assert float(r["forward_ms"]) > 0 and float(r["step_ms"]) > 0 and r["peak_mem_mb"] == ""
        assert float(r["tokens_per_sec"]) == pytest.approx(2 * int(r["seq_len"]) / float(r["step_ms"]) * 1e3)
        # the profiler names the SDPA implementation that ran; the manual kernel runs none
        assert (r["sdpa_backend"] == "-") == (r["kernel"] == "manual"), r
        assert r["compile_s"] == "" and r["dtype"] == "float32"
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "bench.md").read_text().splitlines()
    assert "threads" in table[0], "the machine is named"
    assert len([line for line in table if line.startswith("| ")]) == 2 + 12
    assert "USDT:" not in capfd.readouterr().err, "the profiler's start/stop notices stay off the console"


def test_compiled_cells_run(tmp_path):
    rows = bench.main(["--layouts", "fused_qkv", "--kernels", "sdpa", "--compile", "eager", "compiled",
                       "--seq-len", "8", "--batch", "1", "--n-embd", "16", "--n-head", "2",
                       "--min-run-time", "0.01", "--device", "cpu", "--out", str(tmp_path)])  # fmt: skip
    assert [r["compile"] for r in rows] == ["eager", "compiled"]
    assert rows[0]["compile_s"] is None and rows[1]["compile_s"] > 0, "compilation timed apart, per cell"
    assert "range over passes" not in (tmp_path / "bench.md").read_text(), "one pass: no range column"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--layouts", "fused"], "unknown layout 'fused'; choose from fused_qkv, separate_qkv, wrapper"),
        (["--kernels", "flash"], "unknown kernel 'flash'; choose from flex, manual, sdpa, sdpa_cudnn, "
                                 "sdpa_efficient, sdpa_flash, sdpa_math"),
        (["--kernels", "sdpa_efficient", "--device", "cpu"],
         "kernel=sdpa_efficient (model.sdpa_backend=efficient) cannot run this model's attention on cpu"),
        (["--kv-heads", "0"], "--kv-heads 0 must be at least 1"),
        (["--kv-heads", "3"], "--kv-heads 3 does not divide --n-head 8"),
        (["--window", "wide"], "--window wide: give a positive number of positions, or none"),
        (["--compile", "jit"], "unknown compile mode 'jit'; choose from compiled, eager"),
    ],
)
def test_unknown_grid_values_are_refused(args, message, capsys):
    with pytest.raises(SystemExit):
        bench.main(args)
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, "one line, not the usage block first"


def test_noisy_passes_are_named_per_measurement_with_their_figures():
    quiet = {"forward_spread": 0.05, "step_spread": 0.02}
    assert bench.noise_warnings([quiet, quiet], "train step") == ""
    noisy = [quiet, {"forward_spread": 0.3, "step_spread": 0.12}, {"forward_spread": 0.01, "step_spread": 0.26}]
    assert bench.noise_warnings(noisy, "train step") == (
        "forward: interquartile range 30% of the median in 1 of 3 pass(es), a noisy measurement; "
        "train step: interquartile range 12%, 26% of the median in 2 of 3 pass(es), a noisy measurement"
    )
