"""sample.py: from a training checkpoint (any layout) or a GPT-2 folder, with clear errors."""

from __future__ import annotations

import os
import re

import pytest
import torch
from helpers import FLEX_ON_CPU_UNAVAILABLE, GPT2_LAYOUTS, run_script
from same_choices import Step, Trace, assert_same_choices, record_choices

import sample
from model import GPTConfig, generate
from model.checkpoints.pretrained import load_pretrained_gpt2


def config(**fields) -> sample.SampleConfig:
    return sample.SampleConfig(**{"max_new_tokens": 40, "device": "cpu", **fields})


def test_cli_samples_a_checkpoint_from_a_tiny_training_run(trained_run):
    result = run_script("sample.py", f"source={trained_run}", "prompt='import '", "max_new_tokens=30",
                        "num_samples=2", "seed=3", "device=cpu", cwd=trained_run, env=dict(os.environ))  # fmt: skip
    assert result.returncode == 0, result.stderr
    samples = result.stdout.split("--- sample ")[1:]
    assert len(samples) == 2
    for text in samples:
        body = text.split("---\n", 1)[1]
        assert body.startswith("import ") and len(body) > len("import ") + 5
    assert len(re.findall(r"tokens/s \(\w+-\w+, with KV cache, cpu, float32, 2 samples at once, eager decoding\)",
                          result.stderr)) == 1, "the rate, and what ran: layout-kernel, cache, device, dtype, batch"
    assert "first token after " in result.stderr, "the time to the first token apart from the decode rate"
    assert re.search(r"eager decoding\); memory bandwidth unknown for cpu: no share of its limit \([\d.]+ [kMG]?B "
                     r"read per step\)", result.stderr), "a CPU's bandwidth is not known: no share of it is invented"


@pytest.mark.parametrize("second,said_apart", [(0.02, False), (12.0, True)])
def test_a_first_decode_step_that_sets_up_is_said_apart_from_the_rate(second, said_apart, capsys):
    """(time, tokens) marks: start, first token at 0.1 s, the first decode step, then 18 more tokens in 0.2 s."""
    cfg = sample.SampleConfig(source="x", num_samples=1)
    marks = [(0.0, 0), (0.1, 1), (0.1 + second, 1), (0.3 + second, 18)]
    sample.report_speed(cfg, GPTConfig(n_layer=1, n_head=2, n_embd=8), 4, marks, torch.device("cpu"),
                        torch.float32, "compiled")  # fmt: skip
    line = capsys.readouterr().err
    assert ("the next after 12.00 s (setting up the decode step" in line) == said_apart
    assert ("then 18 tokens in 0.20 s: 90.0 tokens/s" if said_apart else "then 19 tokens in 0.22 s") in line


HYBRID = {"position": "none", "layer_pattern": "LG", "layer_kinds": {"L": {"attention": "gated_deltanet"}, "G": {}}}


@pytest.mark.parametrize("fields,kept", [({}, "with KV cache"),
                                         ({"attention": "gated_deltanet", "position": "none"}, "with recurrent state"),
                                         (HYBRID, "with KV cache and recurrent state")])  # fmt: skip
def test_the_speed_line_says_what_decoding_keeps_between_tokens(fields, kept, capsys):
    cfg = sample.SampleConfig(source="x", num_samples=1)
    marks = [(0.0, 0), (0.1, 1), (0.12, 1), (0.32, 18)]
    sample.report_speed(cfg, GPTConfig(n_layer=2, n_head=2, n_embd=8, **fields), 4, marks, torch.device("cpu"),
                        torch.float32, "eager")  # fmt: skip
    assert f", {kept}, cpu, float32, 1 sample at once, eager decoding)" in capsys.readouterr().err


def test_the_decode_rate_is_said_against_the_memory_bandwidth_limit(monkeypatch, capsys):
    """19 tokens after the first in 0.22 s at batch 1: the decode steps' contexts are 5 to 23 tokens (their mean 14),
    each position 64 bytes of cache (a key and a value of 8 float32 numbers, one layer)."""
    import model.decoding.steps

    monkeypatch.setattr(model.decoding.steps, "memory_bandwidth", lambda device: 4.8e12)
    monkeypatch.setattr(model.decoding.steps, "device_name", lambda device: "NVIDIA H200")
    cfg = sample.SampleConfig(source="x", num_samples=1)
    marks = [(0.0, 0), (0.1, 1), (0.12, 1), (0.32, 18)]
    sample.report_speed(cfg, GPTConfig(n_layer=1, n_head=2, n_embd=8), 4, marks, torch.device("cuda"),
                        torch.float32, "graph", weights=10**11)  # fmt: skip
    rate, limit = 19 / 0.22, 4.8e12 / (10**11 + 14 * 64)
    assert f"graph decoding); {rate / limit:.1%} of the memory-bandwidth limit ({limit:,.0f} tokens/s on NVIDIA " \
           f"H200 at 4.8 TB/s, 100.0 GB read per step)" in capsys.readouterr().err  # fmt: skip


