"""The attention benchmark runs a tiny grid and prints one row per cell."""

from __future__ import annotations

import pytest

import bench


@pytest.mark.parametrize("mode", ["block", "gpt"])
def test_tiny_grid_prints_one_row_per_cell(mode, capsys):
    bench.main([
        "--mode", mode, "--seq-len", "8", "16", "--batch", "2", "--n-embd", "16", "--n-head", "2",
        "--n-layer", "1", "--min-run-time", "0.01", "--device", "cpu",
    ])  # fmt: skip
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    rows = table[2:]  # after the header and the separator
    cells = {tuple(cell.strip() for cell in row.strip("|").split("|")[:3]) for row in rows}
    expected = {(lay, ker, t) for lay in ("fused_qkv", "separate_qkv", "wrapper")
                for ker in ("manual", "sdpa") for t in ("8", "16")}  # fmt: skip
    assert cells == expected
    for row in rows:
        forward_ms, forward_backward_ms = (float(v) for v in row.strip("|").split("|")[3:])
        assert 0 < forward_ms and 0 < forward_backward_ms


def test_unknown_layout_is_refused_with_the_valid_names(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--layouts", "fused"])
    assert (
        "unknown layout 'fused'; choose from ['fused_qkv', 'separate_qkv', 'wrapper']"
        in capsys.readouterr().err
    )
