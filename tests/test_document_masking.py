"""model.document_masking: in a packed window each token attends only within its own document (a document ends with
the end-of-text token). Held to the property that defines it: with relative positions (rope, none) every document
of a packed window computes what it computes alone, in every layout and kernel, at many lengths and boundaries; with
learned positions nothing of another document reaches a token. Cached decoding, with documents ending in the prompt
and in the continuation, equals the full forward (eager and static steps, a ring past block_size). Every bad value
is refused in one line."""

from __future__ import annotations

import pytest
import torch
from helpers import TINY, compose_train, read_metrics, write_text_corpus

from model import GPT, GPTConfig, KVCache
from model.attention.kernels import flex_unavailable
from model.decoding.steps import StaticStep
from training.loop import train

END = 0  # the end-of-text token of these tests' vocabulary
LAYERS = [("fused_qkv", {}), ("separate_qkv", {}), ("wrapper", {"n_kv_head": 1}), ("mla", {"kv_latent": 8}),
          ("fused_qkv", {"differential": True}),
          ("fused_qkv", {"sinks": True, "qk_norm": True, "forget_gate": True})]  # the token bias: within its document


def model(kernel: str = "sdpa", attention: str = "fused_qkv", position: str = "rope", block_size: int = 48,
          seed: int = 0, **fields) -> GPT:  # fmt: skip
    torch.manual_seed(seed)
    if attention == "mla" and position == "rope":
        fields = {"rope_head_dim": 4, **fields}
    config = GPTConfig(vocab_size=50, block_size=block_size, n_layer=2, n_head=4, n_embd=32, attention=attention,
                       kernel=kernel, position=position, document_masking=True, document_end=END, **fields)  # fmt: skip
    gpt = GPT(config).eval()
    with torch.no_grad():
        for p in gpt.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)  # sharp: a key seen across a boundary would show
    return gpt


def packed(rows: int, length: int, seed: int) -> torch.Tensor:
    """Random tokens with ends of text at random places (some rows none, some several, one at the very start)."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(1, 50, (rows, length), generator=gen)
    for row in range(rows):
        for _ in range(row % 3 + (length > 8)):
            idx[row, torch.randint(0, length, (1,), generator=gen)] = END
    return idx


def documents(row: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each document in a row of tokens: an end-of-text token closes its own."""
    bounds, start = [], 0
    for i, token in enumerate(row.tolist()):
        if token == END:
            bounds.append((start, i + 1))
            start = i + 1
    return bounds + ([(start, len(row))] if start < len(row) else [])


def assert_each_document_as_alone(gpt: GPT, idx: torch.Tensor, atol: float = 2e-5) -> int:
    """Every document's logits in the packed rows equal the document's own forward (relative positions: its place in
    the window does not matter); returns how many documents were compared."""
    with torch.no_grad():
        full = gpt(idx, idx)[0]
        compared = 0
        for row in range(idx.size(0)):
            for start, end in documents(idx[row]):
                alone = gpt(idx[row : row + 1, start:end], idx[row : row + 1, start:end])[0][0]
                torch.testing.assert_close(full[row, start:end], alone, atol=atol, rtol=0,
                                           msg=f"row {row}, document {start}..{end}")  # fmt: skip
                compared += 1
    return compared


@pytest.mark.parametrize("attention,fields", LAYERS)
@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
def test_every_document_of_a_packed_window_computes_what_it_computes_alone(kernel, attention, fields):
    compared = 0
    for length in (1, 2, 5, 8, 13, 31, 48):  # to the context, odd and prime lengths, a boundary at every place
        compared += assert_each_document_as_alone(model(kernel, attention, **fields), packed(3, length, seed=length))
    assert compared > 21, "documents were split"


@pytest.mark.skipif(flex_unavailable(torch.device("cpu")) is not None, reason="flex needs AVX2 or AVX-512")
@pytest.mark.slow  # flex compiles graphs of its own (12-16 s on a fresh 2-core machine)
@pytest.mark.parametrize("fields", [{}, {"sinks": True}])
def test_flex_hides_other_documents_too(fields):
    """A CPU's flex (forward only): the documents in its score_mod (torch 2.13's CPU template cannot compile a block
    mask that reads them; a GPU's block mask does, tests/test_cuda.py); padded to flex's block of 128."""
    assert assert_each_document_as_alone(model("flex", **fields), packed(3, 37, seed=1)) > 4


