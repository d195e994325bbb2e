"""The plan of a run, before any work: sizes, FLOPs, the batch split, and an estimate of peak memory.

The memory estimate counts, for one GPU, the float32 weights, gradients and
the optimizer's state (AdamW's two moments: 16 bytes per parameter; with
Muon, its one momentum buffer for the hidden matrices: 12; plus 4 for DDP's
gradient buckets), and the tensors eager autograd saves for the backward pass of one
micro-batch, tensor by tensor (see ``activation_bytes``), plus the logits'
forward transients. It is an estimate: ``torch.compile`` usually saves less;
the CUDA context and allocator fragmentation add some. Tested on CPU against
the bytes autograd really saves.

``plan_of`` is a run's plan and the text ``trainer.plan=true`` prints (with ``micro_batch_size=auto``'s
note); ``plan_variants`` is a sweep's (``train.py -m ... trainer.plan=true``): a table, then each distinct plan.
"""

from __future__ import annotations

import functools
import json
import os
import time
from dataclasses import dataclass, field, replace

import torch

from data.tokenizers import EOT_IDS, VOCAB_SIZES
from model import registry
from model.attention.masks import options_set
from model.attention.modifications import Activations
from model.attention.selection import selection_of
from model.config import GPTConfig, attention_label, mixes_layouts, schedule_text
from model.device import available_memory, resolve_device
from training.config import TrainConfig, micro_batch_for, validate
from training.distributed import from_environment
from training.lengths import resolve_lengths

GIB = 2**30
ASSUMED_MFU = 0.4  # for time estimates only: a typical compiled bf16 GPT-2-small run on an H100 (an assumption)
H100_BF16_PEAK = 989e12
# For CPU time estimates only: the share of the CPU's measured float32 matmul rate a training step reaches
# (the nano default on 2 cores reached about 0.6 of it; smaller widths reach less). An assumption.
CPU_ASSUMED_SHARE = 0.5


