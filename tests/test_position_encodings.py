"""The position encodings (model.position=learned|rope|alibi|none) against their papers, and what they promise a
user: the rotation RoFormer defines on GPT-NeoX/Llama's pairs, ALiBi's slopes as Press et al. define them, NoPE
blind to order but through the causal mask; a model without a position table reads past block_size while the
learned table refuses to; every layout of one function starts from the same weights for a seed and converts
exactly with each new value; a checkpoint written before these fields existed loads and resumes.

The float64 formula of each, in every layout x kernel cell and through decoding and generation past block_size:
tests/test_attention_properties.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from attention_reference import paper_alibi_slopes, rotate
from helpers import GPT2_LAYOUTS, TINY, compose_train
from helpers import tiny_gpt_config as config

from model import GPT, KVCache, convert_attention_layout
from model.attention.positions import Rotary, alibi_slopes
from model.checkpoints.checkpoint import load_checkpoint
from model.checkpoints.load import model_from_checkpoint

LAYOUTS = GPT2_LAYOUTS
# The fields issue 30 added to GPTConfig: a checkpoint written before them has none of them.
NEW_FIELDS = {"position", "rope_theta", "qk_norm", "softcap", "sinks", "kv_latent", "rope_head_dim"}


def test_alibi_slopes_are_the_papers_for_eight_heads():
    assert alibi_slopes(8).tolist() == [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]


@pytest.mark.parametrize("n_head", range(1, 33))
def test_alibi_slopes_follow_the_papers_rule_for_every_head_count(n_head):
    # Powers of two: the geometric sequence from 2^(-8/n); others: the closest lower power's, then every other
    # slope of the next power's (6 heads: 1/4, 1/16, 1/64, 1/256, then 1/2, 1/8).
    paper = torch.tensor(paper_alibi_slopes(n_head), dtype=torch.float64)
    torch.testing.assert_close(alibi_slopes(n_head).double(), paper)
    if n_head == 6:
        assert paper_alibi_slopes(6) == [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]
    if n_head == 16:
        assert paper_alibi_slopes(16) == pytest.approx([2 ** (-h / 2) for h in range(1, 17)])


def test_rotary_turns_dimension_i_towards_i_plus_half_by_position_times_its_frequency():
    # The "rotate half" pairing (GPT-NeoX, Llama): dimension i pairs with i + d/2, not with i + 1.
    rotary, d = Rotary(8, 10000.0), 8
    for i in range(d // 2):
        unit = torch.zeros(1, 1, d)
        unit[..., i] = 1.0
        angle = 3 * 10000.0 ** (-2 * i / d)
        want = torch.zeros(1, 1, d)
        want[..., i], want[..., i + d // 2] = math.cos(angle), math.sin(angle)
        torch.testing.assert_close(rotary(unit, torch.tensor([3])), want)


@pytest.mark.parametrize("theta", [10000.0, 500000.0, 100.0])
def test_rotary_is_roformers_complex_rotation_at_near_and_far_positions(theta):
    gen = torch.Generator().manual_seed(0)
    t = torch.randn(2, 3, 9, 16, generator=gen)
    positions = torch.tensor([0, 1, 2, 17, 128, 129, 1000, 4095, 65536])
    error = (Rotary(16, theta)(t, positions).double() - rotate(t, positions, theta)).abs().amax(dim=(0, 1, 3))
    # float32 angles (as Llama's): position x frequency rounded to float32 (2^-24 of the angle, a few times
    # over), an error growing with the position: 3e-4 at 65536 here. A wrong frequency or pair is off by |t|.
    bound = 1e-6 + 3e-8 * t.abs().max() * (1 + positions.double())
    assert bool((error <= bound).all()), list(zip(positions.tolist(), error.tolist()))


def test_a_rotated_query_key_product_depends_on_their_distance_only():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(5, 32, generator=gen), torch.randn(5, 32, generator=gen)
    rotary = Rotary(32, 10000.0)

    def product(q_pos: int, k_pos: int) -> torch.Tensor:
        return (rotary(q, torch.tensor([q_pos])) * rotary(k, torch.tensor([k_pos]))).sum(-1)

    for shift in (1, 37, 500):
        torch.testing.assert_close(product(9 + shift, 4 + shift), product(9, 4), atol=1e-4, rtol=1e-4)
    assert not torch.allclose(product(9, 4), product(9, 5), atol=1e-3), "another distance, another product"


@pytest.mark.parametrize("position", ["none", "rope", "alibi", "learned"])
def test_without_positions_the_last_token_sees_the_earlier_ones_as_a_set(position):
    # One layer: the last query sees every earlier key; with no position signal (NoPE) the weighted sum cannot
    # tell their order, with any encoding it can.
    torch.manual_seed(0)
    model = GPT(config(vocab_size=64, block_size=16, n_head=4, n_embd=32, position=position, kernel="manual")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    idx = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(1))
    shuffled = torch.cat((idx[:, :-1][:, torch.randperm(11, generator=torch.Generator().manual_seed(2))],
                          idx[:, -1:]), dim=1)  # fmt: skip
    with torch.no_grad():
        same = torch.allclose(model(idx)[0], model(shuffled)[0], atol=1e-5)
    assert same is (position == "none")


def position_model(position: str, **options) -> GPT:
    torch.manual_seed(0)
    return GPT(config(vocab_size=64, block_size=16, n_head=4, n_embd=32, position=position, **options)).eval()


def test_a_learned_position_model_still_refuses_a_sequence_past_block_size():
    model = position_model("learned")
    idx = torch.randint(0, 64, (1, 17))
    with pytest.raises(ValueError, match=r"sequence length 17 exceeds block_size=16; crop the input to its last 16"):
        model(idx)
    cache = KVCache(model.config.n_layer)
    with torch.no_grad():
        model(idx[:, :16], cache=cache)
        with pytest.raises(ValueError, match=r"sequence length 17 exceeds block_size=16"):
            model(idx[:, 16:], cache=cache)


@pytest.mark.parametrize("position", ["rope", "alibi", "none"])
def test_a_model_without_a_position_table_reads_past_block_size_with_a_bounded_context(position):
    # Past block_size each position sees the last block_size keys: its logits there do not depend on a token
    # farther back than n_layer x (block_size - 1) positions (each layer reaches block_size - 1 further back).
    model = position_model(position)
    assert model.config.runs_past_context and "transformer.wpe.weight" not in model.state_dict()
    idx = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(3))
    changed = idx.clone()
    changed[:, 0] = (idx[:, 0] + 1) % 64
    with torch.no_grad():
        logits, _ = model(idx, idx)
        other, _ = model(changed, changed)
    reach = model.config.n_layer * (model.config.block_size - 1)
    torch.testing.assert_close(other[:, reach + 1 :], logits[:, reach + 1 :])
    assert not torch.allclose(other[:, 1], logits[:, 1]), "within its reach a token does change the logits"


@pytest.mark.parametrize(("position", "kernel"), [("rope", "sdpa"), ("alibi", "manual"), ("alibi", "sdpa"),
                                                  ("none", "manual")])  # fmt: skip
def test_a_prompt_fed_in_chunks_then_decoded_past_block_size_is_one_forward(position, kernel):
    # The cache's later chunks attend over the earlier ones at their positions (rotated keys, ALiBi distances).
    model = position_model(position, kernel=kernel, sinks=True, n_layer=2)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if p.dim() > 1 else 1.0)
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        full, _ = model(idx, idx)
        cache, at = KVCache(model.config.n_layer), 0
        for chunk in (5, 4, 7, *[1] * 24):  # the context filled in three chunks, then one position at a time
            logits = model(idx[:, at : at + chunk], cache=cache)[0][:, -1]
            at += chunk
            torch.testing.assert_close(logits, full[:, at - 1], atol=1e-4, rtol=0, msg=f"after {at} tokens")


ENCODINGS = {"rope": dict(position="rope"), "alibi": dict(position="alibi"), "none": dict(position="none"),
             "qk_norm": dict(qk_norm=True), "softcap": dict(softcap=30.0), "sinks": dict(sinks=True),
             "all": dict(position="rope", rope_theta=500.0, qk_norm=True, softcap=30.0, sinks=True)}  # fmt: skip


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_layout_starts_from_the_same_weights_and_converts_exactly_with_each_value(encoding):
    options = dict(vocab_size=100, block_size=16, n_layer=2, n_head=4, n_embd=32, n_kv_head=2, kernel="manual",
                   **ENCODINGS[encoding])  # fmt: skip
    models, states = {}, {}
    for layout in LAYOUTS:
        torch.manual_seed(7)
        models[layout] = GPT(config(**options, attention=layout)).eval()
        states[layout] = convert_attention_layout(models[layout].state_dict(), layout, "fused_qkv", n_head=4)
    for layout in LAYOUTS[1:]:
        assert states[layout].keys() == states[LAYOUTS[0]].keys()
        for key, tensor in states[LAYOUTS[0]].items():
            assert torch.equal(states[layout][key], tensor), (layout, key)
    # Its own parameters start as the docstring of reset_parameters says: norms at 1, sinks at 0.
    for key, tensor in states["fused_qkv"].items():
        if key.endswith(("q_norm.weight", "k_norm.weight")):
            assert torch.equal(tensor, torch.ones_like(tensor)), key
        if key.endswith("sinks"):
            assert torch.equal(tensor, torch.zeros_like(tensor)), key
    # Weights a training run moved (random, not the initialisation), converted there and back: exact, and every
    # layout computes the same logits from them.
    gen = torch.Generator().manual_seed(8)
    moved = {k: torch.randn(t.shape, generator=gen) * 0.3 for k, t in states["fused_qkv"].items()}
    moved["lm_head.weight"] = moved["transformer.wte.weight"]
    idx = torch.randint(0, 100, (2, 16), generator=gen)
    logits = {}
    for layout in LAYOUTS:
        there = convert_attention_layout(moved, "fused_qkv", layout, n_head=4)
        back = convert_attention_layout(there, layout, "fused_qkv", n_head=4)
        assert all(torch.equal(back[k], t) for k, t in moved.items()), layout
        models[layout].load_weights(there)
        with torch.no_grad():
            logits[layout] = models[layout](idx, idx)[0]
    for layout in LAYOUTS[1:]:
        torch.testing.assert_close(logits[layout], logits[LAYOUTS[0]], atol=1e-4, rtol=1e-4, msg=layout)


def written_before_the_new_fields(run, tmp_path):
    """A copy of ``run``'s checkpoint as headlab wrote it before issue 30: its configs lack the new fields."""
    old = tmp_path / "old-run"
    old.mkdir()
    ckpt = load_checkpoint(run)
    for field in NEW_FIELDS:
        ckpt.model_config.pop(field, None)
        if ckpt.train_config and "model" in ckpt.train_config:
            ckpt.train_config["model"].pop(field, None)
    ckpt.save(old / "last.pt")
    return old, ckpt