def test_cli_reads_the_prompt_from_stdin(trained_run):
    result = run_script("sample.py", f"source={trained_run}", "prompt=-", "max_new_tokens=10", "device=cpu",
                        input="while True:", cwd=os.getcwd(), env=dict(os.environ))  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("while True:") and len(result.stdout) > len("while True:")


def test_a_checkpoint_trained_with_one_layout_samples_identically_with_every_other(trained_run, capsys,
                                                                                   monkeypatch):  # fmt: skip
    recorder = record_choices(monkeypatch)
    texts = []
    for layout in GPT2_LAYOUTS:
        for kernel in ("manual", "sdpa"):
            recorder.start()
            texts += sample.run(config(source=str(trained_run), prompt="def ", temperature=0.0, attention=layout,
                                       kernel=kernel))  # fmt: skip
    first, *others = recorder.traces
    for other in others:  # the same greedy choices, up to round-off near-ties
        assert_same_choices(other, first)
    assert texts[0].startswith("def ") and len(texts[0]) > len("def ") + 10


@pytest.mark.slow  # 10 s of compiling; test_decoding.py compiles decoding in the default tier
def test_compiled_sampling_of_a_batch_gives_the_eager_samples(trained_run, capsys, monkeypatch):
    recorder = record_choices(monkeypatch)
    settings = dict(source=str(trained_run), prompt="def ", num_samples=2, max_new_tokens=12, seed=2)
    recorder.start()
    eager = sample.run(config(**settings))
    recorder.start()
    compiled = sample.run(config(**settings, compile=True))
    assert len(compiled) == len(eager) == 2
    assert_same_choices(*recorder.traces[::-1])


def test_same_seed_same_text_with_and_without_the_cache(trained_run, capsys, monkeypatch):
    recorder = record_choices(monkeypatch)
    recorder.start()
    cached = sample.run(config(source=str(trained_run), seed=5, temperature=1.0, top_p=0.9))
    recorder.start()
    uncached = sample.run(config(source=str(trained_run), seed=5, temperature=1.0, top_p=0.9, use_cache=False))
    if not assert_same_choices(recorder.traces[1], recorder.traces[0]):
        assert uncached == cached, "the same choices make the same text"


def test_hub_path_matches_transformers_generate(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf_config = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=300, n_positions=64,
                                        bos_token_id=299, eos_token_id=299)  # fmt: skip
    hf = transformers.GPT2LMHeadModel(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(tmp_path / "gpt2-local")
    prompt = [5, 17, 42, 8]
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=25, do_sample=False, pad_token_id=299,
                      eos_token_id=None, output_logits=True, return_dict_in_generate=True)  # fmt: skip
    tokens = out.sequences[0, len(prompt):].tolist()
    theirs = Trace((0, None, 1.0), [Step(logits.float(), None, [t]) for logits, t in zip(out.logits, tokens)])
    recorder = record_choices(monkeypatch)
    for layout in ("wrapper", "fused_qkv"):
        ours = load_pretrained_gpt2(str(tmp_path / "gpt2-local"), attention=layout).eval()
        recorder.start()
        list(generate(ours, prompt, 25, temperature=0))
        assert_same_choices(recorder.traces[-1], theirs)


def test_hub_model_offline_is_a_clear_error():
    with pytest.raises(RuntimeError, match="could not get 'gpt2-medium' from the Hugging Face hub"):
        load_pretrained_gpt2("gpt2-medium")


def test_missing_checkpoint_is_named_with_every_kind_of_source(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        sample.run(config(source=str(tmp_path / "nothing-here")))
    assert str(err.value) == (f"no checkpoint at '{tmp_path / 'nothing-here'}': give a run directory holding last.pt, "
                              f"a checkpoint file (.pt), a GPT-2 name (gpt2, gpt2-medium, gpt2-large, gpt2-xl: from "
                              f"the Hugging Face hub, or its cache offline) or a Hugging Face folder (config.json and "
                              f"model.safetensors, as save_pretrained or export.py writes them)")  # fmt: skip
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileNotFoundError, match=r"\(a folder holding notes.txt\): give a run directory"):
        sample.run(config(source=str(tmp_path)))


