"""Every cell of the attention grid is the formula at every shape, not at a few chosen ones.

A cell is a layout x kernel x key/value heads (multi-head, grouped, multi-query) x window (none, shorter and
longer than many of the lengths). Each is held to the float64 formula (tests/attention_reference.py) over
sequence lengths from 1 to past FlexAttention's block size (128): odd, prime, just below, at and above it,
batch sizes 1 to 3, two head counts (4 of 16, 6 of 8), in training mode (forward and every gradient) and in
eval mode. Cached decoding (the eager step and the static step a CUDA graph replays, eager and compiled) is held
to a full recomputation from prompts of many lengths, past the window.

The default run holds every cell to a fixed sample of shapes; ``pytest --deep`` (CI runs it too) sweeps
every length from 1 to 40, then primes and block boundaries to 385, both head shapes and more windows. On a
CUDA machine every cell also runs there, flex with gradients.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from attention_reference import reference_attention
from helpers import tiny_gpt_config

from model import ATTENTION_LAYOUTS, GPT, KERNELS, KVCache, build_attention, kernels
from model.decoding import CompiledStep, StaticStep

LAYOUTS = sorted(ATTENTION_LAYOUTS)
KERNEL_NAMES = sorted(KERNELS)
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# n_head x head_dim, and each one's key/value heads: n_head, a divisor, 1.
HEAD_SHAPES = {"4x16": (4, 16, {"mha": 4, "gqa": 2, "mqa": 1}),
               "6x8": (6, 8, {"mha": 6, "gqa": 3, "mqa": 1})}  # fmt: skip
WINDOWS = {"full": None, "window5": 5, "window100": 100}  # 100: shorter than the long lengths, longer than most
# Primes, odd and even; 8 and 40 (where torch's CPU flex went wrong, 8 mod 16); below, at and past flex's block (128).
LENGTHS = [1, 2, 3, 5, 8, 13, 17, 40, 64, 127, 128, 129, 200]
# Every length to 40, then primes and the lengths around flex's blocks (128, 256, 384) to past three of them.
DEEP_LENGTHS = [*range(1, 41), 41, 43, 47, 53, 59, 61, 63, 64, 65, 67, 71, 79, 89, 97, 101, 113, 127, 128, 129, 131,
                137, 149, 157, 160, 191, 255, 256, 257, 263, 300, 383, 384, 385]  # fmt: skip
DEEP_WINDOWS = {"window1": 1, "window64": 64, "window129": 129}



def assert_near(got: torch.Tensor, want: torch.Tensor, what: str, scale: float | None = None) -> None:
    """float32 against the float64 formula: round-off, relative to ``scale`` (by default the tensor's own); a
    wrong mask or head moves values by their own size."""
    scale = 1.0 + (want.abs().max().item() if scale is None else scale)
    torch.testing.assert_close(got.double(), want.double(), atol=2e-5 * scale, rtol=1e-4,
                               msg=lambda m: f"{what}: {m}")  # fmt: skip


def flex_unavailable(device: str) -> str | None:
    """Why kernel=flex cannot run here (it must then be refused, saying so), or None."""
    return kernels.flex_unavailable(torch.device(device))


@pytest.fixture(autouse=True)
def many_models():
    # Dozens of models of different head counts in one process: each (heads, gqa) compiles flex once or twice.
    with torch._dynamo.config.patch(recompile_limit=64):
        yield


def cells(deep: bool):
    """Every layout x kernel x key/value heads x window; the default run gives each cell one of the two head
    shapes (alternating, so each layout x kernel meets both), ``--deep`` both."""
    windows = {**WINDOWS, **(DEEP_WINDOWS if deep else {})}
    shapes = list(HEAD_SHAPES.items())
    combos = itertools.product(LAYOUTS, KERNEL_NAMES, ("mha", "gqa", "mqa"), windows.items())
    for i, (layout, kernel, kv_name, (w_name, window)) in enumerate(combos):
        for shape, (n_head, head_dim, kvs) in shapes if deep else [shapes[i % 2]]:
            yield pytest.param(layout, kernel, n_head, head_dim, kvs[kv_name], window,
                               id=f"{layout}-{kernel}-{shape}-{kv_name}-{w_name}")  # fmt: skip


def pytest_generate_tests(metafunc):
    if "cell" in metafunc.fixturenames:
        deep = metafunc.config.getoption("--deep")
        metafunc.parametrize("cell", [p.values for p in cells(deep)], ids=[p.id for p in cells(deep)])


def seeded_block(layout, kernel, n_head, head_dim, n_kv, window, device, seed=0):
    block = build_attention(layout, n_head * head_dim, n_head, kernel, n_kv_head=n_kv, window=window).to(device)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():  # larger than the 0.02 init: sharp attention, so a wrong mask shows
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return block


def lengths(config) -> list[int]:
    return DEEP_LENGTHS if config.getoption("--deep") else LENGTHS


@pytest.mark.parametrize("device", DEVICES)
def test_every_cell_is_the_formula_at_every_length_in_training_and_eval(cell, device, request):
    layout, kernel, n_head, head_dim, n_kv, window = cell
    block = seeded_block(layout, kernel, n_head, head_dim, n_kv, window, device)
    C = n_head * head_dim
    if kernel == "flex" and flex_unavailable(device):
        with pytest.raises(ValueError, match="kernel=flex cannot run on this CPU"), torch.no_grad():
            block.eval()(torch.randn(1, 3, C, device=device))
        return
    grads = kernel != "flex" or device == "cuda"  # a CPU has no FlexAttention backward (torch 2.13)
    gen = torch.Generator(device=device).manual_seed(1)
    params = list(block.parameters())
    for i, T in enumerate(lengths(request.config)):
        B = 1 + i % 3
        x = torch.randn(B, T, C, device=device, generator=gen)
        where = f"T={T}, batch {B}"
        with torch.no_grad():
            expected = reference_attention(block, layout, x, n_head, n_kv, window)
            assert_near(block.eval()(x), expected, f"eval, {where}")
        block.train()  # dropout 0: the training path (sdpa's dropout argument, flex's) computes the same
        if not grads:
            with torch.no_grad():
                assert_near(block(x), expected, f"train, {where}")
            continue
        x.requires_grad_(True)
        out = block(x)
        assert_near(out, expected, f"train, {where}")
        weights = torch.randn(out.shape, device=device, generator=gen)
        got = torch.autograd.grad((out * weights).sum(), [x, *params])
        ref = reference_attention(block, layout, x, n_head, n_kv, window)
        want = torch.autograd.grad((ref * weights.double()).sum(), [x, *params])
        # One scale for every gradient: some are zero in exact arithmetic (a key bias shifts a whole row of scores,
        # which softmax ignores) and in float32 keep the round-off of the terms that cancel.
        scale = max(w.abs().max().item() for w in want)
        for (name, _), g, w in zip([("x", x), *block.named_parameters()], got, want):
            assert_near(g, w, f"d/d{name}, {where}", scale)


# Decoding: a tiny GPT whose context is short enough to decode to its end from every prompt length.
DECODE_BLOCK = 24
PROMPTS = [1, 2, 5, 8, 13, 23]
DEEP_PROMPTS = list(range(1, DECODE_BLOCK))
DECODE_WINDOWS = {"full": None, "window7": 7}
COMPILED_CELLS = [("fused_qkv", "sdpa", 2, 7)]


def decode_model(layout, kernel, n_kv, window, device) -> GPT:
    torch.manual_seed(0)
    config = tiny_gpt_config(vocab_size=64, block_size=DECODE_BLOCK, n_layer=2, n_head=4, n_embd=32, attention=layout,
                             kernel=kernel, n_kv_head=n_kv, window=window)  # fmt: skip
    model = GPT(config).to(device).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    return model


def decode_cells():
    for layout, kernel, n_kv, (w_name, window) in itertools.product(LAYOUTS, KERNEL_NAMES, (4, 2, 1),
                                                                    DECODE_WINDOWS.items()):  # fmt: skip
        yield pytest.param(layout, kernel, n_kv, window, id=f"{layout}-{kernel}-{n_kv}kv-{w_name}")


def assert_decodes_like_full_recomputation(model, make_step, prompts, device):
    """From each prompt length, fill the cache, then decode one position at a time to the end of the context;
    every step's logits must be those of the full sequence at that position."""
    gen = torch.Generator(device=device).manual_seed(2)
    for i, prompt in enumerate(prompts):
        B = 1 + i % 3
        idx = torch.randint(0, 64, (B, DECODE_BLOCK), device=device, generator=gen)
        with torch.inference_mode():
            full, _ = model(idx, idx)
            cache = KVCache(model.config.n_layer)
            first = model(idx[:, :prompt], cache=cache)[0][:, -1]
            torch.testing.assert_close(first, full[:, prompt - 1], atol=1e-4, rtol=0, msg=f"prompt {prompt}")
            step = make_step(model, cache, B)
            for t in range(prompt, DECODE_BLOCK):
                torch.testing.assert_close(step(idx[:, t : t + 1], t), full[:, t], atol=1e-4, rtol=0,
                                           msg=f"prompt {prompt}, position {t}")  # fmt: skip


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
@pytest.mark.parametrize("layout,kernel,n_kv,window", list(decode_cells()))
def test_cached_decoding_is_a_full_recomputation_from_every_prompt_length(layout, kernel, n_kv, window, static,
                                                                         device, request):  # fmt: skip
    if kernel == "flex" and flex_unavailable(device):
        pytest.skip(flex_unavailable(device))
    model = decode_model(layout, kernel, n_kv, window, device)

    def make_step(model, cache, batch):
        if static:
            return StaticStep(model, cache, batch, torch.device(device))
        return lambda tokens, t: model(tokens, cache=cache)[0][:, -1]

    prompts = DEEP_PROMPTS if request.config.getoption("--deep") else PROMPTS
    assert_decodes_like_full_recomputation(model, make_step, prompts, device)


DEEP_COMPILED_CELLS = [*(c for c in itertools.product(LAYOUTS, KERNEL_NAMES, (2,), (7,)) if c not in COMPILED_CELLS),
                       ("wrapper", "manual", 1, None)]  # fmt: skip


@pytest.mark.parametrize("layout,kernel,n_kv,window",
                         COMPILED_CELLS + [pytest.param(*c, marks=pytest.mark.deep) for c in DEEP_COMPILED_CELLS])
def test_the_compiled_static_step_is_a_full_recomputation(layout, kernel, n_kv, window):
    if kernel == "flex" and flex_unavailable("cpu"):
        pytest.skip(flex_unavailable("cpu"))
    model = decode_model(layout, kernel, n_kv, window, "cpu")
    assert_decodes_like_full_recomputation(
        model, lambda m, cache, batch: CompiledStep(m, cache, batch, torch.device("cpu")), [1, 5, 8], "cpu")