def test_a_checkpoint_written_before_the_new_fields_loads_and_resumes(trained_run, tmp_path, data_cache):
    from training.loop import train

    old, ckpt = written_before_the_new_fields(trained_run, tmp_path)
    assert not NEW_FIELDS & ckpt.model_config.keys()
    raw = torch.load(old / "last.pt", weights_only=True)
    assert not NEW_FIELDS & raw["model_config"].keys() and not NEW_FIELDS & raw["train_config"]["model"].keys()

    model = model_from_checkpoint(load_checkpoint(old)).eval()
    assert model.config.position == "learned" and not model.config.qk_norm and model.config.softcap is None
    original = model_from_checkpoint(load_checkpoint(trained_run)).eval()
    idx = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], original(idx)[0], atol=0, rtol=0)

    run = tmp_path / "resumed"
    summary = train(compose_train(*TINY, "logger=none", f"trainer.run_dir={run}", f"data.cache_dir={data_cache}",
                                  "trainer.max_steps=40", f"trainer.resume={old}"))  # fmt: skip
    resumed = load_checkpoint(run)
    assert resumed.step == 40 and summary["step"] == 40, summary
    assert resumed.model_config["position"] == "learned", "written with today's fields"


def test_rotarys_table_gives_the_angles_computed_directly_as_it_grows_and_past_its_limit():
    # A CPU reads cos and sin from a table of every position so far (grown by doubling), not computed per
    # forward: the same angles, at every length a forward or a decode step asks for, past each growth and past
    # the table's limit (computed again there). Within one float32 rounding: the table's rows go through the
    # same cos and sin, but torch's vectorised and scalar paths may split the elements differently.
    rotary = Rotary(16, 10000.0)
    asked = [torch.arange(n) for n in (1, 2, 7, 255, 256, 257)] + [torch.tensor([p]) for p in (0, 300, 511, 512, 1500)]
    asked += [torch.arange(5, 12), torch.arange(Rotary.TABLE_LIMIT - 3, Rotary.TABLE_LIMIT + 2)]
    for positions in asked:
        for got, want in zip(rotary.looked_up(positions), rotary.angles(positions)):
            torch.testing.assert_close(got, want, atol=2e-7, rtol=0, msg=lambda m, p=positions: f"{p}: {m}")
    assert rotary._table[0].size(0) == 2048, "256, then doubled to cover 1500; past the limit not grown at all"