def test_corrupt_checkpoint_is_refused(tmp_path):
    (tmp_path / "last.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="is not a readable headlab checkpoint"):
        sample.run(config(source=str(tmp_path)))


def test_checkpoint_whose_config_does_not_match_its_weights_is_refused(trained_run, tmp_path):
    ckpt = torch.load(trained_run / "last.pt", weights_only=True)
    ckpt["model_config"]["n_embd"] = 64
    torch.save(ckpt, tmp_path / "edited.pt")
    with pytest.raises(ValueError, match="weights do not match its own config.*transformer.wte.weight"):
        sample.run(config(source=str(tmp_path / "edited.pt")))


def test_prompt_notices_and_clamps(trained_run, capsys):
    long_prompt = "x = 1\n" * 20  # 120 byte tokens > block_size 32
    text = sample.run(config(source=str(trained_run), prompt=long_prompt, max_new_tokens=5, top_k=10_000))[0]
    err = capsys.readouterr().err
    assert "the prompt has 120 tokens, more than block_size=32: kept its last 32" in err
    assert "top_k=10000 is larger than the vocabulary (257): no limit" in err
    assert text.startswith(long_prompt[-32:])
    sample.run(config(source=str(trained_run), prompt="", max_new_tokens=5))
    assert "empty prompt: starting from <|endoftext|>" in capsys.readouterr().err


@pytest.mark.parametrize("top_p", [0.0, 1.5])
def test_top_p_outside_the_unit_interval_is_refused(trained_run, top_p):
    with pytest.raises(ValueError, match=f"top_p={top_p} must be in \\(0, 1\\]"):
        sample.run(config(source=str(trained_run), top_p=top_p))


def test_prompt_from_a_file(trained_run, tmp_path, capsys):
    (tmp_path / "prompt.txt").write_text("class ")
    text = sample.run(config(source=str(trained_run), prompt_file=str(tmp_path / "prompt.txt"), max_new_tokens=5))
    assert text[0].startswith("class ")


@pytest.mark.slow
def test_flex_sampling_says_once_that_it_compiles_before_its_first_token(trained_run):
    """FlexAttention compiles on the prompt's pass (seconds on a CPU): said once, before the wait; not for sdpa."""
    if FLEX_ON_CPU_UNAVAILABLE:
        pytest.skip(FLEX_ON_CPU_UNAVAILABLE)
    lines = {}
    for kernel in ("flex", "sdpa"):
        result = run_script("sample.py", f"source={trained_run}", f"kernel={kernel}", "prompt=def f",
                            "max_new_tokens=3", "device=cpu", cwd=os.getcwd(), env=dict(os.environ))  # fmt: skip
        assert result.returncode == 0, result.stderr
        lines[kernel] = result.stderr.splitlines()
    notice = "[sample] kernel=flex: compiling the kernel"
    said = [i for i, line in enumerate(lines["flex"]) if line.startswith(notice)]
    first_token = next(i for i, line in enumerate(lines["flex"]) if "first token after" in line)
    assert len(said) == 1 and said[0] < first_token, lines["flex"]
    assert not any("compiling the kernel" in line for line in lines["sdpa"])


def test_a_rate_taken_on_a_busy_machine_says_so_and_what_to_do(capsys):
    """Issue 51, item 11: on a busy 2-core machine torch's two threads ran sampling 2-18x slower than one."""
    from common.machine_load import busy_cores, cores

    cfg = sample.SampleConfig(source="x", num_samples=1)
    marks = [(0.0, 0), (0.1, 1), (0.12, 1), (0.32, 18)]
    for others in (busy_cores() + 0.2, busy_cores() / 2, None):
        sample.report_speed(cfg, GPTConfig(n_layer=1, n_head=2, n_embd=8), 4, marks, torch.device("cpu"),
                            torch.float32, "eager", others=others)  # fmt: skip
        line = capsys.readouterr().err
        busy = others is not None and others >= busy_cores()
        said = f"(the machine was busy: other processes used {others or 0:.1f} of {cores()} cores, so this rate is " \
               f"not the model's"  # fmt: skip
        assert (said in line) == busy, line
        assert ("OMP_NUM_THREADS=1" in line) == (busy and torch.get_num_threads() > 1), line
