"""Causal multi-head attention in three layouts that compute the same function.

- ``wrapper``: n_head single-head modules side by side.
- ``separate_qkv``: three Linear projections, reshaped into heads.
- ``fused_qkv``: one Linear projection, split into q, k, v.

Queries have ``n_head`` heads; keys and values ``n_kv_head`` (grouped-query attention: each group of
n_head / n_kv_head query heads shares one key/value head; 1 is multi-query; n_head, the default, is
multi-head). All three layouts concatenate the query heads' outputs (head h in columns h*head_dim ...
(h+1)*head_dim) and apply the same output projection ``c_proj``. Each layout also says how its q/k/v
parameters map to and from one common form, the full-width q, k and v matrices (``to_qkv`` /
``from_qkv``), so ``model.convert`` converts between any two layouts with one generic loop. Each layout
states its other facts too (the copies of its input it keeps under autocast, for the plan; its plot
style; what converting it needs) and registers itself in ``model.registry.ATTENTION_LAYOUTS``, so a new
layout is one class in this file (plus its configs file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model import registry
from model.differential import LAMBDA_INIT, DifferentialHeads
from model.kernels import SDPA_BACKENDS, attention_probs, get_kernel, repeat_kv
from model.masks import HeldKeys, Masks
from model.masks import capacity as mask_capacity
from model.masks import of_spec as masks_of
from model.masks import options_set as masks_set
from model.options import applied, check_applied, check_conflicts, option_fields, spelled, takers
from model.positions import ROPE_SCALINGS, alibi_slopes
from model.registry import ATTENTION_LAYOUTS, KERNELS, POSITIONS, SCORE_MODS, lookup, register
from model.score_mods import GATES, ScoreMods, finite_number, on_the_scores
from model.sparse import INDEXER_DIM, INDEXER_HEADS, LightningIndexer, check_sparse, index_flops

if TYPE_CHECKING:
    from model.kv_cache import LayerCache


# The common form of one attention block's projections: for "weight" and "bias", the (q, k, v)
# tensors: q (n_head * head_dim, n_embd) or (n_head * head_dim,), k and v with n_kv_head heads.
QKV = dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
PROJECTIONS = ("query", "key", "value")


def option(default, example, same_function: bool = False, per_layer: bool = True, labelled: bool = True,
           values: tuple = (), conflicts: dict[str, str] | None = None, **needs):  # fmt: skip
    """An option of ``AttentionSpec``: its default, a value that sets it (with the other options it ``needs``), the
    other ``values`` that set it to another function (each of a choice: rotary and no positions beside ALiBi; the
    option walks set each), whether every value computes the same function (a chunk size of an algorithm), whether a
    schedule's layer kind may set it for its layers (``model.config.LAYER_FIELDS``; not a model-wide setting: the
    rotary scaling a reading applies, dropout, a layout's own widths), and whether a run's label spells it
    (``attention_label``: two runs that differ in it must not share a name; not dropout, a training setting), and
    the options it cannot coexist with, each with why (``conflicts``: refused in one line naming both, whichever is
    set first; the pair walk, tests/test_option_pairs.py, holds every other pair to change the function)."""
    return field(default=default, metadata={"example": example, "values": values, "with": needs,
                                            "same_function": same_function, "per_layer": per_layer,
                                            "labelled": labelled, "conflicts": conflicts or {}})  # fmt: skip


TEMPERATURE_SCALE = 0.1  # Llama 4's attn_scale: how fast the queries' temperature grows with log(position)


def tempered(q: torch.Tensor, positions: torch.Tensor, steps: int) -> torch.Tensor:
    """Queries (..., T, d) at ``positions`` (T,) scaled by Llama 4's temperature, 1 + 0.1 log(1 + floor((i + 1) /
    steps)): 1 before position steps - 1, growing with the log of the length past it (arXiv 2501.19399)."""
    scale = torch.log1p(torch.floor((positions.float() + 1) / steps)) * TEMPERATURE_SCALE + 1
    return (q * scale[:, None]).to(q.dtype)


@dataclass(frozen=True)
class AttentionSpec:
    """One attention block's shape and how it attends: what every layout is built from, and the one place
    its options are checked (a GPTConfig makes one: ``GPTConfig.attention_spec``)."""

    n_embd: int
    n_head: int
    kernel: str = "sdpa"
    # The options (model.options: every field but the shape and the kernel's choice) say a value that sets them
    # (``example``, with the options it needs, ``with``): tests/test_options.py holds every option, in every layer,
    # kernel and the export, to be applied (it changes the function) or refused.
    dropout: float = option(0.0, 0.25, per_layer=False, labelled=False)
    bias: bool = True
    n_kv_head: int | None = option(None, 2, values=(1,))  # None: n_head (multi-head); 1: multi-query
    window: int | None = option(None, 3)  # None: every earlier position
    # Llama 4's chunked attention: a query sees the keys of its own chunk of this many positions; None: off
    attention_chunk: int | None = option(None, 3)
    sdpa_backend: str = "auto"
    position: str = option("learned", "alibi", values=tuple(POSITIONS))  # model.positions: learned|rope|alibi|none
    rope_theta: float = option(10000.0, 50.0, position="rope")
    # the share of each head's dims that rotary turns (the first ones; Qwen3-Next: 0.25)
    rope_fraction: float = option(1.0, 0.5, position="rope")
    # rotary read past its trained length: pi | ntk | yarn (model.positions.scaled)
    rope_scaling: str | None = option(None, "pi", per_layer=False, values=ROPE_SCALINGS, position="rope",
                                      rope_factor=4.0)
    # the scaling's factor s (the read length over the trained one, typically)
    rope_factor: float = option(1.0, 4.0, per_layer=False, position="rope", rope_scaling="pi")
    # the trained length YaRN's ramp counts turns over (None: block_size)
    rope_original_length: int | None = option(None, 2, per_layer=False, position="rope", rope_scaling="yarn",
                                              rope_factor=4.0)
    # Llama 4's temperature for long contexts: the query at position i scaled by 1 + 0.1 log(1 + floor((i + 1) / N)),
    # N this many positions (Llama 4's 8192, its chunk; its NoPE layers'); None: off
    query_temperature: int | None = option(None, 4)
    qk_norm: bool = option(False, True)
    softcap: float | None = option(None, 3.0)
    sinks: bool = option(False, True)
    gate: str = option("none", "headwise", values=GATES)  # an output gate from the block's input (GATES)
    forget_gate: bool = option(False, True)  # the Forgetting Transformer's forget gate on the scores
    # Differential attention (the Diff Transformer, model.differential): heads 2h and 2h+1 one head, weighted by
    # their softmax maps' difference over both heads' values, then an RMSNorm per head and the (1 - lambda_init) scale
    differential: bool = option(False, True)
    # differential attention's lambda at the start (the paper's by depth tends to 0.8; its constant 0.8 did as well)
    lambda_init: float = option(LAMBDA_INIT, 0.5, differential=True)
    block_size: int | None = None  # the model's context: what a position past it sees (``context``)
    kv_latent: int | None = option(None, 8)  # attention=mla's latent width (a schedule's kinds may set it)
    rope_head_dim: int | None = option(None, 4, per_layer=False, position="rope")  # mla's rotary key width
    # attention=gated_deltanet's chunk of positions (None: its default, 64); the same function at any chunk
    linear_chunk: int | None = option(None, 3, same_function=True, per_layer=False)
    # document masking: a query sees no key before its document's start (after the last end-of-text token)
    document_masking: bool = option(False, True, per_layer=False)
    # DeepSeek Sparse Attention (model.sparse): each query attends the keys a lightning indexer of this many heads of
    # this width scores highest, this many of them; None: dense. A schedule's kind may set it (a hybrid's softmax
    # layers); the indexer's shape is the model's, for every sparse layer
    sparse_topk: int | None = option(None, 2)
    indexer_heads: int = option(INDEXER_HEADS, 2, per_layer=False, sparse_topk=2)
    indexer_dim: int = option(INDEXER_DIM, 8, per_layer=False, sparse_topk=2)

    def __post_init__(self) -> None:
        check_heads(self.n_embd, self.n_head)
        kv = self.n_kv_head
        if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or self.n_head % kv):
            problem = "does not divide" if isinstance(kv, int) and kv >= 1 else "is not a positive divisor of"
            raise ValueError(f"model.n_kv_head={kv!r} {problem} model.n_head={self.n_head}; choose a divisor "
                             f"of n_head (1: multi-query, n_head or null: multi-head)")  # fmt: skip
        check_positions("window", self.window, "", "all")
        check_positions("attention_chunk", self.attention_chunk, " per chunk", "no chunks")
        check_positions("query_temperature", self.query_temperature, " (the queries' temperature grows each time the "
                        "position passes a multiple of it; Llama 4's 8192)", "off")  # fmt: skip
        if not isinstance(self.differential, bool):
            raise ValueError(f"model.differential={self.differential!r} must be true or false")
        if not finite_number(self.lambda_init) or not 0 < self.lambda_init < 1:
            raise ValueError(f"model.lambda_init={self.lambda_init!r} must be a number between 0 and 1, both excluded "
                             f"(the paper's 0.8, or 0.8 - 0.6 exp(-0.3 (l - 1)) at depth l)")  # fmt: skip
        if self.lambda_init != LAMBDA_INIT and not self.differential:
            raise ValueError(f"model.lambda_init={self.lambda_init} is differential attention's lambda: set "
                             f"model.differential=true, or leave model.lambda_init at {LAMBDA_INIT}")  # fmt: skip
        if self.differential and self.n_head % 2:
            raise ValueError(f"model.differential=true pairs heads 2h and 2h+1 into one, but model.n_head="
                             f"{self.n_head} is odd; use an even number of heads (model.n_head={self.n_head + 1} "
                             f"or {self.n_head - 1})")  # fmt: skip
        if self.differential and self.kv_heads % 2:
            even = [n for n in range(2, self.n_head + 1, 2) if self.n_head % n == 0]
            raise ValueError(f"model.differential=true pairs key/value heads too (each differential head's two maps "
                             f"read a key each of its group's pair, and a value two heads wide, the paper's grouped "
                             f"form), but model.n_kv_head={self.n_kv_head} is odd; use an even model.n_kv_head "
                             f"({', '.join(map(str, even))})")  # fmt: skip
        check_within_context("query_temperature", self.query_temperature, self.block_size,
                             "Llama 4's 8192 is its chunk", "off")  # fmt: skip
        check_within_context("attention_chunk", self.attention_chunk, self.block_size,
                             "a chunk of the whole context cuts only past it, as Llama 4's does", "no chunks")
        if self.window is not None and self.attention_chunk is not None and self.window >= self.attention_chunk:
            chunk = self.attention_chunk
            raise ValueError(f"model.window={self.window} cuts nothing inside model.attention_chunk={chunk}: a query "
                             f"sees at most the {chunk} keys of its chunk (itself included); use a window below "
                             f"{chunk}, or model.window=null (or model.attention_chunk=null)")  # fmt: skip
        kernel = registry.kernel(self.kernel)
        lookup(SDPA_BACKENDS, "model.sdpa_backend", self.sdpa_backend)
        if self.sdpa_backend != "auto" and self.sdpa_backend not in kernel.backends:
            takers = " or ".join(name for name, k in KERNELS.items() if self.sdpa_backend in k.backends)
            raise ValueError(f"model.sdpa_backend={self.sdpa_backend} chooses kernel={takers}'s implementation, but "
                             f"kernel={self.kernel}; use kernel={takers}, or model.sdpa_backend=auto")  # fmt: skip
        registry.position(self.position)
        if not finite_number(self.rope_theta) or not self.rope_theta > 1:  # NaN compares false: it is refused too
            raise ValueError(f"model.rope_theta={self.rope_theta!r} must be a finite number above 1 (10000: "
                             f"RoFormer's, Llama 2's; 500000: Llama 3's)")  # fmt: skip
        self.check_rope_scaling()
        self.check_rope_fraction()
        check_sparse(self)
        for mod in SCORE_MODS.values():
            mod.check(getattr(self, mod.field))
        check_conflicts(self)

    def check_kernel_applies(self) -> None:
        """Refuse what this attention needs its kernel to apply (``kernel_effects``) and the kernel does not, naming
        the kernels that do: asked by a layer that runs a kernel (``options.check_applied``), never of one that runs
        its own form (Gated DeltaNet: the kernel is not the fix)."""
        kernel = registry.kernel(self.kernel)
        if "dropout" not in kernel.applies and self.dropout > 0:
            others = " or ".join(name for name, k in KERNELS.items() if "dropout" in k.applies)
            raise ValueError(f"kernel={self.kernel} has no attention dropout, but model.dropout={self.dropout}; set "
                             f"model.dropout=0, or use kernel={others}")  # fmt: skip
        for effect, option, what in self.kernel_effects:
            if effect not in kernel.applies:
                takers = " or ".join(kernel_name for kernel_name, k in KERNELS.items() if effect in k.applies)
                raise ValueError(f"{option} {what}, which kernel={self.kernel} cannot do; use "
                                 f"kernel={takers or 'none: no kernel applies it yet'}")  # fmt: skip

    def check_rope_scaling(self) -> None:
        scaling, factor = self.rope_scaling, self.rope_factor
        if self.rope_original_length is not None and scaling != "yarn":
            raise ValueError(f"model.rope_original_length={self.rope_original_length!r} is the trained length YaRN "
                             f"counts each pair's turns over, but model.rope_scaling={spelled(scaling)}; set "
                             f"model.rope_scaling=yarn, or model.rope_original_length=null")  # fmt: skip
        if scaling is None:
            if factor != 1.0:
                raise ValueError(f"model.rope_factor={factor!r} scales nothing without model.rope_scaling; "
                                 f"set model.rope_scaling={'|'.join(ROPE_SCALINGS)}, or leave rope_factor at "
                                 f"1")  # fmt: skip
            return
        if scaling not in ROPE_SCALINGS:
            raise ValueError(f"model.rope_scaling={scaling!r}; choose one of: {', '.join(ROPE_SCALINGS)} (position "
                             f"interpolation, NTK-aware, YaRN), or null")  # fmt: skip
        if not registry.position(self.position).turns_queries_keys:
            raise ValueError(f"model.rope_scaling={scaling} scales rotary positions, but model.position="
                             f"{self.position} turns nothing; use model.position=rope, or "
                             f"model.rope_scaling=null")  # fmt: skip
        if isinstance(factor, bool) or not finite_number(factor) or not factor >= 1:
            raise ValueError(f"model.rope_factor={factor!r} must be a finite number of at least 1 (4: read 4x "
                             f"the trained length)")  # fmt: skip
        if factor == 1:  # every scaling by 1 is rotary as it is
            raise ValueError(f"model.rope_scaling={scaling} at model.rope_factor=1 scales nothing (the same function "
                             f"as no scaling); set model.rope_factor=<the read length over the trained one, above 1>, "
                             f"or model.rope_scaling=null")  # fmt: skip
        original = self.block_size if self.rope_original_length is None else self.rope_original_length
        if scaling == "yarn" and (not isinstance(original, int) or isinstance(original, bool) or original < 1):
            raise ValueError(f"model.rope_scaling=yarn counts each pair's turns over the trained length: "
                             f"model.rope_original_length={self.rope_original_length!r} must be a positive number "
                             f"of tokens (null: block_size)")  # fmt: skip

    def check_rope_fraction(self) -> None:
        fraction = self.rope_fraction
        if isinstance(fraction, bool) or not finite_number(fraction) or not 0 < fraction <= 1:
            raise ValueError(f"model.rope_fraction={fraction!r} must be in (0, 1]: the share of each head's dims "
                             f"that rotary turns (1: all; Qwen3-Next: 0.25)")  # fmt: skip
        if fraction == 1:
            return
        if not registry.position(self.position).turns_queries_keys:
            raise ValueError(f"model.rope_fraction={fraction:g} is the share of each head's dims that rotary turns, "
                             f"but model.position={self.position} turns nothing; use model.position=rope, or "
                             f"model.rope_fraction=1")  # fmt: skip
        turned = fraction * self.head_dim
        if turned != int(turned) or int(turned) % 2:
            even = [f"{k / self.head_dim:g}" for k in range(2, self.head_dim, 2)][:4]
            raise ValueError(f"model.rope_fraction={fraction:g} turns {fraction:g} x {self.head_dim} = {turned:g} "
                             f"of each head's {self.head_dim} dims; rotary turns pairs: choose a fraction that "
                             f"turns an even whole number of them ({', '.join(even)}, ...)")  # fmt: skip

    @property
    def rotary_dim(self) -> int:
        """The dims of each head that rotary turns (``rope_fraction`` of them)."""
        return round(self.rope_fraction * self.head_dim)

    def rotary(self, dim: int):
        """The rotation of ``dim`` dims of queries and keys at this spec's positions (base, scaling read past the
        trained length), or None where its position encoding turns nothing: a head's, a sparse indexer's."""
        scaling = {} if self.rope_scaling is None else dict(
            scaling=self.rope_scaling, factor=float(self.rope_factor),
            original=self.block_size if self.rope_original_length is None else self.rope_original_length)  # fmt: skip
        return registry.position(self.position).rotary(dim, self.rope_theta, **scaling)

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def score_mods(self) -> tuple[str, ...]:
        """The modifications of the scores this attention uses (``model.score_mods``), by name."""
        return tuple(name for name, mod in SCORE_MODS.items() if mod.on_scores and mod.used(getattr(self, mod.field)))

    @property
    def kernel_effects(self) -> list[tuple[str, str, str]]:
        """What this attention needs its kernel to apply, each (effect, the option that asks for it, what it does):
        its masks and its modifications of the scores (``AttentionKernel.applies`` names the ones a kernel does)."""
        effects = [(mask.name, f"model.{mask.field}={value}", "masks keys its queries do not see")
                   for mask, value in masks_set(self)]  # fmt: skip
        if self.document_masking:
            effects.append(("documents", "model.document_masking=true", "masks keys of other documents"))
        if self.sparse_topk is not None:
            effects.append(("sparse", f"model.sparse_topk={self.sparse_topk}", "selects the keys each query attends"))
        return effects + [(name, SCORE_MODS[name].option(getattr(self, SCORE_MODS[name].field)),
                           "changes the scores before the softmax") for name in self.score_mods]  # fmt: skip

    @property
    def context(self) -> int | None:
        """Keys a query sees at most: the window; or, for a model that reads past its ``block_size`` (no
        position table), the block size as well (its training context); None: every earlier key."""
        if not registry.position(self.position).runs_past_context or self.block_size is None:
            return self.window
        return min(self.window or self.block_size, self.block_size)

    @property
    def masks(self) -> Masks:
        """The masks this attention's queries see keys through (``model.masks``): causal, and its context's window."""
        return masks_of(self)

    def build_kernel(self):
        return get_kernel(self.kernel, self.masks, self.sdpa_backend)


def own_draws():
    """A fork of the generators modules are built with (the CPU's, and the default device's when that is an
    accelerator): what is drawn inside is undone on leaving."""
    device = torch.get_default_device()
    if device.type in ("cpu", "meta"):
        return torch.random.fork_rng(devices=[])
    index = device.index if device.index is not None else getattr(torch, device.type).current_device()
    return torch.random.fork_rng(devices=[index], device_type=device.type)


def remember(
    cache: LayerCache | None, slot: int, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, HeldKeys | None]:
    """Add the new positions' k, v to the cache (``model.kv_cache``); return the keys and values to attend
    over, and where they are not in position order from 0 (a ring that has wrapped, a static decode step's whole
    cache) the positions they hold (else None)."""
    if cache is None:
        return k, v, None
    return cache.update(slot, k, v)


def check_positions(name: str, value, unit: str, null: str) -> None:
    """Refuse an option that counts positions unless it is a positive integer or None: ``model.<name>=<value> must be
    a positive number of positions<unit>, or null (<null>)``."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"model.{name}={value!r} must be a positive number of positions{unit}, or null ({null})")


