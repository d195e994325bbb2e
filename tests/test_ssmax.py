"""model.ssmax (Scalable-Softmax, Nakanishi 2025, arXiv 2501.19399) and model.negative_eigenvalues (the delta rules'
beta in (0, 2)): what the generated grids (tests/test_attention_properties.py: every layer's encoding and decoding
cells at the option's example) do not reach.

SSMax scales query i by s_h ln n_i, n_i the keys it sees: here past block_size (a model without a position table
sees at most block_size keys, its KV cache a ring), under a chunk, within its document, among sparse attention's
selected keys; the full forward against its float64 formula with every gradient, cached decoding (eager and static
steps) against the full forward. The delta rules with beta in (0, 2): the chunked form against the recurrence where
beta is near 2 (the transition a reflection). Every bad value refused in one line.
"""

from __future__ import annotations

import pytest
import torch
from attention_reference import recurrent_delta_rule, recurrent_kda, reference
from test_attention_properties import PAST_BLOCK, PAST_PROMPTS, PAST_TOTAL, decode_model, eager_or_static
from test_attention_properties import assert_decodes_like_full_recomputation as decodes_like_the_full_forward
from test_sparse_attention import assert_formula_over

from model import GPT, GPTConfig, build_attention
from model.mixers.deltanet import chunked_delta_rule
from model.mixers.kda import chunked_kda

BLOCK = 16  # the formula cells' context: lengths past it read past the trained length


def float64_block(layout: str, kernel: str, seed: int = 0, **options):
    """A float64 block of width 32, 4 heads, read past its context of BLOCK positions, its parameters drawn N(0, 0.5^2)
    (SSMax's s per head then 0.43 plus that: some heads sharper, some flatter)."""
    if layout == "mla":
        options = {"kv_latent": 8, **options}
    block = build_attention(layout, 32, 4, kernel, block_size=BLOCK, **options).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.5)
    return block


FORMULA_CELLS = [("fused_qkv", "sdpa", dict(position="none")),
                 ("wrapper", "manual", dict(position="none", attention_chunk=4)),
                 ("separate_qkv", "manual", dict(position="rope", window=5, n_kv_head=2)),
                 ("mla", "sdpa", dict(position="none", attention_chunk=4, differential=False)),
                 ("fused_qkv", "manual", dict(position="alibi", sinks=True, differential=True))]  # fmt: skip


@pytest.mark.parametrize("layout,kernel,options", FORMULA_CELLS,
                         ids=[f"{c[0]}-{c[1]}-{'.'.join(f'{k}{v}' for k, v in c[2].items())}" for c in FORMULA_CELLS])
def test_ssmax_is_its_formula_past_block_size_under_each_mask(layout, kernel, options):
    """n_i is the keys query i sees: i + 1 within the context, BLOCK past it, fewer under a window or a chunk (the
    formula counts them from the paper's masks, the model from its kernel's predicates). Output and every gradient,
    s's among them, at lengths within, at and past the context. Rotary's angles and differential attention's lambda
    are float32 in the model: relative to the largest value, 1e-5 (1e-4 with lambda), as tests/test_sparse_attention.py
    holds its float64 blocks."""
    block = float64_block(layout, kernel, **options, ssmax=0.43)
    tolerance = 1e-4 if options.get("differential") else 1e-5
    gen = torch.Generator().manual_seed(1)
    for T in (1, 3, BLOCK, BLOCK + 1, 2 * BLOCK + 5):
        x = torch.randn(2, T, 32, generator=gen, dtype=torch.float64, requires_grad=True)
        got, want = block.train()(x), reference(block, x)
        torch.testing.assert_close(got, want, atol=tolerance * want.abs().max().item(), rtol=0,
                                   msg=lambda m, T=T: f"T={T}: {m}")  # fmt: skip
        weights = torch.randn(got.shape, generator=gen, dtype=torch.float64)
        params = [x, *block.parameters()]
        theirs = torch.autograd.grad((want * weights).sum(), params)
        scale = max(w.abs().max().item() for w in theirs)
        for name, g, w in zip(["x", *(n for n, _ in block.named_parameters())],
                              torch.autograd.grad((got * weights).sum(), params), theirs):  # fmt: skip
            torch.testing.assert_close(g, w, atol=tolerance * scale, rtol=0,
                                       msg=lambda m, T=T, name=name: f"T={T}, d/d{name}: {m}")  # fmt: skip


DECODE_CELLS = [("none", "fused_qkv", "sdpa", {}), ("rope", "wrapper", "manual", {"window": 6}),
                ("none", "separate_qkv", "manual", {"attention_chunk": 5}), ("none", "mla", "sdpa", {})]  # fmt: skip


