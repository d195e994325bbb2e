"""heads.py on models of the new axes: rotary, ALiBi, QK-norm, sinks and latent attention. The maps come from
the block's own encodings; with sinks a row sums to less than 1 and the rest is reported as the sink's weight."""

from __future__ import annotations

import csv
import subprocess

import pytest
import torch
from helpers import TINY, compose_train, run_script

from analysis.heads import SINK, STATS, attention_maps, head_statistics
from model import load_model
from training.loop import train


def trained(tmp_path_factory, data_cache, name: str, *overrides: str):
    run = tmp_path_factory.mktemp(name) / "run"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=10", "model.n_layer=2", f"trainer.run_dir={run}",
                        f"data.cache_dir={data_cache}", *overrides))  # fmt: skip
    return run


@pytest.fixture(scope="module")
def sinks_run(tmp_path_factory, data_cache):
    return trained(tmp_path_factory, data_cache, "sinks", "kernel=manual", "model.position=rope", "model.qk_norm=true",
                   "model.sinks=true")  # fmt: skip


def heads_cli(run, data_cache, tmp_path) -> subprocess.CompletedProcess:
    # map_tokens=8 (default 24): each token is a tick label on both axes of every map, much of what drawing costs
    result = run_script("heads.py", f"source={run}", f"data.cache_dir={data_cache}", "windows=2", "map_tokens=8",
                        f"out={tmp_path / 'heads'}", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_with_sinks_the_stats_report_what_the_sink_took_of_each_row(sinks_run, data_cache, tmp_path):
    result = heads_cli(sinks_run, data_cache, tmp_path)
    with open(tmp_path / "heads" / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["layer", "head", *STATS, SINK]
    assert all(0 < float(row[SINK]) < 1 for row in rows)
    assert "(fused_qkv-rope-qknorm-sinks)" in result.stderr
    assert "sinks: a row of each map sums to less than 1, the rest went to the head's sink" in result.stderr
    for name in ("maps.png", "head_L0_H0.png", "stats.png"):
        assert (tmp_path / "heads" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_sink_weight_is_one_minus_each_rows_sum(sinks_run):
    model = load_model(str(sinks_run)).model.eval()
    maps = attention_maps(model, torch.randint(0, 200, (2, 16)))
    sums = maps.sum(-1)
    assert (sums < 1).all() and (sums > 0).all(), "every row gave some weight to the sink, and some to the keys"
    stats = head_statistics(maps, sinks=True)
    torch.testing.assert_close(stats[SINK], (1 - sums).mean(dim=(1, 3)))
    assert set(head_statistics(maps)) == set(STATS), "without sinks=True: the statistics as before"


@pytest.mark.parametrize(
    "overrides,name",
    [(("model.position=alibi",), "(fused_qkv-alibi)"),
     (("attention=mla", "model.kv_latent=16", "model.position=rope", "model.rope_head_dim=8"),
      "(mla-latent16-ropedim8-rope)"),
     ((), "(fused_qkv)")],  # a default model: named as before (the session's trained_run)
)  # fmt: skip
@pytest.mark.slow
def test_maps_of_alibi_and_latent_models_are_causal_distributions(overrides, name, tmp_path_factory, data_cache,
                                                                   tmp_path, request):  # fmt: skip
    if overrides:
        run = trained(tmp_path_factory, data_cache, "model", *overrides)
    else:
        run = request.getfixturevalue("trained_run")
    model = load_model(str(run)).model.eval()
    maps = attention_maps(model, torch.randint(0, 200, (1, 12)))
    torch.testing.assert_close(maps.sum(-1), torch.ones(maps.shape[:-1]))
    assert (maps.triu(1) == 0).all(), "no weight on a later key"
    result = heads_cli(run, data_cache, tmp_path)
    assert name in result.stderr and "sinks:" not in result.stderr
    with open(tmp_path / "heads" / "stats.csv") as f:
        assert next(csv.reader(f)) == ["layer", "head", *STATS]