def test_a_decode_steps_angles_are_the_tables_own_rows_at_every_position_dtype_and_shape():
    # A step at one position takes (cos, sin) as views made ahead of the table's rows: the same numbers as the
    # rows a longer forward slices (bit for bit: both are the table), shaped for (..., T, dim) or (..., T, heads,
    # dim), across the table's growth, at the last row made ahead and past it (sliced per step there); the rows
    # made ahead are kept, so though made under inference mode they are ordinary tensors a training step can save.
    for dim in (2, 16, 64):
        rotary = Rotary(dim, 500.0)
        for p in (0, 1, 255, 256, 257, 1000, Rotary.ROW_LIMIT - 1, Rotary.ROW_LIMIT, Rotary.ROW_LIMIT + 5, 3):
            for dtype in (torch.float32, torch.bfloat16, torch.float64):
                for time_dim in (-2, -3):
                    key, positions = (dtype, time_dim), torch.tensor([p])
                    with torch.inference_mode():
                        got = rotary.cos_sin(positions, dtype, time_dim)
                    want = rotary.shaped(rotary.looked_up(torch.tensor([p])), key)
                    for g, w in zip(got, want):
                        assert g.shape == w.shape == ((1, 1, dim) if time_dim == -3 else (1, dim)), (p, key)
                        assert torch.equal(g, w), (p, key)
                        assert p >= Rotary.ROW_LIMIT or not g.is_inference(), "kept past this forward: ordinary"
        assert len(rotary._rows[(torch.float32, -3)][0]) == Rotary.ROW_LIMIT, "made ahead up to the limit only"


