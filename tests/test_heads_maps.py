"""heads.py's enlarged map (one head shown large) carries the text it shows: its tokens on both axes, and a title
naming the layer, the head and the text (the prompt, or the validation tokens)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
import torch

import heads
from analysis.head_plots import single_map_figure, token_label
from data.config import DataConfig
from data.tokenizers import get_tokenizer

PROMPT = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)"  # 62 bytes tokens


def causal_map(n: int) -> torch.Tensor:
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.softmax(torch.randn(n, n).masked_fill(future, float("-inf")), -1)


def tick_texts(ax, axis: str) -> list[str]:
    return [t.get_text() for t in getattr(ax, f"get_{axis}ticklabels")()]


@pytest.fixture
def figure():
    made = []
    yield lambda *args: made.append(single_map_figure(*args)) or made[-1]
    for fig in made:
        plt.close(fig)


def test_the_enlarged_map_of_a_prompt_carries_every_token_on_both_axes(figure):
    labels = [token_label(c) for c in PROMPT]
    fig = figure(causal_map(len(labels)), labels, "layer 1, head 1 of run\nthe prompt (62 tokens): def fib(n):⏎")
    ax = fig.axes[0]
    assert tick_texts(ax, "x") == labels and tick_texts(ax, "y") == labels
    assert ax.get_title() == "layer 1, head 1 of run\nthe prompt (62 tokens): def fib(n):⏎"


def test_a_long_text_labels_every_kth_token_with_its_position(figure):
    labels = [token_label(c) for c in (PROMPT * 4)[:200]]
    ax = figure(causal_map(200), labels, "t").axes[0]
    shown = tick_texts(ax, "y")
    assert shown == tick_texts(ax, "x") and 30 <= len(shown) <= 50
    step = int(shown[1].split(" ")[0])
    assert shown == [f"{i} {labels[i]}" for i in range(0, 200, step)]


def caption(prompt: str | None, n_ids: int, block_size: int) -> str:
    tokenizer = get_tokenizer("bytes")
    cfg = heads.HeadsConfig(source="x", prompt=prompt, data=DataConfig(name="pystdlib"))
    ids = tokenizer.encode(prompt)[-block_size:] if prompt is not None else tokenizer.encode("from os import path")
    return heads.map_text_caption(cfg, ids[:n_ids], tokenizer, block_size)


def test_the_caption_names_the_text_the_maps_show():
    assert caption(PROMPT, 62, 64) == f"the prompt (62 tokens): {PROMPT.replace(chr(10), '⏎')}"
    assert caption(PROMPT, 32, 32) == f"the prompt's last 32 tokens (block_size=32): {PROMPT[-32:]}"
    assert caption(None, 9, 64) == "the first 9 validation tokens of data=pystdlib: from os i"
    assert caption("x" * 300, 256, 256).endswith("x" * 98 + "…"), "a long text is cut, on one line"


def test_heads_run_writes_the_enlarged_map_of_a_prompt_longer_than_a_block(trained_run, data_cache, tmp_path):
    out = heads.run(heads.HeadsConfig(source=str(trained_run), prompt=PROMPT, windows=2, device="cpu", layer=0,
                                      head=1, data=DataConfig(cache_dir=str(data_cache)), out=str(tmp_path)))
    assert (out / "head_L0_H1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
