"""GPTConfig: the shape of a GPT and the attention implementation it uses.

The one declaration of a model: Hydra's ``model`` config group validates
against it, checkpoints store it, and every script rebuilds models from it.
The defaults are GPT-2 small's shape; ``configs/model/*.yaml`` change only
what differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from model import positions as _positions  # noqa: F401  (registers the position encodings)
from model import registry
from model.attention import AttentionSpec
from model.score_mods import score_mod_fields

VOCAB_MULTIPLE = 64  # pad the embedding/LM head to a multiple of this for faster matmuls


def kernel_option(model: dict) -> str:
    """The kernel as the ``kernel=`` option spells it: ``sdpa_flash`` for SDPA held to its flash implementation."""
    return registry.kernel_option(model["kernel"], model.get("sdpa_backend", "auto"))


def attention_label(model: dict, sep: str = "-", show: tuple[str, ...] | list[str] = ()) -> str:
    """How a model attends, spelled as its options are: ``<attention>-<kernel>``, then a part for each other
    attention option set away from its default: ``-kv<n>`` for fewer key/value heads than query heads,
    ``-latent<k>`` (and ``-ropedim<r>``) for a latent key/value width, ``-window<w>`` for a sliding window,
    ``-rope`` (``-rope<theta>`` when theta is not 10000), ``-alibi`` or ``-nopos`` for the position encoding,
    ``-qknorm``, ``-softcap<c>``, ``-sinks``: ``fused_qkv-sdpa_flash``, ``wrapper-sdpa-kv2``,
    ``fused_qkv-manual-window64-rope-sinks``. The one name of a variant: run names, sweep directories, report
    tables, plot legends and wandb tags all use it; a default model's is ``<attention>-<kernel>``.

    ``model`` is a GPTConfig's fields (a dict: run.json holds them too; a field it lacks counts as its
    default). ``show`` names the axes (``n_kv_head``, ``window``, ``position``, ``rope_theta``) spelled even at
    their default (``-kv4`` of 4 heads, ``-nowindow``, ``-learned``, ``-rope10000``): those a sweep or a report
    varies. ``sep`` joins the parts.
    """
    parts = [model["attention"], kernel_option(model)]
    kv = model.get("n_kv_head") or model.get("n_head")
    latent = model.get("kv_latent")
    if latent is not None:  # keys and values kept as a latent: no key/value heads to count
        parts.append(f"latent{latent}")
        if model.get("rope_head_dim") is not None:
            parts.append(f"ropedim{model['rope_head_dim']}")
    elif kv != model.get("n_head") or "n_kv_head" in show:
        parts.append(f"kv{kv}")
    window = model.get("window")
    if window or "window" in show:
        parts.append(f"window{window}" if window else "nowindow")
    position = model.get("position", "learned")
    if position == "rope":
        theta = model.get("rope_theta", 10000.0)
        spelled = f"{int(theta)}" if float(theta).is_integer() else f"{theta:g}"  # 500000, not 5e+05
        parts.append(f"rope{spelled}" if theta != 10000 or "rope_theta" in show else "rope")
    elif position != "learned" or "position" in show:
        parts.append({"none": "nopos"}.get(position, position))
    for mod in registry.SCORE_MODS.values():  # -qknorm, -softcap<c>, -sinks: each says its own part
        part = mod.label(model.get(mod.field, mod.off))
        if part:
            parts.append(part)
    return sep.join(parts)


# The GPTConfig fields attention_label spells (its parts); a sweep over one of them names its runs by the label.
LABEL_AXES = ("n_kv_head", "kv_latent", "rope_head_dim", "window", "position", "rope_theta", *score_mod_fields())


@dataclass
class GPTConfig:
    # metadata "reuse": what a change of the field means to a checkpoint reused by trainer.resume or
    # trainer.init_from (training/reuse.py keeps one rule over it)
    name: str = field(default="gpt2_small", metadata={"reuse": "label"})  # for run names and reports; no effect
    vocab_size: int | None = field(default=None, metadata={"reuse": "weights"})  # None: the tokenizer's, at training
    block_size: int = field(default=1024, metadata={"reuse": "positions"})
    n_layer: int = field(default=12, metadata={"reuse": "weights"})
    n_head: int = field(default=12, metadata={"reuse": "weights"})
    n_embd: int = field(default=768, metadata={"reuse": "weights"})
    dropout: float = field(default=0.0, metadata={"reuse": "training"})
    bias: bool = field(default=True, metadata={"reuse": "weights"})
    attention: str = field(default="fused_qkv", metadata={"reuse": "layout"})  # the QKV layout: wrapper | ...
    # manual | sdpa | flex, or sdpa_<backend> (read as kernel=sdpa, sdpa_backend=<backend>)
    kernel: str = field(default="sdpa", metadata={"reuse": "implementation"})
    # key/value heads: None = n_head (multi-head), 1 = multi-query, else grouped-query
    n_kv_head: int | None = field(default=None, metadata={"reuse": "weights"})
    # sliding-window attention: each position sees this many (itself included); None: all
    window: int | None = field(default=None, metadata={"reuse": "function"})
    # kernel=sdpa's implementation: auto | flash | efficient | cudnn | math
    sdpa_backend: str = field(default="auto", metadata={"reuse": "implementation"})
    # The position encoding (model.positions): learned | rope | alibi | none
    position: str = field(default="learned", metadata={"reuse": "weights"})
    rope_theta: float = field(default=10000.0, metadata={"reuse": "function"})  # rotary's base wavelength
    qk_norm: bool = field(default=False, metadata={"reuse": "weights"})  # RMSNorm of each head's queries and keys
    softcap: float | None = field(default=None, metadata={"reuse": "function"})  # scores -> c tanh(scores / c)
    sinks: bool = field(default=False, metadata={"reuse": "weights"})  # a learned softmax sink per head
    # attention=mla: the keys' and values' latent width, and the decoupled rotary key's width (position=rope)
    kv_latent: int | None = field(default=None, metadata={"reuse": "weights"})
    rope_head_dim: int | None = field(default=None, metadata={"reuse": "weights"})

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if name == "vocab_size" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"model.{name}={value!r} must be a positive integer")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout={self.dropout!r} must be in [0, 1)")
        layout = registry.layout(self.attention)
        self.kernel, self.sdpa_backend = one_kernel_vocabulary(self.kernel, self.sdpa_backend)
        layout.check_spec(self.attention_spec)  # every attention option, checked where attention is declared

    @property
    def attention_spec(self) -> AttentionSpec:
        """What every attention block is built from (its checks run as it is made)."""
        return AttentionSpec(**{f.name: getattr(self, f.name) for f in fields(AttentionSpec)})

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_head``, or ``n_head`` (multi-head) when unset."""
        return self.n_kv_head or self.n_head

    @property
    def cache_capacity(self) -> int:
        """Positions a KV cache keeps per layer: the context, or the window when shorter."""
        return min(self.block_size, self.window or self.block_size)

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
