"""Evaluation past the trained length (issue: train short, test long).

- ``past_context=full`` past block_size is a float64 forward over the whole sequence (every earlier key, the
  window still applied), ``ring`` the same with each position's keys capped at block_size, for rope, ALiBi and
  no positions, every kernel that runs on a CPU, each layout in turn;
- the two protocols equal their definitions, computed token by token: independent chunks, and a sliding window
  where each token is scored by the first window that holds it;
- evaluate.py writes the loss at each length, and at each position, in its JSON, table and plot; its 1x chunks
  are training's own validation windows.

The refusals (a length below 1, an unknown protocol, a learned table past its rows): tests/test_bad_inputs.py.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import statistics
from collections import defaultdict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attention_reference import reference_attention
from helpers import GPT2_LAYOUTS, TINY, compose_train, tiny_run
from helpers import tiny_gpt_config as config
from omegaconf import OmegaConf

import evaluate
import sample
from data.config import DataConfig
from model import GPT
from model.attention.positions import ROPE_SCALINGS, Rotary, scaled
from model.decoding.context import with_context
from model.decoding.generation import generate_batch
from training.evaluate import LengthEvaluator
from training.loop import train

LAYOUTS = GPT2_LAYOUTS  # the layouts of one function (attention=mla is another: its cells are in test_mla.py)
CPU_KERNELS = ("manual", "sdpa")  # flex compiles a graph per shape on a CPU: its past-context cells are in
# test_attention_properties' generation past block_size


def reference_logits(model: GPT, idx: torch.Tensor, context: int | None) -> torch.Tensor:
    """The model's logits in float64 with attention written from the formula, each query seeing at most
    ``context`` keys (None: every earlier key)."""
    m, c = copy.deepcopy(model).double(), model.config
    x = m.transformer.wte(idx)
    for block in m.transformer.h:
        x = x + reference_attention(block.attn, c.attention, block.ln_1(x), c.n_head, c.kv_heads, context,
                                    c.position, c.rope_theta)  # fmt: skip
        x = x + block.mlp(block.ln_2(x))
    return m.lm_head(m.transformer.ln_f(x))[..., : c.vocab_size]


CELLS = [(position, kernel, window) for position in ("rope", "alibi", "none") for kernel in CPU_KERNELS
         for window in (None, 5)]  # fmt: skip


@pytest.mark.parametrize("position, kernel, window", CELLS)
def test_full_context_is_every_earlier_key_and_ring_the_last_block_size_in_float64(position, kernel, window):
    # block_size 8, read at 29 tokens (past 3x, prime): rotary at positions it never trained at, ALiBi at
    # distances up to 28. Within block_size both rules are the model as trained.
    layout = LAYOUTS[CELLS.index((position, kernel, window)) % len(LAYOUTS)]
    torch.manual_seed(CELLS.index((position, kernel, window)))
    model = GPT(config(attention=layout, kernel=kernel, position=position, window=window, n_head=4, n_embd=32,
                       n_layer=2)).eval()  # fmt: skip
    idx = torch.randint(0, 50, (2, 29))
    with torch.no_grad():
        full = with_context(model, 29, "full")(idx, idx)[0]
        ring = with_context(model, 29, "ring")(idx, idx)[0]
        want_full = reference_logits(model, idx, window)
        want_ring = reference_logits(model, idx, min(window or 8, 8))
    torch.testing.assert_close(full.double(), want_full, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(ring.double(), want_ring, atol=2e-5, rtol=1e-4)
    if window is None:  # the two rules differ past block_size, and only there
        assert (full[:, 8:] - ring[:, 8:]).abs().amax() > 1e-3
    torch.testing.assert_close(full[:, :8], ring[:, :8], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
def test_greedy_generation_with_full_context_is_the_full_forward_at_every_step(position):
    # sample.py past_context=full: its KV cache holds every position (no ring), so each cached step is the
    # full-context forward over everything so far, up to 5x block_size.
    torch.manual_seed(3)
    model = GPT(config(position=position, n_head=4, n_embd=32, n_layer=2)).eval()
    prompt, new = [1, 2, 3], 37
    wide = with_context(model, len(prompt) + new, "full").eval()
    with torch.no_grad():
        steps = list(generate_batch(wide, prompt, new, [None], temperature=0.0))
        tokens = list(prompt)
        for _ in range(new):
            tokens.append(int(wide(torch.tensor([tokens]))[0][0, -1].argmax()))
    assert [s[0] for s in steps] == tokens[len(prompt):]
    assert wide.cache_capacities == [len(prompt) + new] * 2 and model.cache_capacities == [8] * 2


def token_losses(model: GPT, tokens: np.ndarray, start: int, length: int) -> torch.Tensor:
    """The loss of each of the ``length`` targets after ``tokens[start]``, with exactly that window as context."""
    x = torch.from_numpy(tokens[start : start + length].astype(np.int64))[None]
    y = torch.from_numpy(tokens[start + 1 : start + length + 1].astype(np.int64))[None]
    with torch.no_grad():
        return F.cross_entropy(model(x, y)[0][0].double(), y[0], reduction="none")


@pytest.mark.parametrize("length, stride, batch_tokens", [(8, 3, 8), (8, 8, 24), (13, 5, 100), (5, 1, 7)])
def test_the_protocols_equal_their_definitions_token_by_token(length, stride, batch_tokens):
    torch.manual_seed(length + stride)
    model = with_context(GPT(config(position="rope")).eval(), length, "full")
    tokens = np.random.default_rng(length).integers(0, 50, size=61).astype(np.uint16)
    # chunks: the stretch's first tokens cut into independent chunks, every token scored with its place in the
    # chunk as its position
    span = 3 * length  # the tokens every protocol reads (length_rows: windows x the longest length)
    chunks = LengthEvaluator(tokens, length, "chunks", span, None, batch_tokens, 1.0, torch.device("cpu"),
                             torch.float32)(model)  # fmt: skip
    starts = [i * length for i in range(min(span, 60) // length)]
    want = torch.stack([token_losses(model, tokens, s, length) for s in starts])
    assert chunks["tokens"] == want.numel() and chunks["sequences"] == len(starts)
    np.testing.assert_allclose(chunks["loss_by_position"], want.mean(0).numpy(), rtol=1e-5)
    assert chunks["loss"] == pytest.approx(float(want.mean()), rel=1e-6)
    # the text's noise: the standard error of the chunks' mean losses
    assert chunks["loss_se"] == pytest.approx(statistics.stdev(want.mean(1).tolist()) / math.sqrt(len(starts)),
                                              rel=1e-5)  # fmt: skip
    # sliding: windows `stride` apart from the start; each target scored once, by the first window holding it
    sliding = LengthEvaluator(tokens, length, "sliding", span, stride, batch_tokens, 1.0, torch.device("cpu"),
                              torch.float32)(model)  # fmt: skip
    window_starts = list(range(0, min(span, 60) - length + 1, stride))
    covered = window_starts[-1] + length
    sums, counts, total, by_window = np.zeros(length), np.zeros(length), [], defaultdict(list)
    for target in range(covered):
        first = next(s for s in window_starts if s <= target < s + length)
        loss = float(token_losses(model, tokens, first, length)[target - first])
        sums[target - first] += loss
        counts[target - first] += 1
        total.append(loss)
        by_window[first].append(loss)
    assert sliding["tokens"] == covered == len(total) and sliding["sequences"] == len(window_starts)
    np.testing.assert_allclose(sliding["loss_by_position"], sums / counts, rtol=1e-5)
    assert sliding["loss"] == pytest.approx(np.mean(total), rel=1e-6)
    # windows that score unequal numbers of tokens: the ratio estimator's standard error over the windows
    n, mean = len(by_window), np.mean(total)
    spread = sum((sum(scored) - mean * len(scored)) ** 2 for scored in by_window.values())
    assert sliding["loss_se"] == pytest.approx(math.sqrt(n / (n - 1) * spread) / len(total), rel=1e-5)


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory, data_cache):
    return tiny_run(tmp_path_factory.mktemp("rope") / "run", data_cache, "model.position=rope")


def test_evaluate_writes_the_loss_at_each_length_and_position_over_one_stretch_of_text(rope_run, data_cache,
                                                                                      capsys):  # fmt: skip
    data = DataConfig(cache_dir=str(data_cache))
    result = evaluate.run(evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=["1x", 64, "4x"],
                                                  past_context="full", data=data))  # fmt: skip
    out = capsys.readouterr().out
    rows = result["lengths"]
    assert [r["length"] for r in rows] == [32, 64, 128] and [r["multiple"] for r in rows] == [1, 2, 4]
    assert [r["tokens"] for r in rows] == [8 * 128] * 3, "every length reads the run's 8 windows x 128 tokens"
    for row in rows:
        assert len(row["loss_by_position"]) == row["length"] and row["past_context"] == "full"
        assert row["loss"] == pytest.approx(np.average(row["loss_by_position"]), rel=1e-6)
        assert f"| {row['length']} | {row['multiple']:g}x | chunks | full | none | {row['loss']:.4f} |" in out
    written = json.loads((rope_run / "eval-last-pystdlib.json").read_text())
    assert written["lengths"] == rows
    assert (rope_run / "eval-last-pystdlib.png").stat().st_size > 10_000
    assert "loss by position, the mean over each span of 32 positions" in out


def test_evaluate_says_which_of_its_two_losses_at_the_trained_length_is_which(rope_run, data_cache, capsys):
    """val/loss (training's windows, spread over the split) and the length table's 1x row (the first windows x the
    longest length tokens) are two losses at the trained length: the console says which text each reads."""
    data = DataConfig(cache_dir=str(data_cache))
    result = evaluate.run(evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=["1x", "2x"],
                                                  data=data, out=str(rope_run / "two-losses.json")))  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    trained = result["lengths"][0]
    assert trained["length"] == 32 and trained["loss"] != pytest.approx(result["val/loss"]), "two losses at 32"
    assert lines[0].startswith(f"val/loss {result['val/loss']:.4f}  val/bpb {result['val/bpb']:.4f}  (")
    assert "8 windows of 32 tokens spread over the validation split of data=pystdlib, as training measures " \
           "val/loss)" in lines[0], lines[0]  # fmt: skip
    assert lines[1] == ("by length: every length reads the same first 512 tokens of the validation split (8 windows x "
                        "the longest length, 64); its loss at 32 tokens (1x) is over that stretch, not over "
                        "val/loss's windows above:"), lines[1]  # fmt: skip
    assert lines[2].startswith("| length |") and "| loss | ± s.e. (over its sequences: another stretch of text) |" \
        in lines[2], lines[2]  # fmt: skip
    assert lines[4].startswith(f"| 32 | 1x | chunks | ring | none | {trained['loss']:.4f} | "
                               f"±{trained['loss_se']:.4f} |"), lines[4]  # fmt: skip


def test_evaluate_scores_retrieval_at_each_length_and_depth_in_its_json_table_and_heatmap(rope_run, data_cache,
                                                                                          capsys):  # fmt: skip
    from data.retrieval import QUERIES, examples
    from data.tokenizers import get_tokenizer
    from model import load_model
    from training.retrieval import accuracy

    data = DataConfig(cache_dir=str(data_cache))
    out = rope_run / "retrieval.json"
    cfg = evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=["2x", 96], past_context="full",
                                  retrieval=["passkey", "mqar"], depths=[0, 1], examples=3, seed=5, out=str(out),
                                  data=data)  # fmt: skip
    result = evaluate.run(cfg)
    rows = result["retrieval"]
    cells = [(r["length"], r["task"], r["depth"]) for r in rows]
    assert cells == [(n, t, d) for n in (64, 96) for t in ("passkey", "mqar") for d in (0, 1)]
    model = with_context(load_model(str(rope_run)).model, 96, "full")
    for row in rows:
        assert row["asked"] == 3 * (QUERIES if row["task"] == "mqar" else 1) and row["past_context"] == "full"
        if row["length"] == 96:  # the same count as the scorer gives the same examples, read with full context
            cases = examples(row["task"], get_tokenizer("bytes").encode, 96, row["depth"], 3, 5)
            assert (row["right"], row["asked"]) == accuracy(model, cases, 10**6, torch.device("cpu"), torch.float32)
    assert json.loads(out.read_text())["retrieval"] == rows
    assert (rope_run / "retrieval-retrieval.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "passkey: accuracy (%), 3 answers per cell" in printed
    assert "mqar: accuracy (%), 12 answers per cell" in printed
    assert "| depth | 64 (2x) | 96 (3x) |" in printed


def test_retrieval_with_no_length_long_enough_is_refused_before_any_work(rope_run, data_cache, capsys):
    cfg = evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=[48, 40], retrieval="mqar",
                                  data=DataConfig(cache_dir=str(data_cache)),
                                  out=str(rope_run / "never.json"))  # fmt: skip
    with pytest.raises(ValueError) as err:
        evaluate.run(cfg)
    assert str(err.value).startswith("lengths=[48, 40]: mqar needs at least 56 tokens") and "\n" not in str(err.value)
    assert not (rope_run / "never.json").exists() and capsys.readouterr().out == ""


def test_a_length_too_short_for_a_retrieval_task_is_skipped_for_it_and_said_in_one_line(rope_run, data_cache,
                                                                                       capsys):  # fmt: skip
    # passkey needs 44 tokens, mqar 56: at 48 only passkey is scored, at 32 neither; every length's loss is read.
    cfg = evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=["1x", 48, 64], depths=[0.5],
                                  retrieval=["passkey", "mqar"], examples=2, data=DataConfig(cache_dir=str(data_cache)),
                                  out=str(rope_run / "skips.json"))  # fmt: skip
    result = evaluate.run(cfg)
    assert [r["length"] for r in result["lengths"]] == [32, 48, 64]
    assert [(r["task"], r["length"]) for r in result["retrieval"]] == [("passkey", 48), ("passkey", 64), ("mqar", 64)]
    line = ("retrieval: passkey skips length 32 (it needs at least 44 tokens: the key's sentence and the question); "
            "mqar skips lengths 32, 48 (it needs at least 56 tokens: 4 pairs and their 4 questions); every other "
            "length is scored")  # fmt: skip
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == line and printed.count(line) == 2, "said before the work and again under its table"
    assert json.loads((rope_run / "skips.json").read_text())["retrieval_skipped"] == line


def test_a_learned_table_is_refused_past_it_with_full_context_before_any_token(trained_run, capsys):
    # The session's trained run has learned positions and block_size 32: 40 new tokens would need 41 rows.
    with pytest.raises(ValueError) as err:
        sample.run(sample.SampleConfig(source=str(trained_run), max_new_tokens=40, device="cpu", past_context="full"))
    message = str(err.value)
    assert "\n" not in message and message.startswith("past_context=full: length 41 is past") and "ring" in message
    assert capsys.readouterr().out == "", "refused before generating"


def test_compare_reports_each_runs_loss_at_each_length_with_its_plots(rope_run, data_cache, tmp_path, capsys):
    import compare

    data = DataConfig(cache_dir=str(data_cache))
    result = evaluate.run(evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=[32, 96],
                                                  protocol="sliding", stride=16, data=data,
                                                  out=str(rope_run / "eval-sliding.json")))  # fmt: skip
    capsys.readouterr()
    out = compare.main([str(rope_run), "--out", str(tmp_path / "report")])
    report = (out / "report.md").read_text()
    section = report.split("## Past the trained length", 1)[1]
    header = next(line for line in section.splitlines() if line.startswith("| variant"))
    row = next(line for line in section.splitlines() if line.startswith("| fused_qkv-sdpa-rope (sliding, ring) |"))
    cells = dict(zip([c.strip() for c in header.split("|")[3:-1]], [c.strip() for c in row.split("|")[3:-1]]))
    assert {"32": cells["32"], "96": cells["96"]} == {str(r["length"]): f"{r['loss']:.4f}" for r in result["lengths"]}
    assert row in capsys.readouterr().out, "the newest result of that way, as written, printed too"
    for name in ("loss_vs_length.png", "loss_by_position.png"):
        assert (out / name).stat().st_size > 10_000 and f"![{name[:-4]}]({name})" in report


def test_the_loss_vs_length_plot_draws_each_curves_noise_as_a_band_from_the_results(rope_run, data_cache, tmp_path):
    """A spread of a few thousandths of a nat, which the axis fills, must not read as a ranking (issue 60, item 12):
    each curve carries its noise, the text's standard error that evaluate.py measures, or its seeds' range."""
    from analysis.lengths import length_curves, loss_vs_length_figure, sweep_by_position_figure
    from analysis.runs import find_runs

    def run_copy(name: str, seed: int, shift: float) -> None:
        (tmp_path / name).mkdir()
        for file in ("run.json", "metrics.jsonl"):
            shutil.copy(rope_run / file, tmp_path / name / file)
        info = json.loads((tmp_path / name / "run.json").read_text())
        info["trainer"]["seed"] = seed
        (tmp_path / name / "run.json").write_text(json.dumps(info))
        written = copy.deepcopy(result)
        for row in written["lengths"]:
            row["loss"] += shift
        (tmp_path / name / "eval-lengths.json").write_text(json.dumps(written))

    def bands(runs: list[str]) -> tuple[dict[float, tuple[float, float]], list[str]]:
        curves = length_curves(find_runs([tmp_path / run for run in runs]))
        by_position = sweep_by_position_figure(curves).axes[0].collections  # a band where several seeds ran
        assert len(by_position) == (len(runs) > 1)
        ax = loss_vs_length_figure(curves).axes[0]
        (band,) = ax.collections
        points = band.get_paths()[0].vertices
        extent = {x: (points[points[:, 0] == x, 1].min(), points[points[:, 0] == x, 1].max()) for x in (32, 96)}
        return extent, [t.get_text() for t in ax.get_legend().get_texts()]

    result = evaluate.run(evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=[32, 96],
                                                  data=DataConfig(cache_dir=str(data_cache)),
                                                  out=str(tmp_path / "eval.json")))  # fmt: skip
    run_copy("seed1", 1, 0.0)
    extent, legend = bands(["seed1"])
    for row in result["lengths"]:
        assert 0 < row["loss_se"] < 1 and row["sequences"] > 1
        assert extent[row["length"]] == pytest.approx((row["loss"] - row["loss_se"], row["loss"] + row["loss_se"]))
    assert legend[-1].startswith("band: ±1 standard error over the text's"), legend
    run_copy("seed2", 2, 0.05)  # another seed: the band is the seeds' range
    extent, legend = bands(["seed1", "seed2"])
    for row in result["lengths"]:
        assert extent[row["length"]] == pytest.approx((row["loss"], row["loss"] + 0.05))
    assert legend[-1] == "band: lowest to highest seed", legend


def paper_inverse(dim: int, theta: float, scaling: str, s: float, trained: int) -> list[float]:
    """Each pair's inverse wavelength under a scaling, written from the papers, pair by pair, in float64."""
    out = []
    for i in range(dim // 2):
        base = theta ** (-2 * i / dim)
        if scaling == "pi":  # Chen et al.: position m -> m / s
            out.append(base / s)
        elif scaling == "ntk":  # bloc97: b' = b * s^(|D| / (|D| - 2))
            out.append((theta * s ** (dim / (dim - 2))) ** (-2 * i / dim))
        else:  # YaRN eq. 17-18: r = L / lambda, lambda = 2 pi / theta_d
            r = trained / (2 * math.pi / base)
            gamma = 0.0 if r < 1 else 1.0 if r > 32 else (r - 1) / 31
            out.append((1 - gamma) * base / s + gamma * base)
    return out


@pytest.mark.parametrize("scaling", ["pi", "ntk", "yarn"])
@pytest.mark.parametrize("dim, theta, s, trained", [(8, 10000.0, 4.0, 64), (32, 10000.0, 16.0, 1024),
                                                     (64, 500000.0, 8.0, 4096), (6, 100.0, 2.5, 37)])  # fmt: skip
def test_rope_scaling_turns_each_pair_by_the_published_formula(scaling, dim, theta, s, trained):
    want = torch.tensor(paper_inverse(dim, theta, scaling, s, trained), dtype=torch.float64)
    got, temperature = scaled(dim, theta, scaling, s, trained)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert temperature == (pytest.approx(0.1 * math.log(s) + 1) if scaling == "yarn" else 1.0)
    # the model's angles: cos and the signed sin of position x frequency, times YaRN's sqrt(1/t) on both
    positions = torch.tensor([0, 1, 5, trained - 1, 2 * trained + 3])
    cos, signed_sin = Rotary(dim, theta, scaling, s, trained).angles(positions)
    angle = positions.double()[:, None] * want.repeat(2)[None, :]
    sign = torch.tensor([-1.0] * (dim // 2) + [1.0] * (dim // 2), dtype=torch.float64)
    slack = angle.abs() * 1e-6 + 1e-6  # float32 angles: a few roundings of position x frequency
    assert ((cos.double() - angle.cos() * temperature).abs() <= slack).all()
    assert ((signed_sin.double() - angle.sin() * sign * temperature).abs() <= slack).all()
    if scaling == "ntk":  # the fastest pair keeps its frequency, the slowest is interpolated as PI's
        assert got[0] == 1.0 and got[-1] == pytest.approx(paper_inverse(dim, theta, "pi", s, trained)[-1])


@pytest.mark.parametrize("bad, message", [
    (dict(rope_scaling="yarm"), "model.rope_scaling='yarm'; choose one of: pi, ntk, yarn"),
    (dict(position="alibi", rope_scaling="pi", rope_factor=2.0), "but model.position=alibi turns nothing"),
    (dict(position="none", rope_scaling="ntk", rope_factor=2.0), "but model.position=none turns nothing"),
    (dict(rope_factor=2.0), "model.rope_factor=2.0 scales nothing without model.rope_scaling"),
    (dict(rope_scaling="pi", rope_factor=0.5), "model.rope_factor=0.5 must be a finite number of at least 1"),
    (dict(rope_scaling="pi", rope_factor=math.inf), "model.rope_factor=inf must be a finite number"),
    (dict(rope_scaling="yarn", rope_factor=2.0, rope_original_length=0), "model.rope_original_length=0 must be"),
    # accepted and the identity before (issue 60, item 2): each refused with its fix
    *((dict(rope_scaling=s), f"model.rope_scaling={s} at model.rope_factor=1 scales nothing") for s in ROPE_SCALINGS),
    (dict(rope_original_length=64), "model.rope_original_length=64 is the trained length YaRN counts each pair's "
                                    "turns over, but model.rope_scaling=null; set model.rope_scaling=yarn"),
    (dict(rope_scaling="pi", rope_factor=2.0, rope_original_length=64), "but model.rope_scaling=pi; set"),
    (dict(rope_theta=500.0, n_embd=4, n_head=2), "model.rope_theta=500 changes nothing: rotary turns one pair"),
    (dict(rope_scaling="ntk", rope_factor=2.0, rope_fraction=0.5, n_embd=8, n_head=2),
     "model.rope_scaling=ntk raises rotary's base, which changes nothing when rotary turns one pair of dims "
     "(model.rope_fraction=0.5 of the head's 4 dims)"),
])  # fmt: skip
def test_a_bad_rope_scaling_is_refused_in_one_line_naming_it(bad, message):
    with pytest.raises(ValueError) as err:
        GPT(config(**{"position": "rope", **bad}))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("typed", [dict(rope_original_length=64), dict(rope_scaling="yarn"),
                                   dict(rope_scaling="ntk", rope_factor=2.0)])
def test_a_rotary_scalings_refusal_gives_the_whole_fix_in_one_line(typed):
    """The newcomer's pass: model.rope_original_length=64 on the learned table said to set rope_scaling=yarn, which
    said to use rotary, which said the factor of 1 scales nothing. Each refusal's first fix, applied, now builds."""
    with pytest.raises(ValueError) as err:
        GPT(config(**{"position": "learned", **typed}))
    fix = str(err.value).split("; set ")[-1].split("; use ")[-1].split(", or ")[0]
    fixed = dict(typed)
    for setting in fix.split(" model.") if fix.startswith("model.") else []:
        key, value = setting.removeprefix("model.").split("=", 1)
        fixed[key] = 4.0 if value.startswith("<") else value
    assert fixed.get("position") == "rope", f"the fix {fix!r} names rotary positions"
    GPT(config(**fixed))


def test_evaluate_refuses_a_scaling_by_one_before_any_work(rope_run, data_cache):
    data = DataConfig(cache_dir=str(data_cache))
    with pytest.raises(ValueError, match=r"rope_scaling=yarn scales nothing where the longest length read, 32, is "
                                         r"the trained one: a factor of 1; read past the trained length"):
        evaluate.run(evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=["1x"], rope_scaling="yarn",
                                             data=data, out=str(rope_run / "eval-one.json")))  # fmt: skip
    assert not (rope_run / "eval-one.json").exists()


def test_evaluate_reads_a_rotary_model_scaled_and_names_the_scaling(rope_run, data_cache, capsys):
    data = DataConfig(cache_dir=str(data_cache))
    result = evaluate.run(evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=["1x", "4x"],
                                                  past_context="full", rope_scaling="yarn", data=data,
                                                  out=str(rope_run / "eval-yarn.json")))  # fmt: skip
    assert result["rope_scaling"] == "yarn" and result["rope_factor"] == 4.0, "the factor from the longest length"
    assert [row["rope_scaling"] for row in result["lengths"]] == ["yarn x4"] * 2
    assert "| 128 | 4x | chunks | full | yarn x4 |" in capsys.readouterr().out
    plain = evaluate.run(evaluate.EvaluateConfig(source=str(rope_run), device="cpu", lengths=["4x"], data=data,
                                                 past_context="full",
                                                 out=str(rope_run / "eval-plain.json")))  # fmt: skip
    assert plain["lengths"][0]["loss"] != result["lengths"][1]["loss"], "the scaling changed the function"


@pytest.mark.parametrize("position", ["rope", "learned"])
def test_a_finished_run_reads_its_final_model_past_its_length_as_evaluate_does(position, tmp_path, data_cache,
                                                                              log_lines):  # fmt: skip
    # trainer.eval_lengths: one file per protocol and rule, the rows evaluate.py computes on the last checkpoint
    # (a learned table's model: the lengths within it only, the rest skipped and said).
    run = tmp_path / "run"
    train(compose_train(*TINY, f"model.position={position}", "logger=none", f"trainer.run_dir={run}",
                        f"data.cache_dir={data_cache}", "trainer.eval_lengths=[1x,3x]",
                        "trainer.eval_protocols=[chunks,sliding]", "trainer.eval_past_contexts=[full]"))  # fmt: skip
    data = DataConfig(cache_dir=str(data_cache))
    for protocol in ("chunks", "sliding"):
        written = json.loads((run / f"eval-final-{protocol}-full.json").read_text())
        again = evaluate.run(evaluate.EvaluateConfig(source=str(run), device="cpu", data=data, protocol=protocol,
                                                     lengths=["1x", "3x"] if position == "rope" else ["1x"],
                                                     past_context="full",
                                                     out=str(tmp_path / f"again-{protocol}.json")))  # fmt: skip
        assert [r["length"] for r in written["lengths"]] == ([32, 96] if position == "rope" else [32])
        if position == "rope":  # the same stretch of text: the run's 8 windows x 96 tokens
            for mine, theirs in zip(written["lengths"], again["lengths"]):
                assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-6) and mine["protocol"] == protocol
        # a learned table's run reads the stretch a sweep's other runs read (8 x 96), within its rows
        assert written["lengths"][0]["tokens"] == 8 * 96
    skipped = [line for line in log_lines() if "trainer.eval_lengths: [96] skipped" in line]
    assert len(skipped) == (1 if position == "learned" else 0)


@pytest.mark.parametrize("override, message", [
    ("trainer.eval_lengths=[0]", "trainer.eval_lengths=[0]: 0 is not a length"),
    ("trainer.eval_lengths=[2y]", "trainer.eval_lengths=['2y']: '2y' is not a length"),
    ("trainer.eval_protocols=[strided]", "trainer.eval_protocols: protocol='strided'; choose one of: chunks, sliding"),
    ("trainer.eval_past_contexts=[]", "trainer.eval_past_contexts=[] must be a list of at least one"),
    ("trainer.eval_past_contexts=[fulll]", "trainer.eval_past_contexts: past_context='fulll'; choose one of"),
])  # fmt: skip
def test_a_bad_final_length_option_is_refused_before_any_work(override, message, tmp_path):
    from training.config import validate

    cfg = compose_train(*TINY, "trainer.eval_lengths=[1x,4x]", override)
    with pytest.raises(ValueError) as err:
        validate(OmegaConf.to_object(cfg))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_plan_prices_each_final_length_a_learned_table_only_within_it():
    # The manual kernel keeps each forward's attention matrices: at a fixed budget of tokens per forward (fewer
    # sequences as they grow) they grow with the length; a fused kernel's do not.
    from training.plan import eval_bytes, make_plan

    for position, kernel in (("rope", "manual"), ("rope", "sdpa"), ("learned", "sdpa")):
        cfg = OmegaConf.to_object(compose_train(*TINY, f"model.position={position}", f"kernel={kernel}",
                                                "model.vocab_size=257", "trainer.eval_lengths=[1x,4x,32x]"))
        plan = make_plan(cfg, cfg.model, 1, torch.float32)
        line = next(line for line in plan.text().splitlines() if "reading past the trained length" in line)
        assert plan.eval_lengths == ([32, 128, 1024] if position == "rope" else [32])
        assert ("1,024 tokens x 1" in line) == (position == "rope") and "32 tokens x 8" in line
        sizes = [eval_bytes(cfg.model, n, 8 * 32)[1] for n in (32, 1024)]
        assert (sizes[1] > 10 * sizes[0]) == (kernel == "manual"), sizes


def test_the_preset_sweeps_every_length_variant_each_the_model_it_names():
    from pathlib import Path

    from helpers import CONFIGS

    preset = OmegaConf.load(CONFIGS / "experiment" / "length_generalisation.yaml")
    swept = preset.hydra.sweeper.params.length_variant.split(",")
    assert sorted(swept) == sorted(p.stem for p in Path(CONFIGS / "length_variant").glob("*.yaml"))
    for variant in swept:
        model = OmegaConf.to_object(compose_train("experiment=length_generalisation", f"length_variant={variant}",
                                                  "model.vocab_size=257")).model  # fmt: skip
        layers = [(spec.position, spec.window, spec.rope_theta) for spec in model.layer_specs]
        assert model.block_size == 64 and model.n_layer == 4
        assert [spec.ssmax for spec in model.layer_specs] == [0.43 if variant == "none_ssmax" else None] * 4, variant
        expected = {"learned": [("learned", None, 1e4)] * 4, "rope": [("rope", None, 1e4)] * 4,
                    "alibi": [("alibi", None, 1e4)] * 4, "none": [("none", None, 1e4)] * 4,
                    "none_ssmax": [("none", None, 1e4)] * 4,
                    "window": [("rope", 16, 1e4)] * 4,
                    "gemma3": [("rope", 16, 1e4)] * 3 + [("rope", None, 1e6)]}[variant]  # fmt: skip
        assert layers == expected, variant


@pytest.mark.parametrize("variants, settings, entries", [
    (2, ["chunks, full", "chunks, ring", "sliding, full", "sliding, ring"], 2 + 2 + 2 + 1),  # compact
    (1, ["chunks, full", "chunks, ring"], 2 + 1),  # few curves: one entry each
    (2, ["chunks, full", "chunks, full, yarn x4", "chunks, ring", "sliding, ring"], 8 + 1),  # a scaling: each
])  # fmt: skip
def test_a_sweeps_length_legend_names_each_variant_protocol_and_rule_once_where_that_tells_every_curve(
        variants, settings, entries, tmp_path):  # fmt: skip
    from analysis.lengths import curve_style, legend
    from analysis.tables import pyplot

    curves = {f"variant{v} ({s})": {"block": 64, "loss": {64: 2.0, 128: 2.1}} for v in range(variants)
              for s in settings}  # fmt: skip
    fig, ax = pyplot().subplots()
    for name, curve in curves.items():
        ax.plot(list(curve["loss"]), list(curve["loss"].values()), label=name, **curve_style(name, curves))
    ax.axvline(64, label="block_size 64 (trained length)")
    legend(ax, curves)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    pyplot().close(fig)
    assert len(labels) == entries, labels
    if entries == 7:
        assert labels == ["variant0", "variant1", "protocol=chunks", "protocol=sliding", "past_context=full",
                          "past_context=ring", "block_size 64 (trained length)"]  # fmt: skip
