"""The fast paths change nothing but speed: batched sampling, the preallocated cache, weights cast once;
real GPT-2 BPE offline from the shipped rank file."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from helpers import sharp_gpt, tiny_gpt_config
from same_choices import assert_same_choices, record_choices

import sample
from data.config import DataConfig
from data.loader import PreparedData
from data.prepare import prepare
from model import GPT, Checkpoint, generate
from model.decoding.generation import generate_batch
from model.decoding.packed import (
    ONE_ROW_TOKENS,
    ONE_ROW_VENDORS,
    cpu_vendor,
    is_packed,
    mkl_packing_available,
    packed_linears,
)


def tiny_model(seed: int = 1) -> GPT:
    return sharp_gpt(seed, block_size=16, n_layer=2)


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, None, 1.0), (1.0, None, 1.0), (0.8, 10, 0.9)])
def test_a_batch_of_samples_equals_the_samples_generated_one_at_a_time(temperature, top_k, top_p, monkeypatch):
    model, prompt, n = tiny_model(), [3, 1, 4], 5
    recorder = record_choices(monkeypatch)
    recorder.start()
    list(generate_batch(model, prompt, 40, [torch.Generator().manual_seed(100 + i) for i in range(n)],
                        temperature, top_k, top_p))  # fmt: skip
    for i in range(n):
        recorder.start()
        list(generate(model, prompt, 40, temperature, top_k, top_p, torch.Generator().manual_seed(100 + i)))
    batched, *alone = recorder.traces
    parted = sum(assert_same_choices(batched, alone[i], rows=[(i, 0)]) for i in range(n))
    assert parted <= 1, f"{parted} of {n} samples parted at a near-tie: round-off does not do that"
    if temperature > 0:
        assert len({tuple(batched.tokens(i)) for i in range(n)}) > 1, "the samples differ"


needs_mkl = pytest.mark.skipif(not mkl_packing_available(), reason="MKL weight packing (x86 CPU builds of torch)")


@needs_mkl
def test_weights_packed_for_a_batch_give_the_plain_logits_and_are_dropped_afterwards():
    model = tiny_model()
    idx = torch.randint(0, model.config.vocab_size, (4, 1))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    blocks = [m for m in linears if m is not model.lm_head]  # the head sees one position per sample
    with torch.inference_mode():
        plain, plain_prompt = model(idx)[0], model(idx.repeat(1, 3))[0]
        with packed_linears(model, rows=4) as on:
            assert on and all(is_packed(m) for m in linears)
            paths = [m.forward.calls for m in blocks]
            # MKL promises no bit pattern across calls (its kernel depends on the CPU and on alignment):
            # which path ran is the property; the values agree to float32 round-off.
            torch.testing.assert_close(model(idx)[0], plain, rtol=1e-5, atol=1e-5)
            assert all(calls == {"packed": 1} for calls in paths), "4 rows (a decoding step) take the packed path"
            torch.testing.assert_close(model(idx.repeat(1, 3))[0], plain_prompt, rtol=1e-5, atol=1e-5)
            assert all(calls == {"packed": 1, "plain": 1} for calls in paths), "12 rows (a prompt) take the plain path"
            assert model.lm_head.forward.calls == {"packed": 2}, "the head's 4 last positions, both times"
        assert not any(is_packed(m) for m in model.modules())
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


@needs_mkl
def test_packing_is_left_off_where_it_cannot_pay():
    model = tiny_model()
    with packed_linears(model, rows=1) as on:
        assert not on, "one row of a generation of unknown length: the packing might not be repaid"
    with packed_linears(model, rows=1, tokens=ONE_ROW_TOKENS - 1) as on:
        assert not on, "one row of a short generation: the packing is not repaid"
    with packed_linears(model, rows=1, tokens=ONE_ROW_TOKENS) as on:
        assert on == (cpu_vendor() in ONE_ROW_VENDORS), "one row of a long one: packed where that CPU gains"
    with packed_linears(model.to(torch.bfloat16), rows=8) as on:
        assert not on, "MKL packs float32 only"


@needs_mkl
@pytest.mark.parametrize("how", ["wrapped", "Module.compile", "compiled forward"])
def test_packing_stays_off_under_torch_compile_which_cannot_trace_it(how):
    model = tiny_model()
    if how == "wrapped":
        model = torch.compile(model)
    elif how == "Module.compile":
        model.compile()
    else:
        model.forward = torch.compile(model.forward, dynamic=True)  # a user's own compiled forward
    with packed_linears(model, rows=4) as on:
        assert not on


@needs_mkl
def test_an_abandoned_batch_generation_unpacks_the_model():
    model = tiny_model()
    steps = generate_batch(model, [3, 1, 4], 20, [torch.Generator().manual_seed(i) for i in range(3)])
    next(steps)
    assert is_packed(model.lm_head)
    steps.close()  # a caller that stops reading early
    assert not is_packed(model.lm_head)


def test_samples_stop_one_by_one_at_the_stop_token():
    model = tiny_model()
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    free = list(generate_batch(model, [1], 30, [torch.Generator().manual_seed(i) for i in range(4)], 1.0))
    stop = free[5][0]
    stopped = list(generate_batch(model, [1], 30, gens, 1.0, stop_id=stop))
    first = [step[0] for step in stopped]
    assert stop in first and all(t is None for t in first[first.index(stop) + 1 :])


def test_the_cache_is_written_in_place_not_copied_per_token():
    model = tiny_model()
    from model import KVCache

    cache = KVCache(model.config.n_layer)
    model(torch.tensor([[1, 2, 3]]), cache=cache)
    buffer = cache.layers[0].slots[0][0]
    model(torch.tensor([[4]]), cache=cache)
    assert cache.layers[0].slots[0][0] is buffer and buffer.shape[2] == model.config.block_size


def test_sample_casts_the_weights_once_to_the_dtype_asked(tmp_path, capsys):
    model = GPT(tiny_gpt_config(vocab_size=257, block_size=16))
    Checkpoint(model=model.state_dict(), model_config=asdict(model.config), tokenizer="bytes").save(tmp_path / "m.pt")
    texts = sample.run(sample.SampleConfig(source=str(tmp_path / "m.pt"), dtype="bfloat16", device="cpu",
                                           max_new_tokens=10, num_samples=3, prompt="ab"))  # fmt: skip
    assert len(texts) == 3 and all(t.startswith("ab") for t in texts)
    assert "cpu, bfloat16, 3 samples at once" in capsys.readouterr().err


def test_gpt2_bpe_round_trips_real_text(gpt2_tokenizer_offline):
    tok = gpt2_tokenizer_offline
    text = "Hello world! GPT-2's tokenizer: naïve café, 東京, emoji 😀, code:\n\tdef f(x): return x ** 2\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text and ids[:2] == [15496, 995]  # "Hello", " world" in GPT-2's vocabulary
    assert tok.vocab_size == 50257 and tok.eot_id == 50256


def test_prepare_with_gpt2_bpe_on_the_shipped_rank_file(tmp_path, gpt2_tokenizer_offline):
    folder = tmp_path / "corpus"
    folder.mkdir()
    docs = [f"Document {i}: the rain in Spain stays mainly in the plain. 東京 {i * 7}\n" for i in range(40)]
    for i, doc in enumerate(docs):
        (folder / f"{i:02d}.txt").write_text(doc)
    cfg = DataConfig(name="bpe", source="files", path=str(folder), tokenizer="gpt2", num_proc=2, val_fraction=0.2,
                     cache_dir=str(tmp_path / "cache"))  # fmt: skip
    data = PreparedData(prepare(cfg, gpt2_tokenizer_offline))
    assert data.meta["tokenizer"] == "gpt2" and data.dtype.name == "uint16"
    text = "".join(gpt2_tokenizer_offline.decode(data.tokens[s].tolist()) for s in ("train", "val"))
    assert sorted(text.split("<|endoftext|>")[:-1]) == sorted(docs)


def test_imported_gpt2_matches_transformers_on_real_token_ids(gpt2_tokenizer_offline):
    transformers = pytest.importorskip("transformers")
    from model import import_hf_gpt2

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64)).eval()
    ours = import_hf_gpt2(hf.state_dict(), n_head=4, attention="wrapper", kernel="manual").eval()
    ids = torch.tensor([gpt2_tokenizer_offline.encode("The quick brown fox jumps over the lazy dog.")])
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0][:, -1], hf(ids).logits[:, -1], rtol=0, atol=1e-4)
