"""PaTH read in chunks (``GPT.read_states``): an evaluation of a model whose position encoding turns the keys for each
query (``model.position=path``) puts a long sequence through its KV cache a chunk at a time, where one forward would
widen every head by the sequence's length. The chunks must compute the one forward's hidden states to round-off, at
every length around and between chunk boundaries, in every layout that takes PaTH, with each kernel, with document
masking and grouped key/value heads; and a model whose cache cannot hold every key (a window) reads in one forward."""

from __future__ import annotations

import pytest
import torch
from helpers import GPT2_LAYOUTS, sharp_gpt

# Lengths 1 to past several chunks of 3 and 5, odd and prime ones among them (a chunk only splits past two of them)
LENGTHS = [1, 2, 5, 6, 7, 11, 13, 16, 17, 29, 40]


def read(model, idx: torch.Tensor, chunk: int) -> torch.Tensor:
    with torch.no_grad():
        return model.read_states(idx, chunk)


@pytest.mark.parametrize("layout", GPT2_LAYOUTS)
@pytest.mark.parametrize(("kernel", "options"), [
    ("manual", {}), ("sdpa", {"n_kv_head": 2}), ("sdpa", {"document_masking": True, "document_end": 0}),
], ids=["manual", "sdpa-kv2", "sdpa-documents"])  # fmt: skip
def test_path_read_in_chunks_is_its_one_forward_at_every_length(layout, kernel, options):
    model = sharp_gpt(attention=layout, kernel=kernel, position="path", n_layer=2, n_head=4, n_embd=32,
                      block_size=48, **options)
    idx = torch.randint(1, model.config.vocab_size, (2, max(LENGTHS)), generator=torch.Generator().manual_seed(3))
    idx[:, 9] = idx[:, 23] = 0  # documents ending at 9 and 23 (read only with document masking)
    for chunk in (3, 5):
        for T in LENGTHS:
            whole = read(model, idx[:, :T], chunk=T)  # one forward: T is not past two chunks of T
            pieces = read(model, idx[:, :T], chunk)
            where = f"T={T} chunk={chunk}"
            torch.testing.assert_close(pieces, whole, atol=2e-5, rtol=2e-5, msg=lambda m, where=where: f"{where}: {m}")


def test_a_model_whose_cache_keeps_fewer_keys_than_the_sequence_reads_it_in_one_forward():
    """A window shorter than the sequence: a chunk's first queries would need keys its cache's ring no longer holds."""
    model = sharp_gpt(attention="fused_qkv", position="path", n_head=4, n_embd=32, block_size=48, window=5)
    idx = torch.randint(1, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(model.read_states(idx, 3), model.hidden_states(idx))
