"""The one attention pipeline every softmax layer runs, of which a layout owns only the projection
(``MultiHeadAttention``: its stages in order), what its stages apply (``STAGE_OPTIONS``) and the plan's terms a layer
states (``PIPELINE_TERMS``, ``OWN_FORM_TERMS``). The layouts are ``model.attention.layouts`` and
``model.attention.latent``; a layer of its own form (linear attention) is in ``model.mixers``.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model import registry
from model.attention.differential import DifferentialHeads
from model.attention.kernels import attention_probs, repeat_kv, seen_keys
from model.attention.masks import HeldKeys
from model.attention.masks import capacity as mask_capacity
from model.attention.masks import options_set as masks_set
from model.attention.modifications import ScoreMods, on_the_scores
from model.attention.options import STAGES, applied, check_applied, option_fields, stage_options, takers
from model.attention.positions import alibi_slopes, householder_augmented, turned_through
from model.attention.selection import KeySelection, selection_of
from model.attention.spec import AttentionSpec, check_one_pair
from model.registry import KERNELS, MIXERS, MODIFICATIONS, SELECTIONS, lookup, weight_name_start

if TYPE_CHECKING:
    from model.decoding.kv_cache import LayerCache


# The common form of one attention block's projections: for "weight" and "bias", the (q, k, v)
# tensors: q (n_head * head_dim, n_embd) or (n_head * head_dim,), k and v with n_kv_head heads.
QKV = dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
PROJECTIONS = ("query", "key", "value")


TEMPERATURE_SCALE = 0.1  # Llama 4's attn_scale: how fast the queries' temperature grows with log(position)


def tempered(q: torch.Tensor, positions: torch.Tensor, steps: int) -> torch.Tensor:
    """Queries (..., T, d) at ``positions`` (T,) scaled by Llama 4's temperature, 1 + 0.1 log(1 + floor((i + 1) /
    steps)): 1 before position steps - 1, growing with the log of the length past it (arXiv 2501.19399)."""
    scale = torch.log1p(torch.floor((positions.float() + 1) / steps)) * TEMPERATURE_SCALE + 1
    return (q * scale[:, None]).to(q.dtype)


def keys_seen(q_len: int, k_len: int, masks, keys: HeldKeys | None, positions: torch.Tensor | None,
              documents: torch.Tensor | None, selected: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """How many keys each query sees, counted by the predicates its kernel applies (``seen_keys``: the masks, the
    document, the cache's positions, a static step's empty slots) or sparse attention's ``selected`` keys among them:
    (q_len, 1), or (B, 1, q_len, 1) per row. Each query sees itself at least."""
    keep = seen_keys(q_len, k_len, masks, keys, positions, documents, device) if selected is None else selected
    return keep.sum(dim=-1, keepdim=True).clamp_min(1)


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
    """Add the new positions' k, v to the cache (``model.decoding.kv_cache``); return the keys and values to attend
    over, and where they are not in position order from 0 (a ring that has wrapped, a static decode step's whole
    cache) the positions they hold (else None)."""
    if cache is None:
        return k, v, None
    return cache.update(slot, k, v)


def rms_normed(norm: nn.RMSNorm, t: torch.Tensor) -> torch.Tensor:
    """``norm`` applied in ``t``'s dtype: under autocast the queries are bf16 and the learned scale float32, which
    nn.RMSNorm would compute unfused (with a warning)."""
    return F.rms_norm(t, norm.normalized_shape, norm.weight.to(t.dtype), norm.eps)


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
    and ``qk``, where the queries and keys lie side by side in one tensor (a fused projection's), time-major as the
    projection made them: (B, T, H + kv, d).
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


# The options each stage of the pipeline applies (model.attention.options), from their declarations (``option(stage=
# ...)`` in model.attention.spec): a layer that runs the pipeline applies all of them, with its projection's own
# (``projection_options``), but for those its projection declares it cannot hold (``cannot_hold``, with why). A new
# option declares the stage that applies it, and every pipeline layer applies it there (tests/test_pipeline.py proves
# each stage reaches every layer's output); a layer that runs no kernel states its own ``applies``.
STAGE_OPTIONS = {stage: stage_options(stage, AttentionSpec) for stage in STAGES}
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
    2. the heads' encodings (``encode_queries``/``encode_keys``: QK-norm, rotary positions) on the dims the layout's
       ``query_parts``/``key_parts`` say; ``scale_queries``, the query scalings, per kernel call, once the cache
       says which keys each query sees (SSMax counts them);
    3. the key selection: the masks, which the kernel applies, and a registered selection
       (``model.attention.selection``: ``forward`` asks one that reads the block's input, ``attend_heads`` one that
       reads each call's queries and keys);
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
    # The function it computes: layouts of one function convert exactly (model.checkpoints.convert); what that
    # function is
    function: ClassVar[str] = "mha"
    computes: ClassVar[str] = "keys and values projected from the input per key/value head"
    # Whether the KV cache holds the keys themselves (a position that turns held keys, PaTH, needs them), not what
    # they are made from (MLA's latent, up-projected after the cache by its keys_values)
    caches_keys: ClassVar[bool] = True
    # The options (model.attention.options: AttentionSpec's fields but its shape and the kernel's choice) a layer
    # applies; its position encoding's own come with "position". Any other set away from its off value is refused. A
    # pipeline layer's are its stages' (STAGE_OPTIONS) and its projection's, less what its projection cannot hold,
    # made as the class is defined; a layer that runs no kernel declares its own.
    applies: ClassVar[frozenset[str]]
    projection_options: ClassVar[frozenset[str]] = frozenset({"n_kv_head"})  # the projection's own: key/value heads
    cannot_hold: ClassVar[dict[str, str]] = {}  # stage options its projection cannot hold, and why
    has_attention_maps: ClassVar[bool] = True  # softmax weights over keys (heads.py studies them)
    # Whether its layers may read another layer's keys and values (cross-layer KV sharing, model.config's
    # check_kv_sharing): its projection can make queries alone (``reads_kv``), and the cache holds the keys themselves
    shares_kv: ClassVar[bool] = False
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
        own = weight_name_start(cls, mine)
        for other in registry.values():
            start = weight_name_start(other, mine)
            if start is not None and (own is None or start <= own):  # the other's would win: matched as early
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
        chunk); with a key selection (``model.attention.selection``: sparse attention, MoBA), the keys it attends at
        most and its own scores (a kernel that masks instead of skipping computes them all: the plan counts the
        algorithm's)."""
        keys = mask_capacity(masks_set(spec), seq_len)
        selection = selection_of(spec)
        if selection is None:
            return 6 * sum(cls.score_widths(spec)) * keys
        widths = cls.score_widths(spec)
        return 6 * sum(widths) * selection.attended(spec, keys) + selection.flops(spec, keys, widths)

    @classmethod
    def state_bytes(cls, spec: AttentionSpec, dtype_bytes: int) -> int:
        """Bytes a sequence's decoding state keeps per layer whatever its length, activations ``dtype_bytes``
        wide (a KV cache has none: it grows by ``cache_width`` numbers per token)."""
        return 0

    @classmethod
    def cache_width(cls, spec: AttentionSpec) -> int:
        """Numbers a KV cache keeps per token per layer: its keys and values (``kv_width``) and what a modification
        keeps per key (``Modification.cache_width``); the plan's and the reports' cache bytes per token are this times
        the layers and the dtype's bytes."""
        if spec.kv_from is not None:  # it reads another layer's cache and keeps none (refused what would keep some)
            return 0
        selection = selection_of(spec)
        selected = 0 if selection is None else selection.cache_width(spec)  # a selection's own per token (its keys)
        return cls.kv_width(spec) + selected + sum(mod.cache_width(spec) for mod in MODIFICATIONS.values()
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
        # cross-layer KV sharing: its projection makes queries alone; it attends over the keys and values an earlier
        # layer made and cached (``attend``'s ``shared``), with its own queries, encodings of them and output
        self.reads_kv = spec.kv_from is not None
        self.c_proj = nn.Linear(spec.n_embd, spec.n_embd, bias=spec.bias)
        self.resid_dropout = nn.Dropout(spec.dropout)
        self.kernel = spec.build_kernel() if self.takes_kernel else None
        self.dropout = spec.dropout
        self.diff = DifferentialHeads(spec.head_dim, spec.lambda_init) if spec.differential else None
        scores, values = self.score_widths(spec)
        self.pad_values = self.takes_kernel and "flash" in registry.kernel(spec.kernel).backends and scores > values
        self.build_encodings(spec, spec.head_dim)
        # The key selection (model.attention.selection), held as its own attribute (its parameters' names: indexer):
        # built apart, so the draws after it are the dense model's
        for kind in SELECTIONS.values():
            setattr(self, kind.attribute, None)
        self.selection_kind = selection_of(spec)
        if self.selection_kind is not None:
            with own_draws():
                rotary_width = None if self.rotary is None else self.rotary.dim
                built = self.selection_kind.build(spec, rotary_width, self.score_widths(spec))
            setattr(self, self.selection_kind.attribute, built)
        self.selection_per_call = self.selection_kind is not None and self.selection_kind.per_call

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
            if spec.kv_from is not None:  # the keys it reads were normed by their own layer
                self.k_norm = None
        self.qk_norm, self.softcap, self.query_temperature = spec.qk_norm, spec.softcap, spec.query_temperature
        # SSMax's s per head: its initial value plus this offset, which starts at 0 as a vector does (GPT's rule) and
        # takes AdamW's steps (no weight decay on a vector) exactly as the paper's learned s would
        self.ssmax = spec.ssmax
        self.ssmax_offset = nn.Parameter(torch.zeros(spec.n_head)) if spec.ssmax is not None else None
        self.sinks = None
        for mod in MODIFICATIONS.values():  # each one's (n_head,) parameters, at the values they start at
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
        # PaTH's transforms of the keys (model.position=path): its modification's projections, built above
        self.turns_keys = registry.position(spec.position).transforms_keys

    # Which dims the encodings act on, per head: a layout's are all (rotary's first rotary_dim); MLA's its own
    query_parts: ClassVar[Parts] = WHOLE
    key_parts: ClassVar[Parts] = WHOLE

    def encode_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(B, heads, T, dq) queries at ``positions`` -> normalised (qk_norm), rotated (rope); scaled later, per
        kernel call (``scale_queries``: after QK-norm, which would undo a scaling)."""
        return self.encoded(q, positions, self.q_norm, self.query_parts)

    def encode_keys(self, k: torch.Tensor, positions: torch.Tensor, parts: Parts | None = None) -> torch.Tensor:
        """As ``encode_queries``, for keys (``parts``: the dims, the layout's ``key_parts`` by default): before the
        KV cache, which then holds them encoded."""
        return self.encoded(k, positions, self.k_norm, parts or self.key_parts)

    def encode_queries_keys(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                            qk: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Both encodings at once: queries and keys that the projection made side by side in one tensor ``qk`` (a
        fused projection's) turn in one rotary call where nothing normalises them first (in a decode step of the
        nano model, rotary's extra cost was its calls), the same numbers as one call each."""
        whole = self.query_parts is WHOLE and self.key_parts is WHOLE  # identity: no tuples of slices compared per step
        if qk is None or self.rotary is None or self.qk_norm or not whole:
            return self.encode_queries(q, positions), self.encode_keys(k, positions)
        # nothing to normalise; turned time-major (as projected: no copy into heads-major first), then heads-major views
        q, k = self.encoded(qk, positions, None, WHOLE, time_dim=-3).transpose(1, 2).split([q.size(1), k.size(1)], 1)
        return q, k

    def encoded(self, t: torch.Tensor, positions: torch.Tensor, norm: nn.RMSNorm | None, parts: Parts,
                time_dim: int = -2) -> torch.Tensor:  # fmt: skip
        """QK-norm over ``parts.normed``, then rotary over ``parts.turned``: the heads' encodings, the one code that
        applies them, to (..., T, d) or, ``time_dim=-3``, (..., T, heads, d)."""
        if parts is WHOLE:  # a layout's: every dim, called directly (no closure per call: a decode step's cost)
            t = rms_normed(norm, t) if self.qk_norm else t
            return t if self.rotary is None else self.rotary(t, positions, time_dim)
        if self.qk_norm and parts.normed is not None:
            t = on_dims(t, parts.normed, lambda u: rms_normed(norm, u))
        if self.rotary is not None and parts.turned is not None:
            t = on_dims(t, parts.turned, lambda u: self.rotary(u, positions, time_dim))
        return t

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor | None, head: int = 0,
                      seen: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """The queries' scalings of query heads ``head``.. (``q`` (B, heads, T, dq)): Llama 4's temperature by position
        (model.query_temperature); SSMax's s_h log n_i (model.ssmax), n_i the keys query i sees, ``seen``
        (``keys_seen``: (T, 1) or (B, 1, T, 1))."""
        if self.query_temperature is not None:
            q = tempered(q, positions, self.query_temperature)
        if self.ssmax is None:
            return q
        s = (self.ssmax + self.ssmax_offset[head : head + q.size(1)]).view(-1, 1, 1)  # (heads, 1, 1)
        return (q * (s * seen.to(s.dtype).log())).to(q.dtype)

    def score_mods(self, x: torch.Tensor, cache: LayerCache | None = None, keys_like: torch.Tensor | None = None):
        """The score modifications of this block (``model.attention.modifications``) at its input ``x``, or None when it
        has none; with a ``cache``, a token bias's states are the held keys' (the new ones stored beside them, in the
        dtype of ``keys_like``)."""
        mods = ScoreMods.of_block(self, self.modifications, x)
        return mods if mods is None or cache is None else mods.kept(cache, keys_like)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None = None, cache: LayerCache | None = None,
        document_starts: torch.Tensor | None = None, shared: dict | None = None,
    ) -> torch.Tensor:
        """(B, T, C) -> (B, T, C). ``document_starts`` (B, T): the absolute position where each token's document
        starts (model.document_masking; None: one document): a query sees no key before it. ``shared``: cross-layer KV
        sharing's hand-over (``attend``)."""
        if positions is None and (self.rotary is not None or self.alibi_slopes is not None or self.query_temperature
                                  or self.ssmax or self.turns_keys):  # fmt: skip
            positions = torch.arange(x.size(1), device=x.device)  # a block called alone; else keys in order
        documents = document_starts if self.spec.document_masking else None
        selected = None  # a selection from the block's input (sparse attention's indexer), for every head
        if self.selection_kind is not None and not self.selection_per_call:
            selected = self.selection.select_input(self, x, positions, cache, documents)
        # the hand-over only to a layer that shares (a linear layer's own attend takes none: check_kv_sharing)
        y = self.attend(x, positions, cache, documents, selected, **({} if shared is None else {"shared": shared}))
        y = self.c_proj(y if self.gate is None else self.gated(y, x))
        return self.resid_dropout(y) if self.resid_dropout.p and self.training else y

    @property
    def selection(self) -> KeySelection | None:
        """The key selection this block holds (``model.attention.selection``), under its own attribute, or None."""
        return None if self.selection_kind is None else getattr(self, self.selection_kind.attribute)

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
               shared: dict | None = None) -> torch.Tensor:  # fmt: skip
        """(B, T, C) -> the heads' outputs side by side, (B, T, n_head * dv): the pipeline's stages 1, 2, 4 and 5.
        ``positions`` (T,) are the tokens' absolute positions, computed once by the GPT: a learned encoding was added
        to the embeddings; rotary turns the queries and keys here, ALiBi biases the scores (``score_mods``).
        ``selected`` (B, 1, T, keys): the keys sparse attention chose for each query (``model.attention.sparse``), else
        None. ``shared`` (cross-layer KV sharing), a dict by key group's slot: a layer that others read fills it with
        each group's keys and values as it attends over them (encoded, from its cache where it has one: a ring's or a
        static step's whole buffers, with the positions they hold); a layer that reads (``reads_kv``) attends over
        them with its own queries, and neither projects nor caches keys."""
        outputs, mods, first_group = [], None, True
        householders = MODIFICATIONS["path"].directions(self, x) if self.turns_keys else None
        # A selection that attends its own way (NSA's three gated branches, one over compressed keys; DeepSeek-V4's
        # one softmax over a window and compressed entries: ``attends``) is more than a mask for the kernel: it runs in
        # place of the kernel call, and a selection of branches gates them from the block's input, once
        # (model.attention.selection)
        attends = self.selection_kind is not None and self.selection_kind.attends
        branch_gates = self.selection.branch_gates(x) if attends and self.selection_kind.branches else None
        for group in self.project(x):
            whole = len(group.calls) == 1 and group.calls[0][1].size(1) == self.n_head  # one call of every head
            if self.reads_kv:  # the source layer's keys and values, as it encoded and cached them
                k, v, keys = shared[group.slot]
                q = self.encode_queries(group.calls[0][1], positions) if whole else None
                if first_group:  # no token bias's states: refused on a layer that reads (check_kv_sharing)
                    mods, first_group = self.score_mods(x), False
            else:
                if whole:
                    q, k = self.encode_queries_keys(group.calls[0][1], group.k, positions, group.qk)
                else:
                    k = self.encode_keys(group.k, positions)
                k, v, keys = remember(cache, group.slot, k, group.v)
                if first_group:  # a token bias's states, kept beside the first group's keys
                    mods, first_group = self.score_mods(x, cache, k), False
                k, v = self.keys_values(k, v, positions)
                if shared is not None:  # a later layer reads them
                    shared[group.slot] = (k, v, keys)
            widened = None
            if householders is not None:  # PaTH: the keys turned by the new tokens (a decode step's: in the cache)
                k, widened = self.turned_keys(group, k, v, keys, positions, householders, cache)
            seen = self.keys_seen(x.size(1), k.size(-2), keys, positions, document_starts, selected)  # SSMax's n_i
            for head, queries in group.calls:
                q = self.scale_queries(q if whole else self.encode_queries(queries, positions), positions, head, seen)
                heads_mods = mods if mods is None or q.size(1) == self.n_head else mods.head(head)
                if attends:  # in place of the one kernel call
                    gates = None if branch_gates is None else branch_gates[:, :, head : head + q.size(1)]
                    outputs.append(self.selection.attend(self, q, k, v, keys, heads_mods, positions, document_starts,
                                                         gates))  # fmt: skip
                elif widened is None:
                    outputs.append(self.attend_heads(q, k, v, keys, heads_mods, positions, document_starts, selected))
                else:
                    q_wide, k_wide = widened(q)
                    outputs.append(self.attend_heads(q_wide, k_wide, v, keys, heads_mods, positions, document_starts,
                                                     selected))  # fmt: skip
        if len(outputs) == 1:
            y = outputs[0]
            return y.transpose(1, 2).contiguous().view(*y.shape[:1], y.size(2), -1)  # (B, T, H * dv)
        return torch.cat([y.transpose(1, 2).flatten(2) for y in outputs], dim=-1)  # one head each: views

    def turned_keys(self, group: KeyGroup, k: torch.Tensor, v: torch.Tensor, keys: HeldKeys | None,
                    positions: torch.Tensor, householders: tuple[torch.Tensor, torch.Tensor],
                    cache: LayerCache | None):  # fmt: skip
        """PaTH (model.position=path) on the group's keys ``k`` (those a cache holds, turned through the last token
        before these, and the new ones): the cache is left holding every key turned through the last new token,
        written in place (a captured decode step reads its buffers). Returns the keys a decode step's one query
        attends (those, turned), and None; or, for several new queries, the keys as they are and the widening of a
        call's queries and the keys (``householder_augmented``) that gives each query its own product."""
        w, beta = (t[:, group.slot * k.size(1) : (group.slot + 1) * k.size(1)] for t in householders)  # its heads
        held = keys.positions if keys is not None else torch.arange(k.size(2), device=k.device)
        if cache is not None or positions.size(0) == 1:
            turned = turned_through(k, held, positions, w, beta)
            if cache is not None and k.size(2) == positions.size(0) > cache.capacity:  # a first fill past the cache
                remember(cache, group.slot, turned, v)  # (it kept the last keys, of the tensors given)
            elif cache is not None:
                held_keys = k  # the cache's own buffers (views of them, in position order)
                k = k.clone() if positions.size(0) > 1 else k  # the widening below reads the keys as they were
                held_keys.copy_(turned)
            if positions.size(0) == 1:
                return turned, None

        # A kernel that compiles a graph per head width (flex) meets a new one, d + T, at every length (each prompt,
        # each length an evaluation reads: seconds each on a CPU): widened to the next power of two, a graph per
        # doubling (a GPU's flex rounds its head dims up so, in any case)
        per_width = KERNELS[self.spec.kernel].graph_per_head_width
        width = 1 << (k.size(-1) + positions.size(0) - 1).bit_length() if per_width else None

        def widened(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            heads = q.size(1)  # the call's query heads read the key/value heads keys_per_query gives them
            return householder_augmented(q, k, held, positions, w, beta, self.keys_per_query(w, heads),
                                         self.keys_per_query(beta[..., None], heads)[..., 0], width)  # fmt: skip

        return k, widened

    def attend_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: HeldKeys | None,
                     mods: ScoreMods | None, positions: torch.Tensor | None, documents: torch.Tensor | None,
                     selected: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """The kernel with the score modifications, over (B, h, T, dq) queries and their key group's keys and values,
        then the heads' combination (differential attention) -> (B, h, T, dv). A key selection per call (MoBA's
        blocks) chooses here, from the queries and keys the kernel gets."""
        if self.selection_per_call:
            selected = self.selection.select_heads(q, self.keys_per_query(k, q.size(1)), keys, positions, documents)
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

    def keys_seen(self, q_len: int, k_len: int, keys: HeldKeys | None, positions: torch.Tensor | None,
                  documents: torch.Tensor | None, selected: torch.Tensor | None) -> torch.Tensor | None:  # fmt: skip
        """How many keys each query sees (``keys_seen``) where a query scaling reads it (SSMax), else None."""
        if self.ssmax is None:
            return None
        device = self.ssmax_offset.device
        return keys_seen(q_len, k_len, self.masks, keys, positions, documents, selected, device)

    def queries_keys(self, x: torch.Tensor, documents: torch.Tensor | None = None,
                     selected: torch.Tensor | None = None, source: tuple | None = None,
                     ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """Each query head's queries and keys, (B, H, T, dq), encoded and scaled at positions 0..T-1 by the pipeline's
        own stages (within ``documents`` and, with sparse attention, the ``selected`` keys, where given): what its
        attention weights come from. ``source``: for a layer that reads another's keys (``reads_kv``), that layer's
        attention block and its input."""
        positions = torch.arange(x.size(1), device=x.device)
        seen = self.keys_seen(x.size(1), x.size(1), None, positions, documents, selected)
        queries, keys = [], []
        read = None if source is None else source[0].encoded_keys(source[1], positions)
        for group in self.project(x):
            if read is not None:
                k = read[group.slot]
            else:
                k, _ = self.keys_values(self.encode_keys(group.k, positions), group.v, positions)
            for head, q in group.calls:
                queries.append(self.scale_queries(self.encode_queries(q, positions), positions, head, seen))
                keys.append(self.keys_per_query(k, q.size(1)))
        return torch.cat(queries, dim=1), torch.cat(keys, dim=1)

    def encoded_keys(self, x: torch.Tensor, positions: torch.Tensor) -> dict[int, torch.Tensor]:
        """Each key group's keys (by its slot) at ``x``, encoded: what a layer that reads this one's keys reads."""
        return {group.slot: self.keys_values(self.encode_keys(group.k, positions), group.v, positions)[0]
                for group in self.project(x)}  # fmt: skip

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor, source: tuple | None = None) -> torch.Tensor:
        """(B, H, T, T) attention weights of each query head, from this layout's own projections, with the
        block's score modifications (with sinks, a row sums to less than 1: the rest went to the sink). ``source``:
        for a layer that reads another's keys (cross-layer KV sharing), that layer's attention block and its input.

        The manual kernel applies exactly these; sdpa and flex fuse the same formula, so they describe a
        model run with any kernel.
        """
        positions = torch.arange(x.size(1), device=x.device)
        if self.reads_kv and source is None:
            raise ValueError(f"this layer reads layer kind {self.spec.kv_from}'s keys and values: its attention "
                             f"weights need that layer's block and input, attention_weights(x, source=(block, "
                             f"input))")  # fmt: skip
        if self.turns_keys:
            return self.turned_attention_weights(x, positions)
        selected = None
        if self.selection_kind is not None and not self.selection_per_call:
            selected = self.selection.select_input(self, x, positions, None, None)
        q, k = self.queries_keys(x, None, selected, *(() if source is None else (source,)))  # a linear layer: none
        if self.selection_kind is not None and self.selection_kind.attends:  # its own maps (NSA's gated branches)
            return self.selection.weights(self, q, k, x)
        if self.selection_per_call:
            selected = self.selection.select_heads(q, k, None, positions, None)
        return attention_probs(q, k, self.masks, mods=self.score_mods(x), selected=selected)

    def turned_attention_weights(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``attention_weights`` under PaTH: each query's product of transforms through the widened queries and keys
        (``turned_keys``)."""
        householders, mods, maps = MODIFICATIONS["path"].directions(self, x), self.score_mods(x), []
        seen = self.keys_seen(x.size(1), x.size(1), None, positions, None, None)  # SSMax's n_i
        for group in self.project(x):
            k, v = self.keys_values(self.encode_keys(group.k, positions), group.v, positions)
            k, widened = self.turned_keys(group, k, v, None, positions, householders, None)
            for head, q in group.calls:
                q = self.scale_queries(self.encode_queries(q, positions), positions, head, seen)
                heads_mods = mods if mods is None or q.size(1) == self.n_head else mods.head(head)
                if widened is not None:
                    q, k_wide = widened(q)
                maps.append(attention_probs(q, self.keys_per_query(k if widened is None else k_wide, q.size(1)),
                                            self.masks, mods=heads_mods))  # fmt: skip
        return torch.cat(maps, dim=1)

    @staticmethod
    def to_qkv(params: dict[str, torch.Tensor], n_head: int | None) -> QKV:
        """This layout's q/k/v parameters (names relative to the module) -> the common form."""
        raise NotImplementedError

    @staticmethod
    def from_qkv(qkv: QKV, n_head: int | None) -> dict[str, torch.Tensor]:
        """The common form -> this layout's q/k/v parameters (names relative to the module)."""
        raise NotImplementedError


def build_attention(layout: str, n_embd: int, n_head: int, kernel: str, dropout: float = 0.0, bias: bool = True,
                    **options) -> MultiHeadAttention:  # fmt: skip
    """Build the attention block of a layout by name (an unknown name lists the valid ones); ``options`` are
    the rest of ``AttentionSpec``'s fields (n_kv_head, window, position, ...)."""
    return attention_of(layout, AttentionSpec(n_embd, n_head, kernel, dropout, bias, **options))


def attention_of(layout: str, spec: AttentionSpec) -> MultiHeadAttention:
    """The attention block of ``layout`` built from ``spec``, checked by the layout first."""
    cls = lookup(MIXERS, "attention layout", layout)
    cls.check_spec(spec)
    return cls(spec)