def check_one_pair(spec: AttentionSpec, width: int, what: str, wider: str) -> None:
    """Refuse what a rotation of one pair of dims (``width`` 2: ``what`` sets it) leaves unchanged: its one frequency
    is theta^0 = 1 whatever the base, so model.rope_theta and NTK's scaling (which raises the base) do nothing."""
    if width != 2 or not registry.position(spec.position).turns_queries_keys:
        return
    base = next(f.default for f in fields(AttentionSpec) if f.name == "rope_theta")
    if spec.rope_theta != base:
        raise ValueError(f"model.rope_theta={spec.rope_theta:g} changes nothing: rotary turns one pair of dims here "
                         f"({what}), whose one frequency is theta^0 = 1 at any base; use {wider}, or leave "
                         f"model.rope_theta at {base:g}")  # fmt: skip
    if spec.rope_scaling == "ntk":
        raise ValueError(f"model.rope_scaling=ntk raises rotary's base, which changes nothing when rotary turns one "
                         f"pair of dims ({what}): its one frequency is theta^0 = 1; use {wider}, or "
                         f"model.rope_scaling=pi or yarn")  # fmt: skip


def check_within_context(name: str, value: int | None, block_size: int | None, why: str, null: str) -> None:
    """Refuse an option that counts positions past the model's context, where it would act only beyond it."""
    if value is not None and block_size is not None and value > block_size:
        raise ValueError(f"model.{name}={value} is longer than the context (model.block_size={block_size}): set it "
                         f"to at most {block_size} ({why}), or null ({null})")


