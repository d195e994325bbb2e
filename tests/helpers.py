"""Shared by the training tests: compose configs like train.py does, and read run outputs."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from warm_python import run_python

import training.config  # noqa: F401  (registers the config schema)
from model import KERNELS, GPTConfig
from model.attention.kernels import flex_unavailable
from model.checkpoints.convert import same_function_layouts
from model.registry import canonical_layout

ROOT = Path(__file__).resolve().parents[1]
# The layouts of GPT-2's function (the canonical layout's: fused_qkv, separate_qkv, wrapper), from the registry.
GPT2_LAYOUTS = same_function_layouts(canonical_layout())
CONFIGS = ROOT / "configs"

# The kernels that train on a CPU: FlexAttention runs only its forward there (torch 2.13), compiled
# (seconds per shape); test_attention_properties.py holds it to the formula.
CPU_KERNELS = sorted(k for k in KERNELS if k != "flex")
# Why flex cannot run on this CPU (no AVX2: ATEN_CPU_CAPABILITY=default), or None; tests of flex skip with it.
FLEX_ON_CPU_UNAVAILABLE = flex_unavailable(torch.device("cpu"))

# A process id no process can have: above Linux's largest pid_max (2^22), as a killed writer's leftover names it.
DEAD_PID = 2**22 + 1

# A model and schedule small enough to train for real in about a second on a CPU.
TINY = [
    "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.block_size=32",
    "trainer.batch_size=8", "trainer.micro_batch_size=8", "trainer.max_steps=20",
    "trainer.eval_interval=10", "trainer.checkpoint_interval=10", "trainer.eval_windows=8",
    "trainer.sample_tokens=0", "trainer.device=cpu", "optim.warmup_steps=2", "optim.lr=3e-3",
]  # fmt: skip


def as_if_quiet(run_dir: Path) -> Path:
    """The run's metrics without the load its machine recorded (``perf/others_cores``): a report over it judges
    what a test set up, not how busy the suite's own workers kept the machine while the run trained."""
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    for record in records:
        record.pop("perf/others_cores", None)
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


def tiny_gpt_config(**overrides) -> GPTConfig:
    """The shared tiny model (vocab 50, 8 positions, 1 layer, 2 heads, width 16); tests override what they need."""
    fields = dict(vocab_size=50, block_size=8, n_layer=1, n_head=2, n_embd=16)
    return GPTConfig(**{**fields, **overrides})


def random_block(layout: str, kernel: str, scale: float, seed: int = 0, **options):
    """An attention block of width 32 with 4 heads (block size 64), in eval mode, every parameter drawn from
    N(0, scale^2) for ``seed``: weights well away from the init's, so what a test compares is not a near-tie."""
    from model import build_attention

    block = build_attention(layout, 32, 4, kernel, block_size=64, **options).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return block