@pytest.mark.parametrize("static", [False, True], ids=["eager step", "static step"])
@pytest.mark.parametrize("position,layout,kernel,options", DECODE_CELLS,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{'.'.join(c[3]) or 'full'}" for c in DECODE_CELLS])
def test_cached_decoding_with_ssmax_past_block_size_is_the_full_forward(position, layout, kernel, options, static):
    """The ring past block_size: a decode step counts the keys its held slots show (a static step's empty ones
    none), the full forward those its masks show; the same n_i, every step past every wrap."""
    n_kv = 2 if layout != "mla" else None
    model = decode_model(layout, kernel, n_kv, options.pop("window", None), "cpu", block_size=PAST_BLOCK,
                         position=position, ssmax=0.43, **options)  # fmt: skip
    decodes_like_the_full_forward(model, eager_or_static(static, "cpu"), PAST_PROMPTS, "cpu", PAST_TOTAL)


@pytest.mark.parametrize("layout", ["fused_qkv", "wrapper"])
def test_with_document_masking_a_query_counts_only_its_documents_keys(layout):
    """Without positions, a document's outputs within a packed window are those of the document alone: its queries
    count the keys of their own document (n_i from its start), not the window's."""
    block = float64_block(layout, "manual", position="none", document_masking=True, ssmax=0.43)
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    starts = torch.zeros(2, 12, dtype=torch.long)
    starts[:, 5:] = 5
    with torch.no_grad():
        packed, alone = block.eval()(x, None, None, starts), block(x[:, 5:])
    torch.testing.assert_close(packed[:, 5:], alone, atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize("layout,kernel", [("fused_qkv", "manual"), ("wrapper", "sdpa")])
def test_with_sparse_attention_a_query_counts_the_keys_it_selects(layout, kernel):
    """Sparse attention's softmax runs over the selected keys: n_i = min(top-k, the keys its masks show), the
    formula's count of its selection (tests/attention_reference.py)."""
    assert_formula_over(layout, kernel, {"position": "learned", "ssmax": 0.43}, [1, 4, 9, 17], topks=2)


def test_s_starts_at_the_value_set_for_every_head_and_takes_no_weight_decay():
    gpt = GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=2, n_head=4, n_embd=32, position="none", ssmax=0.3))
    for block in gpt.transformer.h:
        assert torch.equal(block.attn.ssmax + block.attn.ssmax_offset.detach(), torch.full((4,), 0.3))
    assert [name for name, p in gpt.named_parameters() if "ssmax" in name and p.dim() != 1] == []  # AdamW's no_decay


@pytest.mark.parametrize("fields, message", [
    (dict(ssmax=0), "model.ssmax=0 must be a positive number"),
    (dict(ssmax=-0.5), "model.ssmax=-0.5 must be a positive number"),
    (dict(ssmax=True), "model.ssmax=True must be a positive number"),
    (dict(ssmax=float("inf")), "model.ssmax=inf must be a positive number"),
    (dict(ssmax=0.43, query_temperature=4), "model.query_temperature=4 and model.ssmax=0.43 cannot both be set"),
    (dict(ssmax=0.43, attention="kda"), "model.ssmax=0.43 with attention=kda"),
    (dict(negative_eigenvalues=True), "model.negative_eigenvalues=true is an option of attention=gated_deltanet or "
                                      "attention=kda, but attention=fused_qkv"),
    (dict(negative_eigenvalues=1, attention="kda"), "model.negative_eigenvalues=1 must be true"),
])  # fmt: skip
def test_every_bad_value_is_refused_in_one_line(fields, message):
    with pytest.raises(ValueError) as err:
        GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=4, n_embd=32, **fields))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("rule,recurrence,per_channel", [(chunked_delta_rule, recurrent_delta_rule, False),
                                                          (chunked_kda, recurrent_kda, True)])  # fmt: skip
def test_the_chunked_form_is_the_recurrence_where_beta_reflects(rule, recurrence, per_channel):
    """beta in (1.9, 2): each step's transition I - beta k k^T nearly reverses the state along k. The chunked form's
    triangular solve (I + A, A's entries up to 2 k_i . k_j) against the recurrence, float64, across chunk edges."""
    gen = torch.Generator().manual_seed(4)
    B, H, T, d = 2, 3, 21, 8
    q, k, v = (torch.randn(B, H, T, d, generator=gen, dtype=torch.float64) for _ in range(3))
    k = k / k.norm(dim=-1, keepdim=True)
    decay_shape = (B, H, T, d) if per_channel else (B, H, T)
    log_decay = -torch.rand(decay_shape, generator=gen, dtype=torch.float64) * 0.1
    beta = 1.9 + 0.1 * torch.rand(B, H, T, generator=gen, dtype=torch.float64)
    want, state = recurrence(q, k, v, log_decay, beta)
    for chunk in (1, 4, 8, T):
        got, got_state = rule(q, k, v, log_decay, beta, chunk)
        torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-9, msg=lambda m, chunk=chunk: f"chunk {chunk}: {m}")
        torch.testing.assert_close(got_state, state, atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("layout", ["gated_deltanet", "kda"])
def test_negative_eigenvalues_double_beta_and_only_beta(layout):
    """beta = 2 sigmoid(W_b x): the same queries, keys, values, decays and gate, betas twice as large (above 1)."""
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(5))
    plain = build_attention(layout, 32, 4, "sdpa")
    doubled = build_attention(layout, 32, 4, "sdpa", negative_eigenvalues=True)
    doubled.load_state_dict(plain.state_dict())
    for name, a, b in zip(("q", "k", "v", "log decay", "beta", "gate", "conv"), plain.inputs(x, None),
                          doubled.inputs(x, None)):  # fmt: skip
        torch.testing.assert_close(b, 2 * a if name == "beta" else a, msg=lambda m, name=name: f"{name}: {m}")
    assert doubled.inputs(x, None)[4].max() > 1
