"""GPTConfig: the shape of a GPT and the attention implementation it uses.

The one declaration of a model: Hydra's ``model`` config group validates
against it, checkpoints store it, and every script rebuilds models from it.
The defaults are GPT-2 small's shape; ``configs/model/*.yaml`` change only
what differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import SimpleNamespace
from typing import Any

from model import registry
from model.attention import positions as _positions  # noqa: F401  (registers the position encodings)
from model.attention.differential import LAMBDA_INIT
from model.attention.label_parts import LabelPart
from model.attention.masks import capacity as mask_capacity
from model.attention.masks import options_set as masks_set
from model.attention.modifications import score_mod_fields, spelled, with_fields
from model.attention.options import check_conflicts, declared_conflicts, defaults_of, option_fields
from model.attention.sparse import INDEXER_SHAPE
from model.attention.spec import AttentionSpec

VOCAB_MULTIPLE = 64  # pad the embedding/LM head to a multiple of this for faster matmuls


def kernel_option(model: dict) -> str:
    """The kernel as the ``kernel=`` option spells it: ``sdpa_flash`` for SDPA held to its flash implementation."""
    return registry.kernel_option(model["kernel"], model.get("sdpa_backend", "auto"))


# The order run names have spelled their parts in since each option was added: the parts declared since (an option's
# ``label``, model.attention.label_parts) go after these, in declaration order, then the score modifications' parts.
LABEL_ORDER = ("n_kv_head", "k_eq_v", "rope_head_dim", "linear_chunk", "window", "attention_chunk", "position",
               "query_temperature", "ssmax", "negative_eigenvalues", "document_masking", "document_positions",
               "differential", "sparse_topk", "moba_block", "nsa_block")  # fmt: skip


def labelled_parts() -> list[tuple[str, LabelPart]]:
    """(field, its label part) of every GPTConfig field that declares one (the attention options' ``label``, and the
    model's own: ``document_positions``), in a label's order (``LABEL_ORDER``, then declaration order)."""
    declared = {f.name: f.metadata["label"] for f in fields(GPTConfig) if f.metadata.get("label") is not None}
    return [(name, declared[name]) for name in sorted(declared, key=lambda n: LABEL_ORDER.index(n) if n in LABEL_ORDER
                                                      else len(LABEL_ORDER))]  # fmt: skip


def attention_label(model: dict, sep: str = "-", show: tuple[str, ...] | list[str] = ()) -> str:
    """How a model attends, spelled as its options are: ``<attention>-<kernel>``, then the part of each other
    attention option set away from its default, as the option declares it (``option(label=...)``): ``-kv<n>`` for
    fewer key/value heads than query heads, ``-latent<k>`` for a latent key/value width, ``-window<w>`` for a sliding
    window, ``-rope`` (``-rope<theta>`` when theta is not 10000), ``-alibi`` or ``-nopos`` for the position encoding,
    ``-qknorm``, ``-softcap<c>``, ``-sinks``: ``fused_qkv-sdpa_flash``, ``wrapper-sdpa-kv2``,
    ``fused_qkv-manual-window64-rope-sinks``. The one name of a variant: run names, sweep directories, report
    tables, plot legends and wandb tags all use it; a default model's is ``<attention>-<kernel>``.

    ``model`` is a GPTConfig's fields (a dict: run.json holds them too; a field it lacks counts as its
    default). ``show`` names the axes (``n_kv_head``, ``window``, ``position``, ``rope_theta``) spelled even at
    their default (``-kv4`` of 4 heads, ``-nowindow``, ``-learned``, ``-rope10000``): those a sweep or a report
    varies. ``sep`` joins the parts.
    """
    parts = [model["attention"], kernel_option(model)]
    for name, part in labelled_parts():
        spelled_part = part.spelled(name, model, show)
        if spelled_part:
            parts.append(spelled_part)
    for mod in registry.MODIFICATIONS.values():  # -qknorm, -softcap<c>, -sinks: each says its own part
        part = mod.label(model.get(mod.field, mod.off))
        if part:
            parts.append(part)
    if model.get("kv_from"):  # a layer kind that reads another kind's keys and values: S.kvfromG
        parts.append(f"kvfrom{model['kv_from']}")
    if model.get("layer_pattern"):
        parts.append(schedule_part(model, parts, show))
    return sep.join(parts)


def schedule_part(model: dict, parts: list[str], show) -> str:
    """A schedule's part of the label: the pattern, then each kind with the parts its fields change, as the
    label spells them (a field it sets is spelled even at its default: ``kv4``, ``nowindow``; a modification
    it turns off is ``no<part>``): ``LLLG_L.window128.nosinks_G.nopos``."""
    spelled = [model["layer_pattern"]]
    uniform = {**model, "layer_pattern": None, "layer_kinds": {}}
    mixed = mixes_layouts(model)  # then every kind names its layout: KKKM_K.kda_M.mla, not a bare M
    for kind, overrides in (model.get("layer_kinds") or {}).items():
        if not isinstance(overrides, Mapping):  # a bad value, spelled as given (the config refuses it)
            spelled.append(f"{kind}.{overrides}")
            continue
        theirs = attention_label({**uniform, **overrides}, "|", [*show, *overrides]).split("|")
        changes = [p for p in theirs[2:] if p not in parts]
        if mixed or overrides.get("attention", model.get("attention")) != model.get("attention"):
            changes.insert(0, str(overrides.get("attention", model.get("attention"))))  # D.gated_deltanet.nopos
        for mod in registry.MODIFICATIONS.values():  # one a kind turns off: its part, with "no"
            own = mod.label(model.get(mod.field, mod.off))
            if own and mod.field in overrides and not mod.used(overrides[mod.field]):
                changes.append(f"no{own}")
        spelled.append(".".join([kind, *changes]))
    return "_".join(spelled)


def mixes_layouts(model: dict) -> bool:
    """Whether a schedule's kinds run layouts other than the model's own (Kimi Linear's KDA beside MLA): then
    the model's layout and kernel, which a label opens with, say what only some layers run."""
    kinds = schedule_kinds(model)
    return bool(kinds) and kinds != schedule_kinds({**model, "layer_kinds": {}})


def schedule_kinds(model: dict) -> dict[str, str]:
    """What each kind of a schedule's layers runs, in the pattern's order: its layout, then the kernel as
    ``kernel=`` spells it where the layout runs one: ``{"K": "kda", "M": "mla/sdpa"}`` for Kimi Linear's KKKM
    (a Kimi Delta Attention layer runs no kernel). {} for a model whose layers are alike. ``model`` is a
    GPTConfig's fields (a dict, as run.json holds them)."""
    pattern = model.get("layer_pattern")
    if not pattern:
        return {}
    kinds, ran = model.get("layer_kinds") or {}, {}
    for kind in dict.fromkeys(pattern):
        own = kinds.get(kind)
        layout = (own.get("attention") if isinstance(own, Mapping) else None) or model["attention"]
        known = registry.MIXERS.get(layout)  # one this checkout does not know: spelled as the label does
        ran[kind] = layout if known is not None and not known.takes_kernel else f"{layout}/{kernel_option(model)}"
    return ran


def schedule_text(model: dict, preset: str | None = None) -> str | None:
    """A schedule of layers as the reports and run.json say it: the preset that chose it (where one did), its
    pattern and what each kind runs: ``kimi_linear: KKKM, K=kda, M=mla/sdpa``; a kind that reads another's keys and
    values says whose (``cla: GS, G=fused_qkv/sdpa, S=fused_qkv/sdpa on G's keys and values``). None for a model whose
    layers are alike: its label's layout and kernel say it."""
    kinds = schedule_kinds(model)
    if not kinds:
        return None
    own = model.get("layer_kinds") or {}
    reads = {kind: f" on {fields['kv_from']}'s keys and values" for kind, fields in own.items()
             if isinstance(fields, Mapping) and fields.get("kv_from")}  # fmt: skip
    text = ", ".join([model["layer_pattern"], *(f"{kind}={ran}{reads.get(kind, '')}" for kind, ran in kinds.items())])
    return f"{preset}: {text}" if preset else text


def label_parts() -> tuple[tuple[str, str], ...]:
    """What each optional part of a label (``attention_label``) is, in its order: its pattern, its title (plot
    legends, ``python train.py --help``), as each option's part declares it and each registered modification's class."""
    return (
        *(pattern for _, part in labelled_parts() for pattern in part.patterns()),
        *((mod.label_pattern, mod.label_title) for mod in with_fields()),  # -qknorm, -softcap<cap>, -sinks, ...
        (r"kvfrom[A-Z]", "-kvfrom<kind> (a kind's layers read that kind's keys and values)"),
        (r"[A-Z]+(_[A-Z][\w.]*)+", "-<layer pattern>_<kind>.<what it sets>"),  # a schedule: DDDG_D.gated_deltanet_G
    )  # fmt: skip


def label_grammar() -> str:
    """A run label's grammar, its optional parts in brackets: ``<attention>-<kernel>[-kv<key/value heads>]...``."""
    return "<attention>-<kernel>" + "".join(f"[{title}]" for _, title in label_parts())


def with_attention_options(after: str):
    """Give a config dataclass every attention option as a field of its own, declared once in ``AttentionSpec``
    (``option(...)``: its default, and its metadata: what a reuse of a checkpoint makes of a change, its label part,
    its example and needs), placed after field ``after``: a new option is a field of the model's config with no edit
    here."""

    def decorate(cls):
        own, annotations = cls.__dict__.get("__annotations__", {}), {}
        for name, kind in own.items():
            annotations[name] = kind
            if name == after:
                for f in fields(AttentionSpec):
                    if f.name in option_fields() and f.name not in own:
                        annotations[f.name] = f.type
                        setattr(cls, f.name, field(default=f.default, metadata=f.metadata))
        cls.__annotations__ = annotations
        return cls

    return decorate


@dataclass
@with_attention_options(after="sdpa_backend")
class GPTConfig:
    """A model: its shape, its attention's layout and kernel, and every attention option of ``AttentionSpec``
    (declared there, each with what it means; ``with_attention_options``), then what the model does around its
    attention (documents, a schedule of layers)."""

    # metadata "reuse": what a change of the field means to a checkpoint reused by trainer.resume or
    # trainer.init_from (training/reuse.py keeps one rule over it); an attention option declares its own
    name: str = field(default="gpt2_small", metadata={"reuse": "label"})  # for run names and reports; no effect
    vocab_size: int | None = field(default=None, metadata={"reuse": "weights"})  # None: the tokenizer's, at training
    block_size: int = field(default=1024, metadata={"reuse": "positions"})
    n_layer: int = field(default=12, metadata={"reuse": "weights"})
    n_head: int = field(default=12, metadata={"reuse": "weights"})
    n_embd: int = field(default=768, metadata={"reuse": "weights"})
    bias: bool = field(default=True, metadata={"reuse": "weights"})
    attention: str = field(default="fused_qkv", metadata={"reuse": "layout"})  # the QKV layout: wrapper | ...
    # manual | sdpa | flex, or sdpa_<backend> (read as kernel=sdpa, sdpa_backend=<backend>)
    kernel: str = field(default="sdpa", metadata={"reuse": "implementation"})
    # kernel=sdpa's implementation: auto | flash | efficient | cudnn | math
    sdpa_backend: str = field(default="auto", metadata={"reuse": "implementation"})
    # (here: every attention option, AttentionSpec's, from dropout to nsa_window)
    # Document masking's end-of-text token (model.document_masking; None: the tokenizer's, which training fills in)
    document_end: int | None = field(default=None, metadata={"reuse": "function"})
    # with document masking and an absolute position table: each token's position counted from its document's start
    document_positions: bool = field(default=False, metadata={
        "reuse": "function", "label": LabelPart("docpos", "-docpos (positions from each document's start)")})
    # A schedule of layers: each letter of layer_pattern is a kind in layer_kinds, the pattern repeated over the
    # layers (LLLG on 8 layers: LLLGLLLG); a kind sets attention fields (LAYER_FIELDS) for its layers, the
    # fields above holding for the rest. None: every layer alike (an older checkpoint's model).
    layer_pattern: str | None = field(default=None, metadata={"reuse": "weights"})
    layer_kinds: dict[str, Any] = field(default_factory=dict, metadata={"reuse": "weights"})
    # Cross-layer KV sharing (CLA, YOCO, Gemma's shared-KV layers), a layer kind's option only
    # (+model.layer_kinds.S.kv_from=X): a layer of kind S projects no keys or values and keeps no KV cache; it reads
    # those of the nearest earlier layer of kind X, as that layer cached them (``kv_sources``, ``check_kv_sharing``).
    # A layer's own model (``layer_config``) carries its kind's value.
    kv_from: str | None = field(default=None, metadata={"reuse": "weights"})

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if name == "vocab_size" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.{name}={value!r} must be a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout={self.dropout!r} must be in [0, 1)")
        layout = registry.mixer(self.attention)
        self.kernel, self.sdpa_backend = one_kernel_vocabulary(self.kernel, self.sdpa_backend)
        for kind, values in (self.layer_kinds or {}).items():
            if not isinstance(values, Mapping):
                raise ValueError(f"model.layer_kinds.{kind}={values!r} must be the kind's fields, e.g. "
                                 f"{{window: 128}}, or {{}} for none")  # fmt: skip
        self.layer_kinds = {str(kind): dict(values) for kind, values in (self.layer_kinds or {}).items()}
        # Before the kernel's checks, which do not concern a layer that runs none: the kernel is not their fix.
        check_document_end(self)
        check_document_positions(self)
        check_conflicts(self, declared_conflicts())  # two options that cannot coexist, whichever layer takes them
        check_linear_layers(self)
        self.check_kernel_is_used()
        layout.check_spec(self.attention_spec)  # every attention option, checked where attention is declared
        check_schedule(self)

    @property
    def runs_a_kernel(self) -> bool:
        """Whether some layer runs ``model.kernel`` (not every layer linear attention, which runs its own form)."""
        attentions = {self.layer_kinds.get(kind, {}).get("attention", self.attention) for kind in self.layer_kind_names}
        return any(registry.mixer(name).takes_kernel for name in attentions)

    def check_kernel_is_used(self) -> None:
        """Refuse a kernel chosen for a model without a layer that runs one (every layer Gated DeltaNet)."""
        default = type(self).__dataclass_fields__["kernel"].default
        if self.kernel != default and not self.runs_a_kernel:
            raise ValueError(f"model.kernel={self.kernel} chooses softmax attention's kernel, but every layer is "
                             f"attention={self.attention}, which runs its own form, no kernel; leave "
                             f"model.kernel={default}, or give some layers softmax attention "
                             f"(model.layer_pattern)")  # fmt: skip

    @property
    def attention_spec(self) -> AttentionSpec:
        """What every attention block is built from (its checks run as it is made). In a schedule, the model's own
        fields, for its checks and what the model reads as a whole (its masks): a value that serves some layers
        only (a rotary base where a kind has another encoding, lambda_init, the indexer's shape) is left at its
        default here, as ``check_schedule`` holds it to reach one; each layer's is ``layer_config(i)``'s."""
        values = {f.name: getattr(self, f.name) for f in fields(AttentionSpec)}
        if self.layer_pattern is not None:
            defaults = {f.name: f.default for f in fields(AttentionSpec)}
            values |= {name: defaults[name] for name in self.unreached({})}
        return AttentionSpec(**values)

    def unreached(self, fields_of_kind: dict) -> set[str]:
        """The model's options that do not reach a layer with ``fields_of_kind`` (its kind's; {} for the model's
        own fields) unless the kind sets them: its position encoding's (a rotary base) where the layer's encoding
        has none (Llama 4's every fourth layer), lambda_init where it is not differential, the indexer's shape where
        it is not sparse."""
        position = registry.position(fields_of_kind.get("position", self.position))
        names = {name for name in position_fields() if name not in position.fields}
        # an option that needs a switch (its declaration's ``with``: lambda_init differential, the indexer's shape
        # sparse_topk, a selection's top-k its blocks) where the kind leaves that switch off
        off = defaults_of(AttentionSpec)
        for option in fields(AttentionSpec):
            needs = option.metadata.get("with", {})
            if needs and "position" not in needs and any(
                    fields_of_kind.get(switch, getattr(self, switch)) == off[switch] for switch in needs):
                names.add(option.name)
        return names - set(fields_of_kind)

    @property
    def layer_kind_names(self) -> list[str | None]:
        """Each layer's kind (a letter of ``layer_pattern``), or None for every layer of a uniform model."""
        if self.layer_pattern is None:
            return [None] * self.n_layer
        return [self.layer_pattern[i % len(self.layer_pattern)] for i in range(self.n_layer)]

    @property
    def kv_sources(self) -> list[int | None]:
        """Each layer's source of keys and values (cross-layer KV sharing): the nearest earlier layer of the kind its
        kind's ``kv_from`` names, -1 where there is none (refused: ``check_kv_sharing``); None for a layer that
        projects its own."""
        names, sources = self.layer_kind_names, []
        for i, kind in enumerate(names):
            source = self.layer_kinds.get(kind, {}).get("kv_from") if kind is not None else None
            sources.append(None if source is None else
                           next((j for j in range(i - 1, -1, -1) if names[j] == source), -1))  # fmt: skip
        return sources

    def layer_config(self, layer: int) -> GPTConfig:
        """Layer ``layer``'s model as a uniform one: these fields with its kind's (what every per-layer figure,
        check and block is made from)."""
        kind = self.layer_kind_names[layer]
        if kind is None:
            return self
        fields_of_kind = self.layer_kinds[kind]
        layout = registry.mixer(fields_of_kind.get("attention", self.attention))
        defaults = {name: f.default for name, f in type(self).__dataclass_fields__.items()}
        # A layer that runs no kernel (a hybrid's Gated DeltaNet layers) takes none of the model's, which its
        # softmax layers run: the defaults, as a uniform model of that layer has.
        unused = {} if layout.takes_kernel else {name: defaults[name] for name in ("kernel", "sdpa_backend")}
        unused |= {name: defaults[name] for name in self.unreached(fields_of_kind)}
        return replace(self, layer_pattern=None, layer_kinds={}, **fields_of_kind, **unused)

    def consumes(self, name: str) -> bool:
        """Whether some layer's position encoding has option ``name`` (a rotary base: some layer is rotary)."""
        return any(name in registry.position(self.layer_config(i).position).fields for i in range(self.n_layer))

    def in_any_layer(self, name: str) -> bool:
        """Whether any layer sets the attention field ``name`` (``sinks``: some layer has sinks)."""
        return any(getattr(self.layer_config(i), name) for i in range(self.n_layer))

    @property
    def layer_specs(self) -> list[AttentionSpec]:
        """Each layer's attention block's spec (all alike without a schedule)."""
        return [self.layer_config(i).attention_spec for i in range(self.n_layer)]

    @property
    def layer_layouts(self) -> list[tuple[type, AttentionSpec]]:
        """Each layer's attention class (its kind's ``attention``, or the model's) and spec."""
        return [(registry.mixer(one.attention), one.attention_spec)
                for one in (self.layer_config(i) for i in range(self.n_layer))]  # fmt: skip

    @property
    def cache_widths(self) -> list[int]:
        """Numbers sampling's KV cache keeps per token for each layer, as the layout says (``cache_width``)."""
        return [layout.cache_width(spec) for layout, spec in self.layer_layouts]

    def state_bytes(self, dtype_bytes: int) -> int:
        """Bytes every layer's decoding state keeps per sequence whatever its length (a linear layer's; 0 for a
        KV cache, which grows by ``cache_widths``)."""
        return sum(layout.state_bytes(spec, dtype_bytes) for layout, spec in self.layer_layouts)

    def decoding_bytes(self, dtype_bytes: int) -> int:
        """Bytes decoding holds per sequence at any length: each layer's KV cache, allocated whole at its first
        write (``cache_width`` numbers for each of its ``cache_capacities`` positions: a ring past them), and the
        linear layers' states."""
        held = sum(w * c for w, c in zip(self.cache_widths, self.cache_capacities))
        return held * dtype_bytes + self.state_bytes(dtype_bytes)

    @property
    def cache_capacities(self) -> list[int]:
        """Positions a KV cache keeps for each layer: the context, or the layer's window when shorter (a local
        layer's ring stays its window's size)."""
        return [self.layer_config(i).cache_capacity for i in range(self.n_layer)]

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_head``, or ``n_head`` (multi-head) when unset."""
        return self.n_kv_head or self.n_head

    @property
    def cache_capacity(self) -> int:
        """Positions a KV cache keeps per layer: the most recent positions its masks let a query see (the window),
        at most the context (``model.attention.masks.capacity``)."""
        return mask_capacity(self.attention_spec.masks, self.block_size)

    @property
    def runs_past_context(self) -> bool:
        """Whether the model reads past ``block_size`` (no position table): a forward or a KV cache then keeps
        going, each position seeing at most ``cache_capacity`` keys (``AttentionSpec.context``)."""
        return registry.position(self.position).runs_past_context

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def padded_vocab_size(self) -> int:
        if self.vocab_size is None:
            raise ValueError("vocab_size is not set; set model.vocab_size or let training take it from the tokenizer")
        return -(-self.vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def position_fields() -> tuple[str, ...]:
    """The options of every registered position encoding (rotary's base, fraction and scaling)."""
    return tuple(dict.fromkeys(name for encoding in registry.POSITIONS.values() for name in encoding.fields))


# The GPTConfig fields attention_label spells (each part's own and those it reads beside it, a score modification's, a
# schedule's); a sweep over one of them names its runs by the label.
LABEL_AXES = (*(axis for name, part in labelled_parts() for axis in (name, *part.fields)), *score_mod_fields(),
              "layer_pattern", "layer_kinds")  # fmt: skip

# The attention fields a layer kind may set (model.layer_kinds.<kind>.<field>); attention only to a layout of
# another function than the model's (a hybrid's gated_deltanet layers).
LAYER_FIELDS = ("attention", *(f.name for f in fields(AttentionSpec) if f.metadata.get("per_layer")), "kv_from")


def context_notes(config: GPTConfig) -> list[str]:
    """What the model's windows mean at its context, for the trainer to say before it trains (each allowed, but
    not what a user may think they run): a window that covers the whole context is the same function as none (a
    sweep shortened to a small context); a window of 1 leaves each position only itself (a schedule's window, a
    share of the context rounded down, at a small block_size). The model's window and every layer kind's."""
    names = config.layer_kind_names
    takes_models = any(kind is None or "window" not in config.layer_kinds[kind] for kind in names)
    notes = window_notes(config.window, config.block_size) if takes_models else []
    for kind in dict.fromkeys(kind for kind in names if kind is not None):
        if "window" in config.layer_kinds[kind]:
            notes += window_notes(config.layer_kinds[kind]["window"], config.block_size, kind,
                                  kind_layers(config, kind))  # fmt: skip
    for kind in dict.fromkeys(names):  # sparse attention (the model's, or a kind's) over every key a query sees
        layer = config.layer_config(names.index(kind))
        seen = mask_capacity(masks_set(layer), config.block_size)
        if layer.sparse_topk is not None and layer.sparse_topk >= seen:
            option = where_set(config, "sparse_topk", kind)
            where = "" if kind is None else f" in layer kind {kind} {kind_layers(config, kind)}"
            notes.append(f"{option}={layer.sparse_topk} is at least the {seen} keys a query sees{where}: every query "
                         f"attends every key it sees (dense attention), while the indexers still learn and cost their "
                         f"FLOPs")  # fmt: skip
    return notes


def window_notes(window: int | None, block_size: int, kind: str | None = None, layers: str = "") -> list[str]:
    """The notes on one window: the model's (``kind`` None) or a layer kind's, whose ``layers`` they name."""
    if not window:
        return []
    option = f"model.layer_kinds.{kind}.window" if kind else "model.window"
    if window >= block_size:
        if kind is None:
            return [f"{option}={window} covers the whole context (block_size={block_size}): the same function as "
                    f"{option}=null"]  # fmt: skip
        return [f"{option}={window} covers the whole context (block_size={block_size}) in its layers {layers}: the "
                f"same function as no window there ({option}=null)"]  # fmt: skip
    if window == 1:
        if kind is None:
            return [f"{option}=1 lets each position see only itself: attention mixes no tokens"]
        return [f"{option}=1 lets each position of its layers {layers} see only itself: they mix no tokens (where it "
                f"is a schedule's share of the context, model.block_size={block_size} is too short for the "
                f"schedule's local attention)"]  # fmt: skip
    return []


def check_document_end(config: GPTConfig) -> None:
    """Refuse an end-of-text token that ends no document (without document masking) or is outside the vocabulary."""
    end = config.document_end
    if end is None:
        return  # with document masking: the tokenizer's end-of-text, filled in by training (GPT refuses none)
    if not config.document_masking:
        raise ValueError(f"model.document_end={end!r} is document masking's end-of-text token, but "
                         f"model.document_masking=false; set model.document_masking=true, or model.document_end=null")
    if not isinstance(end, int) or isinstance(end, bool) or end < 0 or (config.vocab_size and end >= config.vocab_size):
        # before training reads the tokenizer, the vocabulary's size is not known: only the lower bound is
        ids = (f"0 to {config.vocab_size - 1}" if config.vocab_size
               else "0 or more, below the tokenizer's vocabulary size")  # fmt: skip
        raise ValueError(f"model.document_end={end!r} must be a token id of the vocabulary ({ids}): the token that "
                         f"ends a document (null: training fills in the tokenizer's end-of-text)")  # fmt: skip


def check_document_positions(config: GPTConfig) -> None:
    """Refuse positions restarted per document without document masking (which finds the documents) or with an
    encoding that reads distances (rotary, ALiBi, none), where a restart changes nothing a query sees."""
    restart = config.document_positions
    if restart is False:
        return
    if not isinstance(restart, bool):
        raise ValueError(f"model.document_positions={restart!r} must be true or false")
    if not config.document_masking:
        raise ValueError("model.document_positions=true counts each token's position from its document's start, "
                         "which document masking finds; set model.document_masking=true, or "
                         "model.document_positions=false")  # fmt: skip
    if not registry.position(config.position).absolute:
        absolute = " or ".join(name for name, cls in registry.POSITIONS.items() if cls.absolute)
        raise ValueError(f"model.document_positions=true restarts an absolute position table at each document, but "
                         f"model.position={config.position} reads only the distance between a query and a key, which "
                         f"a restart leaves unchanged within a document (with document masking each document already "
                         f"computes what it computes alone); use model.position={absolute}, or "
                         f"model.document_positions=false")  # fmt: skip


def check_schedule(config: GPTConfig) -> None:
    """Refuse a bad schedule of layers before any work, in one line naming the layer kind (its layers) and the
    value: a pattern that does not tile the layers, a letter with no kind, a field a kind cannot set, a value
    its layers' attention cannot take (each kind's layers are checked as a uniform model is), a position option of
    the model's that no layer's encoding has."""
    check_pattern(config)
    for kind in dict.fromkeys(config.layer_pattern or ""):
        where = kind_where(config, kind)
        check_no_window_left(config, kind)
        try:
            check_layer_position(config, config.layer_kinds[kind].get("position", config.position))
            check_layer_attention(config, config.layer_kinds[kind].get("attention", config.attention))
            config.layer_config(config.layer_kind_names.index(kind))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    check_position_options_reach_a_layer(config)
    check_kv_sharing(config)
    if config.lambda_init != LAMBDA_INIT and not config.in_any_layer("differential"):
        raise ValueError(f"model.lambda_init={config.lambda_init} is differential attention's lambda, but no layer is "
                         f"differential; set model.differential=true (or +model.layer_kinds.<kind>.differential=true), "
                         f"or leave model.lambda_init at {LAMBDA_INIT}")  # fmt: skip
    for name, default in INDEXER_SHAPE.items():
        if getattr(config, name) != default and not config.in_any_layer("sparse_topk"):
            make = making_sparse(config)
            raise ValueError(f"model.{name}={getattr(config, name)} shapes the lightning indexer of sparse attention, "
                             f"but no layer is sparse; {f'set {make}, or ' if make else ''}leave model.{name} at "
                             f"{default}")  # fmt: skip


# What a layer that reads another's keys (cross-layer KV sharing) must share with its source: the keys it reads were
# made, normed and turned by the source (its key/value heads, keys equal to values, QK-norm, its position encoding and
# that encoding's options): the reader's queries must meet them under the same encoding.
KEY_SIDE = tuple(f.name for f in fields(AttentionSpec) if f.metadata.get("key_side"))  # option(key_side=True)


def check_kv_sharing(config: GPTConfig) -> None:
    """Refuse a bad cross-layer KV sharing (``model.layer_kinds.S.kv_from=X``) in one line naming the kind, the value
    and the fix: the model's own field (a relation between layers), a letter of no kind, a kind that reads itself or
    reads from a kind that reads, a layer with no earlier layer of kind X, a source whose keys and values another
    layout or function makes (MLA's latent, a linear layer's state), keys encoded otherwise than the reader's queries
    (key/value heads, k_eq_v, QK-norm, position and its options), PaTH (which turns the keys each query reads), what
    would keep a cache of its own (sparse attention's indexer keys, a forget gate's states), and more keys seen than the
    source keeps (a window longer than the source's). A layer's own model (``layer_config``) carries its kind's value:
    a uniform model's is refused by the GPT that would build it."""
    if config.layer_pattern is None:
        return
    if config.kv_from is not None:
        raise ValueError(f"model.kv_from={config.kv_from!r} is a layer kind's option (its layers read an earlier "
                         f"layer's keys and values); set +model.layer_kinds.<kind>.kv_from={config.kv_from} on the "
                         f"kinds that read them, and leave model.kv_from unset")  # fmt: skip
    kinds, sources, names = config.layer_kinds, config.kv_sources, config.layer_kind_names
    for kind in dict.fromkeys(config.layer_pattern):
        source = kinds[kind].get("kv_from")
        if source is None:
            continue
        where = f"model.layer_kinds.{kind}.kv_from={source!r} {kind_layers(config, kind)}"
        if not isinstance(source, str) or source not in kinds:
            raise ValueError(f"{where} names no layer kind of model.layer_pattern={config.layer_pattern} (its kinds: "
                             f"{', '.join(kinds)}); name the kind whose keys and values its layers read")  # fmt: skip
        if source == kind:
            raise ValueError(f"{where}: a kind's layers cannot read their own kind's keys and values (they make "
                             f"none); name another kind, whose layers project them")  # fmt: skip
        if kinds[source].get("kv_from") is not None:
            further = kinds[source]["kv_from"]
            raise ValueError(f"{where}: kind {source}'s layers make no keys or values either (they read kind "
                             f"{further}'s); name the kind that makes them: kv_from={further}")  # fmt: skip
        first = next((i for i, k in enumerate(names) if k == kind and sources[i] == -1), None)
        if first is not None:
            raise ValueError(f"{where}: layer {first} has no earlier layer of kind {source} to read (the pattern "
                             f"{config.layer_pattern} repeated over {config.n_layer} layers); put a layer of kind "
                             f"{source} before every layer of kind {kind} (e.g. model.layer_pattern={source}{kind})")
        layer = names.index(kind)
        mine, theirs = config.layer_config(layer), config.layer_config(sources[layer])
        layout = registry.mixer(theirs.attention)
        if not layout.shares_kv or mine.attention != theirs.attention:
            readers = ", ".join(name for name, cls in registry.MIXERS.items() if cls.shares_kv)
            raise ValueError(f"{where}: kind {source}'s layers run attention={theirs.attention} ({layout.computes}) "
                             f"and kind {kind}'s attention={mine.attention}; a layer reads the keys and values of "
                             f"a layer of its own layout, one of {readers}")  # fmt: skip
        position = registry.position(mine.position)
        for name in (*KEY_SIDE, *position.fields):
            ours, its = getattr(mine, name), getattr(theirs, name)
            if name == "n_kv_head":
                ours, its = mine.kv_heads, theirs.kv_heads
            if ours != its:
                raise ValueError(f"{where}: {name}={spelled(ours)} in kind {kind}'s layers but {spelled(its)} in "
                                 f"kind {source}'s, whose keys they read as that kind made and encoded them; set "
                                 f"+model.layer_kinds.{kind}.{name}={spelled(its)}")  # fmt: skip
        if position.transforms_keys:
            raise ValueError(f"{where}: model.position={mine.position} turns the held keys through each query's "
                             f"tokens, which a cache shared between layers cannot hold for two layers; use another "
                             f"position, or no kv_from")  # fmt: skip
        spec = mine.attention_spec
        own = [f"{mod.field}={spelled(getattr(mine, mod.field))}" for mod in registry.MODIFICATIONS.values()
               if mod.used(getattr(mine, mod.field)) and mod.cache_width(spec)]  # fmt: skip
        own += [f"sparse_topk={mine.sparse_topk}"] if mine.sparse_topk is not None else []
        if own:
            raise ValueError(f"{where}: {own[0]} keeps numbers per key in a layer's own KV cache, which a layer that "
                             f"reads another's keeps none of; set +model.layer_kinds.{kind}.{own[0].split('=')[0]}="
                             f"{spelled(type(spec).__dataclass_fields__[own[0].split('=')[0]].default)}, or no "
                             f"kv_from")  # fmt: skip
        if mine.cache_capacity > theirs.cache_capacity:
            bound = next(f"{name}={getattr(theirs, name)}" for name in ("window", "attention_chunk")
                         if getattr(theirs, name) is not None)  # what keeps the source's cache short
            raise ValueError(f"{where}: its layers see up to {mine.cache_capacity} keys but kind {source}'s keep "
                             f"{theirs.cache_capacity} (its {bound}); give kind {kind} a window of at most "
                             f"{theirs.cache_capacity} (+model.layer_kinds.{kind}.window={theirs.cache_capacity}), "
                             f"or kind {source} a longer one")  # fmt: skip


def making_sparse(config: GPTConfig) -> str | None:
    """The overrides that make a model's layers sparse (``model.sparse_topk``): the model's where every layer takes
    it, else those of the kinds whose layers do (a hybrid's softmax kinds); None where no layer does."""
    kinds = dict.fromkeys(config.layer_kind_names)
    takes = {kind: "sparse_topk" in registry.mixer(config.layer_config(config.layer_kind_names.index(kind))
                                                    .attention).applies for kind in kinds}  # fmt: skip
    if all(takes.values()):
        return "model.sparse_topk=<keys per query>"
    return " ".join(f"+model.layer_kinds.{kind}.sparse_topk=<keys per query>" for kind in kinds if takes[kind]) or None


def check_position_options_reach_a_layer(config: GPTConfig) -> None:
    """A schedule's model-level position option (a rotary base) reaches only the layers whose encoding has it:
    refused where no layer's does, as a uniform model's would be."""
    if config.layer_pattern is None:
        return
    defaults = {name: f.default for name, f in type(config).__dataclass_fields__.items()}
    for name in position_fields():
        value = getattr(config, name)
        if value != defaults[name] and not config.consumes(name):
            takers = " or ".join(f"model.position={n}" for n, p in registry.POSITIONS.items() if name in p.fields)
            positions = sorted({config.layer_config(i).position for i in range(config.n_layer)})
            raise ValueError(f"model.{name}={value!r} is an option of {takers}, but no layer has it (the layers' "
                             f"positions: {', '.join(positions)}); use {takers} in some layer, or "
                             f"model.{name}={spelled(defaults[name])}")  # fmt: skip


# What a layer kind's window (chunk, temperature's length) of 0 would leave, and what null means instead. A schedule's
# share of too short a context is refused where it is computed (training/config.py, context_share): a 0 here was typed.
ZERO_POSITIONS = {"window": ("leaves each position no key to see", "the whole context"),
                  "attention_chunk": ("leaves each position no chunk to see", "no chunks"),
                  "query_temperature": ("scales the queries by a temperature of no positions", "off")}  # fmt: skip


def check_no_window_left(config: GPTConfig, kind: str) -> None:
    """Refuse a kind's window (chunk, temperature's length) of 0 in one line naming the kind's field and its
    layers."""
    for name, (problem, null) in ZERO_POSITIONS.items():
        value = config.layer_kinds[kind].get(name)
        if value == 0 and not isinstance(value, bool):
            raise ValueError(f"model.layer_kinds.{kind}.{name}=0 {kind_layers(config, kind)} {problem}; set it to a "
                             f"positive number of positions, or null ({null})")  # fmt: skip


def where_set(config: GPTConfig, name: str, kind: str | None) -> str:
    """Option ``name`` of layer kind ``kind``'s layers as the user set it: the kind's field where the kind sets it
    (``model.layer_kinds.B.differential``), else the model's (``model.differential``)."""
    return f"model.layer_kinds.{kind}.{name}" if name in config.layer_kinds.get(kind, {}) else f"model.{name}"


def kind_where(config: GPTConfig, kind: str) -> str:
    """A layer kind as refusals name it: ``model.layer_kinds.L (layers 0, 2)``."""
    return f"model.layer_kinds.{kind} {kind_layers(config, kind)}"


def kind_layers(config: GPTConfig, kind: str) -> str:
    """A layer kind's layers as messages spell them: ``(layers 0, 2)``, ``(layer 3)``."""
    layers = [i for i, k in enumerate(config.layer_kind_names) if k == kind]
    return f"(layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))})"


def check_pattern(config: GPTConfig) -> None:
    """Refuse a schedule's shape: a pattern that does not tile the layers, a letter with no kind, a kind in no
    layer, a field a kind cannot set."""
    pattern, kinds = config.layer_pattern, config.layer_kinds
    if pattern is None:
        if kinds:
            raise ValueError(f"model.layer_kinds names {', '.join(kinds)} but model.layer_pattern is not set; say "
                             f"which layers are which, e.g. model.layer_pattern={''.join(kinds)}")  # fmt: skip
        return
    if not isinstance(pattern, str) or not pattern or not all("A" <= c <= "Z" for c in pattern):
        raise ValueError(f"model.layer_pattern={pattern!r} must be capital letters, one per layer kind (e.g. LLLG), "
                         f"or null (every layer alike)")  # fmt: skip
    if config.n_layer % len(pattern):
        raise ValueError(f"model.layer_pattern={pattern} has {len(pattern)} layers, which does not tile "
                         f"model.n_layer={config.n_layer}; use a pattern whose length divides "
                         f"{config.n_layer}")  # fmt: skip
    for kind in kinds:
        if kind not in pattern:
            raise ValueError(f"model.layer_kinds.{kind} is in no layer of model.layer_pattern={pattern}; use it in "
                             f"the pattern or remove it")  # fmt: skip
    for kind in dict.fromkeys(pattern):
        if kind not in kinds:
            raise ValueError(f"model.layer_pattern={pattern}: layer kind {kind} is not in model.layer_kinds (has: "
                             f"{', '.join(kinds) or 'none'}); add model.layer_kinds.{kind} (its fields, or "
                             f"{{}})")  # fmt: skip
        for name, value in kinds[kind].items():
            if name not in LAYER_FIELDS:
                raise ValueError(f"{kind_where(config, kind)}: {name}={value!r} is not a field a layer sets; choose "
                                 f"from {', '.join(LAYER_FIELDS)}")  # fmt: skip


def check_linear_layers(config: GPTConfig) -> None:
    """Refuse a field set where a layer of linear attention (one that runs no kernel: Gated DeltaNet) cannot
    apply it, naming those layers (the whole model, or a kind's) and what to do, before any kernel's check:
    such a layer has no scores, so the kernel is never the fix (kernel=manual gives it no softcap)."""
    if config.layer_pattern is None:
        layout = registry.mixer(config.attention)
        unapplied = [] if layout.takes_kernel else layout.unapplied(config)
        if unapplied:
            name, value, offs, why = unapplied[0]
            # a layer's field may go to a hybrid's softmax layers; one of the whole model only to softmax everywhere
            softmax = "or a hybrid schedule: mixing=hybrid" if name in LAYER_FIELDS else "in every layer"
            raise ValueError(f"model.{name}={spelled(value)} with attention={config.attention} in every layer: "
                             f"{why}; set model.{name}={' or '.join(map(spelled, offs))}, or give it to softmax "
                             f"attention (another model.attention, {softmax})")  # fmt: skip
        return
    check_pattern(config)
    for kind in dict.fromkeys(config.layer_pattern):
        try:
            fields = SimpleNamespace(**{**vars(config), **config.layer_kinds[kind]})  # the kind's layers' fields
            layout = registry.mixer(fields.attention)
            unapplied = [] if layout.takes_kernel else layout.unapplied(fields)
        except ValueError as err:
            raise ValueError(f"{kind_where(config, kind)}: {err}") from None
        if unapplied:
            raise ValueError(linear_kind_refusal(config, kind, *unapplied[0]))


def linear_kind_refusal(config: GPTConfig, kind: str, name: str, value, offs: tuple, why: str) -> str:
    """Why layer kind ``kind``'s linear layers cannot apply ``name=value``, named where it is set (the kind's
    field or the model's), and the fixes: set it on the softmax kinds only, or turn it off for this kind."""
    kinds, own = config.layer_kinds, config.layer_kinds[kind]
    if name == "position":  # a layer's encoding differs from the model's only among those without a table
        offs = tuple(o for o in offs if registry.position(o).runs_past_context) or offs
    off, shown, layers = spelled(offs[0]), spelled(value), kind_layers(config, kind)
    linear = f"attention={own.get('attention', config.attention)}, which cannot apply it: {why}"
    if name not in LAYER_FIELDS:  # a setting of the whole model: no kind can be given it or spared it
        return (f"model.{name}={shown} reaches layer kind {kind} {layers}, {linear}; it is a setting of the whole "
                f"model, so set model.{name}={off}, or a schedule without linear layers")  # fmt: skip
    softmax = [k for k in kinds if registry.mixer(kinds[k].get("attention", config.attention)).takes_kernel]
    given = " ".join(f"+model.layer_kinds.{k}.{name}={shown}" for k in softmax if name not in kinds[k])
    if name in own:
        fix = f"set model.layer_kinds.{kind}.{name}={off}" + (f" (the softmax kinds take it: {given})" if given else "")
        return f"model.layer_kinds.{kind}.{name}={shown}: layer kind {kind} {layers} is {linear}; {fix}"
    only = f"set model.{name}={off}"
    if softmax:
        only = f"set it on the softmax kinds only ({' '.join(filter(None, [f'model.{name}={off}', given]))})"
    return (f"model.{name}={shown} reaches layer kind {kind} {layers}, {linear}; {only}, or turn it off for kind "
            f"{kind} (+model.layer_kinds.{kind}.{name}={off})")  # fmt: skip


def check_layer_attention(config: GPTConfig, attention: str) -> None:
    """A layer's attention may differ from the model's only as another function (a hybrid's linear layers): the
    layouts of one function are one choice for the whole model, which converts them all together."""
    if attention == config.attention:
        return
    mine, theirs = registry.mixer(config.attention), registry.mixer(attention)
    if mine.function == theirs.function:
        raise ValueError(f"attention={attention} with model.attention={config.attention}: they are layouts of one "
                         f"function, chosen for the whole model; set model.attention={attention}, or give the layer "
                         f"another function (e.g. attention=gated_deltanet)")  # fmt: skip


def check_layer_position(config: GPTConfig, position: str) -> None:
    """A layer's position encoding may differ from the model's only among those without a table (learned
    positions are the model's input table, not a layer's)."""
    if position == config.position:
        return
    if not (registry.position(config.position).runs_past_context and registry.position(position).runs_past_context):
        tableless = ", ".join(n for n, p in registry.POSITIONS.items() if p.runs_past_context)
        raise ValueError(f"position={position} with model.position={config.position}: layers' encodings may differ "
                         f"only among those without a table ({tableless}), the model's among them; learned positions "
                         f"are the model's input table, not a layer's")  # fmt: skip


def one_kernel_vocabulary(kernel: str, sdpa_backend: str) -> tuple[str, str]:
    """``model.kernel`` takes every ``kernel=`` spelling: ``sdpa_flash`` is kernel sdpa held to flash (the
    config keeps the two fields); a backend given twice must agree."""
    if not isinstance(kernel, str) or kernel in registry.KERNELS:
        return kernel, sdpa_backend
    name, backend = registry.split_kernel_option(kernel)
    if backend == "auto":
        return kernel, sdpa_backend  # no such option: refused where the kernel is looked up
    if sdpa_backend not in ("auto", backend):
        raise ValueError(f"model.kernel={kernel} holds sdpa to {backend}, but model.sdpa_backend={sdpa_backend}; "
                         f"give one of them")  # fmt: skip
    return name, backend
