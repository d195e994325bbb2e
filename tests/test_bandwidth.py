"""Decoding's share of the memory-bandwidth limit: the bandwidths by GPU name, the bytes a decode step reads
(counted by hand for a tiny model), the limit at a batch, and no invented share where the bandwidth is unknown."""

from __future__ import annotations

import pytest
import torch
from helpers import sharp_gpt, tiny_gpt_config

import model.decoding.steps as decoding
from model import GPT
from model.decoding.generation import context_lengths, generate_batch
from model.decoding.steps import bandwidth_limit, bandwidth_share, step_bytes, weight_bytes
from model.device import memory_bandwidth, memory_bandwidth_tbs


@pytest.mark.parametrize("name,tbs", [
    ("NVIDIA H100 80GB HBM3", 3.35), ("NVIDIA H100 PCIe", 2.0), ("NVIDIA H100 NVL", 3.9), ("NVIDIA H200", 4.8),
    ("NVIDIA A100-SXM4-80GB", 2.039), ("NVIDIA A100 80GB PCIe", 1.935), ("NVIDIA A100-SXM4-40GB", 1.555),
    ("NVIDIA A100-PCIE-40GB", 1.555), ("NVIDIA L4", 0.3), ("NVIDIA GeForce RTX 4090", 1.008),
    ("NVIDIA GeForce RTX 3090", 0.936), ("NVIDIA GeForce RTX 3090 Ti", 1.008), ("NVIDIA A10", 0.6),
    ("Tesla V100-SXM2-16GB", 0.9), ("Tesla T4", 0.32),
    ("NVIDIA A100", None), ("Tesla V100S-PCIE-32GB", None), ("NVIDIA B200", None),  # not guessed
])  # fmt: skip
def test_memory_bandwidths_match_whole_device_names(name, tbs):
    assert memory_bandwidth_tbs(name) == tbs


def test_a_cpu_has_no_known_bandwidth():
    assert memory_bandwidth(torch.device("cpu")) is None


def tiny_model(**fields) -> GPT:
    return GPT(tiny_gpt_config(**fields))  # vocabulary 50 (64 padded), 8 positions, 1 layer, 2 heads, width 16


def test_a_step_reads_every_weight_once_and_the_cache_up_to_its_length():
    model = tiny_model()
    block = 2 * 16 + (16 * 48 + 48) + (16 * 16 + 16) + 2 * 16 + (16 * 64 + 64) + (64 * 16 + 16)  # LN QKV proj LN MLP
    weights = (64 * 16 + block + 2 * 16) * 4  # the tied embedding once, the block, ln_f; not the position table
    assert weight_bytes(model) == weights == 17_344
    per_position = 2 * 2 * 8 * 4  # a key and a value of 2 heads of 8, float32
    assert step_bytes(model.config, weights, 3, 5, torch.float32) == weights + 3 * 5 * per_position
    windowed = tiny_model(window=4)  # a ring of 4 slots: no more than 4 keys, however long the context
    assert step_bytes(windowed.config, weights, 3, 5, torch.float32) == weights + 3 * 4 * per_position
    halved = tiny_model().to(torch.bfloat16)
    assert weight_bytes(halved) == weights // 2
    assert step_bytes(halved.config, weights // 2, 3, 5, torch.bfloat16) == (weights + 3 * 5 * per_position) // 2


def test_a_linear_layer_reads_its_state_whatever_the_length():
    model = tiny_model(attention="gated_deltanet", position="none")
    state = 4 * 2 * 8 * 8 + 4 * 3 * 3 * 16  # two 8 x 8 float32 states, the convolution's last 3 inputs of q, k, v
    weights = weight_bytes(model)
    assert step_bytes(model.config, weights, 2, 5, torch.float32) == weights + 2 * state
    assert step_bytes(model.config, weights, 2, 500, torch.float32) == weights + 2 * state


def test_the_limit_is_the_batchs_tokens_per_step_over_its_bytes_at_the_bandwidth(monkeypatch):
    monkeypatch.setattr(decoding, "memory_bandwidth", lambda device: 4.8e12)
    monkeypatch.setattr(decoding, "device_name", lambda device: "NVIDIA H200")
    model, gpu = tiny_model(), torch.device("cuda")
    per_step = 17_344 + 3 * 6 * 128  # the keys' mean, 6
    limit, read = bandwidth_limit(model.config, 17_344, 3, [5, 6, 7], torch.float32, gpu)
    assert read == per_step and limit == pytest.approx(3 * 4.8e12 / per_step)
    text = bandwidth_share(limit / 4, model.config, 17_344, 3, [5, 6, 7], torch.float32, gpu)
    assert text == f"25.0% of the memory-bandwidth limit ({limit:,.0f} tokens/s on NVIDIA H200 at 4.8 TB/s, " \
                   f"19.6 kB read per step)"  # fmt: skip


def test_no_share_is_invented_where_the_bandwidth_is_unknown():
    model = tiny_model()
    limit, _ = bandwidth_limit(model.config, 17_344, 1, [5], torch.float32, torch.device("cpu"))
    text = bandwidth_share(1000.0, model.config, 17_344, 1, [5], torch.float32, torch.device("cpu"))
    assert limit is None and "%" not in text
    assert text == "memory bandwidth unknown for cpu: no share of its limit (18.0 kB read per step)"


@pytest.mark.parametrize("position,prompt", [("learned", 3), ("learned", 20), ("rope", 3)])
def test_the_context_lengths_are_those_generation_reads(position, prompt, monkeypatch):
    """A position table slides its window past block_size (16); rope reads on (its cache a ring)."""
    model = sharp_gpt(block_size=16, n_layer=1, position=position)
    forward, read = model.forward, []

    def reading(idx, targets=None, cache=None):
        read.append(cache.length + idx.size(1))
        return forward(idx, targets, cache)

    monkeypatch.setattr(model, "forward", reading)
    list(generate_batch(model, list(range(prompt)), 40, [torch.Generator().manual_seed(0)], decoding="eager"))
    assert read == context_lengths(model.config, prompt, 40)
    assert max(read) == (16 if position == "learned" else prompt + 39)


def test_the_benchmarks_decode_rate_leaves_out_the_first_decode_step():
    """Its set-up (a graph captured, a step compiled) is said apart, as sample.py says it: a compilation at every
    generation once made compiled decoding's rate look ten times slower than its steps."""
    from measuring.generation_reference import split_times

    first, setup, rate = split_times(0.0, [1.0, 3.0, 3.1, 3.2, 3.3], tokens=2)  # moments the steps' tokens came out
    assert (first, setup) == (1.0, 2.0) and rate == pytest.approx(3 * 2 / 0.3)
