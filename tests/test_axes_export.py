"""export.py refuses, before it writes anything, a model GPT-2's format cannot hold (positions other than the
learned table, QK-norm, softcap, sinks, a latent, a window), naming each option and the fix; what GPT-2 holds
(grouped-query heads, written as multi-head) still exports."""

from __future__ import annotations

import pytest
from helpers import TINY, compose_train, run_script, tiny_gpt_config

from model import GPT
from model.gpt2_export import check_gpt2_holds, export_hf_gpt2, what_gpt2_cannot_hold
from training.loop import train


@pytest.mark.parametrize(
    "options,named",
    [
        (dict(position="rope"), ["model.position=rope"]),
        (dict(position="alibi"), ["model.position=alibi"]),
        (dict(position="none"), ["model.position=none"]),
        (dict(qk_norm=True), ["model.qk_norm=true"]),
        (dict(kernel="manual", softcap=30.0), ["model.softcap=30.0"]),
        (dict(sinks=True), ["model.sinks=true"]),
        (dict(attention="mla", kv_latent=8), ["attention=mla"]),
        (dict(window=4), ["model.window=4"]),
        (dict(position="rope", qk_norm=True, sinks=True, window=4),
         ["model.window=4", "model.position=rope", "model.qk_norm=true", "model.sinks=true"]),
        (dict(n_kv_head=1), []),  # grouped-query: the same function in GPT-2's multi-head form
        (dict(), []),
    ],
)  # fmt: skip
def test_every_option_gpt2_cannot_hold_is_named(options, named):
    config = tiny_gpt_config(**options)
    problems = what_gpt2_cannot_hold(config)
    assert [p.split(" (")[0] for p in problems] == named
    if named:
        with pytest.raises(ValueError, match="GPT-2's format cannot hold this model: model|GPT-2's format cannot hold "
                                             "this model: attention") as err:  # fmt: skip
            check_gpt2_holds(config)
        assert "Export a model trained with GPT-2's attention" in str(err.value)


def test_the_refusal_comes_before_the_folder_is_made(tmp_path):
    with pytest.raises(ValueError, match="model.sinks=true"):
        export_hf_gpt2(GPT(tiny_gpt_config(sinks=True)), tmp_path / "hf", eot_id=None)
    assert not (tmp_path / "hf").exists()


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, data_cache):
    run = tmp_path_factory.mktemp("rope") / "run"
    train(compose_train(*TINY, "logger=none", "trainer.max_steps=2", "model.position=rope", "model.qk_norm=true",
                        f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))  # fmt: skip
    return run


def test_export_of_a_rope_model_is_one_line_and_writes_nothing(rope_run, tmp_path):
    out = tmp_path / "hf"
    result = run_script("export.py", f"source={rope_run}", f"out={out}", cwd=tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "GPT-2's format cannot hold" in line]
    assert len(errors) == 1 and "model.position=rope" in errors[0] and "model.qk_norm=true" in errors[0], lines
    assert "Traceback" not in result.stderr
    assert not out.exists(), "nothing written"