def sharp_gpt(seed: int = 1, **overrides):
    """A tiny GPT in eval mode whose matrices are scaled 8x: sharper logits than the 0.02 init, so the
    choices tests compare across code paths are not near-ties."""
    import torch

    from model import GPT

    torch.manual_seed(seed)
    model = GPT(tiny_gpt_config(**overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(8.0 if p.dim() > 1 else 1.0)
    return model


def assert_steps_are_a_full_forward(model, idx: torch.Tensor, prompt: int, make_step, atol: float):
    """Prefill a fresh KV cache with ``idx``'s first ``prompt`` positions, then decode the rest one position at a time
    with ``make_step(model, cache)`` (a static, warmed-up or graphed step): each position's logits must be those of a
    full forward over ``idx``. Returns the cache."""
    from model import KVCache

    with torch.inference_mode():
        full, _ = model(idx, idx)
        cache = KVCache(model.config.n_layer)
        model(idx[:, :prompt], cache=cache)
        step = make_step(model, cache)
        for t in range(prompt, idx.size(1)):
            torch.testing.assert_close(step(idx[:, t : t + 1], t), full[:, t], rtol=0, atol=atol, msg=f"position {t}")
    return cache


def save_tiny_hf_gpt2(folder: Path, n_layer: int = 2, n_positions: int = 64, seed: int = 0):
    """A small transformers GPT2LMHeadModel (GPT-2's vocabulary) written with save_pretrained."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=n_layer, n_head=2, n_embd=32, n_positions=n_positions)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(folder)
    return model


def write_text_corpus(folder: Path, n_docs: int, text: str) -> Path:
    """``n_docs`` text files, ``text`` formatted with the document's number ({i})."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n_docs):
        (folder / f"{i:03d}.txt").write_text(text.format(i=i))
    return folder


def compose_train(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def tiny_run(run: Path, data_cache: Path, *overrides: str) -> Path:
    """A real (tiny) training run in ``run``, without wandb, on the session's prepared data: a fixture's
    checkpoint."""
    from training.loop import train

    train(compose_train(*TINY, "logger=none", *overrides, f"trainer.run_dir={run}", f"data.cache_dir={data_cache}"))
    return run


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def train_losses(run_dir: Path) -> dict[int, float]:
    return {m["step"]: m["train/loss"] for m in read_metrics(run_dir) if "train/loss" in m}


def run_cli(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python train.py *args`` in a process of its own (forked from the warm interpreter: tests/warm_python.py)."""
    return run_python([str(ROOT / "train.py"), *args], cwd=cwd, env=env, timeout=timeout)


def user_env(**changes: str) -> dict[str, str]:
    """The environment a user's shell gives a script: without the suite's HYDRA_FULL_ERROR=1, so errors are the
    lines a user sees; plus ``changes``."""
    return {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}, **changes}


def run_script(script: str, *args: str, cwd: Path = ROOT, env: dict | None = None, input: str | None = None,
               timeout: int = 300, umask: int | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """``python <script> *args`` (a file of the project, or ``-m data``) as a user runs it (``user_env`` unless
    ``env`` is given), in a process of its own forked from the warm interpreter (tests/warm_python.py)."""
    target = ["-m", *script.split()[1:]] if script.startswith("-m ") else [str(ROOT / script)]
    return run_python([*target, *args], cwd=cwd, env=user_env() if env is None else env, input=input,
                      timeout=timeout, umask=umask)  # fmt: skip


def assert_chunked_form_is_the_recurrence(chunked, recurrent, inputs: list, chunk: int, where: str) -> None:
    """A delta rule's chunked form against its float64 step-by-step recurrence on ``inputs`` (queries, keys, values,
    log decays, betas, a starting state or None): the outputs, the final state and every input's gradient."""
    import torch

    got = chunked(*inputs[:5], chunk, inputs[5])
    want = recurrent(*inputs)
    for g, w, what in zip(got, want, ("outputs", "state")):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-10, msg=f"{what}: {where}")
    weights = [torch.randn_like(t) for t in want]
    leaves = [t for t in inputs if t is not None]
    got_grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, weights)), leaves)
    want_grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(want, weights)), leaves)
    for name, g, w in zip("q k v log_decay beta state".split(), got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-9, msg=f"d{name}: {where}")


def random_linear_layer(layout: str, n_embd: int, n_head: int, seed: int, **options):
    """A linear-attention layer (gated_deltanet, kda) with ``options`` in float64 and eval mode, every parameter drawn
    anew for ``seed`` (matrices N(0, 0.3^2), vectors N(0, 0.5^2)): far from the init, so a wrong formula shows."""
    import torch

    from model import build_attention

    block = build_attention(layout, n_embd, n_head, "sdpa", position="none", **options).double().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * (0.3 if p.dim() > 1 else 0.5))
    return block


def assert_layer_is_its_formula(block, reference, lengths) -> None:
    """``block`` against ``reference(block, x)`` (its paper's formula in float64) at each of ``lengths``: the outputs,
    and the gradient of every parameter."""
    import torch

    for T in lengths:
        x = torch.randn(2, T, block.spec.n_embd, dtype=torch.float64, generator=torch.Generator().manual_seed(T))
        got, want = block(x), reference(block, x)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10, msg=f"T={T}")
        params, weight = dict(block.named_parameters()), torch.randn_like(got)
        for name, g, w in zip(params, torch.autograd.grad((got * weight).sum(), list(params.values())),
                              torch.autograd.grad((want * weight).sum(), list(params.values()))):  # fmt: skip
            torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-9, msg=f"d{name}: T={T}")