@functools.lru_cache(maxsize=1)
def cpu_matmul_flops(seconds: float = 0.3, n: int = 512) -> float:
    """This CPU's float32 matmul rate in FLOP/s: the best of repeated ``n`` x ``n`` products over about
    ``seconds``. The best trial is the one least slowed by other work on the machine."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b  # the first call sets up threads and buffers
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / max(time.perf_counter() - start, 1e-9))
    return best


def duration_text(minutes: float) -> str:
    """Minutes as a reader wants them: seconds below a minute, hours above two."""
    if minutes < 1:
        return f"{max(minutes * 60, 1):.0f} s" if minutes * 60 >= 1 else "under a second"
    return f"{minutes:,.1f} min" if minutes < 120 else f"{minutes / 60:,.1f} h"


@functools.lru_cache(maxsize=64)
def _counted(fields: str) -> tuple[int, int]:
    """(parameters, training FLOPs per token) of the model these GPTConfig fields build, built on the meta
    device (no memory, no arithmetic): every layout, position encoding and score modification counts its own
    (QK-norm scales, sinks, a latent's projections, no position table without learned positions)."""
    from model.gpt import GPT

    with torch.device("meta"):
        model = GPT(GPTConfig(**json.loads(fields)))
    return model.num_params(), model.flops_per_token()


@functools.lru_cache(maxsize=64)
def _muon_counted(fields: str) -> int:
    """Parameters of the model these GPTConfig fields build that Muon takes (its 2-D hidden weights; the split does
    not change which), built on the meta device."""
    from model.gpt import GPT
    from training.muon import hidden_matrices

    with torch.device("meta"):
        model = GPT(GPTConfig(**json.loads(fields)))
    return sum(p.numel() for p in {id(piece.param): piece.param for m in hidden_matrices(model, "as_stored")
                                   for piece in m.pieces}.values())  # fmt: skip


def optimizer_state(config: GPTConfig, optim) -> tuple[int, int]:
    """(parameters with Muon's one momentum buffer, parameters with AdamW's two moments) under ``optim``."""
    params = param_count(config)
    muon = _muon_counted(json.dumps(vars(config), sort_keys=True)) if optim.name == "muon" else 0
    return muon, params - muon


def model_counts(config: GPTConfig) -> tuple[int, int]:
    """(parameters, FLOPs per token) as the model counts them (``GPT.num_params``, ``GPT.flops_per_token``: the
    figures training's MFU uses): 6 per weight that multiplies a token (the position table excluded; a latent
    attention's up-projections are weights and count), plus the score and value matmuls over the keys seen."""
    return _counted(json.dumps(vars(config), sort_keys=True))  # hashable, a schedule's layer kinds too


def param_count(config: GPTConfig) -> int:
    """Parameters, each counted once (the LM head is tied to the token embedding); same for every layout of
    one function."""
    return model_counts(config)[0]


def axes_text(config: GPTConfig) -> str:
    """The attention options set away from their defaults, as the run's label spells them (``; rope, sinks``),
    or "" for a model with none."""
    parts = attention_label(vars(config), sep="|").split("|")[2:]
    return f"; {', '.join(parts)}" if parts else ""


def cache_kind(config: GPTConfig) -> str:
    """What sampling's KV cache keeps per layer, in words: the keys and values of every head (multi-head), of
    fewer shared heads (grouped-query, multi-query), or a latent they are made from (latent)."""
    if registry.mixer(config.attention).state_bytes(config.attention_spec, 4):  # a linear layer
        return f"none: each of {config.n_head} heads keeps a {config.head_dim} x {config.head_dim} state instead"
    if config.kv_latent is not None:
        rope = f" + a rotary key of {config.rope_head_dim}" if config.rope_head_dim else ""
        return f"latent: {config.kv_latent} latent dims{rope}"
    if config.kv_heads == config.n_head:
        return "multi-head"
    if config.kv_heads == 1:
        return f"multi-query: 1 key/value head for {config.n_head}"
    return f"grouped-query: {config.kv_heads} key/value heads for {config.n_head}"


def attends(config: GPTConfig) -> str:
    """How a model attends, for the plan's lines: the layout and the kernel (``fused_qkv + sdpa``); the layout alone
    where no layer runs a kernel (every layer linear attention); what each kind runs where a schedule's kinds run
    other layouts (``KKKM: K=kda, M=mla/sdpa``: not ``mla + sdpa``, which three of its four layers do not run)."""
    if mixes_layouts(vars(config)):
        return schedule_text(vars(config)).replace(", ", ": ", 1)
    return f"{config.attention} + {config.kernel}" if config.runs_a_kernel else config.attention


def cache_width(config: GPTConfig) -> int:
    """Numbers sampling's KV cache keeps per token and layer, as the layout says (``cache_width(spec)``)."""
    return registry.mixer(config.attention).cache_width(config.attention_spec)


def layer_rows(config: GPTConfig, dtype: torch.dtype) -> list[str]:
    """A schedule's plan, by layer kind: its layers, parameters, FLOPs per token and KV cache (per position, and
    per sample once its ring or the context is full), each per layer and for the kind's layers together."""
    from model.gpt import Block, score_flops

    a = torch.finfo(dtype).bits // 8
    rows = []
    for kind in dict.fromkeys(config.layer_kind_names):
        layers = [i for i, k in enumerate(config.layer_kind_names) if k == kind]
        one = config.layer_config(layers[0])
        with torch.device("meta"):
            params = sum(p.numel() for p in Block(one).parameters())
        spec, T = one.attention_spec, config.block_size
        flops = 6 * params + score_flops(registry.mixer(one.attention), spec, T)
        per_position = cache_width(one) * a
        full = per_position * one.cache_capacity
        label = attention_label(vars(one), sep="|").split("|")
        options = ", ".join([*([one.attention] if one.attention != config.attention else []), *label[2:]])
        state = registry.mixer(one.attention).state_bytes(spec, a)
        if state:  # a linear layer: a state of fixed size, no KV cache
            memory = f"a state of {state * len(layers) / 1024:,.1f} KiB per sample for the {len(layers)} at any length"
        elif one.kv_from is not None:  # cross-layer KV sharing: it reads the cache of a layer of another kind
            memory = f"no KV cache of its own (reads the keys and values of the nearest earlier layer {one.kv_from})"
        else:
            memory = f"KV cache {per_position:,} B per position up to {one.cache_capacity:,} positions, " \
                     f"{full * len(layers) / 1024:,.1f} KiB per sample for the {len(layers)} when full"  # fmt: skip
        rows.append(f"    {kind} x {len(layers)} (layers {', '.join(map(str, layers))}; {options or 'no other option'}"
                    f"): {params:,} parameters and {flops / 1e6:,.2f} M FLOPs per token each; {memory}")  # fmt: skip
    return rows


def activation_bytes(config: GPTConfig, micro_batch: int, dtype: torch.dtype) -> dict[str, int]:
    """Bytes of the tensors eager autograd keeps for backward in one forward pass, by part.

    Float32 for LayerNorm inputs, softmax and cross-entropy outputs (autocast runs those in float32);
    ``dtype`` for matmul inputs and outputs. Under autocast each Linear casts its input separately: the
    layout says how many copies of the block's input its projections keep (``input_casts``: the wrapper's
    one per head and key/value group), and the kernel whether it keeps the attention matrices.
    """
    if config.layer_pattern is not None:  # each layer's parts as its own uniform model's, then summed
        each = [activation_bytes(config.layer_config(i), micro_batch, dtype) for i in range(config.n_layer)]
        shared = ("final norm and LM head input", "log-softmax of the logits")
        names = dict.fromkeys(name for parts in each for name in parts)
        return {name: each[0][name] if name in shared else sum(parts.get(name, 0) for parts in each) // config.n_layer
                for name in names}  # fmt: skip
    a = torch.finfo(dtype).bits // 8 if dtype.is_floating_point else 4
    B, T, C, H, L = micro_batch, config.block_size, config.n_embd, config.n_head, config.n_layer
    N = B * T * C  # one (batch, seq, width) tensor, in elements
    # keys and values are this share of N (none of a layer that reads another's: it projects and encodes queries alone)
    kv_share = 0.0 if config.kv_from is not None else config.kv_heads / H
    scores = B * H * T * T  # one attention matrix per head, in elements (a window masks them, not shrinks)
    drop = config.dropout > 0
    casts = registry.mixer(config.attention).input_casts(H, config.kv_heads) if a < 4 else 1

    qkv_input = casts * N * a
    qkv = int((1 + 2 * kv_share) * N * a)
    # The manual kernel and SDPA's math implementation keep the attention matrices; the fused kernels do not.
    matrices = registry.kernel(config.kernel).keeps_scores(config.sdpa_backend)
    if matrices:
        # softmax output (float32), its cast for the matmul with V under autocast, dropout's mask
        kernel = scores * 4 + (scores * a if a < 4 else 0) + (scores * (1 + a) if drop else 0)
        heads_out = N * a  # merged heads, the input of c_proj
    else:
        kernel = B * H * T * 4  # the fused kernel keeps only its output and the log-sum-exp
        heads_out = 2 * N * a  # the kernel's output and the merged heads
    per_layer = {
        "layernorm inputs": 2 * N * 4,
        "attention projections": qkv_input + qkv + heads_out,
        "attention matrices" if matrices else "attention log-sum-exp": kernel,
        "MLP": N * a + 2 * 4 * N * a,  # c_fc input, GELU input, c_proj input
        "query/key encodings": encoding_bytes(config, Activations(B, T, H, N, kv_share), a),
        "dropout masks": 2 * N if drop else 0,
        # differential attention's two kernel calls (each pair's values read in halves): the second call's queries,
        # keys, values and output, the outputs side by side (which the difference reads), and the difference its norm
        # reads in float32 (measured: 6 widths at the matmuls' dtype and one in float32, float32 and bfloat16 alike)
        "differential heads": (6 * N * a + 4 * N) if config.differential else 0,
    }
    selection = selection_of(config.attention_spec)
    if selection is not None and selection.plan_part:  # what a key selection keeps (sparse attention's indexer)
        per_layer[selection.plan_part] = selection.plan_bytes(config.attention_spec, B, T, a)
    own = getattr(registry.mixer(config.attention), "activation_bytes", None)  # a linear layer's own parts
    if own is not None:
        del per_layer["attention projections"], per_layer["attention matrices" if matrices else "attention log-sum-exp"]
        per_layer = {**own(config.attention_spec, B, T, a), **per_layer}
    parts = {name: L * value for name, value in per_layer.items()}
    V = config.vocab_size or config.padded_vocab_size
    parts["final norm and LM head input"] = N * 4 + N * a
    parts["log-softmax of the logits"] = B * T * V * 4
    return {name: value for name, value in parts.items() if value}


def eval_bytes(config: GPTConfig, length: int, batch_tokens: int) -> tuple[int, int]:
    """Reading ``length`` tokens past the trained context (trainer.eval_lengths, without gradients): the
    sequences per forward (``LengthEvaluator``: at most ``batch_tokens`` tokens, one sequence at least) and the
    bytes a forward holds at its peak, float32: the residual stream, a layer's norm, q/k/v and MLP hidden
    (about 9 widths), a layer's attention matrices where the kernel makes them (the manual kernel: the scores,
    their masked copy and the softmax, with the boolean mask: 3.25 length x length matrices a head, as measured
    at 2,048 and 4,096 tokens), and the logits with their log-softmax (the loss of every position)."""
    b = max(1, batch_tokens // length)
    n = b * length * config.n_embd
    keeps = registry.kernel(config.kernel).keeps_scores(config.sdpa_backend)
    scores = 3 * b * config.n_head * length * length + length * length // 4 if keeps else b * config.n_head * length
    logits = 2 * b * length * (config.vocab_size or config.padded_vocab_size)
    return b, 4 * (9 * n + scores + logits)


def encoding_bytes(config: GPTConfig, forward: Activations, a: int) -> int:
    """Per layer, what the modifications (``MODIFICATIONS``' plan terms: QK-norm's RMSNorm its float32 steps) and rotary
    positions keep of the queries and keys (``forward.elements`` is one query tensor): rotary the input and its
    rotated half (one copy in the matmul dtype, measured). 0 for a model without them."""
    mods = sum(mod.plan_bytes(forward) for mod in registry.MODIFICATIONS.values()
               if mod.used(getattr(config, mod.field)))  # fmt: skip
    turns = registry.position(config.position).turns_queries_keys
    rotary = (1 + forward.kv_share) * forward.elements * a if turns else 0
    return int(mods + rotary)


@dataclass
class Plan:
    config: GPTConfig
    world_size: int
    micro_batch: int
    grad_accum: int
    tokens_per_step: int
    max_steps: int
    params: int
    flops_per_token: int
    dtype: torch.dtype
    static_bytes: int
    activations: dict[str, int]
    logits_transient_bytes: int
    cpu_flops: float | None = None  # a plan for this CPU: its measured matmul rate (cpu_matmul_flops)
    loss_chunk: int = 0  # trainer.loss_chunk: the head and loss in chunks of this many tokens (0: whole)
    eval_lengths: list[int] = field(default_factory=list)  # trainer.eval_lengths, in tokens (see eval_bytes)
    muon_params: int = 0  # parameters whose optimizer state is Muon's one momentum buffer (the rest: AdamW's two)

    @property
    def kv_cache_bytes_per_token(self) -> int:
        """What sampling's KV cache holds per position and sample: every layer's ``cache_width`` numbers (the
        layout's: keys and values, or a latent) in the plan's dtype."""
        return sum(self.config.cache_widths) * (torch.finfo(self.dtype).bits // 8)

    @property
    def state_bytes_per_sample(self) -> int:
        """What a linear layer's decoding state holds per sample, whatever the length (0 without one)."""
        return self.config.state_bytes(torch.finfo(self.dtype).bits // 8)

    @property
    def peak_bytes(self) -> int:
        return self.static_bytes + sum(self.activations.values()) + self.logits_transient_bytes

    def h100_minutes(self) -> float:
        """Estimated minutes per GPU on H100s at ``ASSUMED_MFU``."""
        flops = self.flops_per_token * self.tokens_per_step * self.max_steps
        return flops / (ASSUMED_MFU * H100_BF16_PEAK) / 60 / self.world_size

    def cpu_minutes(self) -> float | None:
        """Estimated minutes on this CPU at ``CPU_ASSUMED_SHARE`` of its measured matmul rate (a CPU plan only)."""
        if self.cpu_flops is None:
            return None
        return self.flops_per_token * self.tokens_per_step * self.max_steps / (CPU_ASSUMED_SHARE * self.cpu_flops) / 60

    def time_text(self) -> str:
        """The time estimate, in the plan's table of a sweep: on this CPU for a CPU plan, else on H100s."""
        cpu = self.cpu_minutes()
        if cpu is not None:
            return f"{duration_text(cpu)} on this CPU"
        return f"{duration_text(self.h100_minutes())} on H100s"

    def _precision(self) -> str:
        """The dtype and how: float32 runs as is; bf16/fp16 under autocast (float32 weights, low-precision matmuls)."""
        name = str(self.dtype).removeprefix("torch.")
        return name if self.dtype == torch.float32 else f"{name} autocast"

    def _time_lines(self) -> list[str]:
        h100 = (f"one H100 (bf16 peak 989 TFLOP/s at an assumed {ASSUMED_MFU:.0%} MFU): "
                f"{duration_text(self.h100_minutes())} per GPU over {self.world_size} GPU(s)")  # fmt: skip
        if self.cpu_flops is None:
            return [f"  estimated time on {h100} (an estimate)"]
        return [
            f"  estimated time on this CPU: {duration_text(self.cpu_minutes())} (its float32 matmuls measured at "
            f"{self.cpu_flops / 1e9:,.0f} GFLOP/s just now, a step assumed to reach {CPU_ASSUMED_SHARE:.0%} of that; "
            f"a rough estimate: a short run's tokens/s tells better)",
            f"  on a GPU instead (trainer=gpu), {h100}",
        ]

    def _eval_lines(self) -> list[str]:
        """trainer.eval_lengths: what reading each length costs at the end of the run (main rank, float32)."""
        if not self.eval_lengths:
            return []
        parts = []
        for length in self.eval_lengths:
            batch, nbytes = eval_bytes(self.config, length, self.micro_batch * self.config.block_size)
            parts.append(f"{length:,} tokens x {batch}: {nbytes / 2**20:,.0f} MiB")
        return [f"  reading past the trained length at the end (trainer.eval_lengths; sequences per forward, the "
                f"forward's peak beside the weights, float32): {'; '.join(parts)}"]  # fmt: skip

    def text(self) -> str:
        c = self.config
        tokens = self.tokens_per_step * self.max_steps
        flops = self.flops_per_token * tokens
        lines = [
            f"plan: {c.name} ({attends(c)}{axes_text(c)}), {self.params:,} parameters, vocab "
            f"{c.vocab_size:,}",
            f"  {c.n_layer} layers x {c.n_head} heads x {c.n_embd} wide, context {c.block_size}, "
            f"dropout {c.dropout}",
            f"  FLOPs per token (forward + backward): {self.flops_per_token / 1e6:,.1f} M",
            f"  tokens per step: {self.tokens_per_step:,} over {self.world_size} rank(s): micro-batch "
            f"{self.micro_batch} x {c.block_size} tokens, {self.grad_accum} accumulation step(s) per rank",
            f"  run: {self.max_steps:,} steps = {tokens / 1e6:,.1f} M tokens = {flops:.3g} FLOPs",
            *self._time_lines(),
            f"  estimated peak memory {'in RAM' if self.cpu_flops else 'per GPU'} ({self._precision()}, eager): "
            f"{self.peak_bytes / GIB:,.2f} GiB",
            f"    weights + gradients + {self._optimizer_text()}{' + DDP buckets' if self.world_size > 1 else ''}: "
            f"{self.static_bytes / GIB:,.2f} GiB",
        ]
        lines += [f"    {name}: {value / GIB:,.2f} GiB" for name, value in self.activations.items()]
        lines.append(f"    logits in flight: {self.logits_transient_bytes / GIB:,.2f} GiB")
        if c.layer_pattern is not None:
            full = sum(w * n for w, n in zip(c.cache_widths, c.cache_capacities)) * (torch.finfo(self.dtype).bits // 8)
            lines.append(f"  layers ({c.layer_pattern} repeated over {c.n_layer}), by kind:")
            lines += layer_rows(c, self.dtype)
            lines.append(f"  sampling's KV cache: {self.kv_cache_bytes_per_token / 1024:,.1f} KiB per position and "
                         f"sample while every layer's ring fills, {full / 1024:,.1f} KiB per sample when all are "
                         f"full ({str(self.dtype).removeprefix('torch.')})")  # fmt: skip
            return "\n".join([*lines, *self._state_lines()])
        lines += self._eval_lines()
        # a window, a chunk: the cache holds what they see
        capped = [f"{mask.field.replace('_', ' ')} {value}" for mask, value in options_set(c)]
        most = f"{c.cache_capacity} position{'s' if c.cache_capacity != 1 else ''}"
        window = f", {', '.join(capped)}: at most {most}" if capped else ""
        lines.append(f"  sampling's KV cache: {self.kv_cache_bytes_per_token / 1024:,.1f} KiB per position and "
                     f"sample ({cache_kind(c)}; {cache_width(c):,} numbers per layer x {c.n_layer} layers{window}, "
                     f"{str(self.dtype).removeprefix('torch.')})")  # fmt: skip
        return "\n".join([*lines, *self._state_lines()])

    def _optimizer_text(self) -> str:
        """The optimizer's state: AdamW's moments, or Muon's momentum beside them (how many parameters each keeps)."""
        if not self.muon_params:
            return "AdamW"
        return (f"optimizer (Muon's momentum for {self.muon_params:,} parameters, AdamW's two moments for "
                f"{self.params - self.muon_params:,})")

    def _state_lines(self) -> list[str]:
        if not self.state_bytes_per_sample:
            return []
        return [f"  sampling's state: {self.state_bytes_per_sample / 1024:,.1f} KiB per sample at any length (what "
                f"the linear layers carry from token to token: their state_bytes)"]  # fmt: skip


def make_plan(cfg: TrainConfig, model_config: GPTConfig, world_size: int, dtype: torch.dtype,
              micro_batch: int | None = None) -> Plan:  # fmt: skip
    t = cfg.trainer
    micro = micro_batch or micro_batch_for(t, world_size)
    params, flops = model_counts(model_config)
    a = torch.finfo(dtype).bits // 8
    muon, adam = optimizer_state(model_config, cfg.optim)
    return Plan(
        config=model_config,
        world_size=world_size,
        micro_batch=micro,
        grad_accum=max(1, t.batch_size // (micro * world_size)),
        tokens_per_step=t.batch_size * model_config.block_size,
        max_steps=t.max_steps,
        params=params,
        flops_per_token=flops,
        dtype=dtype,
        static_bytes=params * (8 + (4 if world_size > 1 else 0)) + 4 * muon + 8 * adam,  # weights, gradients, state
        activations=loss_activations(activation_bytes(model_config, micro, dtype), model_config, micro, t.loss_chunk),
        logits_transient_bytes=logits_in_flight(model_config, micro, a, t.loss_chunk),
        eval_lengths=read_lengths(t, model_config),
        loss_chunk=t.loss_chunk,
        muon_params=muon,
    )


LOSS_PARTS = ("log-softmax of the logits", "loss gradients (chunked head and loss)")  # what trainer.loss_chunk changes


def loss_activations(parts: dict[str, int], config: GPTConfig, micro_batch: int, loss_chunk: int) -> dict[str, int]:
    """``activation_bytes``' parts with the loss as trainer.loss_chunk computes it: in chunks, the log-softmax of
    every logit is not kept; the gradients of the hidden states and of the head's weight are (float32)."""
    if not loss_chunk:
        return parts
    parts = {name: value for name, value in parts.items() if name != "log-softmax of the logits"}
    parts["loss gradients (chunked head and loss)"] = 4 * config.n_embd * (micro_batch * config.block_size
                                                                             + config.padded_vocab_size)
    return parts


def logits_in_flight(config: GPTConfig, micro_batch: int, a: int, loss_chunk: int) -> int:
    """Bytes of logits alive together for a moment, ``a`` bytes per element in the products. Whole: the LM head's
    output, its cropped copy and its float32 cast. In chunks of ``loss_chunk`` tokens: a chunk's product, its float32
    copy, the log-sum-exp's float32 scratch and the gradient cast back for the products (float32: the two float32)."""
    V, tokens = config.padded_vocab_size, micro_batch * config.block_size
    if not loss_chunk:
        return tokens * V * (2 * a + (4 if a < 4 else 0))
    return min(loss_chunk, tokens) * V * (8 + (2 * a if a < 4 else 0))


def read_lengths(trainer, config: GPTConfig) -> list[int]:
    """trainer.eval_lengths in tokens, those a learned table's model reads (within its rows)."""
    if trainer.eval_lengths is None:
        return []
    lengths = resolve_lengths(trainer.eval_lengths, config.block_size)
    return lengths if config.runs_past_context else [n for n in lengths if n <= config.block_size]


AUTO_HEADROOM = 0.85  # share of free memory micro_batch_size=auto plans to fill: workspaces, fragmentation


def auto_micro_batch(cfg: TrainConfig, model_config: GPTConfig, world_size: int, dtype: torch.dtype,
                     available_bytes: int | None) -> int:  # fmt: skip
    """The largest micro-batch that divides a rank's share of the batch and whose estimated peak fits
    ``AUTO_HEADROOM`` of ``available_bytes`` (unknown: the whole share); fewer accumulation steps run
    faster (bigger matrix products, fewer launches)."""
    per_rank = cfg.trainer.batch_size // world_size
    if available_bytes is None:
        return per_rank
    budget = AUTO_HEADROOM * available_bytes
    for micro in (m for m in range(per_rank, 0, -1) if per_rank % m == 0):
        if make_plan(cfg, model_config, world_size, dtype, micro_batch=micro).peak_bytes <= budget:
            return micro
    smallest = make_plan(cfg, model_config, world_size, dtype, micro_batch=1).peak_bytes
    raise ValueError(
        f"trainer.micro_batch_size=auto: not even one sequence fits; it needs an estimated {smallest / GIB:.1f} "
        f"GiB and {AUTO_HEADROOM:.0%} of the {available_bytes / GIB:.1f} GiB free is {budget / GIB:.1f} GiB. "
        f"Use a smaller model or block_size, or the sdpa kernel"
    )


def auto_choices_text(cfg: TrainConfig, model_config: GPTConfig, world_size: int, dtype: torch.dtype,
                      sizes_gib: tuple[int, ...] = (80, 40, 24)) -> str:  # fmt: skip
    """What ``micro_batch_size=auto`` would pick on GPUs with this much free memory (for a plan made elsewhere)."""
    picks = []
    for gib in sizes_gib:
        try:
            micro = auto_micro_batch(cfg, model_config, world_size, dtype, gib * GIB)
            peak = make_plan(cfg, model_config, world_size, dtype, micro_batch=micro).peak_bytes
            picks.append(f"{gib} GiB free -> {micro} (estimated {peak / GIB:.1f} GiB)")
        except ValueError:
            picks.append(f"{gib} GiB free -> none fits")
    return "  on other GPUs it would pick: " + "; ".join(picks)


def planned_device(trainer) -> str:
    """Where a run would train: ``cpu`` when asked for, or with ``auto`` where no GPU is present; else ``cuda``."""
    return "cpu" if trainer.device == "cpu" or (trainer.device == "auto" and not torch.cuda.is_available()) else "cuda"


def planned_dtype(trainer) -> torch.dtype:
    """The dtype a run would use, without its device: ``auto`` plans for bf16 on a GPU
    (Ampere or newer), and float32 for a run on the CPU."""
    if trainer.dtype == "auto":
        if planned_device(trainer) == "cpu":
            return torch.float32
        return torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[trainer.dtype]


def check_fits_device(plan: Plan, device: torch.device, total_bytes: int | None = None) -> None:
    """Refuse a run whose estimated peak exceeds the memory it will have, naming a micro-batch that fits: a GPU's
    memory, or on a CPU the RAM available now, shared by this machine's ranks (the estimate counts tensors, not
    the libraries' own hundreds of MB, so it refuses only what cannot fit)."""
    what = "per GPU" if device.type == "cuda" else "of RAM per process"
    if total_bytes is None:
        if device.type == "cuda":
            total_bytes = torch.cuda.get_device_properties(device).total_memory
        else:
            available = available_memory(device)
            if available is None:  # not Linux: nothing to compare with
                return
            total_bytes = available // local_ranks()
    if plan.peak_bytes <= total_bytes:
        return
    per_rank = plan.tokens_per_step // plan.config.block_size // plan.world_size
    fits = [m for m in range(plan.micro_batch - 1, 0, -1) if per_rank % m == 0]
    smaller = next((m for m in fits if _with_micro(plan, m).peak_bytes <= total_bytes), None)
    hint = (f"set trainer.micro_batch_size={smaller} (estimated {_with_micro(plan, smaller).peak_bytes / GIB:.1f} GiB)"
            if smaller else "no micro-batch fits: use a smaller model or block_size")  # fmt: skip
    has = (f"the GPU has {total_bytes / GIB:.1f} GiB" if device.type == "cuda" else
           f"this machine has {total_bytes / GIB:.1f} GiB of RAM available{' per rank' if local_ranks() > 1 else ''}")
    raise ValueError(
        f"out of memory expected: trainer.micro_batch_size={plan.micro_batch} needs an estimated "
        f"{plan.peak_bytes / GIB:.1f} GiB {what} ({attends(plan.config)}), {has}; {hint}. "
        f"`trainer.plan=true` shows the estimate"
    )


def local_ranks() -> int:
    """The processes of this run on this machine (torchrun's LOCAL_WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def _with_micro(plan: Plan, micro: int) -> Plan:
    """``plan`` at another micro-batch: the model's activations scale with it; the loss's terms are made anew (in
    chunks, the head's weight gradient and a chunk's logits do not grow with the batch)."""
    scale = micro / plan.micro_batch
    model_parts = {k: int(v * scale) for k, v in plan.activations.items() if k not in LOSS_PARTS}
    loss_parts = {k: v for k, v in activation_bytes(plan.config, micro, plan.dtype).items() if k in LOSS_PARTS}
    a = torch.finfo(plan.dtype).bits // 8
    return Plan(**{**plan.__dict__, "micro_batch": micro,
                   "activations": loss_activations({**model_parts, **loss_parts}, plan.config, micro, plan.loss_chunk),
                   "logits_transient_bytes": logits_in_flight(plan.config, micro, a, plan.loss_chunk)})  # fmt: skip


def planned_model(cfg: TrainConfig) -> GPTConfig:
    """The model as it will be built: the vocabulary, unset, is the tokenizer's."""
    return for_tokenizer(cfg.model, VOCAB_SIZES[cfg.data.tokenizer], EOT_IDS[cfg.data.tokenizer])


def for_tokenizer(model: GPTConfig, vocab_size: int, eot_id: int) -> GPTConfig:
    """The model as the tokenizer makes it: its vocabulary where unset, and with document masking, its end-of-text
    as what ends a document where unset."""
    end = model.document_end if model.document_end is not None or not model.document_masking else eot_id
    return replace(model, vocab_size=model.vocab_size or vocab_size, document_end=end)


def plan_of(cfg: TrainConfig, planned: GPTConfig, world_size: int):
    """The plan and its text. ``micro_batch_size=auto`` is planned for the GPU at hand, or for an 80 GiB
    one (an H100) where there is none, with what it would pick on others."""
    t, dtype = cfg.trainer, planned_dtype(cfg.trainer)
    micro, note = None, ""
    if t.micro_batch_size == "auto":
        on_gpu = t.device != "cpu" and torch.cuda.is_available()
        free = available_memory(resolve_device(t.device)) if on_gpu else 80 * GIB
        micro = auto_micro_batch(cfg, planned, world_size, dtype, free)
        where = f"this GPU's {free / GIB:.1f} GiB free" if on_gpu else "an 80 GiB GPU (an H100; none is here)"
        note = f"\n  micro-batch auto: planned above for {where}\n" + auto_choices_text(cfg, planned, world_size, dtype)
    plan = make_plan(cfg, planned, world_size, dtype, micro_batch=micro)
    if planned_device(t) == "cpu":  # a run on this CPU: its time is estimated from a quick matmul measurement
        plan = replace(plan, cpu_flops=cpu_matmul_flops())
    return plan, plan.text() + note


def plan_variants(configs: dict[str, TrainConfig]) -> str:
    """The plans of a sweep's variants: a table of each one's micro-batch, memory and time, then each
    distinct plan once, headed by the variants it covers (seeds do not change a plan)."""
    world = from_environment().world_size
    plans: dict[str, list[str]] = {}
    rows = []
    for name, cfg in configs.items():
        validate(cfg)
        plan, text = plan_of(cfg, planned_model(cfg), world)
        plans.setdefault(text, []).append(name)
        rows.append(f"| {name} | {plan.micro_batch} x {plan.grad_accum} | {plan.peak_bytes / GIB:,.1f} | "
                    f"{plan.time_text()} |")  # fmt: skip
    table = ["| run | micro-batch x accumulation | est. peak GiB | est. time |", "| --- | ---: | ---: | ---: |",
             *rows]  # fmt: skip
    parts = [f"{len(configs)} runs; estimates, as each plan below says:", "\n".join(table)]
    parts += [f"--- {'; '.join(names)} ---\n{text}" for text, names in plans.items()]
    return "\n\n".join(parts)