def rms_normed(norm: nn.RMSNorm, t: torch.Tensor) -> torch.Tensor:
    """``norm`` applied in ``t``'s dtype: under autocast the queries are bf16 and the learned scale float32, which
    nn.RMSNorm would compute unfused (with a warning)."""
    return F.rms_norm(t, norm.normalized_shape, norm.weight.to(t.dtype), norm.eps)


def check_heads(n_embd: int, n_head: int) -> None:
    if n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}; choose n_embd as a multiple of n_head")


class CausalAttentionHead(nn.Module):
    """ONE causal attention head's projections, d_model -> head_dim: the wrapper's building block (the pipeline runs
    its attention, as every layout's, one head at a time).

    The first head of each key/value group owns the group's key and value projections (its notes);
    the other heads of the group own only a query and read the group's keys and values.
    """

    def __init__(self, n_embd: int, head_dim: int, bias: bool, owns_kv: bool = True) -> None:
        super().__init__()
        self.query = nn.Linear(n_embd, head_dim, bias=bias)
        if owns_kv:
            self.key = nn.Linear(n_embd, head_dim, bias=bias)
            self.value = nn.Linear(n_embd, head_dim, bias=bias)

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """This head's queries, (B, 1, T, hd): a head axis of size 1 lets every kernel serve single heads too."""
        return self.query(x).unsqueeze(1)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This head's group's keys and values, (B, 1, T, hd) each."""
        return self.key(x).unsqueeze(1), self.value(x).unsqueeze(1)


class Parts(NamedTuple):
    """Which dims of a head's queries or keys each encoding acts on: QK-norm's and rotary's, each a slice or None
    (none). Rotary turns the first ``rotary_dim`` dims of its slice (partial rotary: GPT-NeoX's)."""

    normed: slice | None
    turned: slice | None


WHOLE = Parts(slice(None), slice(None))  # a layout's queries and keys: every dim normed, rotary from the first


class KeyGroup(NamedTuple):
    """What a projection makes of a block's input for one set of keys and values: the KV cache's ``slot`` for them,
    the keys ``k`` the encodings turn before the cache keeps them, ``v`` (the values, or what they are made from
    after the cache: MLA's latent), and the kernel ``calls`` that read them, each (its first query head, its
    queries (B, heads, T, dq)): one call of every head (a layout that splits heads), or one per head (the wrapper);
    and ``qk``, where the queries and keys lie side by side in one tensor (a fused projection's): (B, H + kv, T, d).
    """

    slot: int
    k: torch.Tensor
    v: torch.Tensor
    calls: list[tuple[int, torch.Tensor]]
    qk: torch.Tensor | None = None  # the queries and keys as one tensor of heads, where the projection made them so


def on_dims(t: torch.Tensor, dims: slice, f) -> torch.Tensor:
    """``t`` with ``f`` applied to the dims ``dims`` of its last axis, the others passing."""
    if dims == slice(None):
        return f(t)
    start, stop, _ = dims.indices(t.size(-1))
    return torch.cat((t[..., :start], f(t[..., start:stop]), t[..., stop:]), dim=-1)


# The options each stage of the pipeline applies (model.options): a layer that runs the pipeline applies all of them,
# with its projection's own (``projection_options``), but for those its projection declares it cannot hold
# (``cannot_hold``, with why). A new option goes in the stage that applies it, and every pipeline layer applies it
# there (tests/test_pipeline.py proves each stage reaches every layer's output); a layer that runs no kernel states
# its own ``applies``.
STAGE_OPTIONS = {
    "encodings": frozenset({"position", "qk_norm", "query_temperature"}),  # with the position encoding's own fields
    "key selection": frozenset({"window", "attention_chunk", "document_masking", "sparse_topk", "indexer_heads",
                                "indexer_dim"}),
    "kernel": frozenset({"softcap", "sinks", "forget_gate", "dropout"}),
    "combination": frozenset({"differential", "lambda_init"}),
    "gate": frozenset({"gate"}),
}  # fmt: skip
# The plan's terms a layer states about itself (what it keeps for backward, computes, caches, carries): a layer takes
# none from another registered layer (KDA once priced itself as Gated DeltaNet). A pipeline layer's memory and FLOPs
# come from the widths its projection states; a layer that runs no kernel states them all.
PIPELINE_TERMS = ("input_casts", "score_widths", "kv_width")
OWN_FORM_TERMS = ("input_casts", "score_widths", "kv_width", "cache_width", "mixing_flops", "state_bytes",
                  "activation_bytes")  # fmt: skip


class MultiHeadAttention(nn.Module):
    """The one pipeline every softmax layer runs, from the block's input to its output, of which a layout owns only
    the projection:

    1. the projection (``project``: the layout's, the one stage it owns): queries, keys and values, in key groups;
    2. the heads' encodings (``encode_queries``/``encode_keys``: QK-norm, rotary positions; ``scale_queries``: the
       query scalings) on the dims the layout's ``query_parts``/``key_parts`` say;
    3. the key selection (``forward``: sparse attention's indexer; the masks, which the kernel applies);
    4. the KV cache (``remember``), then ``keys_values`` (what the cache holds -> each head's keys and values: the
       identity, or MLA's up-projection, whose content keys pass the same encodings);
    5. the kernel with its score modifications, and the heads' combination (``attend_heads``: differential);
    6. the heads side by side, the output gate (``gated``), the output projection ``c_proj``.

    The attention maps (``queries_keys``) come from the same stages. A layout implements ``project`` (and, where the
    cache holds something other than keys and values, ``keys_values``), its weights' common form ``to_qkv`` /
    ``from_qkv``, and its facts; never a stage (tests/test_pipeline.py). A layer that runs no kernel (linear
    attention) replaces the pipeline with its own form (``attend``).
    """

    name: ClassVar[str]  # model.attention's value
    # Matches this layout's q/k/v parameter names, relative to the attention module; an example, for errors.
    QKV_KEY: ClassVar[re.Pattern]
    QKV_EXAMPLE: ClassVar[str]
    canonical: ClassVar[bool] = False  # initial weights are drawn in this layout's form (one layout says so)
    # The function it computes: layouts of one function convert exactly (model.convert); what that function is
    function: ClassVar[str] = "mha"
    computes: ClassVar[str] = "keys and values projected from the input per key/value head"
    # The options (model.options: AttentionSpec's fields but its shape and the kernel's choice) a layer applies; its
    # position encoding's own come with "position". Any other set away from its off value is refused. A pipeline
    # layer's are its stages' (STAGE_OPTIONS) and its projection's, less what its projection cannot hold, made as the
    # class is defined; a layer that runs no kernel declares its own.
    applies: ClassVar[frozenset[str]]
    projection_options: ClassVar[frozenset[str]] = frozenset({"n_kv_head"})  # the projection's own: key/value heads
    cannot_hold: ClassVar[dict[str, str]] = {}  # stage options its projection cannot hold, and why
    has_attention_maps: ClassVar[bool] = True  # softmax weights over keys (heads.py studies them)
    takes_kernel: ClassVar[bool] = True  # runs model.kernel (a linear layer runs its own form)
    colour: ClassVar[str] = "tab:gray"  # its colour and marker in plots
    marker: ClassVar[str] = "o"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if cls.takes_kernel:  # a pipeline layer: its stages' options, its projection's, less what it cannot hold
            stages = frozenset().union(*STAGE_OPTIONS.values())
            cls.applies = (stages | cls.projection_options) - set(cls.cannot_hold)

    @classmethod
    def check_registration(cls, registry: dict[str, type]) -> None:
        """Refused as the class is registered, naming why: weight names another layer's ``QKV_KEY`` claims (a state
        dict's layout is read from them, layers asked in the order they were registered: another function's
        ``in_proj`` would load as that layer); options or plan terms taken from another registered layer (a layer
        applies an option, and prices itself, only where it says so itself: ``applies``, ``OWN_FORM_TERMS``); a layer
        that runs no kernel without its own ``applies`` or plan terms (the pipeline's would price it as softmax
        attention's projections and scores)."""
        terms = PIPELINE_TERMS if cls.takes_kernel else (*OWN_FORM_TERMS, "applies")
        for name in terms:
            owner = next((c for c in cls.__mro__ if name in vars(c)), None)
            # a layout of the same function may share a term (a renamed separate_qkv); another function may not
            if owner is cls or (owner in registry.values() and owner.function == cls.function):
                continue
            if owner is not None and owner not in registry.values() and cls.takes_kernel:
                continue  # the pipeline's shared projection classes (SplitHeadsAttention)
            taken = f"takes {name} from attention={owner.name}" if owner in registry.values() else \
                f"states no {name} of its own"  # fmt: skip
            what = "its options are" if name == "applies" else "a plan term is"
            raise ValueError(f"attention={cls.name} {taken}: {what} the layer's own (what it applies, keeps for "
                             f"backward, computes, caches, carries); define {name} in its class")  # fmt: skip
        mine = cls.QKV_EXAMPLE.replace(".N.", ".0.") + ".weight"
        for other in registry.values():
            match = other.QKV_KEY.search(mine)
            if match and (match.start() == 0 or mine[match.start() - 1] == "."):
                raise ValueError(f"attention={cls.name}'s weight names ({mine}) are attention={other.name}'s "
                                 f"(its QKV_KEY claims them): a state dict could not say which layout it holds; "
                                 f"name its projections otherwise")  # fmt: skip

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        """Copies of the block's input kept for backward under autocast: each projection module casts its
        input to the autocast dtype separately (the plan's memory estimate)."""
        raise NotImplementedError

    @classmethod
    def heads_in(cls, params: dict[str, torch.Tensor]) -> int | None:
        """Query heads that this layout's q/k/v parameters (names relative to the module) say they have, or
        None when they do not say (converting to a layout that splits heads then needs n_head)."""
        return None

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]] | None:
        """How this layer's stored matrices split into its projections and heads, for an optimizer that acts on whole
        matrices (Muon's ``optim.muon_split``): each weight (named relative to the block) -> its parts, (projection,
        head or None, first row, end row), covering its rows. A 2-D weight not named is one projection of its own
        (``c_proj``). None: the layer does not say, and only the split as stored applies to it."""
        return None

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        """The widths, over all query heads, of the score matmul (queries . keys) and the value matmul: what
        the attention's FLOPs per key scale with (``GPT.flops_per_token``)."""
        raise NotImplementedError

    @classmethod
    def mixing_flops(cls, spec: AttentionSpec, seq_len: int) -> int:
        """Training FLOPs per token of the score and value matmuls: 6 x their widths (``score_widths``) x the keys
        each query sees at most (``seq_len``, or fewer under a mask the model sets that caps them: a window, a
        chunk); with sparse attention, the keys it selects at most, and its indexer's scores over every key."""
        keys = mask_capacity(masks_set(spec), seq_len)
        if spec.sparse_topk is None:
            return 6 * sum(cls.score_widths(spec)) * keys
        return 6 * sum(cls.score_widths(spec)) * min(spec.sparse_topk, keys) + index_flops(spec, keys)

    @classmethod
    def state_bytes(cls, spec: AttentionSpec, dtype_bytes: int) -> int:
        """Bytes a sequence's decoding state keeps per layer whatever its length, activations ``dtype_bytes``
        wide (a KV cache has none: it grows by ``cache_width`` numbers per token)."""
        return 0

    @classmethod
    def cache_width(cls, spec: AttentionSpec) -> int:
        """Numbers a KV cache keeps per token per layer: its keys and values (``kv_width``) and what a modification
        keeps per key (``ScoreMod.cache_width``); the plan's and the reports' cache bytes per token are this times
        the layers and the dtype's bytes."""
        indexer = spec.indexer_dim if spec.sparse_topk is not None else 0  # its key per token
        return cls.kv_width(spec) + indexer + sum(mod.cache_width(spec) for mod in SCORE_MODS.values()
                                                  if mod.used(getattr(spec, mod.field)))  # fmt: skip

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        """Numbers of keys and values (or what they are made from) a KV cache keeps per token per layer."""
        raise NotImplementedError

    @classmethod
    def unapplied(cls, spec) -> list[tuple[str, object, tuple, str]]:
        """Each option a layer kind may set (``per_layer``) that ``spec`` sets (an AttentionSpec, a GPTConfig or a
        kind's fields: read by name) and this layer does not apply (``applies``): (field, value, the values that leave
        it off, why). A layer that runs no kernel is asked before any kernel's check (``check_linear_layers``), so the
        refusal names the model's or the kind's field and its fix; a layer may add reasons of its own."""
        mine, found = applied(cls, spec), []
        for option in fields(AttentionSpec):
            value = getattr(spec, option.name, option.default)
            offs = (option.default, spec.n_head) if option.name == "n_kv_head" else (option.default,)
            if option.name in option_fields() and option.metadata["per_layer"] and option.name not in mine:
                if value not in offs:
                    who = " or ".join(takers(option.name)) or "no layer"
                    found.append((option.name, value, offs[:1], f"it is an option of {who}, not attention={cls.name}"))
        return found

    @classmethod
    def check_spec(cls, spec: AttentionSpec) -> None:
        """Refuse what this layout cannot build (beyond the spec's own checks), naming the fix; last, any option set
        that it does not apply (``applies``: model.kv_latent is attention=mla's)."""
        if registry.position(spec.position).turns_queries_keys and spec.head_dim % 2:
            raise ValueError(f"model.position={spec.position} turns pairs of a head's dimensions, but the head dim "
                             f"n_embd/n_head = {spec.n_embd}/{spec.n_head} = {spec.head_dim} is odd; choose n_embd "
                             f"and n_head with an even quotient")  # fmt: skip
        if spec.rope_fraction == 1:
            check_one_pair(spec, spec.rotary_dim, f"the head's {spec.head_dim} dims, model.n_embd / model.n_head",
                           "a wider head")  # fmt: skip
        else:
            check_one_pair(spec, spec.rotary_dim, f"model.rope_fraction={spec.rope_fraction:g} of the head's "
                           f"{spec.head_dim} dims", "a larger model.rope_fraction")  # fmt: skip
        check_applied(cls, spec)

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec  # what it was built from: its options, which a reference formula reads too
        self.n_head, self.n_kv_head, self.window, self.head_dim = spec.n_head, spec.kv_heads, spec.window, spec.head_dim
        self.masks = spec.masks  # which keys a query sees: causal, the window (or a model's context past its length)
        self.c_proj = nn.Linear(spec.n_embd, spec.n_embd, bias=spec.bias)
        self.resid_dropout = nn.Dropout(spec.dropout)
        self.kernel = spec.build_kernel() if self.takes_kernel else None
        self.dropout = spec.dropout
        self.diff = DifferentialHeads(spec.head_dim, spec.lambda_init) if spec.differential else None
        scores, values = self.score_widths(spec)
        self.pad_values = self.takes_kernel and "flash" in registry.kernel(spec.kernel).backends and scores > values
        self.build_encodings(spec, spec.head_dim)
        self.indexer = None  # DeepSeek's sparse attention: built apart, so the draws after it are the dense model's
        if spec.sparse_topk is not None:
            with own_draws():
                self.indexer = LightningIndexer(spec, None if self.rotary is None else self.rotary.dim)

    @classmethod
    def rotary_width(cls, spec: AttentionSpec) -> int:
        """The dims of each head that rotary turns: ``rope_fraction`` of them (attention=mla: its decoupled part)."""
        return spec.rotary_dim

    def build_encodings(self, spec: AttentionSpec, qk_dim: int) -> None:
        """What acts on the queries and keys (QK-norm over ``qk_dim`` dims, then rotary over ``rotary_width``) and on
        the scores (ALiBi, softcap, sinks)."""
        self.rotary = spec.rotary(self.rotary_width(spec))
        self.q_norm = self.k_norm = None
        if spec.qk_norm:  # one learned scale per head dim, shared by the heads (Qwen3's, OLMo 2's)
            self.q_norm, self.k_norm = nn.RMSNorm(qk_dim, eps=1e-6), nn.RMSNorm(qk_dim, eps=1e-6)
        self.qk_norm, self.softcap, self.query_temperature = spec.qk_norm, spec.softcap, spec.query_temperature
        self.sinks = None
        for mod in SCORE_MODS.values():  # each one's (n_head,) parameters, at the values they start at
            if mod.used(getattr(spec, mod.field)):
                for name, value in mod.parameters(spec.n_head).items():
                    setattr(self, name, nn.Parameter(torch.full((spec.n_head,), value)))
                for name, (width, bias) in mod.projections(spec).items():  # its projections of the block's input
                    setattr(self, name, nn.Linear(spec.n_embd, width, bias=bias))
        self.gate = None  # one gate per head (headwise) or per element of the heads' outputs (elementwise)
        if spec.gate != "none":
            self.gate = nn.Linear(spec.n_embd, spec.n_head if spec.gate == "headwise" else spec.n_embd, bias=False)
        slopes = alibi_slopes(spec.n_head) if registry.position(spec.position).biases_scores else None
        self.register_buffer("alibi_slopes", slopes, persistent=False)  # a function of n_head: not saved
        self.modifications = on_the_scores(spec)  # the registered modifications of the scores it uses, in order

    # Which dims the encodings act on, per head: a layout's are all (rotary's first rotary_dim); MLA's its own
    query_parts: ClassVar[Parts] = WHOLE
    key_parts: ClassVar[Parts] = WHOLE

    def encode_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, heads, T, dq) queries at ``positions`` -> normalised (qk_norm), rotated (rope), then scaled
        (``scale_queries``: after QK-norm, which would undo a scaling)."""
        return self.scale_queries(self.encoded(q, positions, self.q_norm, self.query_parts), positions)

    def encode_keys(self, k: torch.Tensor, positions: torch.Tensor, parts: Parts | None = None) -> torch.Tensor:
        """As ``encode_queries``, for keys (``parts``: the dims, the layout's ``key_parts`` by default): before the
        KV cache, which then holds them encoded."""
        return self.encoded(k, positions, self.k_norm, parts or self.key_parts)

    def encode_queries_keys(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                            qk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Both encodings at once: queries and keys that the projection made side by side in one tensor ``qk`` (a
        fused projection's) turn in one rotary call where nothing normalises them first (in a decode step of the
        nano model, rotary's extra cost was its calls), the same numbers as one call each."""
        if qk is None or self.rotary is None or self.qk_norm or not self.query_parts == self.key_parts == WHOLE:
            return self.encode_queries(q, positions), self.encode_keys(k, positions)
        q, k = self.encoded(qk, positions, None, WHOLE).split([q.size(1), k.size(1)], dim=1)  # nothing to normalise
        return self.scale_queries(q, positions), k

    def encoded(self, t: torch.Tensor, positions: torch.Tensor, norm: nn.RMSNorm | None, parts: Parts) -> torch.Tensor:
        """QK-norm over ``parts.normed``, then rotary over ``parts.turned``: the heads' encodings, the one code that
        applies them."""
        if self.qk_norm and parts.normed is not None:
            t = on_dims(t, parts.normed, lambda u: rms_normed(norm, u))
        if self.rotary is not None and parts.turned is not None:
            t = on_dims(t, parts.turned, lambda u: self.rotary(u, positions))
        return t

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The queries' scalings: Llama 4's temperature by position (model.query_temperature)."""
        return q if self.query_temperature is None else tempered(q, positions, self.query_temperature)

    def score_mods(self, x: torch.Tensor, cache: LayerCache | None = None, keys_like: torch.Tensor | None = None):
        """The score modifications of this block (``model.score_mods``) at its input ``x``, or None when it has none;
        with a ``cache``, a token bias's states are the held keys' (the new ones stored beside them, in the dtype of
        ``keys_like``)."""
        mods = ScoreMods.of_block(self, self.modifications, x)
        return mods if mods is None or cache is None else mods.kept(cache, keys_like)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, cache: LayerCache | None = None,
        document_starts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """(B, T, C) -> (B, T, C). ``document_starts`` (B, T): the absolute position where each token's document
        starts (model.document_masking; None: one document): a query sees no key before it."""
        if positions is None and (self.rotary is not None or self.alibi_slopes is not None or self.query_temperature):
            positions = torch.arange(x.size(1), device=x.device)  # a block called alone; else keys in order
        documents = document_starts if self.spec.document_masking else None
        selected = None
        if self.indexer is not None:
            selected, index = self.indexer(x, positions, cache, self.masks, documents)
            if self.training and torch.is_grad_enabled() and cache is None:
                self.indexer.loss = self.indexer_loss(x, index, selected, positions, documents)
        y = self.attend(x, positions, cache, documents, selected)
        y = self.c_proj(y if self.gate is None else self.gated(y, x))
        return self.resid_dropout(y) if self.resid_dropout.p and self.training else y

    def indexer_loss(self, x: torch.Tensor, index: torch.Tensor, selected: torch.Tensor | None,
                     positions: torch.Tensor | None, documents: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """The indexer's KL (``model.sparse.indexer_kl``) to this layer's attention weights at ``x``, summed over its
        heads: over the ``selected`` keys, or (dense: the warm-up) every key a query sees. The weights are taken
        without gradients, from the queries and keys projected again (``queries_keys``)."""
        with torch.no_grad():
            q, k = self.queries_keys(x)
            probs = attention_probs(q, k, self.masks, mods=self.score_mods(x), positions=positions,
                                    document_starts=documents, selected=selected)
        return self.indexer.kl(index, probs.to(index.dtype).sum(dim=1), selected, self.masks, positions, documents)

    def gated(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (B, T, C) times sigmoid(x W_g): per element, or per head over its dims."""
        gate = torch.sigmoid(self.gate(x))
        if gate.size(-1) == y.size(-1):
            return y * gate
        return (y.unflatten(-1, (gate.size(-1), -1)) * gate.unsqueeze(-1)).flatten(-2)

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """The layout's projection of the block's input (B, T, C): its key groups (``KeyGroup``)."""
        raise NotImplementedError

    def keys_values(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """What the cache holds of a key group -> its keys and values, (B, kv, S, dq) and (B, kv, S, dv): as they
        are, for a layout that caches keys and values."""
        return k, v

    def attend(self, x: torch.Tensor, positions: torch.Tensor, cache: LayerCache | None = None,
               document_starts: torch.Tensor | None = None, selected: torch.Tensor | None = None,
               ) -> torch.Tensor:  # fmt: skip
        """(B, T, C) -> the heads' outputs side by side, (B, T, n_head * dv): the pipeline's stages 1, 2, 4 and 5.
        ``positions`` (T,) are the tokens' absolute positions, computed once by the GPT: a learned encoding was added
        to the embeddings; rotary turns the queries and keys here, ALiBi biases the scores (``score_mods``).
        ``selected`` (B, 1, T, keys): the keys sparse attention chose for each query (``model.sparse``), else None."""
        outputs, mods, first_group = [], None, True
        for group in self.project(x):
            whole = len(group.calls) == 1 and group.calls[0][1].size(1) == self.n_head  # one call of every head
            if whole:
                q, k = self.encode_queries_keys(group.calls[0][1], group.k, positions, group.qk)
            else:
                k = self.encode_keys(group.k, positions)
            k, v, keys = remember(cache, group.slot, k, group.v)
            if first_group:  # a token bias's states, kept beside the first group's keys
                mods, first_group = self.score_mods(x, cache, k), False
            k, v = self.keys_values(k, v, positions)
            for head, queries in group.calls:
                q = q if whole else self.encode_queries(queries, positions)
                heads_mods = mods if mods is None or q.size(1) == self.n_head else mods.head(head)
                outputs.append(self.attend_heads(q, k, v, keys, heads_mods, positions, document_starts, selected))
        if len(outputs) == 1:
            y = outputs[0]
            return y.transpose(1, 2).contiguous().view(*y.shape[:1], y.size(2), -1)  # (B, T, H * dv)
        return torch.cat([y.transpose(1, 2).flatten(2) for y in outputs], dim=-1)  # one head each: views

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: HeldKeys | None,
                     mods: ScoreMods | None, positions: torch.Tensor | None, documents: torch.Tensor | None,
                     selected: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """The kernel with the score modifications, over (B, h, T, dq) queries and their key group's keys and values,
        then the heads' combination (differential attention) -> (B, h, T, dv)."""
        if self.diff is not None:  # every map reads both halves of its pair's values; the pairs' differences are heads
            k, halves = self.keys_per_query(k, q.size(1)), self.diff.value_halves(v, q.size(1))
            # Attention dropout must drop the same weights for both halves: then one call over the halves side by side
            calls = [torch.cat(halves, dim=-1)] if self.dropout and self.training else halves
            return self.diff.combine(torch.cat([self.kernel(q, k, values, self.dropout, self.training, keys=keys,
                                                            mods=mods, positions=positions, document_starts=documents,
                                                            selected=selected)
                                                for values in calls], dim=-1))  # fmt: skip
        # PyTorch's flash implementation takes values only as wide as the queries (MLA's are narrower): padded with
        # zeros and the padding cut from the output (DeepSeek's own code), faster than the math fallback on a CPU
        pad = q.size(-1) - v.size(-1) if self.pad_values else 0
        y = self.kernel(q, k, F.pad(v, (0, pad)) if pad else v, self.dropout, self.training, keys=keys, mods=mods,
                        positions=positions, document_starts=documents, selected=selected)  # fmt: skip
        return y[..., : v.size(-1)] if pad else y

    def keys_per_query(self, k: torch.Tensor, heads: int) -> torch.Tensor:
        """(B, kv, S, d) keys -> the key each of ``heads`` query heads reads, (B, heads, S, d): its group's, or with
        differential attention its map's of its group's pair (``DifferentialHeads.paired``)."""
        return repeat_kv(k, heads) if self.diff is None else self.diff.paired(k, heads)

    def queries_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each query head's queries and keys, (B, H, T, dq), encoded at positions 0..T-1 by the pipeline's own
        stages: what its attention weights come from."""
        positions = torch.arange(x.size(1), device=x.device)
        queries, keys = [], []
        for group in self.project(x):
            k, _ = self.keys_values(self.encode_keys(group.k, positions), group.v, positions)
            for _, q in group.calls:
                queries.append(self.encode_queries(q, positions))
                keys.append(self.keys_per_query(k, q.size(1)))
        return torch.cat(queries, dim=1), torch.cat(keys, dim=1)

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, T, T) attention weights of each query head, from this layout's own projections, with the
        block's score modifications (with sinks, a row sums to less than 1: the rest went to the sink).

        The manual kernel applies exactly these; sdpa and flex fuse the same formula, so they describe a
        model run with any kernel.
        """
        positions = torch.arange(x.size(1), device=x.device)
        selected = None if self.indexer is None else self.indexer(x, positions, None, self.masks, None)[0]
        return attention_probs(*self.queries_keys(x), self.masks, mods=self.score_mods(x), selected=selected)

    @staticmethod
    def to_qkv(params: dict[str, torch.Tensor], n_head: int | None) -> QKV:
        """This layout's q/k/v parameters (names relative to the module) -> the common form."""
        raise NotImplementedError

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        """The common form -> this layout's q/k/v parameters (names relative to the module)."""
        raise NotImplementedError


def kv_heads_of(qkv: QKV, n_head: int) -> int:
    """Key/value heads in the common form: the key's width over the head width the queries give."""
    q, k, _ = next(iter(qkv.values()))
    head_dim = q.size(0) // n_head
    if q.size(0) % n_head or k.size(0) % head_dim or n_head % (k.size(0) // head_dim):
        raise ValueError(f"q/k widths {q.size(0)}/{k.size(0)} do not make n_head={n_head} heads with whole "
                         f"key/value groups")  # fmt: skip
    return k.size(0) // head_dim


@register(ATTENTION_LAYOUTS)
class WrapperAttention(MultiHeadAttention):
    """n_head single-head modules side by side: the committee, literally (with grouped-query heads, the
    members of a group share the notes of its first member)."""

    name, colour, marker = "wrapper", "tab:blue", "o"
    QKV_KEY = re.compile(r"heads\.(?P<head>\d+)\.(?P<proj>query|key|value)\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "heads.N.query"
    # Its heads attend one by one: differential attention combines a pair's two maps, which one call must hold
    cannot_hold = dict.fromkeys(("differential", "lambda_init"), "its heads attend one at a time, and differential "
                                "attention combines a pair of heads' maps")  # fmt: skip

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return spec.n_embd, spec.n_embd

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        return 2 * spec.kv_heads * spec.head_dim  # a key and a value per key/value group

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return n_head + 2 * kv_heads  # a query per head, a key and a value per group

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        group = spec.n_head // spec.kv_heads
        self.heads = nn.ModuleList(
            CausalAttentionHead(spec.n_embd, spec.head_dim, spec.bias, owns_kv=h % group == 0)
            for h in range(spec.n_head)
        )

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """Each key/value group's notes (its first head's keys and values), read by each of its heads alone."""
        group, heads = self.n_head // self.n_kv_head, list(self.heads)  # not heads[h]: slow
        return [KeyGroup(g, *heads[g * group].keys_values(x),
                         [(h, heads[h].queries(x)) for h in range(g * group, (g + 1) * group)])
                for g in range(self.n_kv_head)]  # fmt: skip

    @classmethod
    def to_qkv(cls, params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        # Query head h's rows are rows h*head_dim ... (h+1)*head_dim of the full-width q; the key/value of
        # group g (owned by its first head) are rows g*head_dim ... of the full-width k and v.
        per_head: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
        for name, tensor in params.items():
            m = cls.QKV_KEY.match(name)
            per_head.setdefault((m["kind"], m["proj"]), {})[int(m["head"])] = tensor
        qkv = {}
        for kind in sorted({kind for kind, _ in per_head}):
            parts = []
            for proj in PROJECTIONS:
                heads = per_head.get((kind, proj))
                if heads is None:
                    raise ValueError(f"the attention has no heads.*.{proj}.{kind}; the state dict is incomplete")
                if proj == "query" and sorted(heads) != list(range(len(heads))):
                    raise ValueError(f"heads.*.{proj}.{kind}: head indices {sorted(heads)} are not 0..{len(heads) - 1}")
                parts.append(torch.cat([heads[h] for h in sorted(heads)], dim=0))
            qkv[kind] = tuple(parts)
        return qkv

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # each head's query, and each key/value group's key and value (owned by its first head), a matrix apiece
        group, hd = spec.n_head // spec.kv_heads, spec.head_dim
        rows = {f"heads.{h}.query.weight": [("query", h, 0, hd)] for h in range(spec.n_head)}
        for proj in ("key", "value"):
            rows.update({f"heads.{g * group}.{proj}.weight": [(proj, g, 0, hd)] for g in range(spec.kv_heads)})
        return rows

    @classmethod
    def heads_in(cls, params: dict[str, torch.Tensor]) -> int:
        """Query heads in a wrapper state dict."""
        matches = (cls.QKV_KEY.match(name) for name in params)
        return len({m["head"] for m in matches if m and m["proj"] == "query"})

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        if n_head is None:
            raise ValueError("converting to 'wrapper' needs n_head=<number of heads> to split the heads")
        n_kv = kv_heads_of(qkv, n_head)
        group = n_head // n_kv
        out = {}
        for kind, (q, k, v) in qkv.items():
            if q.size(0) % n_head != 0:
                raise ValueError(f"attention width {q.size(0)} is not divisible by n_head={n_head}")
            for h, part in enumerate(q.chunk(n_head, dim=0)):
                out[f"heads.{h}.query.{kind}"] = part.clone()
            for proj, full in (("key", k), ("value", v)):
                for g, part in enumerate(full.chunk(n_kv, dim=0)):
                    out[f"heads.{g * group}.{proj}.{kind}"] = part.clone()
        return out


class SplitHeadsAttention(MultiHeadAttention):
    """Layouts that project full-width q, k, v, then split them into heads for one kernel call."""

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.kv_width = spec.kv_heads * spec.head_dim

    @classmethod
    def score_widths(cls, spec: AttentionSpec) -> tuple[int, int]:
        return spec.n_embd, spec.n_embd * (2 if spec.differential else 1)  # each map reads its pair's values

    @classmethod
    def kv_width(cls, spec: AttentionSpec) -> int:
        return 2 * spec.kv_heads * spec.head_dim  # a key and a value per key/value head

    @staticmethod
    def initial_tensor(name: str, template: torch.Tensor) -> torch.Tensor | None:
        """Its own initial draws (``GPT.reset_parameters``): differential attention's lambda vectors."""
        return DifferentialHeads.initial(name, template)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, T, C), k and v (B, T, kv_width)."""
        raise NotImplementedError

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """Full-width q, k, v, split into heads: one key group, one call of every head."""
        q, k, v = self.projections(x)
        return [KeyGroup(0, self.split_heads(k, self.n_kv_head), self.split_heads(v, self.n_kv_head),
                         [(0, self.split_heads(q, self.n_head))])]  # fmt: skip

    def split_heads(self, t: torch.Tensor, heads: int) -> torch.Tensor:
        B, T, _ = t.shape
        return t.view(B, T, heads, self.head_dim).transpose(1, 2)  # (B, T, heads*hd) -> (B, heads, T, hd)


@register(ATTENTION_LAYOUTS)
class SeparateQKVAttention(SplitHeadsAttention):
    name, colour, marker = "separate_qkv", "tab:orange", "s"
    QKV_KEY = re.compile(r"(?P<proj>query|key|value)\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "query"
    LINEARS = PROJECTIONS  # the q, k, v Linear modules' names

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        for name, width in zip(self.LINEARS, (spec.n_embd, self.kv_width, self.kv_width)):
            setattr(self, name, nn.Linear(spec.n_embd, width, bias=spec.bias))

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = (getattr(self, name) for name in self.LINEARS)
        return q(x), k(x), v(x)

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 3

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        hd, heads = spec.head_dim, (spec.n_head, spec.kv_heads, spec.kv_heads)
        return {f"{linear}.weight": [(proj, h, h * hd, (h + 1) * hd) for h in range(n)]
                for linear, proj, n in zip(cls.LINEARS, PROJECTIONS, heads)}  # fmt: skip

    @classmethod
    def to_qkv(cls, params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        kinds = sorted({name.split(".")[1] for name in params})
        for kind in kinds:
            missing = [p for p in cls.LINEARS if f"{p}.{kind}" not in params]
            if missing:
                raise ValueError(f"the attention has no {missing} {kind}; the state dict is incomplete")
        return {kind: tuple(params[f"{p}.{kind}"] for p in cls.LINEARS) for kind in kinds}

    @classmethod
    def from_qkv(cls, qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        return {f"{p}.{kind}": t.clone() for kind, tensors in qkv.items() for p, t in zip(cls.LINEARS, tensors)}


@register(ATTENTION_LAYOUTS)
class FusedQKVAttention(SplitHeadsAttention):
    name, colour, marker = "fused_qkv", "tab:green", "^"
    QKV_KEY = re.compile(r"c_attn\.(?P<kind>weight|bias)$")
    QKV_EXAMPLE = "c_attn"
    canonical = True  # GPT-2's own form

    @classmethod
    def input_casts(cls, n_head: int, kv_heads: int) -> int:
        return 1

    @classmethod
    def matrix_rows(cls, spec: AttentionSpec) -> dict[str, list[tuple[str, int | None, int, int]]]:
        # c_attn stacks [query; key; value] by rows, each by head
        hd, starts = spec.head_dim, (0, spec.n_embd, spec.n_embd + spec.kv_heads * spec.head_dim)
        heads = (spec.n_head, spec.kv_heads, spec.kv_heads)
        return {"c_attn.weight": [(proj, h, start + h * hd, start + (h + 1) * hd)
                                  for proj, start, n in zip(PROJECTIONS, starts, heads) for h in range(n)]}

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.c_attn = nn.Linear(spec.n_embd, spec.n_embd + 2 * self.kv_width, bias=spec.bias)

    def projections(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.c_attn(x).split([x.size(-1), self.kv_width, self.kv_width], dim=-1)

    def project(self, x: torch.Tensor) -> list[KeyGroup]:
        """As every layout that splits heads, with its queries and keys side by side in c_attn's output, as one
        tensor of heads: the encodings turn them in one call."""
        B, T, C = x.shape
        qk, v = self.c_attn(x).split([C + self.kv_width, self.kv_width], dim=-1)
        qk = qk.view(B, T, self.n_head + self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = qk.split([self.n_head, self.n_kv_head], dim=1)
        return [KeyGroup(0, k, self.split_heads(v, self.n_kv_head), [(0, q)], qk)]

    @staticmethod
    def to_qkv(params: dict[str, torch.Tensor], n_head: int | None = None) -> QKV:
        # c_attn stacks [query; key; value] by rows: n_embd rows of queries, then two equal parts.
        out = {}
        for name, t in params.items():
            rows = t.size(0)
            width = t.size(1) if t.dim() == 2 else None
            if width is None:  # a bias: its weight says how wide the queries are
                weight = params.get(name.replace("bias", "weight"))
                width = weight.size(1) if weight is not None else rows // 3
            kv = (rows - width) // 2
            if width + 2 * kv != rows:
                raise ValueError(f"c_attn has {rows} rows for width {width}: not queries and two equal key/value parts")
            out[name.split(".")[1]] = tuple(t.split([width, kv, kv], dim=0))
        return out

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        return {f"c_attn.{kind}": torch.cat(tensors, dim=0) for kind, tensors in qkv.items()}


def build_attention(layout: str, n_embd: int, n_head: int, kernel: str, dropout: float = 0.0, bias: bool = True,
                    **options) -> MultiHeadAttention:  # fmt: skip
    """Build the attention block of a layout by name (an unknown name lists the valid ones); ``options`` are
    the rest of ``AttentionSpec``'s fields (n_kv_head, window, position, ...)."""
    return attention_of(layout, AttentionSpec(n_embd, n_head, kernel, dropout, bias, **options))


def attention_of(layout: str, spec: AttentionSpec) -> MultiHeadAttention:
    """The attention block of ``layout`` built from ``spec``, checked by the layout first."""
    cls = lookup(ATTENTION_LAYOUTS, "attention layout", layout)
    cls.check_spec(spec)
    return cls(spec)
