"""A transformers GPT-2 and its imported headlab GPT give the same logits, in every layout."""

from __future__ import annotations

import pytest
import torch
from helpers import CPU_KERNELS

from model import import_hf_gpt2, same_function_layouts

transformers = pytest.importorskip("transformers")

VOCAB = 1000  # not a multiple of 64, so the padding of the vocabulary is exercised


@pytest.fixture(scope="module")
def hf_model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=VOCAB,
        n_positions=64,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    # Random init leaves biases at 0 and LayerNorms at 1: perturb everything so they count.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize("layout", same_function_layouts("fused_qkv"))
def test_imported_gpt2_matches_transformers_logits(hf_model, layout, kernel):
    ours = import_hf_gpt2(hf_model.state_dict(), n_head=4, attention=layout, kernel=kernel).eval()
    assert ours.config.vocab_size == VOCAB and ours.config.block_size == 64
    idx = torch.randint(0, VOCAB, (2, 40))
    with torch.no_grad():
        expected = hf_model(idx).logits
        logits, _ = ours(idx, idx)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-4)


def test_import_rejects_a_state_dict_that_is_not_gpt2():
    with pytest.raises(ValueError, match="not a GPT2LMHeadModel state dict"):
        import_hf_gpt2({"encoder.weight": torch.zeros(2, 2)}, n_head=1)


def test_import_rejects_a_head_count_that_does_not_divide_the_width(hf_model):
    with pytest.raises(ValueError, match="n_embd=32 is not divisible by n_head=5"):
        import_hf_gpt2(hf_model.state_dict(), n_head=5)


def test_import_rejects_embeddings_without_layers_in_one_line(hf_model):
    embeddings = {k: v for k, v in hf_model.state_dict().items() if ".h." not in k}
    with pytest.raises(ValueError) as err:
        import_hf_gpt2(embeddings, n_head=2)
    assert str(err.value).startswith("not a whole GPT2LMHeadModel state dict: embeddings but no layers")