@pytest.mark.parametrize("heads, kv_heads, head_dim, seq_len", [
    (1, 1, 2, 1), (2, 1, 8, 7), (3, 3, 16, 13), (4, 2, 32, 1), (4, 4, 32, 64), (6, 3, 4, 129), (8, 1, 64, 31),
])  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_queries_and_keys_side_by_side_turn_in_one_call_with_the_numbers_of_one_call_each(
    heads, kv_heads, head_dim, seq_len, dtype
):
    # c_attn's queries and keys sit side by side: fused_qkv's projection gives them as one tensor too, which the
    # pipeline turns in one call (a decode step's cost): the same queries, keys and gradients, bit for bit, as each.
    from model.attention import build_attention

    torch.manual_seed(heads * 100 + seq_len)
    block = build_attention("fused_qkv", heads * head_dim, heads, "sdpa", n_kv_head=kv_heads, position="rope",
                            query_temperature=3).to(dtype)  # fmt: skip
    x = torch.randn(2, seq_len, heads * head_dim, dtype=dtype, requires_grad=True)
    positions = torch.arange(5, 5 + seq_len)
    outs, grads = [], []
    for joint in (True, False):
        [group] = block.project(x)
        q = group.calls[0][1]
        encoded = block.encode_queries_keys(q, group.k, positions, group.qk if joint else None)
        weights = [torch.randn_like(t, generator=torch.Generator().manual_seed(i)) for i, t in enumerate(encoded)]
        grads.append(torch.autograd.grad(sum((t * w).sum() for t, w in zip(encoded, weights)), x)[0])
        outs.append(encoded)
    assert group.qk is not None and group.qk.shape[2] == heads + kv_heads  # time-major: (B, T, H + kv, d)
    for a, b in zip(*outs):
        assert a.shape == b.shape and torch.equal(a, b)
    assert torch.equal(*grads)


def test_rotarys_table_made_while_sampling_serves_a_training_step():
    # Sampling runs under inference_mode: a table first made there must still be an ordinary tensor, which a
    # later training step's autograd can save for backward.
    torch.manual_seed(0)
    model = GPT(config(vocab_size=64, block_size=16, n_head=2, n_embd=32, position="rope", rope_theta=777.0))
    idx = torch.randint(0, 64, (2, 16))
    with torch.inference_mode():
        model(idx)
    _, loss = model(idx, targets=idx)
    loss.backward()
    assert model.transformer.wte.weight.grad is not None
