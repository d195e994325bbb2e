"""Bad input is a clear error that names the value and the fix, before any work."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_gpt_config as config

from model import GPT, MIXERS, build_attention, convert_attention_layout


def test_width_not_divisible_by_heads_names_both_numbers():
    expected = (r"n_embd=130 is not divisible by n_head=4; choose n_embd as a multiple of n_head, or an n_head that "
                r"divides it: 1, 2, 5, 10, 13, 26, 65, 130$")  # fmt: skip
    with pytest.raises(ValueError, match=expected):
        config(n_embd=130, n_head=4)
    with pytest.raises(ValueError, match="n_embd=10 is not divisible by n_head=3"):
        build_attention("fused_qkv", 10, 3, "sdpa")


def test_key_value_heads_that_do_not_divide_the_heads_list_the_ones_that_do():
    with pytest.raises(ValueError, match=r"model.n_kv_head=5 does not divide model.n_head=12; choose a divisor of "
                                         r"n_head: 1 \(multi-query\), 2, 3, 4, 6, 12 or null \(multi-head\)$"):
        config(n_embd=48, n_head=12, n_kv_head=5)


@pytest.mark.parametrize("field,value", [("n_layer", 0), ("vocab_size", -3), ("block_size", 2.5)])
def test_non_positive_or_non_integer_sizes_are_rejected(field, value):
    with pytest.raises(ValueError, match=f"{field}={value!r} must be a positive integer"):
        config(**{field: value})


def test_dropout_outside_unit_interval_is_rejected():
    with pytest.raises(ValueError, match=r"dropout=1.5 must be in \[0, 1\)"):
        config(dropout=1.5)


def test_unknown_layout_lists_the_valid_ones():
    expected = rf"unknown attention layout 'fused'; choose one of: {', '.join(sorted(MIXERS))}"
    with pytest.raises(ValueError, match=expected):
        config(attention="fused")
    with pytest.raises(ValueError, match=expected):
        build_attention("fused", 16, 2, "sdpa")


def test_unknown_kernel_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown attention kernel 'flash'; choose one of: flex, manual, sdpa"):
        config(kernel="flash")


def test_sequence_longer_than_block_size_is_rejected():
    model = GPT(config())
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size=8; crop"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_state_dict_of_another_shape_names_the_tensors():
    model = GPT(config())
    other = GPT(config(n_embd=32)).state_dict()
    expected = r"transformer.wte.weight: state dict \(64, 32\) vs model \(64, 16\)"
    with pytest.raises(ValueError, match=expected):
        model.load_weights(other)


def test_state_dict_of_another_depth_names_the_missing_keys():
    model = GPT(config(n_layer=2))
    with pytest.raises(ValueError, match=r"missing \['transformer.h.1.attn.c_attn.bias'"):
        model.load_weights(GPT(config(n_layer=1)).state_dict())


def test_state_dict_that_is_not_a_gpt_is_rejected():
    with pytest.raises(ValueError, match="holds no attention q/k/v weights"):
        GPT(config()).load_weights({"weight": torch.zeros(3)})


def test_conversion_checks_the_source_layout():
    sd = GPT(config(attention="fused_qkv")).state_dict()
    with pytest.raises(ValueError, match="holds 'fused_qkv' attention weights, not src='wrapper'"):
        convert_attention_layout(sd, "wrapper", "separate_qkv")


def test_conversion_to_wrapper_needs_the_head_count():
    sd = GPT(config(attention="separate_qkv")).state_dict()
    with pytest.raises(ValueError, match="converting to 'wrapper' needs n_head="):
        convert_attention_layout(sd, "separate_qkv", "wrapper")


def test_conversion_rejects_a_wrong_head_count_for_a_wrapper():
    sd = GPT(config(attention="wrapper")).state_dict()
    with pytest.raises(ValueError, match="has 2 heads, but n_head=4 was given"):
        convert_attention_layout(sd, "wrapper", "fused_qkv", n_head=4)


def test_conversion_rejects_an_incomplete_state_dict():
    sd = GPT(config(attention="separate_qkv")).state_dict()
    del sd["transformer.h.0.attn.value.weight"]
    with pytest.raises(ValueError, match=r"has no \['value'\] weight"):
        convert_attention_layout(sd, "separate_qkv", "fused_qkv")