def compare_output_and_gradients(failures, block, x, want, gen) -> None:
    """A block against its float64 formula's output ``want`` at ``x`` (requires grad), in training mode: the output, and
    the gradients of the input and every parameter under one random weighting of the outputs, each within 1e-5 of the
    largest, recorded in ``failures`` (``CellFailures``). A parameter the formula never reads (a compressor before
    any complete block) has the gradient 0."""
    import torch

    got = block.train()(x)
    failures.compare(got, want, 1e-5 * want.abs().max().item(), 0, "output")
    weights = torch.randn(got.shape, generator=gen, dtype=torch.float64)
    params = list(block.parameters())
    mine = torch.autograd.grad((got * weights).sum(), [x, *params])
    theirs = torch.autograd.grad((want * weights).sum(), [x, *params], allow_unused=True)
    theirs = [torch.zeros_like(p) if g is None else g for p, g in zip([x, *params], theirs)]
    scale = max(w.abs().max().item() for w in theirs)
    names = ["x", *(name for name, _ in block.named_parameters())]
    for name, g, w in zip(names, mine, theirs):
        failures.compare(g, w, 1e-5 * scale, 0, f"d/d{name}")


# The block selections' decoding cells (MoBA, NSA, DeepSeek's sparse and compressed attention): the eager step in the
# README's tier, the static step (a whole cache's buffers, empty slots at negative positions) in the slow tier, which
# CI runs after it
SELECTION_STEPS = [False, pytest.param(True, marks=pytest.mark.slow)]

def assert_decodes_as_the_full_forward(gpt, static: bool, total: int = 29) -> None:
    """Block selections' decoding (MoBA's means, NSA's compressed blocks, both from the cache's keys): each decoded
    position's logits are the full forward's, from every prompt length to past block_size (prompts 1 to 19, every
    third; every sixth for static steps), in batches of 1-3, with an end of text in each prompt (a document boundary
    where documents are masked). The full forward is one over the whole sequence (every position's logits; each
    query sees its last block_size keys, as the ring holds them)."""
    import torch

    from model import KVCache
    from model.decoding.steps import StaticStep

    gen = torch.Generator().manual_seed(2)
    for prompt in range(1, 20, 3 if not static else 6):
        B = 1 + prompt % 3
        idx = torch.randint(0, gpt.config.vocab_size, (B, total), generator=gen)
        idx[:, prompt // 2] = 0
        with torch.inference_mode():
            cache = KVCache(gpt.config.n_layer)
            full = gpt(idx, idx)[0]  # (B, total, vocab)
            first = gpt(idx[:, :prompt], cache=cache)[0][:, -1]
            torch.testing.assert_close(first, full[:, prompt - 1], rtol=1e-9, atol=1e-9)
            step = StaticStep(gpt, cache, B, torch.device("cpu")) if static else None
            for t in range(prompt, total):
                got = step(idx[:, t : t + 1], t) if static else gpt(idx[:, t : t + 1], cache=cache)[0][:, -1]
                torch.testing.assert_close(got, full[:, t], rtol=1e-9, atol=1e-9, msg=f"prompt {prompt}, position {t}")


def assert_converts_exactly(a, b, src: str, dst: str) -> None:
    """Two GPTs of one seed in layouts ``src`` and ``dst``: they drew the same weights (``a``'s state dict converted
    is ``b``'s, and back is ``a``'s, bit for bit), and once ``a``'s weights move away from the init (every weight
    matters), ``b`` loading them converted computes ``a``'s logits."""
    import torch

    from model import convert_attention_layout

    n_head = a.config.n_head
    there = convert_attention_layout(a.state_dict(), src, dst, n_head=n_head)
    assert there.keys() == b.state_dict().keys()
    assert all(torch.equal(there[k], b.state_dict()[k]) for k in there)
    back = convert_attention_layout(there, dst, src, n_head=n_head)
    assert all(torch.equal(back[k], a.state_dict()[k]) for k in back)
    idx = torch.randint(0, a.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        for p in a.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        b.load_state_dict(convert_attention_layout(a.state_dict(), src, dst, n_head=n_head))
        torch.testing.assert_close(b(idx)[0], a(idx)[0], atol=1e-5, rtol=0)


def unambiguous_input(block, shape: tuple, gen, smallest_gap, ranked: str):
    """A float64 input (requires grad) on which a block selection's ranking has no near-tie: ``smallest_gap(block,
    x)``, the smallest difference between two of ``ranked`` a query ranks relative to the largest, above 1e-5 (the
    float32 block's round-off must not reorder them against the float64 formula). Ten draws at most."""
    import torch

    for _ in range(10):
        x = torch.randn(shape, generator=gen, dtype=torch.float64, requires_grad=True)
        with torch.no_grad():
            if smallest_gap(block, x.detach()) > 1e-5:
                return x
    raise AssertionError(f"no input without a near-tie of {ranked} in 10 draws")