@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
def test_with_learned_positions_nothing_of_another_document_reaches_a_token_forward_or_backward(kernel):
    gpt = model(kernel, position="learned")
    idx = torch.randint(1, 50, (2, 40), generator=torch.Generator().manual_seed(3))
    idx[:, 17] = END  # two documents per row: 0..17 and 18..39
    changed = idx.clone()
    changed[:, :17] = torch.randint(1, 50, (2, 17), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        a, b = gpt(idx, idx)[0], gpt(changed, changed)[0]
    torch.testing.assert_close(a[:, 18:], b[:, 18:], atol=1e-5, rtol=0)
    assert (a[:, :17] - b[:, :17]).abs().max() > 1e-2, "the first documents did change"
    gpt.train()
    x = gpt.transformer.wte(idx).detach().requires_grad_()  # the embeddings' gradient from the second document alone
    hidden = x + gpt.transformer.wpe.to_add(torch.arange(40))
    starts = gpt.document_starts(idx, torch.arange(40), None)
    for block in gpt.transformer.h:
        hidden = block(hidden, torch.arange(40), None, starts)
    hidden[:, 18:].sum().backward()
    assert not x.grad[:, :18].any(), "no gradient crosses a boundary"


@pytest.mark.parametrize("attention,fields", LAYERS)
@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
def test_positions_restarted_per_document_make_each_document_compute_what_it_computes_alone(kernel, attention, fields):
    """model.document_positions: the learned table reads each token's place in its document, so with learned
    positions too a document of a packed window computes what it computes alone (without it, its place in the
    window shows: the property fails)."""
    compared = 0
    for length in (1, 2, 5, 8, 13, 31, 48):
        gpt = model(kernel, attention, position="learned", document_positions=True, **fields)
        compared += assert_each_document_as_alone(gpt, packed(3, length, seed=length))
    assert compared > 21, "documents were split"
    unrestarted = model(kernel, attention, position="learned", **fields)
    with pytest.raises(AssertionError):
        assert_each_document_as_alone(unrestarted, packed(3, 31, seed=31))


def test_the_kernels_compute_one_function_with_gradients():
    idx = packed(3, 40, seed=5)
    grads = {}
    for kernel in ("manual", "sdpa"):
        gpt = model(kernel, position="learned").train()
        gpt(idx, idx)[1].backward()
        grads[kernel] = {name: p.grad for name, p in gpt.named_parameters()}
    for name, g in grads["manual"].items():
        torch.testing.assert_close(grads["sdpa"][name], g, atol=1e-4, rtol=1e-4, msg=name)


@pytest.mark.parametrize("position,static", [("rope", False), ("rope", True), ("learned", False), ("learned", True),
                                             ("docpos", False), ("docpos", True)])  # fmt: skip
def test_cached_decoding_is_the_full_forward_with_documents_ending_anywhere(position, static):
    """Prompts that end documents, continuations that end more; rope's ring wraps past block_size (16); docpos: the
    learned table read from each document's start (the cache carries where the next token's document starts)."""
    restart = position == "docpos"
    gpt = model("sdpa", position="learned" if restart else position, block_size=16, document_positions=restart)
    position = "learned" if restart else position
    length = 16 if position == "learned" else 40
    idx = packed(2, length, seed=7)
    idx[0, 5], idx[1, 11], idx[1, length - 4] = END, END, END
    with torch.inference_mode():
        full = gpt(idx, idx)[0]
        for prompt in (1, 4, 6, 12, 15):
            cache = KVCache(gpt.config.n_layer)
            first = gpt(idx[:, :prompt], cache=cache)[0][:, -1]
            torch.testing.assert_close(first, full[:, prompt - 1], atol=1e-4, rtol=0)
            step = StaticStep(gpt, cache, 2, torch.device("cpu")) if static else (
                lambda tokens, t, cache=cache: gpt(tokens, cache=cache)[0][:, -1])  # fmt: skip
            for t in range(prompt, length):
                torch.testing.assert_close(step(idx[:, t : t + 1], t), full[:, t], atol=1e-4, rtol=0,
                                           msg=f"prompt {prompt}, position {t}")  # fmt: skip


def test_a_reused_cache_starts_with_one_document():
    gpt = model("sdpa")
    idx = torch.tensor([[3, 4, END, 5, 6]])
    with torch.inference_mode():
        cache = KVCache(gpt.config.n_layer)
        gpt(idx, cache=cache)
        assert cache.document_starts.tolist() == [3]
        cache.reset()
        again = gpt(idx[:, 3:], cache=cache)[0][:, -1]
        torch.testing.assert_close(again, gpt(idx[:, 3:])[0][:, -1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("fields,says", [
    ({"attention": "gated_deltanet", "position": "none"},
     r"^model.document_masking=true with attention=gated_deltanet in every layer: its state carries every earlier "
     r"token past a document's end .*; set model.document_masking=false, or give it to softmax attention \(another "
     r"model.attention, in every layer\)$"),
    ({"attention": "mla", "kv_latent": 8, "position": "none", "n_layer": 2, "layer_pattern": "KM",
      "layer_kinds": {"K": {"attention": "kda", "kv_latent": None}, "M": {}}},  # Kimi Linear: no kind is spared it
     r"^model.document_masking=true reaches layer kind K \(layer 0\), attention=kda, which cannot apply it: .*; it "
     r"is a setting of the whole model, so set model.document_masking=false, or a schedule without linear layers$"),
    ({"document_masking": False}, r"^model.document_end=0 is document masking's end-of-text token, but "
                                  r"model.document_masking=false; set model.document_masking=true, or "
                                  r"model.document_end=null$"),
    ({"document_end": 50}, r"^model.document_end=50 must be a token id of the vocabulary \(0 to 49\): the token "
                           r"that ends a document"),
    # before the tokenizer says the vocabulary's size (issue 60, item 7: it said "0 to 0")
    ({"document_end": -1, "vocab_size": None}, r"^model.document_end=-1 must be a token id of the vocabulary \(0 or "
                                               r"more, below the tokenizer's vocabulary size\): the token that ends"),
    ({"document_positions": True, "document_masking": False, "document_end": None},
     r"^model.document_positions=true counts each token's position from its document's start, which document "
     r"masking finds; set model.document_masking=true, or model.document_positions=false$"),
    ({"document_positions": True, "position": "rope"},
     r"^model.document_positions=true restarts an absolute position table at each document, but model.position=rope "
     r"reads only the distance .*; use model.position=learned, or model.document_positions=false$"),
    ({"document_positions": "yes"}, r"^model.document_positions='yes' must be true or false$"),
])  # fmt: skip
def test_each_bad_value_is_refused_in_one_line(fields, says):
    with pytest.raises(ValueError, match=says):
        GPTConfig(**{"vocab_size": 50, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 16,
                     "document_masking": True, "document_end": END, **fields})  # fmt: skip


def test_a_model_without_its_end_of_text_is_refused_and_gpt2_cannot_hold_it():
    from model.checkpoints.gpt2_export import check_gpt2_holds

    with pytest.raises(ValueError, match=r"^model.document_masking=true needs the token that ends a document"):
        GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, document_masking=True))
    with pytest.raises(ValueError, match="document_masking"):
        check_gpt2_holds(model().config)


def test_a_run_masks_its_documents_names_it_and_refuses_a_source_of_one_document(tmp_path, data_cache):
    run = tmp_path / "run"
    train(compose_train(*TINY, "logger=none", "model.document_masking=true", "trainer.max_steps=6",
                        "trainer.eval_interval=3", f"trainer.run_dir={run}",
                        f"data.cache_dir={data_cache}"))  # fmt: skip
    assert any("val/loss" in m for m in read_metrics(run))
    import json

    from model import load_checkpoint

    assert load_checkpoint(run).config.document_end == 256, "the bytes tokenizer's end-of-text, filled in and kept"
    info = json.loads((run / "run.json").read_text())
    assert "-docs" in info["name"] and info["model"]["document_end"] == 256, "run.json records what was used"
    corpus = write_text_corpus(tmp_path / "one", 1, "one long document, " * 400)
    with pytest.raises(ValueError, match=r"model.document_masking=true, but the train split of .* is 1 document"):
        train(compose_train(*TINY, "logger=none", "model.document_masking=true", "data=files",
                            f"data.path={corpus}", f"trainer.run_dir={tmp_path / 'r2'}",
                            f"data.cache_dir={tmp_path / 'cache'}"))  # fmt: skip


@pytest.mark.parametrize("kernel", ["manual", "sdpa"])
def test_a_forwards_layers_and_heads_share_one_documents_mask_which_a_finished_job_lets_go(kernel, monkeypatch):
    import model.attention.kernels as kernels
    from model.attention.masks import within_documents
    from training.memory import release_memory

    built = []
    monkeypatch.setattr(kernels, "within_documents", lambda *a: built.append(1) or within_documents(*a))
    gpt = model(kernel, attention="wrapper")  # 2 layers x 4 heads: 8 kernel calls a forward
    idx = packed(2, 20, seed=9)
    with torch.no_grad():
        first = gpt(idx, idx)[0]
        assert len(built) == 1, "one mask for every layer and head of the forward"
        gpt(idx, idx)
        assert len(built) == 2, "a new forward, new documents: a new mask"
    with torch.no_grad():
        assert_each_document_as_alone(gpt, idx)  # the shared mask is each layer's
        torch.testing.assert_close(gpt(idx, idx)[0], first)
    release_memory(torch.device("cpu"))
    assert kernels._last_seen[0] is None and kernels._last_bias[0] is None
